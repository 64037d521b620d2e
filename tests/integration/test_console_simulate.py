"""The console's simulation page (``services.console.simulate``) over HTTP: the comparison it
draws is the JSON line ``mdq simulate`` prints for the same request, on a generated workload and
on a history projected into a real PostgreSQL and read through the console's read-only role;
bad fields are refused by name; one simulation runs at a time, in a process of its own that is
killed at the time limit. The charts in a browser: tests/e2e/test_console_browser.py."""

from __future__ import annotations

import asyncio
import html
import json
import multiprocessing
import re
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from nats.aio.client import Client
from typer.testing import CliRunner

from mdq.bus.subjects import Subjects
from mdq.cli.main import app as cli
from mdq.embedded import free_port
from mdq.sim.generator import GeneratorSpec
from mdq.sim.report import PANELS
from mdq.store.engine import create_engine
from mdq.store.roles import RoleUrls
from services.console.app import Console
from services.console.simulate import (
    SimulationBusy,
    SimulationFailed,
    Simulations,
    parse_request,
)
from tests.integration.test_console import serve_console
from tests.integration.test_projector import History, history_projected, requeue_history
from tests.integration.test_sim_history import crash_history

BIG = GeneratorSpec(nodes=2_000, jobs=50_000, seed=3)
"""A workload whose comparison of every configuration takes far longer than the limits below."""


@dataclass
class Page:
    url: str
    console: Console
    database_url: str


@pytest.fixture
async def page(
    nc: Client,
    subjects: Subjects,
    database_roles: RoleUrls,
    pool: asyncpg.Pool,
    data_dir: Path,
) -> AsyncIterator[Page]:
    """A console over a projected history of two jobs (the default time limit: a small
    comparison's process, started on a loaded machine, is never cut short)."""
    js = nc.jetstream()
    retried = History("retried")
    first, second = requeue_history(retried)
    crashy = History("crashy", request_id="ba9876543210")
    crashy.clock = retried.clock
    events = [*first, *second, *crash_history(crashy)]
    engine = create_engine(database_roles.reader)
    console = Console(
        engine=engine,
        nc=nc,
        subjects=subjects,
        data_dir=data_dir,
    )
    server, serving, url = await serve_console(console)
    try:
        async with history_projected(js, subjects, pool, events):
            yield Page(url, console, database_roles.reader)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        await engine.dispose()


