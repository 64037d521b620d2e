"""Every identity connects to a real server configured as mdq configures it, in the longest
namespace allowed: a user's CONNECT line carries its JWT, whose permissions grow with the
namespace, and the server's default 4 KiB limit refused placement in an 11-character one."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdq.bus.connect import connect
from mdq.bus.security.auth import generate, issue, runner_issuer, write_secret
from mdq.bus.security.permissions import IDENTITIES, tenant_permissions
from mdq.bus.subjects import Subjects
from mdq.embedded import start_nats

LONGEST = "n" * 32


@pytest.fixture(scope="module")
def deployment() -> Iterator[tuple[str, dict[str, Path]]]:
    folder = Path(tempfile.mkdtemp(prefix="mdq-long-"))
    generated = generate(folder / "secrets", LONGEST)
    creds = dict(generated.creds)
    subjects = Subjects(LONGEST)
    creds["tenant"] = issue(
        generated.trust, tenant_permissions(subjects, "t" * 31), folder / "tenant.creds"
    )
    job = f"{'t' * 31}.0123456789ab-{'j' * 40}"  # the longest job id
    creds["runner"] = write_secret(
        folder / "runner.creds", runner_issuer(generated.trust).creds(job)
    )
    server = start_nats(folder / "nats", auth=generated.server_block.read_text())
    yield server.url, creds
    server.stop()


@pytest.mark.parametrize("identity", [*IDENTITIES, "tenant", "runner"])
async def test_every_identity_connects_in_the_longest_namespace(
    deployment: tuple[str, dict[str, Path]], identity: str
) -> None:
    url, creds = deployment
    async with asyncio.timeout(10):  # a refused CONNECT makes nats-py try again and again
        client = await connect(url, name=identity, creds=creds[identity])
    try:
        await client.flush(timeout=5)
        assert client.is_connected
    finally:
        await client.close()


def test_a_namespace_longer_than_that_is_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        Subjects("n" * 33)
