"""End to end on the embedded stack with two local execution clusters (``mdq up --clusters
2``): NATS authenticates every connection, each cluster's node agent
may use its own cluster's buckets, and real OpenMM jobs run where their ``clusters`` selector
sends them, a chain's analysis where its run left its outputs; events and PostgreSQL name the
node within its cluster."""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections import Counter
from pathlib import Path

import psutil
import pytest

from mdq.backends.clusters import ClusterEntry
from mdq.core import ids
from mdq.core.runner_task import ENV_ATTEMPT, ENV_JOB_ID, job_dir
from mdq.testing.cluster import SimulatedCluster
from mdq.testing.runner_files import last_energy_step, logged_resume
from tests.e2e.stacks import attempt_rows, operator_client, own_stack
from tests.e2e.test_stack import md_job
from tests.helpers import events_of, read_all, wait_for
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e


async def test_jobs_run_on_the_clusters_they_ask_for(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = own_stack(tmp_path, database_url, monkeypatch, clusters=2)
    await stack.start()
    try:
        campaign = submit_request(
            md_job("on-lab2", steps=500, clusters={"require": {"site": "lab2"}}),
            md_job("on-lab1", steps=500, clusters={"require": {"site": "lab1"}}),
            {
                "name": "analyze",
                "task": "TASK_ANALYZE",
                "depends_on": ["on-lab2"],
                "resources": {"cpu": 0.5},
            },
            key="clusters-1",
        )
        async with await operator_client(stack) as client:
            job_ids = await client.submit_when_ready(campaign)
            states = await client.wait(job_ids, timeout=300)
            assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
            on_lab2, on_lab1, analyze = job_ids
            js = client.nc.jetstream()
            bound = {
                event.job_id: event.bound for event in await events_of(js, client.subjects, "bound")
            }
        assert bound[on_lab2].node == "lab2/local-1" and bound[on_lab2].cluster == "lab2"
        assert bound[on_lab1].node == "lab1/local-1"
        # the analysis may run anywhere: it goes where its run's outputs are
        assert bound[analyze].cluster == "lab2"
        assert {c.cluster for c in bound[analyze].clusters} == {"lab1", "lab2"}
    finally:
        await stack.stop()

    attempts = await attempt_rows(database_url, job_ids, "node")
    nodes = {job_id: row["node"] for (job_id, _), row in attempts.items()}
    assert nodes == {on_lab2: "lab2/local-1", on_lab1: "lab1/local-1", analyze: "lab2/local-1"}


async def test_a_whole_cluster_lost_mid_campaign_its_jobs_finish_on_the_other(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss of a whole cluster, on local clusters: once every job ran and had a checkpoint
    copied to the shared store, all of lab1 freezes (SIGSTOP to its node agent and its runners: a
    partition, nothing there answers or dies) and its jobs' checkpoint files are deleted (its
    data volume is gone with it; the two local clusters share one folder here). Its jobs run
    again on lab2 from their latest *copied* checkpoints, fetched and checked, losing at most
    a checkpoint interval plus the copy's lag (recorded per attempt in PostgreSQL); when lab1
    thaws its stale runners stop; every job SUCCEEDED exactly once."""
    stack = own_stack(
        tmp_path,
        database_url,
        monkeypatch,
        clusters=2,
        extra_env={"MDQ_LOCAL_CPU_PER_NODE": "4", "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5"},
        stuck_after_s=3600.0,  # lab1's frozen agent plays a partition: not for the stack to heal
    )
    await stack.start()
    frozen: list[psutil.Process] = []
    interval = 500
    report_interval = 100
    try:
        campaign = submit_request(
            *(
                md_job(
                    f"md{i}",
                    # lab1's jobs run on when it freezes, however late their first copy comes
                    steps=8000 if site == "lab1" else 4000,
                    checkpoint_interval_steps=interval,
                    report_interval_steps=report_interval,
                    resources={"cpu": 1, "memory_mb": 512},
                    clusters={"prefer": {"site": site}},
                )
                for i, site in enumerate(("lab1", "lab2", "lab1", "lab2"))
            ),
            key="clusters-lost",
        )
        async with await operator_client(stack) as client:

            async def both_clusters_ready() -> bool:
                loads = await client.node_loads()
                return {e.node_load.cluster for e in loads.values() if e.node_load.ready} == {
                    "lab1",
                    "lab2",
                }

            # a preference is no requirement: with only lab2 reported, lab1's jobs would go there
            await wait_for(both_clusters_ready, timeout=60, what="both clusters' nodes")
            job_ids = await client.submit_when_ready(campaign)
            agent = stack.child_pid("local-backend-lab1")
            assert agent is not None

            def lab1_runners() -> dict[str, tuple[int, psutil.Process]]:
                found = {}
                for child in psutil.Process(agent).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        env = child.environ()
                        if "services.runner" in " ".join(child.cmdline()) and ENV_JOB_ID in env:
                            found[env[ENV_JOB_ID]] = (int(env[ENV_ATTEMPT]), child)
                return found

            def folder(job_id: str) -> Path:
                return job_dir(stack.data_dir, job_id)

            js = client.nc.jetstream()

            async def lab1_running_with_copies() -> bool:
                # the jobs lab1 runs each had a checkpoint copied (where placement put each job
                # is its choice: a preference weighs against load)
                copied = {e.job_id for e in await events_of(js, client.subjects, "copied")}
                running = set(lab1_runners())
                return bool(running) and running <= copied

            await wait_for(lab1_running_with_copies, timeout=240, what="a copy of lab1's jobs")
            on_lab1 = lab1_runners()
            frozen = [psutil.Process(agent), *(process for _, process in on_lab1.values())]
            for process in frozen:
                process.send_signal(signal.SIGSTOP)
            last_steps = {j: last_energy_step(folder(j) / "energies.csv") for j in on_lab1}
            for job_id in on_lab1:  # lab1's volume is gone with it
                shutil.rmtree(folder(job_id) / "checkpoints")

            def resumed(job_id: str, attempt: int) -> int | None:
                log = stack.data_dir / "pods" / f"{ids.pod_name(job_id, attempt + 1)}.log"
                return logged_resume(log)

            async def moved() -> bool:
                return all(resumed(j, a) is not None for j, (a, _) in on_lab1.items())

            await wait_for(moved, timeout=120, what="lab1's jobs running again on lab2")
            copies = [e for e in await events_of(js, client.subjects, "copied")]
            for job_id, (attempt, _) in on_lab1.items():
                step = resumed(job_id, attempt)
                assert step is not None and step > 0, "resumed from its copied checkpoint"
                # the newest copy lab1's attempt made (the attempt on lab2 copies its own soon)
                latest_copy = max(
                    c.copied.checkpoint.step
                    for c in copies
                    if c.job_id == job_id and c.attempt == attempt
                )
                assert step == latest_copy
                log = stack.data_dir / "pods" / f"{ids.pod_name(job_id, attempt + 1)}.log"
                assert f"fetched the copy of checkpoint {step}" in log.read_text()
            for process in frozen:
                process.send_signal(signal.SIGCONT)
            _, alive = psutil.wait_procs(frozen[1:], timeout=60)
            assert not alive, "lab1's stale runners stop once it answers again"
            states = await client.wait(job_ids, timeout=300)
            assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
            succeeded = Counter(e.job_id for e in await events_of(js, client.subjects, "succeeded"))
            bound = {e.job_id: e.bound for e in await events_of(js, client.subjects, "bound")}
        assert succeeded == dict.fromkeys(job_ids, 1)
        for job_id in on_lab1:  # its last attempt ran on lab2
            assert bound[job_id].cluster == "lab2"
    finally:
        for process in frozen:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGCONT)
        await stack.stop()

    rows = await attempt_rows(
        database_url,
        on_lab1,
        "failure_reason, steps_lost, copy_lag_steps, resumed_from_step, resumed_from_copy",
    )
    for job_id, (attempt, _) in on_lab1.items():
        lost, retry = rows[job_id, attempt], rows[job_id, attempt + 1]
        assert lost["failure_reason"] == "FAILURE_CLUSTER_LOST"
        assert retry["resumed_from_copy"] and retry["resumed_from_step"] == resumed(job_id, attempt)
        # what the attempt reached less where its retry began, at most an interval plus the lag;
        # mdq counts what it heard of, and a runner frozen between writing a report's line and
        # publishing it has reached one report more than that
        reached = last_steps[job_id] - retry["resumed_from_step"]
        assert reached <= lost["steps_lost"] + report_interval, (reached, lost["steps_lost"])
        assert lost["steps_lost"] <= interval + lost["copy_lag_steps"]


async def test_a_kubernetes_cluster_lost_mid_campaign_its_jobs_resume_from_copies(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss of a whole cluster, across kinds: two Kubernetes clusters (API emulators, a
    kubelet each) and a local one, one campaign. Once every job runs and had a checkpoint
    copied, the whole of ``east`` dies — its kubelet crashes (its runners die with it) and its
    API stops answering — and its jobs' files are deleted (its volume is gone). After
    MDQ_CLUSTERS_LOST_AFTER_S the router declares it lost: each of its jobs fails
    FAILURE_CLUSTER_LOST (not counted as a retry) and runs again on another cluster from its
    latest copied checkpoint, fetched and checked, losing at most an interval plus the copy's
    lag (recorded per attempt); every job SUCCEEDED exactly once."""
    kubes = {
        name: SimulatedCluster(
            work_dir=tmp_path / name,
            namespace="mdq",
            nodes=(node,),
            cpu_per_node=2.0,
            memory_mb_per_node=4096,
            heartbeat_s=0.3,
            node_monitor_grace_s=5.0,
            bookmark_interval_s=0.5,
        )
        for name, node in (("east", "ip-10-0-1-17.ec2.internal"), ("west", "node-w1"))
    }
    for kube in kubes.values():
        await kube.start()
    stack = own_stack(
        tmp_path,
        database_url,
        monkeypatch,
        clusters=1,
        remote_clusters=[
            ClusterEntry(
                name=name,
                kind="kubernetes",
                labels={"site": name},
                kubernetes={
                    "kubeconfig": str(kube.kubeconfig),
                    "namespace": "mdq",
                    "node_lost_after_s": 1,
                    "termination_grace_s": 3,
                    "retry_backoff_s": 0.2,
                },
            )
            for name, kube in kubes.items()
        ],
        extra_env={
            "MDQ_LOCAL_CPU_PER_NODE": "2",
            "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
            "MDQ_CLUSTERS_LOST_AFTER_S": "4",
            "MDQ_METRICS_INTERVAL_S": "1",
        },
    )
    interval = 500
    await stack.start()
    try:
        campaign = submit_request(
            *(
                md_job(
                    f"md-{site}",
                    steps=8000 if site == "east" else 4000,  # east's runs on when it dies
                    checkpoint_interval_steps=interval,
                    report_interval_steps=100,
                    resources={"cpu": 1, "memory_mb": 512},
                    clusters={"prefer": {"site": site}},
                )
                for site in ("east", "west", "lab1")
            ),
            key="kubernetes-cluster-lost",
        )
        async with await operator_client(stack) as client:
            job_ids = await client.submit_when_ready(campaign)
            js = client.nc.jetstream()

            async def east_busy_with_a_copy() -> bool:
                # east's job has a copy of the attempt it runs now (a loaded machine can lose
                # and requeue an attempt before: its copy is not this one's) and has not ended
                # (the others' pace does not matter: on a loaded machine east's job could
                # finish before a slow cluster copies)
                copies = await events_of(js, client.subjects, "copied")
                copied = {(e.job_id, e.attempt) for e in copies}
                ended = {e.job_id for e in await events_of(js, client.subjects, "succeeded")}
                latest = {e.job_id: e for e in await events_of(js, client.subjects, "bound")}
                east = {(j, e.attempt) for j, e in latest.items() if e.bound.cluster == "east"}
                return bool(east) and east <= copied and not {j for j, _ in east} & ended

            await wait_for(east_busy_with_a_copy, timeout=240, what="a copy of east's job")
            latest = {e.job_id: e for e in await events_of(js, client.subjects, "bound")}
            on_east = {j: e.attempt for j, e in latest.items() if e.bound.cluster == "east"}
            for kubelet in kubes["east"].kubelets.values():
                await kubelet.crash()
            await kubes["east"].api.stop()
            for job_id in on_east:  # east's volume is gone with it
                shutil.rmtree(job_dir(stack.data_dir, job_id) / "checkpoints", ignore_errors=True)
            states = await client.wait(job_ids, timeout=300)
            assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
            succeeded = Counter(e.job_id for e in await events_of(js, client.subjects, "succeeded"))
            copies = await events_of(js, client.subjects, "copied")
            first_reports = {}
            for job_id, attempt in on_east.items():
                reports = [
                    e.progress.step
                    for e in await read_all(js, client.subjects.progress(job_id))
                    if e.attempt == attempt + 1
                ]
                first_reports[job_id] = min(reports)
            final = {e.job_id: e.bound for e in await events_of(js, client.subjects, "bound")}
    finally:
        await stack.stop()
        for kube in kubes.values():
            await kube.stop()  # raises what a kubelet or the emulator failed with, if any
    assert succeeded == dict.fromkeys(job_ids, 1)
    assert on_east, "a job preferred east and ran there"
    rows = await attempt_rows(
        database_url,
        on_east,
        "failure_reason, steps_lost, copy_lag_steps, resumed_from_step, resumed_from_copy, node",
    )
    for job_id, attempt in on_east.items():
        lost, retry = rows[job_id, attempt], rows[job_id, attempt + 1]
        assert lost["failure_reason"] == "FAILURE_CLUSTER_LOST"
        assert lost["node"].startswith("east/")
        assert final[job_id].cluster in ("west", "lab1")
        latest_copy = max(
            c.copied.checkpoint.step for c in copies if c.job_id == job_id and c.attempt == attempt
        )
        assert retry["resumed_from_copy"] and retry["resumed_from_step"] == latest_copy > 0
        # it went on from the copy (its files were gone): its first report is the next one
        assert first_reports[job_id] == latest_copy + 100
        assert lost["steps_lost"] <= interval + lost["copy_lag_steps"]