async def token_of(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/simulate") as response:
        assert response.status == 200
        found = re.search(r'name="token" value="([^"]+)"', await response.text())
    assert found is not None
    return found.group(1)


async def post(
    url: str, fields: list[tuple[str, str]], *, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        form = [("token", await token_of(session, url)), *fields]
        async with session.post(f"{url}/simulate", data=form, headers=headers) as response:
            return response.status, await response.text()


def line_of(page: str) -> dict[str, Any]:
    found = re.search(r'<pre id="sim-line">(.*?)</pre>', page, re.S)
    assert found is not None, page
    line: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return line


def command_of(page: str) -> list[str]:
    found = re.search(r'<code id="sim-command">(.*?)</code>', page, re.S)
    assert found is not None, page
    return shlex.split(html.unescape(found.group(1)))


def bars_of(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<g class="bar" data-config="([^"]+)" data-value="([^"]+)"', page)


async def test_the_page_draws_what_mdq_simulate_prints(page: Page) -> None:
    fields = [
        ("config", "fifo"),
        ("config", "load-aware"),
        ("custom", "load-aware:target_load=0.6"),
        ("source", "generated"),
        ("nodes", "8"),
        ("jobs", "300"),
        ("seed", "5"),
        ("noisy_fraction", "0.25"),
    ]
    status, shown = await post(page.url, fields)
    assert status == 200, shown
    line = line_of(shown)
    names = ["fifo", "load-aware", "load-aware:target_load=0.6"]
    assert [figures["config"] for figures in line["configs"]] == names
    assert line["workload"]["jobs"] == 300 and line["workload"]["nodes"] == 8
    # the command the page names prints the very same line
    command = command_of(shown)
    assert command[:2] == ["mdq", "simulate"]
    printed = CliRunner().invoke(cli, command[1:])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout.splitlines()[0]) == line
    # one bar per configuration in each metric's chart, its value the line's figure
    bars = bars_of(shown)
    assert len(bars) == len(PANELS) * len(names)
    for index, panel in enumerate(PANELS):
        drawn = bars[index * len(names) : (index + 1) * len(names)]
        assert [config for config, _ in drawn] == names
        expected = [float(figures[panel.key]) * panel.factor for figures in line["configs"]]
        assert [float(value) for _, value in drawn] == pytest.approx(expected)
    best = re.search(
        r'data-metric="makespan_s">\s*<figcaption>[^<]*best: <span class="best">([^<]*)<', shown
    )
    assert best is not None
    fastest = min(figures["makespan_s"] for figures in line["configs"])
    assert best.group(1).split(", ") == [
        figures["config"] for figures in line["configs"] if figures["makespan_s"] == fastest
    ]


async def test_the_sites_own_history_is_replayed_through_the_read_only_role(page: Page) -> None:
    fields = [
        ("config", "fifo"),
        ("config", "load-aware"),
        ("source", "history"),
        ("days", "3650"),
        ("node_cpu", "4"),
        ("node_memory_mb", "8192"),
        ("extra_nodes", "1"),
    ]
    status, shown = await post(page.url, fields)
    assert status == 200, shown
    line = line_of(shown)
    assert line["workload"]["source"] == "history"
    assert line["workload"]["jobs"] == 2
    assert line["workload"]["nodes"] == 3  # n1 and n2 from the history, and one more
    for figures in line["configs"]:
        assert figures["succeeded"] == 2, line
        assert figures["crashes"] == 1  # crashy's first attempt, replayed
    printed = await asyncio.to_thread(  # the CLI runs its own event loop
        CliRunner().invoke, cli, ["--database-url", page.database_url, *command_of(shown)[1:]]
    )
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout.splitlines()[0]) == line


@pytest.mark.parametrize(
    "fields, field",
    [
        pytest.param([("config", "fifo"), ("nodes", "0")], "nodes", id="no-nodes"),
        pytest.param([("config", "fifo"), ("jobs", "1000000")], "jobs", id="too-many-jobs"),
        pytest.param([("config", "fifo"), ("jobs", "12.5")], "jobs", id="jobs-not-whole"),
        pytest.param([("config", "fifo"), ("load", "nan")], "load", id="load-nan"),
        pytest.param([("config", "fifo"), ("seed", "-1")], "seed", id="seed-negative"),
        pytest.param([("config", "bogus")], "config", id="unknown-config"),
        pytest.param([], "config", id="no-config"),
        pytest.param([("custom", "load-aware:no_such_tunable=1")], "custom", id="bad-custom"),
        pytest.param([("custom", "load-aware:sample_size=inf")], "custom", id="custom-inf"),
        pytest.param([("config", "fifo"), ("source", "../etc")], "source", id="bad-source"),
        pytest.param(
            [("config", "fifo"), ("source", "history"), ("days", "1")], "days", id="empty-window"
        ),
    ],
)
async def test_a_bad_field_is_refused_naming_it(
    page: Page, fields: list[tuple[str, str]], field: str
) -> None:
    status, shown = await post(page.url, fields)
    assert status == 400, shown
    assert f'id="refusal-field">{field}<' in shown, shown
    assert not bars_of(shown)


async def test_a_history_window_past_the_bound_is_refused_before_its_attempts_are_read(
    page: Page,
) -> None:
    page.console.simulations.max_history_jobs = 1  # the projected history holds two jobs
    history = [("config", "fifo"), ("source", "history"), ("days", "3650")]
    status, shown = await post(page.url, history)
    assert status == 400, shown
    assert 'id="refusal-field">days<' in shown
    assert "the last 3650 days hold more than 1 jobs" in shown
    assert not bars_of(shown)
    page.console.simulations.max_history_jobs = 2
    status, shown = await post(page.url, history)
    assert status == 200, shown
    assert line_of(shown)["workload"]["jobs"] == 2


async def test_the_command_shown_is_quoted_for_a_shell(page: Page) -> None:
    custom = "load-aware:target_load= 0.6"  # a number with a space before it is a number
    fields = [("custom", custom), ("nodes", "2"), ("jobs", "20")]
    status, shown = await post(page.url, fields)
    assert status == 200, shown
    line = line_of(shown)
    assert [figures["config"] for figures in line["configs"]] == [custom]
    command = command_of(shown)
    assert command[2:4] == ["-c", custom]
    printed = CliRunner().invoke(cli, command[1:])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout.splitlines()[0]) == line


