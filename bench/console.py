"""The web console at a year's size: ``make bench-console``.

A real console serves bench-history's synthetic year from a fresh PostgreSQL; the bench times
the jobs list, a job page and a campaign page against bare asyncpg reads, and the live chart's
latency in headless Chromium against a bare subscriber. Method, keys and runs:
docs/benchmarks.md, "make bench-console".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import asyncpg
import nats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history_pg import JOBS_PER_CAMPAIGN, load, p99, quantile  # noqa: E402

from mdq.bus.publisher import EventPublisher  # noqa: E402
from mdq.bus.subjects import Subjects  # noqa: E402
from mdq.contracts import pb  # noqa: E402
from mdq.embedded import free_port, start_nats, start_postgres  # noqa: E402
from mdq.store.engine import asyncpg_dsn  # noqa: E402
from mdq.store.roles import set_up_new_roles  # noqa: E402
from mdq.testing.browser import MISSING, chromium_paths, headless_chromium  # noqa: E402
from services.console.filters import Cursor  # noqa: E402

OBSERVER = """
window.benchDrawn = [];
(function () {
  let real = undefined;
  function wrapped(options, data, target) {
    options.hooks = options.hooks || {};
    options.hooks.draw = (options.hooks.draw || []).concat([function (chart) {
      const xs = chart.data[0] || [];
      window.benchDrawn.push([
        (target && target.id) || '?',
        xs.length ? xs[xs.length - 1] : -1,
        performance.timeOrigin + performance.now(),
      ]);
    }]);
    return new real(options, data, target);
  }
  Object.defineProperty(window, 'uPlot', {
    configurable: true,
    get() { return real === undefined ? undefined : wrapped; },
    set(value) {
      real = value;
      Object.assign(wrapped, value);
      wrapped.prototype = value.prototype;
    },
  });
})();
"""
"""Installed by the bench before the job page's scripts run: every chart the page makes gets a
``draw`` hook noting (chart, last step of the data it painted, the browser's clock in ms)."""
LIVE_RATE = 10.0
"""Progress events per second on the live job (a runner reports far less often)."""


async def timed(runs: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    """Milliseconds of each of ``runs`` calls, after two untimed ones."""
    for _ in range(2):
        await call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return times


async def fetch_ok(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        body = await response.text()
        if response.status != 200:
            raise SystemExit(f"{url} answered {response.status}: {body[:300]}")
        return body


def start_console(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "services.console"],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, child: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"the console exited with {child.returncode}")
        try:
            async with session.get(f"{url}/healthz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("the console never answered /healthz")


async def live_latency(
    console_url: str, nats_url: str, job_id: str, events: int, folder: Path, token: str
) -> dict[str, Any]:
    """Bus → drawn point in the browser, against a bare subscriber on the same subject."""
    if chromium_paths() is None:
        return {"p99_live_ms": None, "live": f"skipped: {MISSING}"}
    driver = headless_chromium(folder / "chromium")
    await asyncio.to_thread(
        driver.execute_cdp_cmd, "Page.addScriptToEvaluateOnNewDocument", {"source": OBSERVER}
    )
    nc = await nats.connect(nats_url)
    try:
        # the access link, as a person opens it: the console keeps a session cookie
        link = f"{console_url}/jobs/{job_id}?{urlencode({'token': token})}"
        await asyncio.to_thread(driver.get, link)
        deadline = time.monotonic() + 30
        while "following" not in await asyncio.to_thread(
            lambda: driver.find_element("id", "live-status").text
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the job page never said it follows the job live")
            await asyncio.sleep(0.1)
        charts: list[str] = await asyncio.to_thread(
            driver.execute_script,
            "return [...new Set(window.benchDrawn.map(function (d) { return d[0]; }))];",
        )
        if len(charts) < 2:
            raise SystemExit(f"the bench's draw hook saw the charts {charts}: not observing")
        subjects = Subjects("mdq")
        seen: dict[int, float] = {}

        async def on_raw(message: Any) -> None:
            event = pb.Event()
            event.ParseFromString(message.data)
            seen[event.progress.step] = time.time() * 1000

        await nc.subscribe(subjects.progress(job_id), cb=on_raw)
        publisher = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="runner")
        sent: dict[int, float] = {}
        base_step = 10_000_000  # after every step the loaded history has
        for n in range(events):
            step = base_step + n
            event = publisher.event(
                "progress",
                pb.Progress(step=step, target_steps=base_step * 2, potential_kj_mol=-41000.0 - n),
                job_id=job_id,
                attempt=1,
                detail=step,
            )
            sent[step] = time.time() * 1000
            await publisher.publish(event)
            await asyncio.sleep(1 / LIVE_RATE)
        await asyncio.sleep(2.0)
        seen_drawn: list[list[Any]] = await asyncio.to_thread(
            driver.execute_script, "return window.benchDrawn;"
        )
    finally:
        await nc.drain()
        await asyncio.to_thread(driver.quit)
    latencies = []
    for step, at in sent.items():
        # drawn once every chart has painted data reaching its step
        firsts = [
            next((t for chart, last, t in seen_drawn if chart == name and last >= step), None)
            for name in charts
        ]
        if all(first is not None for first in firsts):
            latencies.append(max(first for first in firsts if first is not None) - at)
    raw = [seen[step] - at for step, at in sent.items() if step in seen]
    if len(latencies) < events or len(raw) < events:
        raise SystemExit(f"drawn {len(latencies)} and seen {len(raw)} of {events} live points")
    return {
        "live_events": events,
        "p50_live_ms": round(quantile(latencies, 0.5), 1),
        "p99_live_ms": round(p99(latencies), 1),
        "raw_subscriber_p99_ms": round(p99(raw), 2),
        "live_ratio_vs_raw": round(p99(latencies) / max(p99(raw), 0.01), 1),
        "live_charts_observed": len(charts),
        "live_measured": "publish time here to the last chart's uPlot draw hook reaching the "
        "step, in the browser (the bench's hook, installed before the page's scripts)",
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    def log(line: str) -> None:
        if args.verbose:
            print(line, file=sys.stderr, flush=True)

    folder = Path(tempfile.mkdtemp(prefix="mdq-bench-console-"))
    postgres = start_postgres(folder / "pg", database="mdq", keep=False)
    bus = start_nats(folder / "nats")
    child: subprocess.Popen[bytes] | None = None
    try:
        urls = await set_up_new_roles(postgres.url, "mdq")
        started = time.perf_counter()
        await load(postgres.url, args.jobs, args.progress, log)
        log(f"loaded in {time.perf_counter() - started:.0f} s")
        raw = await asyncpg.connect(asyncpg_dsn(urls.reader))
        jobs = int(await raw.fetchval("SELECT count(*) FROM jobs"))
        running = await raw.fetchval("SELECT job_id FROM jobs WHERE state = 'RUNNING' LIMIT 1")
        port = free_port()
        token = secrets.token_urlsafe(32)  # every request goes through the access gate
        token_file = folder / "console.token"
        token_file.write_text(token)
        env = os.environ | {
            "DATABASE_URL": urls.reader,
            "NATS_URL": bus.url,
            "MDQ_NAMESPACE": "mdq",
            "MDQ_DATA_DIR": str(folder / "data"),
            "MDQ_CONSOLE_PORT": str(port),
            "MDQ_CONSOLE_ACCESS_TOKEN_FILE": str(token_file),
            "PYTHONPATH": str(ROOT),
        }
        child = start_console(env, folder / "console.log")
        url = f"http://127.0.0.1:{port}"
        rng = random.Random(16)
        campaigns = max(1, args.jobs // JOBS_PER_CAMPAIGN)  # c0 … c<campaigns - 1>

        def some_job() -> str:
            return f"{rng.randint(1, args.jobs):012x}-md"

        cursors = []  # pages that start at random jobs of the year, made before the timing
        for _ in range(args.runs + 2):
            row = await raw.fetchrow(
                "SELECT submitted_at, job_id FROM jobs WHERE job_id = $1", some_job()
            )
            cursors.append(Cursor(row["submitted_at"], row["job_id"]).encode())
        deep = iter(cursors)

        results: dict[str, list[float]] = {}
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
            await wait_healthy(session, url, child)
            pages: dict[str, Callable[[], Awaitable[Any]]] = {
                "list newest": lambda: fetch_ok(session, f"{url}/jobs"),
                "list state": lambda: fetch_ok(session, f"{url}/jobs?state=FAILED"),
                "list deep page": lambda: fetch_ok(session, f"{url}/jobs?after={next(deep)}"),
                "list state+priority": lambda: fetch_ok(
                    session, f"{url}/jobs?state=SUCCEEDED&priority=low&size=100"
                ),
                "job": lambda: fetch_ok(session, f"{url}/jobs/{some_job()}"),
                "campaign": lambda: fetch_ok(
                    session, f"{url}/campaigns?label=campaign=c{rng.randrange(campaigns)}"
                ),
            }
            for name, call in pages.items():
                results[name] = await timed(args.runs, call)
                log(f"{name}: p99 {p99(results[name]):.1f} ms")
        baselines = {
            "list": await timed(
                args.runs,
                lambda: raw.fetch(
                    "SELECT * FROM jobs ORDER BY submitted_at DESC, job_id DESC LIMIT 26"
                ),
            ),
            "job": await timed(
                args.runs, lambda: raw.fetchrow("SELECT * FROM jobs WHERE job_id = $1", some_job())
            ),
            "campaign": await timed(
                args.runs,
                lambda: raw.fetch(
                    "WITH matched AS MATERIALIZED (SELECT job_id, submitted_at FROM jobs "
                    "WHERE spec->'labels' @> $1::jsonb) "
                    "SELECT job_id FROM matched ORDER BY submitted_at DESC LIMIT 200",
                    json.dumps({"campaign": f"c{rng.randrange(campaigns)}"}),
                ),
            ),
        }
        await raw.close()
        live = await live_latency(url, bus.url, running, args.live_events, folder, token)
    finally:
        if child is not None:
            child.terminate()
            child.wait(timeout=10)
        bus.stop()
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)
    lists = [name for name in results if name.startswith("list")]
    p99_list = max(p99(results[name]) for name in lists)
    summary: dict[str, Any] = {
        "bench": "console",
        "history_jobs": jobs,
        "runs": args.runs,
        "p99_ms": {name: round(p99(times), 2) for name, times in results.items()},
        "p50_ms": {name: round(quantile(times, 0.5), 2) for name, times in results.items()},
        "p99_list_ms": round(p99_list, 2),
        "p99_job_ms": round(p99(results["job"]), 2),
        "p99_campaign_ms": round(p99(results["campaign"]), 2),
        "raw_p99_ms": {name: round(p99(times), 3) for name, times in baselines.items()},
        "list_ratio_vs_raw": round(p99_list / p99(baselines["list"]), 1),
        "job_ratio_vs_raw": round(p99(results["job"]) / p99(baselines["job"]), 1),
        "campaign_ratio_vs_raw": round(p99(results["campaign"]) / p99(baselines["campaign"]), 1),
        **live,
        "goal_p99_page_ms": 100,
        "goal_p99_live_ms": 500,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_avg": [round(value, 2) for value in os.getloadavg()],
    }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--history-jobs",
        "--jobs",
        dest="jobs",
        type=int,
        default=1_000_000,
        help="jobs of the synthetic history (1,000,000; a big site's year: 10,000,000)",
    )
    parser.add_argument(
        "--progress", type=int, default=None, help="progress rows (default: 5 per job)"
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--live-events", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="100,000 jobs, 500,000 rows")
    parser.add_argument("--verbose", action="store_true", help="say what it does on stderr")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.progress, args.runs, args.live_events = 100_000, 500_000, 50, 30
    if args.progress is None:
        args.progress = 5 * args.jobs
    print(json.dumps(asyncio.run(measure(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
