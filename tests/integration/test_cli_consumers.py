"""The consumers the ``mdq`` command makes on a tenant's stream, and the job ids it accepts.

A tenant's stream holds at most 16 consumers at once (docs/security.md, "Tenants"): every
command that reads it deletes the consumers it made before it exits, so a tenant runs its
commands as often as it likes; a stream that refuses a consumer all the same is said plainly
with the exit code for what does not answer (3), and ``submit --wait`` says its jobs were
accepted first. ``watch`` refuses a job these credentials cannot read (exit 5) at once, and
every command taking a job id refuses one intake could not have made (exit 2), as ``plot``
refuses an image format it cannot write.

Runs against the closed bus of ``test_people_on_the_closed_bus`` (a real nats-server configured
as ``mdq up`` configures it, the real intake, tenants made as ``mdq tenant add`` makes them).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import ConsumerConfig

from mdq.bus.connect import connect
from mdq.bus.security.permissions import inbox_prefix, tenant_identity
from mdq.errors import InvalidInput, NotFound, Unavailable
from mdq.sdk import JobNotInLog, MdqClient
from tests.integration import test_people_on_the_closed_bus as people
from tests.integration.test_people_on_the_closed_bus import (
    NS,
    SUBJECTS,
    TENANT,
    Closed,
    in_tenant_stream,
    job_file,
    mdq,
    run_job,
)

ROUNDS = 20
"""How many times each command runs in a row: more than the 16 consumers a tenant may hold."""
TENANT_CONSUMERS = 16


closed = people.closed
"""The closed bus of ``test_people_on_the_closed_bus`` (a server that authenticates every
connection, the tenants made, intake running), one for this module too."""


async def consumers_on(closed: Closed, stream: str) -> list[str]:
    """The names of the consumers ``stream`` holds now (read as the admin)."""
    admin = await connect(closed.url, name="check", creds=closed.generated.creds["admin"])
    try:
        return [info.name for info in await admin.jetstream().consumers_info(stream)]
    finally:
        await admin.close()


async def finished_job(closed: Closed, who: str, folder: Path) -> tuple[Path, str]:
    """A job file ``who`` submitted with ``mdq submit``, and its job, succeeded and in the
    tenant's stream."""
    path = job_file(folder, f"{who}-{os.urandom(3).hex()}")
    submitted = await asyncio.to_thread(mdq, closed, who, "submit", str(path))
    assert submitted.exit_code == 0, submitted.output
    [job] = submitted.stdout.split()
    await run_job(closed, job)
    await in_tenant_stream(closed, who, job)
    return path, job


async def test_a_tenant_runs_its_commands_again_and_again_and_keeps_no_consumer(
    closed: Closed, tmp_path: Path
) -> None:
    """watch, explain, replay and submit --wait, each 20 times in a row as the tenant: every
    run succeeds and leaves the tenant's stream without a consumer. Red when a command leaves
    its consumers to the stream's 10-minute idle limit (the 17th fails)."""
    path, job = await finished_job(closed, TENANT, tmp_path)
    stream = SUBJECTS.tenant_stream(TENANT)
    commands = {
        "watch": ("watch", job, "--timeout", "30"),
        "explain": ("explain", job),
        "replay": ("replay", job),
        "submit --wait": ("submit", str(path), "--wait", "--timeout", "30"),  # the same key
    }
    for round_number in range(ROUNDS):
        for name, args in commands.items():
            result = await asyncio.to_thread(mdq, closed, TENANT, *args)
            assert result.exit_code == 0, (name, round_number, result.output)
            assert job in result.stdout, (name, result.stdout)
            left = await consumers_on(closed, stream)
            assert left == [], (name, round_number, left)


