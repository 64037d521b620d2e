"""The console's pages over HTTP, on a history projected into a real PostgreSQL by the
watcher's projector and a real NATS (``services.console``): what each page shows, keyset
pages, live progress over server-sent events, downloads only of a job's own files, and
refusals that name the parameter. The browser itself: tests/e2e/test_console_browser.py."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
import uvicorn
from nats.aio.client import Client

from mdq.bus.runtime import LineBudgetFilter
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.runner_task import job_dir
from mdq.store.engine import create_engine
from mdq.store.roles import RoleUrls
from mdq.testing.tasks import Background
from services.console import reads
from services.console.app import Console, build_app, server_config
from services.console.filters import JobFilter
from services.metrics.app import MetricsService
from services.metrics.settings import MetricsSettings
from tests.helpers import OwnersPublisher, RecordingBackend, read_all, running, wait_for
from tests.integration.test_projector import History, history_projected, requeue_history


@dataclass
class Site:
    """A console serving a projected history."""

    url: str
    console: Console
    retried: History
    doomed: History
    publisher: OwnersPublisher
    trajectory: bytes


async def serve_console(
    console: Console, *, access_token: str | None = None
) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    server = uvicorn.Server(
        server_config(build_app(console, access_token=access_token), "127.0.0.1", 0)
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the console's server stopped before it listened"
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@pytest.fixture
async def site(
    nc: Client,
    subjects: Subjects,
    database_roles: RoleUrls,
    pool: asyncpg.Pool,
    data_dir: Path,
) -> AsyncIterator[Site]:
    js = nc.jetstream()
    retried = History("retried")
    retried.spec.labels["campaign"] = "water"
    first, second = requeue_history(retried)
    doomed = History("doomed", request_id="ba9876543210")
    folder = job_dir(data_dir, retried.job_id)
    folder.mkdir(parents=True)
    trajectory = b"DCD frames" * 100
    (folder / "trajectory.dcd").write_bytes(trajectory)
    secret = data_dir / "secret.txt"  # not the job's: no output may name it
    secret.write_text("not yours")
    outputs = pb.JobOutputs(
        final_step=1000,
        output_dir=str(folder),
        files=[
            pb.OutputFile(
                kind="trajectory",
                path=str(folder / "trajectory.dcd"),
                format="dcd",
                size_bytes=len(trajectory),
            ),
            pb.OutputFile(kind="final_state", path=str(folder / ".." / ".." / "secret.txt")),
        ],
    )
    events = [
        *first,
        *second,
        retried.event("outputs", outputs, 2),
        doomed.submitted(),
        doomed.bound(1, "n1"),
        doomed.started(1, "n1"),
        doomed.progress(1, 20, units="lj"),  # a LAMMPS script in reduced LJ units
        doomed.attempt_failed(1, "n1", last_step=40),
        doomed.failed(1),
    ]
    engine = create_engine(database_roles.reader)
    try:
        async with history_projected(js, subjects, pool, events):
            console = Console(engine=engine, nc=nc, subjects=subjects, data_dir=data_dir)
            server, serving, url = await serve_console(console)
            try:
                publisher = OwnersPublisher(js=js, subjects=subjects)
                yield Site(url, console, retried, doomed, publisher, trajectory)
            finally:
                server.should_exit = True
                await asyncio.wait_for(serving, timeout=10)
    finally:
        await engine.dispose()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def test_the_jobs_page_lists_every_job_newest_first(site: Site) -> None:
    status, html = await get(f"{site.url}/jobs")
    assert status == 200
    listed = re.findall(r'data-job="([^"]+)"', html)
    assert listed == [site.doomed.job_id, site.retried.job_id]  # doomed was submitted last
    assert "FAILED" in html and "SUCCEEDED" in html


@pytest.mark.parametrize(
    "query, expected",
    [
        ("state=FAILED", ["doomed"]),
        ("state=succeeded", ["retried"]),
        ("priority=high", ["doomed", "retried"]),
        ("priority=low", []),
        ("name=RETR", ["retried"]),
        ("tenant=-", ["doomed", "retried"]),
        ("tenant=alice", []),
        ("label=campaign=water", ["retried"]),
        ("label=campaign=ice", []),
        ("label=campaign=water&state=FAILED", []),
        ("until=2026-11-29T12:00:00%2B00:00", []),
        ("since=2026-11-29T12:00:00%2B00:00", ["doomed", "retried"]),
    ],
)
async def test_the_jobs_page_filters(site: Site, query: str, expected: list[str]) -> None:
    status, html = await get(f"{site.url}/jobs?{query}")
    assert status == 200
    names = {site.doomed.job_id: "doomed", site.retried.job_id: "retried"}
    assert [names[job] for job in re.findall(r'data-job="([^"]+)"', html)] == expected


@pytest.mark.parametrize(
    "query, field",
    [
        ("state=DONE", "state"),
        ("colour=red", "colour"),
        ("size=7", "size"),
        ("after=forged", "after"),
        ("label=nokey", "label"),
    ],
)
async def test_a_bad_filter_is_refused_naming_it(site: Site, query: str, field: str) -> None:
    status, html = await get(f"{site.url}/jobs?{query}")
    assert status == 400
    assert f'<code id="error-field">{field}</code>' in html


async def test_pages_follow_one_another_by_keyset_without_overlap(site: Site) -> None:
    engine = site.console.engine
    first = await reads.list_jobs(engine, JobFilter(size=1))
    assert [row.job_id for row in first.rows] == [site.doomed.job_id]
    assert first.next_cursor is not None
    second = await reads.list_jobs(engine, JobFilter(size=1, after=first.next_cursor))
    assert [row.job_id for row in second.rows] == [site.retried.job_id]
    assert second.next_cursor is None  # the last page says so
    # the link the page renders leads to the same second page
    cursor = first.next_cursor.encode()
    status, html = await get(f"{site.url}/jobs?after={cursor}")
    assert status == 200
    assert re.findall(r'data-job="([^"]+)"', html) == [site.retried.job_id]


async def test_a_job_page_shows_attempts_explanation_checkpoints_and_points(site: Site) -> None:
    status, html = await get(f"{site.url}/jobs/{site.retried.job_id}")
    assert status == 200
    assert 'id="attempt-1"' in html and 'id="attempt-2"' in html
    resumed = re.search(r'id="attempt-2">.*?<td class="resumed">(\d+)</td>', html, re.S)
    assert resumed is not None and resumed.group(1) == "200"  # resumed from its checkpoint
    assert "filtered: insufficient cpu" in html  # the explanation names the excluded node
    assert re.search(r"<td>n-busy</td>", html)
    data = re.search(r'<script type="application/json" id="job-data">(.*?)</script>', html, re.S)
    assert data is not None
    points = json.loads(data.group(1))["points"]
    steps = [(p["attempt"], int(p["progress"]["step"])) for p in points]
    assert steps == [(1, 100), (1, 200), (1, 300), *((2, s) for s in range(300, 1001, 100))]
    assert points[0]["progress"]["potential_kj_mol"] == pytest.approx(-1010.0)
    assert "trajectory.dcd" in html
    assert "Potential energy (kJ/mol)" in html and "Speed (ns/day)" in html, re.findall(
        "<figcaption>[^<]*", html
    )
    _, reduced = await get(f"{site.url}/jobs/{site.doomed.job_id}")
    for caption in ("Potential energy (ε, ", "Temperature (ε/k_B, ", "Speed (kτ/day, "):
        assert caption in reduced, re.findall("<figcaption>[^<]*", reduced)
    assert "kJ/mol" not in reduced and "ns/day" not in reduced


async def test_an_unknown_job_and_a_malformed_id_are_not_found(site: Site) -> None:
    status, html = await get(f"{site.url}/jobs/0123456789ab-nobody")
    assert status == 404
    assert 'http-equiv="refresh"' in html  # maybe just submitted: it looks again by itself
    assert (await get(f"{site.url}/jobs/..%2F..%2Fetc"))[0] == 404


async def test_a_job_output_downloads_and_nothing_else_does(site: Site) -> None:
    job = site.retried.job_id
    _, html = await get(f"{site.url}/jobs/{job}")
    links = dict(
        (name, int(index))
        for index, name in re.findall(rf'href="/jobs/{job}/outputs/(\d+)" download>([^<]+)<', html)
    )
    assert set(links) == {"trajectory.dcd", "secret.txt"}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{site.url}/jobs/{job}/outputs/{links['trajectory.dcd']}") as got:
            assert got.status == 200
            assert await got.read() == site.trajectory
        # the other output names a file outside the job's folder: refused
        async with session.get(f"{site.url}/jobs/{job}/outputs/{links['secret.txt']}") as got:
            assert got.status == 404
            assert "not yours" not in await got.text()
        async with session.get(f"{site.url}/jobs/{job}/outputs/2") as got:
            assert got.status == 404


async def test_a_campaign_page_overlays_its_jobs_curves(site: Site) -> None:
    status, html = await get(f"{site.url}/campaigns?label=campaign=water")
    assert status == 200 and "1 job(s)" in html
    data = re.search(r'type="application/json" id="campaign-data">(.*?)</script>', html, re.S)
    assert data is not None
    [curve] = json.loads(data.group(1))
    assert curve["jobId"] == site.retried.job_id
    assert len(curve["steps"]) == len(curve["potentialKjMol"]) == 11  # both attempts' points
    assert curve["steps"] == sorted(curve["steps"])


async def test_a_campaign_curve_keeps_reports_of_a_runner_whose_clock_is_off(
    site: Site, pool: asyncpg.Pool
) -> None:
    # the campaign page reads each job's reports only from a clock margin before its submit to
    # one after its last event (so only its own partitions are read); a runner clock half a
    # day behind, on a job that has ended, still puts every point on the curve
    skewed = History("skewed", request_id="cafe01234567")
    skewed.spec.labels["campaign"] = "skew"
    events = [skewed.submitted(), skewed.bound(1, "n1"), skewed.started(1, "n1")]
    skewed.clock -= timedelta(hours=12)
    events += [skewed.progress(1, step) for step in (100, 200, 300)]
    skewed.clock += timedelta(hours=12)
    events.append(skewed.succeeded(1, 1000))
    for event in events:
        await site.publisher.publish(event)
    deadline = asyncio.get_running_loop().time() + 20
    query = (
        "SELECT state, count(p.job_id) FROM jobs LEFT JOIN progress p USING (job_id) "
        "WHERE job_id = $1 GROUP BY state"
    )
    while await pool.fetchrow(query, skewed.job_id) != ("SUCCEEDED", 3):
        assert asyncio.get_running_loop().time() < deadline, "the skewed job was projected"
        await asyncio.sleep(0.05)
    [job] = await reads.campaign(site.console.engine, "campaign", "skew")
    assert job.steps == [100, 200, 300]
    assert job.potential_kj_mol == [-1010.0, -1020.0, -1030.0]


async def test_the_campaign_and_nodes_pages_render(site: Site) -> None:
    status, html = await get(f"{site.url}/campaigns?label=campaign=none")
    assert status == 200 and "0 job(s)" in html
    assert (await get(f"{site.url}/campaigns?label=broken"))[0] == 400
    status, html = await get(f"{site.url}/nodes")
    assert status == 200


async def test_the_nodes_page_says_why_a_node_takes_no_new_pods(
    site: Site, nc: Client, subjects: Subjects
) -> None:
    problem = "data disk full (ENOSPC): No space left on device"
    publisher = OwnersPublisher(js=nc.jetstream(), subjects=subjects)
    for node, said in (("sick-node", problem), ("well-node", "")):
        body = pb.NodeLoad(
            node=node, cpu_capacity=2, memory_capacity_mb=2048, ready=True, problem=said
        )
        await publisher.emit("node_load", body, job_id="", attempt=0, detail=f"{node}:1")
    async with console_serving(site, nc, subjects) as url:
        status, html = await get(f"{url}/nodes")
    assert status == 200
    sections = dict(re.findall(r'<h2 id="node-\d+">([^<]+)</h2>(.*?)</section>', html, re.S))
    assert f"Takes no new pods: {problem}" in sections["sick-node"]
    assert "Takes no new pods" not in sections["well-node"]


class SwingingNodes(RecordingBackend):
    """Two nodes whose load swings from one sample to the next, so that each summary's mean
    and peak differ."""

    def __init__(self) -> None:
        super().__init__()
        self.taken = 0

    async def sample_nodes(self) -> list[NodeSample]:
        self.taken += 1
        swing = (self.taken % 4) / 4
        return [
            NodeSample(
                name=name,
                cpu_capacity=4,
                memory_capacity_mb=8192,
                ready=True,
                cpu_load=swing * share,
                memory_load=(1 - swing) * share,
            )
            for name, share in (("lab-a", 0.5), ("lab-b", 1.0))
        ]


HOUR_OF_SUMMARIES = 60
"""An hour of one summary a minute, here test-accelerated to one every 0.1 s."""
NODE_DATA = re.compile(r'<script type="application/json" class="node-data">(.*?)</script>', re.S)


@asynccontextmanager
async def console_serving(site: Site, nc: Client, subjects: Subjects) -> AsyncIterator[str]:
    """A console started now (as after a restart: nothing in memory), once it has read the
    nodes' history; its URL."""
    console = Console(
        engine=site.console.engine, nc=nc, subjects=subjects, data_dir=site.console.data_dir
    )
    async with Background("console_serving") as background:
        following = background.spawn(console.nodes.follow(nc, subjects), name="nodes.follow")
        server, serving, url = await serve_console(console)
        try:

            async def history_read() -> bool:
                assert not following.done(), "following the nodes stopped"
                return console.nodes.history_read

            await wait_for(history_read, timeout=20, what="the console to read the nodes' hour")
            yield url
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, timeout=10)
        # leaving Background cancels following and raises what it failed with, if it did


