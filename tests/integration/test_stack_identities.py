"""The embedded stack's NATS identities: made once, kept secret, one per process.

What each child really got is read from ``/proc/<pid>/environ``; the files from the disk.
"""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import aiohttp
import psutil
import pytest

from mdq.bus.connect import identity_of_creds
from mdq.bus.security.auth import nats_secrets_dir
from mdq.stack import STACK_FILE, Stack
from tests.helpers import wait_for
from tests.integration.test_stack_database import process_env

CHILDREN = {
    "intake": "intake",
    "placement": "placement",
    "watcher": "watcher",
    "recovery": "recovery",
    "metrics": "metrics",
    "console": "console",
    "local-backend": "agent",
}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def listening_on(process: psutil.Process, *, what: str) -> set[str]:
    """The addresses ``process`` listens on, once it listens at all (``what``: that moment,
    named if it never comes)."""

    async def listening() -> bool:
        return any(c.status == psutil.CONN_LISTEN for c in process.net_connections("inet"))

    await wait_for(listening, timeout=60, what=what)
    return {c.laddr.ip for c in process.net_connections("inet") if c.status == "LISTEN"}


async def test_each_process_gets_its_own_identity_and_nothing_else(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("MDQ_NATS_CREDS", raising=False)
    state = tmp_path / "state"
    stack = Stack(state_dir=state, database_url=database_url, metrics_port=0, grace_s=15.0)
    info = await stack.start()
    try:
        folder = nats_secrets_dir(state)
        assert mode(folder.parent) == 0o700 and mode(folder) == 0o700
        files = [path for path in folder.iterdir() if path.is_file()]
        assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
        trust = json.loads((folder / "trust.json").read_text())
        seeds = [value for key, value in trust.items() if key.endswith("seed")]
        assert len(seeds) == 5  # operator, system, streams and users accounts, runner key

        for child, identity in CHILDREN.items():
            pid = stack.child_pid(child)
            assert pid is not None, child
            env = process_env(pid)
            creds = Path(env["MDQ_NATS_CREDS"])
            assert creds.parent == folder and identity_of_creds(creds) == identity, child
            # placement alone holds the runner key; the node agent asks it for credentials
            assert ("MDQ_NATS_RUNNER_ISSUER" in env) == (identity == "placement"), child
            for seed in seeds:  # no process holds the operator's or the account's keys
                assert not [k for k, v in env.items() if seed in v], (child, seed[:4])

        # /metrics listens on the loopback only: on one machine, nobody else scrapes it.
        metrics = psutil.Process(stack.child_pid("metrics"))
        assert await listening_on(metrics, what="/metrics listening") == {"127.0.0.1"}

        # So does the web console, and loopback is every account's on a shared machine: the
        # console lets in only who brings the token that only the stack's owner can read.
        console = psutil.Process(stack.child_pid("console"))
        assert await listening_on(console, what="the console listening") == {"127.0.0.1"}
        assert info.console_url.startswith("http://127.0.0.1:")
        token_file = Path(info.console_token_file)
        assert token_file.parent == state / "secrets" and mode(token_file) == 0o600
        token = (await asyncio.to_thread(token_file.read_text)).strip()
        holders = [
            c for c in CHILDREN if str(token_file) in process_env(stack.child_pid(c) or 0).values()
        ]
        # the console and /metrics (job ids name the tenants) ask for it
        assert holders == ["metrics", "console"], "only they are told where the token is"
        for child in CHILDREN:  # and no process holds the token itself
            env = process_env(stack.child_pid(child) or 0)
            assert not [k for k, v in env.items() if token in v], child
        jar = aiohttp.CookieJar(unsafe=True)  # keeps 127.0.0.1's cookies, as a browser does
        async with aiohttp.ClientSession(cookie_jar=jar) as session:
            async with session.get(f"{info.console_url}jobs") as response:
                assert response.status == 401
            async with session.get(info.console_link("jobs")) as response:
                assert response.status == 200
        assert token not in (state / STACK_FILE).read_text()
        async with aiohttp.ClientSession() as session:
            async with session.get(info.metrics_url) as response:
                assert response.status == 401  # another account of the machine
            bearer = {"Authorization": f"Bearer {token}"}
            async with session.get(info.metrics_url, headers=bearer) as response:
                assert response.status == 200 and "mdq_jobs" in await response.text()

        # Logs: no other account reads them (folder 0750, files 0640 at most).
        logs = state / "logs"
        assert mode(logs) & 0o027 == 0 and mode(state / "data") & 0o027 == 0
        for path in logs.rglob("*"):
            assert mode(path) & (0o027 if path.is_dir() else 0o137) == 0, (path, oct(mode(path)))

        # The CLI identity is in stack.json, and no secret is.
        text = (state / STACK_FILE).read_text()
        assert Path(info.nats_creds) == folder / "cli.creds"
        assert identity_of_creds(Path(info.nats_creds)) == "cli"
        assert not [seed for seed in seeds if seed in text]
    finally:
        await stack.stop()

    # A second start keeps the identities (the server's trust and every file are reused).
    before = {path.name: path.read_text() for path in nats_secrets_dir(state).glob("*.creds")}
    again = Stack(state_dir=state, database_url=database_url, services=(), backend="kubernetes")
    await again.start()
    try:
        after = {path.name: path.read_text() for path in nats_secrets_dir(state).glob("*.creds")}
        assert after == before
    finally:
        await again.stop()