async def test_a_stream_refusing_a_consumer_is_said_plainly(closed: Closed, tmp_path: Path) -> None:
    """With the tenant's 16 consumers taken (by another of its clients), each reading command
    exits 3 naming the limit, no traceback; submit --wait names the jobs it got accepted
    before it says following them failed."""
    path, job = await finished_job(closed, TENANT, tmp_path)
    stream = SUBJECTS.tenant_stream(TENANT)
    nc = await nats.connect(
        closed.url,
        user_credentials=str(closed.creds(TENANT)),
        inbox_prefix=inbox_prefix(tenant_identity(TENANT)),
    )
    js = nc.jetstream()
    taken = [
        (await js.add_consumer(stream, ConsumerConfig(name=f"taken{number}"))).name
        for number in range(TENANT_CONSUMERS)
    ]
    try:
        for args in (("watch", job), ("explain", job), ("replay", job)):
            result = await asyncio.to_thread(mdq, closed, TENANT, *args)
            assert result.exit_code == Unavailable.exit_code, (args, result.output)
            assert "maximum consumers limit reached" in result.output, result.output
            assert stream in result.output, result.output
        waited = await asyncio.to_thread(mdq, closed, TENANT, "submit", str(path), "--wait")
        assert waited.exit_code == Unavailable.exit_code, waited.output
        accepted_at = waited.output.index("the submit was accepted")
        assert job in waited.output[accepted_at:], waited.output
        assert waited.output.index("maximum consumers limit reached") > accepted_at
    finally:
        for name in taken:
            await js.delete_consumer(stream, name)
        await nc.close()
    assert await consumers_on(closed, stream) == []


async def test_watch_refuses_a_job_it_cannot_read_at_once(closed: Closed, tmp_path: Path) -> None:
    """A job that does not exist and another tenant's job: exit 5 within seconds, not a wait
    until --timeout."""
    _, others = await finished_job(closed, "bob", tmp_path)
    for job in (f"{TENANT}.0123456789ab-nothing", others, "0123456789ab-nothing"):
        started = time.monotonic()
        result = await asyncio.to_thread(mdq, closed, TENANT, "watch", job)
        assert result.exit_code == NotFound.exit_code, (job, result.output)
        assert f"no job {job}" in result.output, result.output
        assert time.monotonic() - started < 15, job


async def test_the_sdks_wait_refuses_a_job_it_cannot_read_at_once(
    closed: Closed, tmp_path: Path
) -> None:
    """The SDK's ``wait`` makes ``mdq watch``'s check: another tenant's job and one that does
    not exist raise ``JobNotInLog`` (a NotFound, exit 5 in the CLI) within seconds, not a
    ``WaitTimeout`` after the whole timeout; its own job is waited for as before."""
    _, own = await finished_job(closed, TENANT, tmp_path)
    _, others = await finished_job(closed, "bob", tmp_path)
    nothing = f"{TENANT}.0123456789ab-nothing"
    async with await MdqClient.connect(closed.url, NS, creds=closed.creds(TENANT)) as client:
        for jobs in ([others], [nothing], [own, others]):
            started = time.monotonic()
            with pytest.raises(JobNotInLog) as caught:
                await client.wait(jobs, timeout=60)
            assert isinstance(caught.value, NotFound)
            assert caught.value.job_ids == [job for job in jobs if job != own]
            assert str(caught.value) == f"no job {jobs[-1]} in the log"
            assert time.monotonic() - started < 15, jobs
        assert {str(state) for state in (await client.wait([own], timeout=30)).values()} == {
            "SUCCEEDED"
        }


MALFORMED = {
    "star": "*",
    "greater": ">",
    "subject": "mdq.>",
    "wildcard token": f"{TENANT}.*",
    "spaces": "bad id with spaces",
    "two dots": f"{TENANT}.x.0123456789ab-md",
    "no hex": "md",
    "markup": "[/x]",
}
COMMANDS = {
    "show": ("show",),
    "watch": ("watch",),
    "explain": ("explain",),
    "replay": ("replay",),
    "plot": ("plot",),
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("who", ["cli", TENANT])
def test_a_malformed_job_id_is_refused_naming_the_argument(
    closed: Closed, who: str, command: tuple[str, ...], value: str
) -> None:
    result = mdq(closed, who, *command, value)
    assert result.exit_code == InvalidInput.exit_code, result.output
    assert "JOB" in result.output and "is not a job id" in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("output", ["p.txt", "p", "p.PNG.exe"], ids=["txt", "no suffix", "exe"])
def test_plot_refuses_a_format_it_cannot_write(closed: Closed, tmp_path: Path, output: str) -> None:
    result = mdq(closed, "cli", "plot", "0123456789ab-md", "-o", str(tmp_path / output))
    assert result.exit_code == InvalidInput.exit_code, result.output
    assert "--output" in result.output, result.output
    for supported in ("png", "svg", "pdf"):
        assert supported in result.output, result.output
    assert not (tmp_path / output).exists()