async def nodes_page_data(url: str) -> dict[str, dict[str, list[float]]]:
    """Each node's chart data on the nodes page, as the server sent it."""
    status, html = await get(f"{url}/nodes")
    assert status == 200
    names = re.findall(r'<h2 id="node-\d+">([^<]+)</h2>', html)
    charts = [json.loads(text) for text in NODE_DATA.findall(html)]
    return dict(zip(names, charts, strict=True))


async def test_the_nodes_page_shows_the_real_last_hour_whenever_the_console_started(
    site: Site, nc: Client, subjects: Subjects
) -> None:
    """The metrics service (real, test-accelerated: a summary every 0.1 s) summarises an hour's
    worth of its samples before any console runs; a console started then draws each node's
    hour from them, mean and peak of each, then the node's latest report; a restarted one (or
    a second replica) draws the very same."""
    js = nc.jetstream()
    settings = MetricsSettings(
        interval_s=0.02, summary_interval_s=0.1, http_port=0, http_host="127.0.0.1"
    )
    metrics = MetricsService(js=js, subjects=subjects, backend=SwingingNodes(), settings=settings)
    try:
        async with running(metrics.run()) as serving:

            async def an_hour_summarised() -> bool:
                assert not serving.done(), "the metrics service stopped"
                info = await js.stream_info(subjects.node_summaries_stream)
                return info.state.messages >= 2 * HOUR_OF_SUMMARIES

            await wait_for(an_hour_summarised, timeout=60, what="an hour of summaries per node")
    finally:
        await metrics.close()

    summaries: dict[str, list[pb.NodeLoadSummary]] = defaultdict(list)
    for event in await read_all(js, subjects.node_summary()):
        summaries[event.node_summary.node].append(event.node_summary)
    latest = {
        event.node_load.node: event.time.ToMilliseconds() / 1000
        for event in await read_all(js, subjects.node_load())
    }
    expected: dict[str, dict[str, list[float]]] = {}
    for node, of_node in summaries.items():
        assert len(of_node) >= HOUR_OF_SUMMARIES
        assert any(s.cpu_load_max > s.cpu_load_mean for s in of_node), "the loads swing"
        ends = [s.end.ToMilliseconds() / 1000 for s in of_node]
        assert ends == sorted(ends)
        last = [latest[node]] if latest[node] > ends[-1] else []
        expected[node] = {
            "t": ends + last,
            "cpu": [s.cpu_load_mean for s in of_node],
            "cpu_max": [s.cpu_load_max for s in of_node],
            "memory": [s.memory_load_mean for s in of_node],
            "memory_max": [s.memory_load_max for s in of_node],
        }
    assert set(expected) == {"lab-a", "lab-b"}

    shown = []
    for _start in ("started after the hour", "restarted"):
        async with console_serving(site, nc, subjects) as url:
            data = await nodes_page_data(url)
        shown.append(data)
        for node, chart in expected.items():
            assert data[node]["t"] == chart["t"], node
            for series in ("cpu", "cpu_max", "memory", "memory_max"):
                # the summaries, then the latest report's load (when it is newer)
                assert data[node][series][: len(chart[series])] == chart[series], (node, series)
                assert len(data[node][series]) == len(chart["t"])
    assert shown[0] == shown[1]


