"""A service's liveness file (``mdq.health``): what the probe says of it, by name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mdq.health import age_problem, keep_renewing, main

NOW = 1_000_000.0

AGES = {
    "renewed just now": (0.0, 30.0, ""),
    "renewed at the limit": (30.0, 30.0, ""),
    "older than the limit": (31.0, 30.0, "last renewed 31 s ago (more than 30 s)"),
    "a stricter limit": (6.0, 5.0, "last renewed 6 s ago (more than 5 s)"),
}


@pytest.mark.parametrize(("age", "max_age", "says"), AGES.values(), ids=AGES.keys())
def test_the_age_of_the_file(tmp_path: Path, age: float, max_age: float, says: str) -> None:
    alive = tmp_path / "alive"
    alive.touch()
    os.utime(alive, (NOW - age, NOW - age))
    problem = age_problem(alive, max_age, now=NOW)
    assert (says in problem) if says else problem == ""
    assert bool(problem) == bool(says)


def test_no_file_is_a_service_that_has_not_started(tmp_path: Path) -> None:
    assert "does not exist" in age_problem(tmp_path / "alive", 30.0)


async def test_a_running_service_renews_the_file(tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    renewing = asyncio.create_task(keep_renewing(alive, every_s=0.05))
    try:
        await asyncio.sleep(0.2)
        first = alive.stat().st_mtime_ns
        os.utime(alive, (NOW, NOW))  # as if renewed long ago
        await asyncio.sleep(0.2)
        assert alive.stat().st_mtime_ns >= first
    finally:
        renewing.cancel()
    assert age_problem(alive, 1.0) == ""


PROBES = {
    "a fresh file": ("fresh", [], 0, ""),
    "a stale file": ("stale", [], 1, "last renewed"),
    "a stale file within a wider limit": ("stale", ["7200"], 0, ""),
    "no file": ("missing", [], 1, "does not exist"),
    "a limit that is not a number": ("fresh", ["soon"], 2, "must be a number"),
}


@pytest.mark.parametrize(("state", "extra", "code", "says"), PROBES.values(), ids=PROBES.keys())
def test_the_probe(tmp_path: Path, state: str, extra: list[str], code: int, says: str) -> None:
    alive = tmp_path / "alive"
    if state != "missing":
        alive.touch()
    if state == "stale":
        old = time.time() - 3600
        os.utime(alive, (old, old))
    assert main([str(alive), *extra]) == code
    done = subprocess.run(
        [sys.executable, "-m", "mdq.health", str(alive), *extra],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == code
    assert says in done.stderr


async def test_a_file_that_cannot_be_written_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alive = tmp_path / "missing" / "alive"
    renewing = asyncio.create_task(keep_renewing(alive, every_s=0.01))
    try:
        while caplog.text.count("cannot renew the liveness file") < 2:
            assert not renewing.done(), "a failed renewal ended the task"
            await asyncio.sleep(0.01)
        (tmp_path / "missing").mkdir()
        while not alive.exists():  # noqa: ASYNC110 - a file, no event to wait on
            await asyncio.sleep(0.01)
    finally:
        renewing.cancel()
    assert age_problem(alive, 1.0) == ""
