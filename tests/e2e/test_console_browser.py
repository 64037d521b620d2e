"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against the whole stack (every service, the local
backend, real OpenMM). A person submits from the page, watches the chart gain points while
the job runs, opens the placement explanation, and follows the job into its second attempt
after its runner is killed. Screenshots of every page go to ``MDQ_TEST_ARTIFACTS`` (default
``test-artifacts/``) under ``console/``.

Skipped, saying what to install, where Chromium or its driver is missing (``.ci/run`` installs
both)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mdq.contracts import pb
from mdq.sdk.client import IntakeUnavailable, SubmitRefused
from mdq.stack import Stack
from mdq.testing.browser import MISSING, chromium_paths, headless_chromium
from services.console.simulate import CHART_HEIGHT
from tests.e2e.stacks import operator_client
from tools.processes import runner_pid

pytestmark = pytest.mark.e2e

if chromium_paths() is None:
    pytest.skip(MISSING, allow_module_level=True)

from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("MDQ_TEST_ARTIFACTS") or REPO / "test-artifacts") / "console"

JOB_FILE = """\
# a small water box, long enough to be watched and killed once
idempotency_key: browser-{key}
jobs:
  - name: watched
    task: TASK_MD
    system: {{water_box: {{box_nm: 1.6}}}}
    temperature_k: 300
    steps: 4000
    report_interval_steps: 100
    checkpoint_interval_steps: 500
    resources: {{cpu: 1, memory_mb: 1024}}
    labels: {{campaign: browser}}
  - name: summary
    task: TASK_ANALYZE
    depends_on: [watched]
    resources: {{cpu: 0.5, memory_mb: 512}}
"""

STATUS_WATCH = """
window.mdqStatuses = [];
var line = document.getElementById('live-status');
new MutationObserver(function () { window.mdqStatuses.push(line.textContent); })
  .observe(line, {childList: true, characterData: true, subtree: true});
"""
"""Records every text the job page's status line shows (read back at the end)."""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    driver = headless_chromium(tmp_path / "chromium")
    try:
        yield driver
    finally:
        driver.quit()


def shoot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


async def until(check: Callable[[], T | None], *, timeout: float, what: str) -> T:
    """Poll ``check`` (blocking browser calls, in a thread) until it returns a value."""
    deadline = time.monotonic() + timeout
    while True:
        found = await asyncio.to_thread(check)
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


async def open_submit_page(browser: WebDriver, stack: Stack) -> None:
    """Open the submit page by the link ``mdq up`` prints (its access token: the console keeps
    a session cookie, so the other pages open by their plain address), once the console
    listens (the stack starts it in the background)."""

    def opened() -> bool:
        try:
            browser.get(stack.info.console_link("submit"))
        except WebDriverException:  # not listening yet
            return False
        return bool(browser.find_elements(By.ID, "text"))

    await until(opened, timeout=60, what="the console's submit page")