async def _sse_events(
    response: aiohttp.ClientResponse, kinds: set[str], count: int
) -> list[dict[str, object]]:
    """The data of the next ``count`` events of ``kinds`` on an event stream."""
    found: list[dict[str, object]] = []
    kind = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            kind = line.partition(":")[2].strip()
        elif line.startswith("data:") and kind in kinds:
            found.append({"kind": kind, **json.loads(line.partition(":")[2])})
            if len(found) >= count:
                return found
    return found


async def test_live_progress_arrives_once_and_in_order(site: Site) -> None:
    history = site.retried
    job = history.job_id
    url = f"{site.url}/jobs/{job}/live?attempt=2&step=1000"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        # the stream replays what the page already has, and none of it is sent again
        await asyncio.wait_for(_sse_events(response, {"ready"}, 1), timeout=10)
        history.clock += timedelta(seconds=1)
        await site.publisher.publish(history.progress(2, 1100))
        await site.publisher.publish(history.progress(2, 900))  # older: not drawn again
        await site.publisher.publish(history.progress(2, 1200))
        events = await asyncio.wait_for(_sse_events(response, {"progress"}, 2), timeout=10)
    steps = [int(event["progress"]["step"]) for event in events]  # type: ignore[index]
    assert steps == [1100, 1200]
    assert {event["job_id"] for event in events} == {job}


