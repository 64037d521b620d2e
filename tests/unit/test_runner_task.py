"""The runner's environment contract (``mdq.core.runner_task``): what placement writes, the
runner reads back, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format

from mdq.contracts import pb
from mdq.core.runner_task import ENV_RESUME_FROM, ENV_SPEC, RunnerTask
from mdq.core.spec import normalize_job

SPEC = normalize_job(pb.JobSpec(name="md", steps=5000, temperature_k=310.0), "jobs[0]")
CHECKPOINT = pb.Checkpoint(step=2500, path="checkpoints/2500.xml", sha256="ab" * 32)


def task(resume: pb.Checkpoint | None) -> RunnerTask:
    return RunnerTask(
        job_id="0123456789ab-md",
        attempt=2,
        spec=SPEC,
        job_dir=Path("/data/jobs/0123456789ab-md"),
        threads=4,
        resume_from=resume,
        input_dirs=(Path("/data/jobs/a"), Path("/data/jobs/b")),
    )


@pytest.mark.parametrize(
    "original", [task(None), task(CHECKPOINT)], ids=["fresh start", "resume from checkpoint"]
)
def test_round_trip(original: RunnerTask) -> None:
    assert RunnerTask.from_env(original.to_env()) == original


def test_spec_travels_as_base64_protobuf() -> None:
    env = task(CHECKPOINT).to_env()
    assert not env[ENV_SPEC].startswith("{") and not env[ENV_RESUME_FROM].startswith("{")


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("not base64!", id="not-base64"),
        pytest.param(json_format.MessageToJson(SPEC, indent=None), id="the-json-mapping"),
    ],
)
def test_a_spec_not_in_base64_protobuf_is_an_error(spec: str) -> None:
    with pytest.raises(ValueError):
        RunnerTask.from_env(task(None).to_env() | {ENV_SPEC: spec})
