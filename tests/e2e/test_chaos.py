"""The short chaos campaign (``make chaos`` in small): a few MD jobs (half OpenMM, half LAMMPS,
whose scripts are uploaded as ``mdq submit`` does) on the embedded stack while
every kind of fault hits once — kill -9 of intake, placement, watcher, recovery, metrics, the
node agent and a runner, NATS and PostgreSQL killed and restarted, the data disk filled and
freed, a running job cancelled, and the strikes at the worst moments (a pod starting, a
checkpoint being written, a placement snapshot being written, a job waiting out its backoff) —
and every job still ends SUCCEEDED exactly once, at its exact final step (the cancelled one
CANCELLED, or SUCCEEDED if it got there first, with no runner left), with no two runners of one
job alive at once, at most one checkpoint interval of MD lost per retry, and a projection
rebuilt from the log equal to the live one (``tools.chaos``)."""

from __future__ import annotations

import json
import os

import pytest

from tools.chaos import (
    PROCESS_KINDS,
    SHORT_KINDS,
    STRIKE_KINDS,
    ChaosConfig,
    run_campaign,
)

pytestmark = pytest.mark.e2e

SHORT = ChaosConfig(
    jobs=4,
    kinds=(*SHORT_KINDS, *STRIKE_KINDS),  # the long episodes are make chaos's, not make test's
    seed=20261201,
    steps=24000,  # long enough for the whole schedule, strikes waiting for their moments included
    checkpoint_interval_steps=500,
    report_interval_steps=100,
    faults_per_kind=1,
    pause_s=(0.5, 1.2),
    outage_s=(1.0, 1.5),
    disk_full_s=(1.0, 2.0),
    disk_mb=64,
    # About a minute on a quiet 2-core machine; the deadline only stops a campaign that hangs.
    deadline_s=240.0,  # inside pytest-timeout's 300 s, with room to clean up
    check_reserve_s=60.0,
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the data disk is a loop mount: needs root")
async def test_every_job_survives_one_of_every_fault() -> None:
    # Its servers live in a folder of its own under /tmp, not under pytest's temporary root
    # (which a new pytest session resets to mode 0700, cutting pgserver's server off from its
    # data); a failed campaign keeps that folder and names it in the report.
    report = await run_campaign(SHORT)
    print(report.to_json())  # the figures, with pytest -s
    figures = json.loads(report.to_json())
    assert report.problems == [], report.to_json()
    assert figures["succeeded"] == figures["final_step_exact"]
    assert figures["jobs"] == figures["succeeded"] + figures["cancelled"] == SHORT.jobs
    assert figures["cancels"] >= 1 and figures["cancelled"] <= figures["cancels"]
    assert set(figures["kills"]) == set(PROCESS_KINDS)
    assert all(figures["kills"][kind] >= 1 for kind in PROCESS_KINDS), figures["kills"]
    assert figures["nats_restarts"] >= 1 and figures["postgres_restarts"] >= 1
    assert figures["disk_full_episodes"] >= 1 and figures["disk_full_mode"] == "ext4-loop"
    assert figures["double_succeeded"] == 0 and figures["concurrent_runners"] == 0
    assert figures["runner_samples"] > 0 and figures["retries"] >= 1
    assert 0 <= figures["max_steps_lost"] <= figures["checkpoint_interval_steps"] == 500
    assert figures["lammps_jobs"] == SHORT.jobs // 2
    assert 0 <= figures["max_steps_lost_thermo_log"] <= 500
    assert figures["rebuild_equal"] is True
    assert set(SHORT_KINDS) <= set(figures["kills"]) | {"nats", "postgres", "disk_full", "cancel"}
    assert all(figures["strikes"][kind] >= 1 for kind in STRIKE_KINDS), figures["strikes"]