async def test_a_form_from_elsewhere_or_without_the_token_is_refused(page: Page) -> None:
    status, shown = await post(
        page.url, [("config", "fifo")], headers={"Origin": "http://evil.example"}
    )
    assert status == 400 and 'id="error-field">origin<' in shown
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{page.url}/simulate", data={"token": "guess", "config": "fifo"}) as response,
    ):
        assert response.status == 400
        assert 'id="error-field">token<' in await response.text()


async def test_one_simulation_at_a_time_and_none_past_its_time_limit(page: Page) -> None:
    page.console.simulations.time_limit_s = 4.0
    every = [("config", name) for name in ("fifo", "priority", "load-aware", "binpack")]
    big = [*every, ("nodes", str(BIG.nodes)), ("jobs", str(BIG.jobs)), ("seed", "3")]
    first = asyncio.create_task(post(page.url, big))
    deadline = asyncio.get_running_loop().time() + 30
    while not page.console.simulations.busy:
        assert not first.done(), await first
        assert asyncio.get_running_loop().time() < deadline, "the first simulation never started"
        await asyncio.sleep(0.02)
    status, shown = await post(page.url, [("config", "fifo"), ("jobs", "10")])
    assert status == 409, shown
    assert "another simulation is running" in shown
    status, shown = await first
    assert status == 503, shown
    assert "time limit of 4 s" in shown
    assert multiprocessing.active_children() == []  # the simulation's process is gone
    page.console.simulations.time_limit_s = 120.0
    status, shown = await post(page.url, [("config", "fifo"), ("jobs", "10"), ("nodes", "2")])
    assert status == 200, shown  # and the next one runs


async def test_the_runner_kills_its_process_when_its_caller_is_cancelled() -> None:
    simulations = Simulations(time_limit_s=300)
    running = asyncio.create_task(
        simulations.run(BIG, parse_request(["fifo"], {}).resolved_configs())
    )
    while not multiprocessing.active_children():
        assert not running.done()
        await asyncio.sleep(0.02)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert multiprocessing.active_children() == []
    assert not simulations.busy
    with pytest.raises(SimulationFailed, match="failed"):  # an error inside is reported
        await simulations.run(GeneratorSpec(nodes=0, jobs=10), [])
    assert not simulations.busy
    with pytest.raises(SimulationBusy):
        async with simulations._lock:  # held, as a running simulation holds it
            await simulations.run(GeneratorSpec(nodes=2, jobs=10), [])


async def test_a_history_database_that_does_not_answer_is_a_503_and_generated_runs_go_on(
    nc: Client, subjects: Subjects, data_dir: Path
) -> None:
    nobody = f"postgresql://mdq@127.0.0.1:{free_port()}/mdq"  # nothing listens there
    engine = create_engine(nobody)
    console = Console(engine=engine, nc=nc, subjects=subjects, data_dir=data_dir)
    server, serving, url = await serve_console(console)
    try:
        async with console.simulations.turn():  # a simulation holds the turn: no reading either
            status, shown = await post(url, [("config", "fifo"), ("source", "history")])
            assert status == 409, shown
        status, shown = await post(url, [("config", "fifo"), ("source", "history")])
        assert status == 503, shown
        assert "the history database did not answer" in shown
        status, shown = await post(url, [("config", "fifo"), ("nodes", "2"), ("jobs", "20")])
        assert status == 200, shown
        assert line_of(shown)["workload"]["jobs"] == 20
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        await engine.dispose()


async def test_a_history_database_that_never_answers_gives_the_turn_back_at_the_time_limit(
    nc: Client, subjects: Subjects, data_dir: Path
) -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # takes the connection, never says a word

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    engine = create_engine(f"postgresql://mdq@127.0.0.1:{port}/mdq")
    console = Console(engine=engine, nc=nc, subjects=subjects, data_dir=data_dir)
    console.simulations.time_limit_s = 2.0
    server, serving, url = await serve_console(console)
    try:
        started = asyncio.get_running_loop().time()
        status, shown = await post(url, [("config", "fifo"), ("source", "history")])
        assert status == 503, shown
        assert "the history database did not answer" in shown
        # at the page's limit, long before asyncpg's own connect timeout (60 s)
        assert asyncio.get_running_loop().time() - started < 30
        assert not console.simulations.busy
        console.simulations.time_limit_s = 120.0
        status, shown = await post(url, [("config", "fifo"), ("nodes", "2"), ("jobs", "20")])
        assert status == 200, shown
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        await engine.dispose()
        silent.close()
