"""A runner whose reports are far apart still shows it is alive, in between.

A large system may take minutes between two reports of its report interval; the watcher counts a
run silent from its last report. The runner times its chunks (``MDQ_RUNNER_CHUNK_S``) and, when
``MDQ_RUNNER_ALIVE_REPORT_S`` has passed since its last report, reports where it is.
"""

from __future__ import annotations

from mdq.core.exit_codes import RunnerExit
from tests.integration.test_runner import (  # noqa: F401 (fixtures)
    StartJob,
    md_spec,
    start_job,
    start_runner,
)


async def test_reports_far_apart_get_reports_between_them_as_signs_of_life(
    start_job: StartJob,  # noqa: F811
) -> None:
    steps = 3_000
    spec = md_spec("md", steps=steps, report_interval_steps=steps, checkpoint_interval_steps=steps)
    task, events, runner = await start_job(
        "job-alive", spec, MDQ_RUNNER_ALIVE_REPORT_S="0.3", MDQ_RUNNER_CHUNK_S="0.05"
    )
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    reached = [report.step for report in progress]
    assert reached[-1] == steps and progress[-1].done_reason == "steps_reached"
    assert len(reached) >= 3, reached  # reports between the interval's two ends
    assert reached == sorted(set(reached)), reached
    assert all(0 < step < steps for step in reached[:-1]), reached
    assert not any(report.done_reason for report in progress[:-1])
    assert all(report.potential_kj_mol < 0 < report.kinetic_kj_mol for report in progress)
    rows = (task.job_dir / "energies.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in rows] == reached