@pytest.mark.expected_crashes({"console": 1})
async def test_a_person_submits_watches_and_follows_a_retried_job(
    stack: Stack, browser: WebDriver, namespace: str
) -> None:
    console = stack.info.console_url.rstrip("/")
    assert console, "mdq up starts the console"

    await open_submit_page(browser, stack)
    # Keyboard first: the first Tab reaches the skip link.
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Skip to content"
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys(JOB_FILE.format(key=namespace))
    shoot(browser, "submit")

    def accepted() -> str | None:
        browser.find_element(By.ID, "submit-button").click()
        try:
            links = browser.find_elements(By.CSS_SELECTOR, "#accepted a")
            refusal = browser.find_elements(By.ID, "refusal")
            if refusal and "intake" not in refusal[0].text.lower():
                raise AssertionError(f"refused: {refusal[0].text}")
            return links[0].text if links else None
        except StaleElementReferenceException:
            return None  # the answer replaced what was read: the next look reads it

    job_id = await until(accepted, timeout=60, what="intake to accept the submit")
    browser.find_element(By.CSS_SELECTOR, "#accepted a").click()
    # Until the watcher has projected the submit, the page says so and looks again by itself.
    shown = await until(
        lambda: [e.text for e in browser.find_elements(By.ID, "job-id")],
        timeout=60,
        what="the job page (once the job is in the history)",
    )
    assert shown == [job_id]
    browser.execute_script(STATUS_WATCH)
    # The spec as submitted, numbers as numbers (the JSON mapping writes int64 as strings).
    spec = browser.find_element(By.ID, "spec").text
    assert '"steps": 4000' in spec and '"steps": "4000"' not in spec, spec
    # The temperature chart draws the thermostat's temperature beside the attempts' lines.

    def temperature_series() -> list[str] | None:
        series = browser.find_element(By.ID, "chart-temperature").get_attribute("data-series")
        return json.loads(series) if series else None

    def points() -> int:
        return int(browser.find_element(By.ID, "charts").get_attribute("data-points") or 0)

    # The chart gains points while the job runs, without a reload.
    first = await until(lambda: points() or None, timeout=120, what="a first point on the chart")
    page = browser.current_url
    await until(lambda: points() >= first + 3 or None, timeout=60, what="the chart to grow")
    assert browser.current_url == page
    assert browser.find_element(By.ID, "job-state").text == "RUNNING"
    # The caption and the chart move together: one script reads both, so no event can land
    # between the two reads (the page updates them in one handler).
    caption, charted = browser.execute_script(
        "return [document.getElementById('point-count').textContent,"
        " document.getElementById('charts').getAttribute('data-points')];"
    )
    assert int(caption) == int(charted)
    assert "thermostat 300 K" in (temperature_series() or []), temperature_series()
    shoot(browser, "job-running")

    # Once a checkpoint is written, the runner dies; the page follows the second attempt.
    def checkpointed() -> bool:
        return points() * 100 > 600  # past the first checkpoint at step 500

    await until(checkpointed, timeout=120, what="the job to pass its first checkpoint")
    pid = runner_pid(job_id, stack.namespace)
    assert pid is not None, "the job's runner"
    os.kill(pid, signal.SIGKILL)
    await until(
        lambda: browser.find_element(By.ID, "job-attempt").text == "2" or None,
        timeout=120,
        what="the page to show attempt 2 live",
    )
    # The status line said what happened in words, never an event's internal name.
    statuses: list[str] = browser.execute_script("return window.mdqStatuses;")
    assert any(s == "live: attempt 1, this attempt failed: its runner crashed" for s in statuses), (
        statuses
    )
    for status in statuses:
        assert "_" not in status and not re.fullmatch(r"live: \w+ \(attempt \d+\)", status), (
            statuses
        )
    # The speed is the last interval's (simulated time over wall time between the last two
    # reports), not the runner's average since the attempt started.
    await assert_speed_is_the_last_intervals(browser, f"{console}/jobs/{job_id}")

    def second_attempt_row() -> str | None:
        browser.get(f"{console}/jobs/{job_id}")
        rows = browser.find_elements(By.ID, "attempt-2")
        return rows[0].find_element(By.CLASS_NAME, "resumed").text if rows else None

    resumed = await until(second_attempt_row, timeout=60, what="attempt 2 in the history")
    assert int(resumed) >= 500, "the second attempt resumed from a checkpoint, not from 0"
    failed = browser.find_element(By.ID, "attempt-1").text
    assert "FAILURE_CRASHED" in failed

    # The explanation: every node's score, the chosen one marked.
    details = browser.find_element(By.ID, "explain-1")
    details.find_element(By.TAG_NAME, "summary").click()
    table = details.find_element(By.TAG_NAME, "table")
    assert table.is_displayed()
    assert "chosen" in table.text and re.search(r"local-\d", table.text)
    shoot(browser, "job-retried")

    browser.get(f"{console}/jobs?label=campaign=browser")
    assert job_id in browser.page_source
    shoot(browser, "jobs")
    browser.get(f"{console}/campaigns?label=campaign=browser")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-campaign canvas")
    shoot(browser, "campaign")
    # Each node's chart: its summaries (one every 10 s here), then its latest report.
    before = await until(
        lambda: node_charts(browser, console, at_least=3),
        timeout=60,
        what="every node's chart with its recent summaries",
    )
    assert {"local-1", "local-2"} <= set(before)
    shoot(browser, "nodes")
    # A console restarted (a rollout, a crash) draws the same past, not one that starts now.
    killed = stack.child_pid("console")
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    await until(
        lambda: stack.child_pid("console") not in (None, killed) or None,
        timeout=30,
        what="the console to be started again",
    )
    after = await until(
        lambda: node_charts(browser, console, at_least=2),
        timeout=60,
        what="the restarted console's charts",
    )
    for node, (_, earliest) in before.items():
        # as far back as before: the restarted console read the past from the stream
        assert after[node][1] <= earliest, (node, before[node], after[node])
    # Each node chart's time axis: times of day, never two ticks alike, none crowded.
    for chart in browser.find_elements(By.CSS_SELECTOR, ".node-chart"):
        ticks = json.loads(chart.get_attribute("data-ticks") or "[]")
        width = int(chart.get_attribute("clientWidth") or 0)
        assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", tick) for tick in ticks), ticks
        assert len(set(ticks)) == len(ticks) and len(ticks) <= width // 90 + 1, (ticks, width)

    # The analysis (after the MD job) has no speed: nothing in the list, no chart of it.
    summary_id = job_id.rsplit("-", 1)[0] + "-summary"

    def summary_done() -> bool:
        browser.get(f"{console}/jobs/{summary_id}")
        states = browser.find_elements(By.ID, "job-state")
        return bool(states) and states[0].text == "SUCCEEDED"

    await until(summary_done, timeout=300, what="the analysis to succeed")
    assert browser.find_element(By.ID, "no-speed").is_displayed()
    # A node's name is never broken over two lines, even in a narrow window.
    browser.set_window_size(900, 1600)
    browser.get(f"{console}/jobs")
    lines = browser.execute_script(NODE_LINES)
    assert len(lines) >= 2 and set(lines) == {1}, lines
    shoot(browser, "jobs-narrow")
    browser.set_window_size(1300, 1600)
    browser.get(f"{console}/jobs")
    speeds = {
        row.get_attribute("data-job"): row.find_element(By.CLASS_NAME, "speed").text
        for row in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")
    }
    assert speeds[summary_id] == "" and float(speeds[job_id]) > 0, speeds
    shoot(browser, "jobs-with-analysis")


