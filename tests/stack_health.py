"""What a test's stacks went through, read from outside: crashes, restarts, hangs on stop and
unhandled exceptions.

``Stack`` restarts a crashed service with backoff, so a test that only waits for an end state
would pass over a service that crashes on every tenth message. Every stack a test starts keeps
its notes in ``<state>/logs/stack.log`` and each process's output in ``<state>/logs/<name>.log``;
``check_stacks`` reads those after the test and reports:

- a part that exited while the stack ran (``<name>: exited ...; restarting``), beyond what the
  test's ``expected_crashes`` marker names;
- a child that did not exit on SIGTERM within the grace period, or exited non-zero on stop;
- a ``Traceback`` in any log of a part the marker does not name under ``tracebacks``.

A test that kills or breaks a part on purpose says so, naming the part and how often::

    @pytest.mark.expected_crashes({"recovery": 1})                  # exactly once
    @pytest.mark.expected_crashes({"nats-server": ANY}, tracebacks={"watcher"})
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

ANY: Final = "any"
"""An ``expected_crashes`` count: the part may exit any number of times (at least once)."""

_NOTE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?P<name>[\w.@/-]+): (?P<what>.*)$")
_CRASH = re.compile(r"^exited (with -?\d+|\([^)]*\)); restarting in ")
_HANG = re.compile(r"^no exit .* after SIGTERM; SIGKILL$")
_BAD_STOP = re.compile(r"^exited with -?\d+ on stop$")
TRACEBACK: Final = "Traceback (most recent call last)"
_NOT_PROCESS_LOGS: Final = frozenset({"stack.log"})


@dataclass
class StackHealth:
    """What one stack's state folder says about its parts."""

    state_dir: Path
    crashes: Counter[str] = field(default_factory=Counter)
    crash_lines: list[str] = field(default_factory=list)
    stop_problems: list[str] = field(default_factory=list)
    tracebacks: dict[str, str] = field(default_factory=dict)
    """log name (without ``.log``) → the first traceback in it, a few lines of it."""


def read_stack_health(state_dir: Path) -> StackHealth:
    """Parse ``state_dir``'s stack notes and process logs."""
    health = StackHealth(state_dir)
    logs = state_dir / "logs"
    for line in _lines(logs / "stack.log"):
        note = _NOTE.match(line)
        if note is None:
            continue
        name, what = note["name"], note["what"]
        if _CRASH.match(what):
            health.crashes[name] += 1
            health.crash_lines.append(line)
        elif _HANG.match(what) or _BAD_STOP.match(what):
            tail = _lines(logs / f"{name}.log")[-6:]
            health.stop_problems.append("\n    ".join([line, *tail]))
    for log in sorted(logs.glob("*.log")):
        if log.name in _NOT_PROCESS_LOGS:
            continue
        lines = _lines(log)
        for index, line in enumerate(lines):
            if TRACEBACK in line:
                excerpt = lines[max(0, index - 1) : index + 12]
                health.tracebacks[log.stem] = "\n".join(excerpt)
                break
    return health


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []


def stack_state_dirs(root: Path) -> list[Path]:
    """Every stack state folder under ``root`` (one with ``logs/stack.log``)."""
    return sorted(log.parent.parent for log in root.rglob("logs/stack.log"))


def problems(
    healths: Iterable[StackHealth],
    *,
    expected: Mapping[str, int | str],
    tracebacks_allowed: Iterable[str] = (),
) -> list[str]:
    """What went wrong beyond what the test expected, one line each (empty: all well).

    ``expected`` maps a part to the number of times it exited over all of the test's stacks
    (``ANY``: at least once). A part named there that never exited is a problem too: the test
    claims a fault it did not cause, so its check of recovery proved nothing."""
    healths = list(healths)
    allowed = set(tracebacks_allowed)
    found: list[str] = []
    crashes: Counter[str] = Counter()
    for health in healths:
        crashes.update(health.crashes)
        found.extend(f"{health.state_dir}: {line}" for line in health.stop_problems)
        for name, excerpt in health.tracebacks.items():
            if name not in allowed:
                found.append(f"{health.state_dir}/logs/{name}.log has a traceback:\n{excerpt}")
    for name in sorted(set(crashes) | set(expected)):
        seen, wanted = crashes.get(name, 0), expected.get(name, 0)
        if wanted == ANY:
            if seen == 0:
                found.append(f"{name} was expected to exit, and never did")
        elif seen != wanted:
            lines = [
                line for health in healths for line in health.crash_lines if f" {name}: " in line
            ]
            found.append(
                f"{name} exited {seen} time(s) while its stack ran, expected {wanted}"
                + "".join(f"\n  {line}" for line in lines[:5])
            )
    return found


KILLS: Final = pytest.StashKey[Counter[str]]()
"""Where the ``kills`` fixture keeps a test's count of the parts it killed."""


def verdict(node: pytest.Item, state_dirs: Iterable[Path]) -> list[str]:
    """``problems`` of the stacks in ``state_dirs``, against what test ``node`` expects: its
    ``expected_crashes`` marker and the kills it counted."""
    marker = node.get_closest_marker("expected_crashes")
    expected: dict[str, int | str] = dict(marker.args[0]) if marker and marker.args else {}
    counted: Counter[str] = node.stash.get(KILLS, Counter())
    expected.update(counted)
    allowed = marker.kwargs.get("tracebacks", ()) if marker is not None else ()
    return problems(
        (read_stack_health(state) for state in state_dirs),
        expected=expected,
        tracebacks_allowed=allowed,
    )


def fail_unless_healthy(node: pytest.Item, state_dirs: Iterable[Path]) -> None:
    """Fail the test (from a fixture's teardown) if ``verdict`` found anything."""
    found = verdict(node, state_dirs)
    if found:
        pytest.fail("the test's stack was not healthy:\n" + "\n".join(found), pytrace=False)
