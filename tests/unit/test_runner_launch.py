"""How a pod's runner is started (``mdq.backends.launch``) and what a pod record may hold:
the environment allowlist, the ids that become folders, forged record fields, and specs that
validate the same way twice (placement and the runner validate them again)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mdq.backends.launch import (
    PodRefused,
    check_pod,
    inherited_environment,
    module_argv,
    runner_environment,
)
from mdq.backends.local.records import PodRecord
from mdq.backends.port import PodSpec
from mdq.contracts import pb
from mdq.core.runner_task import RunnerTask
from mdq.core.spec import SpecError, normalize_job

ALLOWLISTED = {
    "PATH": "/usr/bin",
    "HOME": "/home/agent",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "OPENMM_CPU_THREADS": "2",
    "MDQ_RUNNER_METRICS_PORT": "0",
    "MDQ_FORCEFIELD_DIR": "/srv/ff",
}
"""The host's variables a runner inherits."""

HOST = {
    **ALLOWLISTED,
    "DATABASE_URL": "postgresql://mdq:hunter2@db/mdq",
    "MDQ_DATABASE_URL": "postgresql://mdq:hunter2@db/mdq",
    "PGPASSWORD": "hunter2",
    "NATS_URL": "nats://agent-only:4222",
    "MDQ_PLACEMENT_BACKEND": "local",
    "AWS_SECRET_ACCESS_KEY": "x",
    "PYTHONPATH": "/tmp/evil",
    "PYTHONSTARTUP": "/tmp/evil.py",
    "LD_PRELOAD": "/tmp/evil.so",
}


def pod(**fields: object) -> PodSpec:
    values: dict[str, object] = {
        "name": "mdq-j1-2",
        "job_id": "j1",
        "attempt": 2,
        "node": "n1",
        "cpu": 2.0,
        "memory_mb": 512,
        "priority_class": "normal",
        "spec": normalize_job(pb.JobSpec(name="j"), "jobs[0]"),
        "depends_on": ("j0",),
        "threads": 2,
        "resume_from": pb.Checkpoint(step=100, path="/data/jobs/j1/checkpoints/x.xml"),
    }
    values.update(fields)
    return PodSpec(**values)  # type: ignore[arg-type]


def test_only_allowlisted_variables_are_inherited() -> None:
    assert inherited_environment(HOST) == ALLOWLISTED


def test_the_runner_environment_is_the_task_the_bus_and_the_allowlist() -> None:
    env = runner_environment(
        pod(), data_dir=Path("/data"), nats_url="nats://bus:4222", namespace="ns", host=HOST
    )
    assert not {"DATABASE_URL", "MDQ_DATABASE_URL", "PGPASSWORD", "LD_PRELOAD"} & set(env)
    assert env["NATS_URL"] == "nats://bus:4222" and env["MDQ_NAMESPACE"] == "ns"
    task = RunnerTask.from_env(env)
    assert task.job_dir == Path("/data/jobs/j1")
    assert task.input_dirs == (Path("/data/jobs/j0"),)
    assert (task.attempt, task.threads, task.resume_from) == (2, 2, pod().resume_from)


def test_the_argv_is_this_interpreter_running_the_runner() -> None:
    import sys

    assert module_argv() == [sys.executable, "-m", "services.runner"]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        pytest.param({"job_id": "../../etc", "name": "mdq-../../etc-2"}, "job id", id="dot-dot"),
        pytest.param({"job_id": "a/b", "name": "mdq-a/b-2"}, "job id", id="slash"),
        pytest.param({"job_id": "", "name": "mdq--2"}, "job id", id="empty"),
        pytest.param({"depends_on": ("../other",)}, "dependency", id="dependency-path"),
        pytest.param({"name": "mdq-other-2"}, "pod name", id="name-not-derived"),
        pytest.param({"attempt": 0, "name": "mdq-j1-0"}, "attempt", id="attempt-zero"),
        pytest.param({"job_id": "..", "name": "mdq----2"}, "job id", id="dot-dot-alone"),
        pytest.param({"job_id": "a..b", "name": "mdq-a--b-2"}, "job id", id="two-dots"),
        pytest.param({"job_id": "alice.", "name": "mdq-alice--2"}, "job id", id="tenant-only"),
        pytest.param({"job_id": "x.y.z", "name": "mdq-x-y-z-2"}, "job id", id="three-tokens"),
    ],
)
def test_ids_that_are_not_plain_names_are_refused(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(PodRefused, match=problem):
        check_pod(pod(**fields))


def test_a_tenants_job_is_a_plain_folder_name() -> None:
    """``alice.<hex>-<name>``: one folder under the jobs root, its pod name a DNS label."""
    job = "alice.0123456789ab-md"
    check_pod(pod(job_id=job, name="mdq-alice-0123456789ab-md-2"))
    env = runner_environment(
        pod(job_id=job, name="mdq-alice-0123456789ab-md-2"),
        data_dir=Path("/data"),
        nats_url="nats://bus:4222",
        namespace="ns",
        host={},
    )
    assert RunnerTask.from_env(env).job_dir == Path("/data/jobs") / job


def test_a_pod_record_round_trips_and_ignores_command_and_env(
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = PodRecord(spec=pod())
    assert PodRecord.from_json(record.to_json()) == record
    document = json.loads(record.to_json())
    assert not {"command", "env"} & set(document)
    document["command"] = ["sh", "-c", "touch /tmp/pwned"]
    document["env"] = {"LD_PRELOAD": "/tmp/evil.so"}
    with caplog.at_level(logging.WARNING):
        forged = PodRecord.from_json(json.dumps(document).encode())
    assert forged == record
    assert "fields mdq never writes (command, env)" in caplog.text


def test_a_record_with_a_spec_that_is_not_protobuf_is_malformed() -> None:
    document = json.loads(PodRecord(spec=pod()).to_json())
    document["spec"] = "bm90IHByb3RvYnVm"  # base64 of "not protobuf"
    with pytest.raises(ValueError):
        PodRecord.from_json(json.dumps(document).encode())


@pytest.mark.parametrize("steps", [1, 5, 9, 10, 11, 499, 501, 20_000])
def test_a_normalized_spec_passes_validation_again(steps: int) -> None:
    once = normalize_job(pb.JobSpec(name="j", steps=steps), "jobs[0]")
    assert normalize_job(once, "spec") == once


def test_a_force_field_the_check_does_not_know_is_refused_naming_the_field() -> None:
    spec = pb.JobSpec(
        name="j",
        system=pb.System(
            structure=pb.Structure(
                pdb_content="ATOM      1  N   ALA A   1       0.0   0.0   0.0\n",
                force_fields=["amber14-all.xml", "evil.xml"],
            )
        ),
    )
    known = {"amber14-all.xml"}
    with pytest.raises(SpecError) as caught:
        normalize_job(spec, "jobs[0]", force_field_exists=known.__contains__)
    assert caught.value.field == "jobs[0].system.structure.force_fields[1]"
    assert "MDQ_FORCEFIELD_DIR" in caught.value.message
