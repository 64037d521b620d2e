"""The README's submitting examples, run as written against a test stack (NATS and an
in-process intake in the test's own namespace): the ten-line nats-py client, and `mdq submit`
with the README's job file. The `nats` CLI examples are not run (natscli is not installed
here); they send the same bytes to the same subjects as the Python client."""

from __future__ import annotations

import ast
import asyncio
import re
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key
from mdq.embedded import child_environment
from mdq.stack import Stack
from services.intake.app import Intake
from tests.helpers import RecordingBackend, events_of, node_load, publisher
from tests.integration.test_control import job as control_job
from tests.integration.test_control import placement_running
from tests.integration.test_intake import wait_for_events
from tests.integration.test_sdk_cli import _intake_answers

README = Path(__file__).resolve().parents[2] / "README.md"
TIMEOUT = 60.0


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)


def readme_client() -> str:
    [snippet] = [block for block in code_blocks("python") if ".api.submit" in block]
    return snippet


def readme_control_client() -> str:
    [snippet] = [block for block in code_blocks("python") if ".api.control" in block]
    return snippet


async def run(*command: str, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode is not None
    return process.returncode, output.decode()


def test_the_client_is_about_ten_lines() -> None:
    for client in (readme_client(), readme_control_client()):
        lines = [line for line in client.splitlines() if line.strip()]
        assert len(lines) <= 12, lines


async def test_the_readme_control_client_cancels_a_job(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    """The plain-NATS job-control snippet, run as written against placement (its leader
    answers job control) on the test's namespace: the job it names ends CANCELLED."""
    js = nc.jetstream()
    bus = publisher(js, subjects)
    await bus.publish(node_load("n1", cpu_capacity=1))
    await bus.publish(control_job("abcdefabcdef-w", cpu=8))  # fits nowhere: stays PENDING
    async with placement_running(nc, subjects, RecordingBackend()):
        script = tmp_path / "control.py"
        script.write_text(readme_control_client())
        env = child_environment(NATS_URL=nats_url, MDQ_NAMESPACE=namespace)
        code, output = await run(
            sys.executable, str(script), env={**env, "JOB_ID": "abcdefabcdef-w"}, cwd=tmp_path
        )
    assert code == 0, output
    [outcome] = ast.literal_eval(output.strip().splitlines()[-1])
    assert (outcome["job_id"], outcome["result"], outcome["state"]) == (
        "abcdefabcdef-w",
        "CONTROL_DONE",
        "CANCELLED",
    )
    [cancelled] = await events_of(js, subjects, "cancelled")
    assert cancelled.job_id == "abcdefabcdef-w"


async def test_the_readme_python_client_submits_both_ways(
    intake: Intake, nats_url: str, namespace: str, nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    script = tmp_path / "client.py"
    script.write_text(readme_client())
    code, output = await run(
        sys.executable,
        str(script),
        env=child_environment(NATS_URL=nats_url, MDQ_NAMESPACE=namespace),
        cwd=tmp_path,
    )
    assert code == 0, output

    printed = ast.literal_eval(output.strip().splitlines()[-1])
    assert printed["job_ids"] == [f"{request_id_for_key('k2')}-w"]
    events = await wait_for_events(nc.jetstream(), subjects, 2)
    submitted = {event.job_id: event.submitted for _, event in events}
    assert set(submitted) == {f"{request_id_for_key(key)}-w" for key in ("k1", "k2")}
    assert all(body.spec.steps == 2000 for body in submitted.values())


async def test_the_readme_mdq_submit_example(
    intake: Intake, nats_url: str, namespace: str, nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    [shell] = [block for block in code_blocks("sh") if "mdq submit w.json" in block]
    [job_file] = re.findall(r"echo '(.*)' > w.json", shell)
    (tmp_path / "w.json").write_text(job_file)
    mdq = Path(sys.executable).with_name("mdq")
    code, output = await run(
        str(mdq),
        "submit",
        "w.json",
        env=child_environment(NATS_URL=nats_url, MDQ_NAMESPACE=namespace),
        cwd=tmp_path,
    )
    assert code == 0, output
    assert output.split() == [f"{request_id_for_key('k2')}-w"]
    [(_, event)] = await wait_for_events(nc.jetstream(), subjects, 1)
    assert event.WhichOneof("body") == "submitted"
    assert event.submitted.spec.task == pb.TASK_MD


async def test_the_readme_python_client_with_the_credentials_mdq_up_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    """Against an embedded stack (its NATS authenticates; a client without credentials is
    refused, test_bus_permissions.py), the snippet submits with the `cli` credentials that
    `mdq up` wrote, passed as the README says."""
    monkeypatch.delenv("NATS_URL", raising=False)
    stack = Stack(
        state_dir=tmp_path / "state",
        namespace="readme",
        database_url=database_url,
        services=("intake",),
        backend="kubernetes",  # no node agent: only intake answers here
        metrics_port=0,
        grace_s=15.0,
    )
    info = await stack.start()
    try:
        await _intake_answers(info.nats_url, Subjects("readme"), creds=info.nats_creds)
        script = tmp_path / "client.py"
        script.write_text(readme_client())
        env = child_environment(
            NATS_URL=info.nats_url, MDQ_NAMESPACE="readme", MDQ_NATS_CREDS=info.nats_creds
        )
        code, output = await run(sys.executable, str(script), env=env, cwd=tmp_path)
        assert code == 0, output
        printed = ast.literal_eval(output.strip().splitlines()[-1])
        assert printed["job_ids"] == [f"{request_id_for_key('k2')}-w"]
    finally:
        await stack.stop()