NODE_LINES = """
return Array.from(document.querySelectorAll('#jobs td.node span'))
  .filter(function (span) { return span.textContent.trim(); })
  .map(function (span) {
    var range = document.createRange();
    range.selectNodeContents(span);
    return new Set(Array.from(range.getClientRects()).map(function (r) { return r.top; })).size;
  });
"""
"""How many lines each node name in the jobs list takes."""


async def assert_speed_is_the_last_intervals(browser: WebDriver, page: str) -> None:
    """The speed chart's newest point, against the page's own progress reports: the
    simulated time between the newest two of the newest attempt over the wall time between
    them (once that attempt has two reports)."""

    def seconds(point: dict[str, Any]) -> float:
        """The report's time to the millisecond, as the page reads it."""
        at = datetime.fromisoformat(str(point["time"]).replace("Z", "+00:00"))
        return at.replace(microsecond=at.microsecond // 1000 * 1000).timestamp()

    def compared() -> tuple[float, float] | None:
        browser.get(page)
        # one script, so no live event is drawn between the reads: the page's reports, the
        # speed chart's newest point and the step that point is of
        script, shown, shown_step = browser.execute_script(
            "return [document.getElementById('job-data').textContent,"
            " document.getElementById('chart-speed').getAttribute('data-last'),"
            " document.getElementById('charts').getAttribute('data-last-step')];"
        )
        points = json.loads(script or "{}")["points"]
        newest = max(int(point.get("attempt", 0)) for point in points)
        reports = [point for point in points if int(point.get("attempt", 0)) == newest]
        if len(reports) < 2:
            return None
        before, last = reports[-2]["progress"], reports[-1]["progress"]
        if str(last.get("step", 0)) != shown_step:
            return None  # the live stream drew a newer report than the page came with
        simulated_ns = (last["time_ps"] - before["time_ps"]) / 1000
        elapsed_days = (seconds(reports[-1]) - seconds(reports[-2])) / 86_400
        return float(shown or "nan"), simulated_ns / elapsed_days

    shown, expected = await until(
        compared, timeout=60, what="two reports of the newest attempt, the last one drawn"
    )
    # both from the same whole milliseconds; the difference of two epoch times as doubles
    # (about 2e-7 s apart near 1.7e9 s) over an interval of a fraction of a second: 1e-5
    assert shown == pytest.approx(expected, rel=1e-5), (shown, expected)


def node_charts(
    browser: WebDriver, console: str, *, at_least: int
) -> dict[str, tuple[int, float]] | None:
    """Each node's number of points on the nodes page and the time of its first, once every
    node has a drawn chart of ``at_least`` points and the console has read the nodes' past;
    None until then."""
    try:
        browser.get(f"{console}/nodes")
    except WebDriverException:  # the console is not listening (yet, or again)
        return None
    if browser.find_elements(By.ID, "history-reading"):
        return None
    charts = browser.find_elements(By.CSS_SELECTOR, ".node-chart")
    drawn = browser.find_elements(By.CSS_SELECTOR, ".node-chart canvas")
    points = {
        (chart.get_attribute("aria-label") or "").split(" ")[2]: (
            int(chart.get_attribute("data-points") or 0),
            float(chart.get_attribute("data-first") or "inf"),
        )
        for chart in charts
    }
    if len(charts) < 2 or len(drawn) != len(charts):
        return None
    return points if min(count for count, _ in points.values()) >= at_least else None


async def intake_answers(stack: Stack) -> None:
    """Until intake answers a submit (here a refused one): the stack starts it in the
    background, and until then the page can only say that intake is unavailable."""
    async with await operator_client(stack) as client:
        empty = pb.SubmitRequest(idempotency_key="intake-ready")
        for _ in range(120):
            try:
                await client.submit(empty, timeout=5)
            except SubmitRefused:
                return
            except IntakeUnavailable:
                await asyncio.sleep(0.5)
        raise AssertionError("intake never answered")


async def test_a_refusal_on_the_page_names_the_field_as_the_cli_does(
    stack: Stack, browser: WebDriver
) -> None:
    await intake_answers(stack)
    await open_submit_page(browser, stack)
    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys("jobs:\n  - name: x\n    resources: {cpu: -1}\n")
    browser.find_element(By.ID, "submit-button").click()

    def refusal() -> tuple[str, str] | None:
        field = browser.find_elements(By.ID, "refusal-field")
        message = browser.find_elements(By.ID, "refusal-message")
        return (field[0].text, message[0].text) if field and message else None

    field, message = await until(refusal, timeout=60, what="the refusal")
    assert field == "jobs[0].resources.cpu" and message
    shoot(browser, "submit-refused")
    # Another account on this machine, without the link: the way to get it, and nothing else.
    browser.delete_all_cookies()
    browser.get(f"{stack.info.console_url.rstrip('/')}/jobs")
    assert "needs its access link" in browser.page_source
    assert not browser.find_elements(By.TAG_NAME, "table")
    shoot(browser, "access-link-needed")


async def test_a_person_compares_scheduler_configurations_on_the_simulation_page(
    stack: Stack, browser: WebDriver
) -> None:
    await open_submit_page(browser, stack)
    browser.find_element(By.LINK_TEXT, "Simulate").click()
    for box in browser.find_elements(By.CSS_SELECTOR, "input[name=config]"):
        if box.get_attribute("value") not in ("fifo", "load-aware", "fair-share") and (
            box.is_selected()
        ):
            box.click()  # untick: three configurations stay
    for name, value in (("nodes", "3"), ("jobs", "400"), ("seed", "7")):
        field = browser.find_element(By.ID, name)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.ID, "simulate-button").click()

    def drawn() -> list[Any] | None:
        charts = browser.find_elements(By.CSS_SELECTOR, "figure.sim-chart")
        return charts or None

    charts = await until(drawn, timeout=120, what="the simulation's charts")
    shoot(browser, "simulate")
    line = json.loads(browser.find_element(By.ID, "sim-line").get_attribute("textContent") or "")
    names = [figures["config"] for figures in line["configs"]]
    assert names == ["fifo", "load-aware", "fair-share"]
    assert line["workload"]["jobs"] == 400 and line["workload"]["nodes"] == 3
    assert len(charts) == 10
    makespan = next(chart for chart in charts if chart.get_attribute("data-metric") == "makespan_s")
    bars = makespan.find_elements(By.CSS_SELECTOR, "g.bar")
    assert [bar.get_attribute("data-config") for bar in bars] == names
    # each bar is drawn as tall as its figure, against the longest makespan's full height
    heights = [bar.find_element(By.TAG_NAME, "rect").rect["height"] for bar in bars]
    makespans = [figures["makespan_s"] for figures in line["configs"]]
    assert len(set(makespans)) > 1  # fair share ends this workload sooner
    for height, makespan in zip(heights, makespans, strict=True):
        assert height == pytest.approx(CHART_HEIGHT * makespan / max(makespans), abs=1.5)
    for bar, figures in zip(bars, line["configs"], strict=True):
        title = bar.find_element(By.TAG_NAME, "title").get_attribute("textContent") or ""
        assert title.startswith(f"{figures['config']}: ")
    # the command the page names is the one a shell runs for the same line
    command = browser.find_element(By.ID, "sim-command").text
    assert command.startswith("mdq simulate -c fifo -c load-aware -c fair-share --nodes 3 ")
