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
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from mdq.contracts import pb
from mdq.sdk.client import IntakeUnavailable, MdqClient, SubmitRefused
from mdq.stack import Stack
from mdq.testing.browser import MISSING, chromium_paths, headless_chromium
from mdq.testing.processes import runner_pid

pytestmark = pytest.mark.e2e

if chromium_paths() is None:
    pytest.skip(MISSING, allow_module_level=True)

from selenium.common.exceptions import WebDriverException  # noqa: E402
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
"""


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
        links = browser.find_elements(By.CSS_SELECTOR, "#accepted a")
        refusal = browser.find_elements(By.ID, "refusal")
        if refusal and "intake" not in refusal[0].text.lower():
            raise AssertionError(f"refused: {refusal[0].text}")
        return links[0].text if links else None

    job_id = await until(accepted, timeout=60, what="intake to accept the submit")
    browser.find_element(By.CSS_SELECTOR, "#accepted a").click()
    # Until the watcher has projected the submit, the page says so and looks again by itself.
    shown = await until(
        lambda: [e.text for e in browser.find_elements(By.ID, "job-id")],
        timeout=60,
        what="the job page (once the job is in the history)",
    )
    assert shown == [job_id]

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
    async with await MdqClient.connect(
        stack.info.nats_url, stack.namespace, creds=stack.info.nats_creds
    ) as client:
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