async def _sse_until(
    response: aiohttp.ClientResponse, kind: str, found: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The data of the first ``kind`` event on an event stream that ``found`` accepts."""
    current = ""
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            current = line.partition(":")[2].strip()
        elif line.startswith("data:") and current == kind:
            data: dict[str, Any] = json.loads(line.partition(":")[2])
            if found(data):
                return data
    raise AssertionError(f"the stream ended before a matching {kind}")


async def test_live_lifecycle_events_reach_the_page_even_between_history_and_stream(
    site: Site,
) -> None:
    history = site.doomed
    folded_at = datetime.now(UTC)  # the page's state is as of here
    # published after the history the page shows, before the page asks for the live stream
    await site.publisher.publish(history.requeued(2, resume_step=0, steps_lost=40))
    since = quote(folded_at.isoformat())
    url = f"{site.url}/jobs/{history.job_id}/live?attempt=1&step=40&events_since={since}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        missed = await asyncio.wait_for(
            _sse_until(response, "event", lambda e: "requeued" in e), timeout=10
        )
        assert missed["attempt"] == 2
        await site.publisher.publish(history.bound(2, "n2"))  # and what happens from now on
        live = await asyncio.wait_for(
            _sse_until(response, "event", lambda e: "bound" in e and e["attempt"] == 2),
            timeout=10,
        )
    assert live["bound"]["node"] == "n2"


async def test_the_submit_page_refuses_a_bad_file_naming_the_field(site: Site) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{site.url}/submit") as response:
            page = await response.text()
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token is not None
        bad = "jobs:\n  - name: x\n    steps: many\n"
        form = {"token": token.group(1), "text": bad}
        async with session.post(f"{site.url}/submit", data=form) as response:
            html = await response.text()
            assert response.status == 400
        assert re.search(r'id="refusal-field">jobs\[0\]\.steps<', html), html
        async with session.post(
            f"{site.url}/submit", data={"token": "guess", "text": bad}
        ) as response:
            assert response.status == 400
            assert 'id="error-field">token<' in await response.text()
        async with session.post(
            f"{site.url}/submit", data=form, headers={"Origin": "http://evil.example"}
        ) as response:
            assert response.status == 400
            assert 'id="error-field">origin<' in await response.text()


async def test_pages_forbid_foreign_scripts_and_framing(site: Site) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{site.url}/jobs") as response:
        policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy


async def test_static_assets_ship_inside_the_package(site: Site) -> None:
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "console.js", "console.css"):
        status, body = await get(f"{site.url}/static/{name}")
        assert status == 200 and len(body) > 100, name


TOKEN = "t0ken-" + "x" * 40


@pytest.fixture
async def gated(site: Site) -> AsyncIterator[str]:
    """The same console behind its access token, as ``mdq up`` serves it."""
    server, serving, url = await serve_console(site.console, access_token=TOKEN)
    try:
        yield url
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)


@pytest.mark.parametrize(
    "path",
    ["/", "/jobs", "/jobs?state=FAILED", "/nodes", "/submit", "/static/console.js"],
)
async def test_without_its_token_the_console_shows_only_how_to_get_the_link(
    gated: str, site: Site, path: str
) -> None:
    """Loopback is every account's on a shared machine: without the link nothing of the jobs
    shows (nor a file, nor the submit form); a wrong token is no better."""
    for url in (f"{gated}{path}", f"{gated}{path}{'&' if '?' in path else '?'}token=wrong"):
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 401, url
            body = await response.text()
        assert "needs its access link" in body and "mdq console" in body
        assert site.retried.job_id not in body and "<form" not in body


async def test_the_link_opens_a_session_and_drops_the_token_from_the_address(gated: str) -> None:
    # a browser keeps cookies of 127.0.0.1; aiohttp only when told to
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        async with session.get(
            f"{gated}/jobs?state=FAILED&token={TOKEN}", allow_redirects=False
        ) as response:
            assert response.status == 303
            assert response.headers["Location"] == "/jobs?state=FAILED"
            cookie = response.headers["Set-Cookie"]
        assert TOKEN not in cookie, "the cookie holds an HMAC of the token, not the token"
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        async with session.get(f"{gated}/jobs?state=FAILED") as response:
            assert response.status == 200  # the session cookie
            assert "doomed" in await response.text()
        async with session.get(f"{gated}/jobs/{'x' * 3}/live") as response:
            assert response.status != 401  # live streams too (a 400/404 of its own here)


async def test_a_script_may_bring_the_token_as_a_bearer_and_health_needs_none(
    gated: str,
) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with session.get(f"{gated}/jobs", headers=headers) as response:
            assert response.status == 200
        async with session.get(f"{gated}/jobs", headers={"Authorization": "Bearer no"}) as r:
            assert r.status == 401
        async with session.get(f"{gated}/healthz") as response:
            assert response.status == 200  # the liveness probe says nothing of the jobs


async def test_what_anyone_makes_the_console_log_keeps_to_the_budget(site: Site) -> None:
    """Three hundred connections that send no HTTP: uvicorn says so for each, and its lines go
    to the handlers of the process's root logger, where every service keeps its log (not to
    handlers of uvicorn's own beside them), so the budget every service's log keeps
    (``mdq.bus.runtime.configure_logging``) holds them to a burst and a few a second."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    kept = Keep(logging.WARNING)
    kept.addFilter(LineBudgetFilter())
    root = logging.getLogger()
    root.addHandler(kept)
    host, port = site.url.removeprefix("http://").split(":")
    started = time.monotonic()
    try:
        for _ in range(300):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the server closes it
            writer.close()
            await writer.wait_closed()
    finally:
        root.removeHandler(kept)
    elapsed = time.monotonic() - started
    invalid = [line for line in said if "Invalid HTTP request" in line]
    assert invalid, "uvicorn's lines reach the root logger's handlers"
    assert len(invalid) <= 50 + 5 * elapsed + 1, (len(invalid), elapsed)
