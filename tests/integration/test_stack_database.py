"""The embedded stack's database (``mdq.store.stack_database``), with a real ``Stack``: the
embedded PostgreSQL asks every connection for a password, the passwords are generated into
private files, only the watcher gets a database URL (the writer's), and stack.json leads the
CLI to the reader, never to the superuser.

What each child really got is read from ``/proc/<pid>/environ``, not from the stack's own
bookkeeping.
"""

from __future__ import annotations

import asyncio
import re
import stat
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
from pgserver._commands import POSTGRES_BIN_PATH

from mdq.cli.context import GlobalOptions, resolve_endpoints
from mdq.stack import STACK_FILE, Stack
from mdq.store.engine import asyncpg_dsn
from mdq.store.stack_database import POSTGRES_SECRETS, SECRETS_DIR

README_SH_BLOCKS = re.findall(
    r"```sh\n(.*?)```", (Path(__file__).resolve().parents[2] / "README.md").read_text(), re.DOTALL
)
PSQL = POSTGRES_BIN_PATH / "psql"
DATABASE_VARIABLES = ("DATABASE_URL", "MDQ_DATABASE_URL", "PGPASSWORD", "PGUSER")


def process_env(pid: int, *, within_s: float = 10.0) -> dict[str, str]:
    """The environment the process ``pid`` was started with, once it has one of its own.

    A child just spawned may still be the parent's copy (between fork and exec) or in the
    middle of its exec, when /proc shows the parent's environment or none: what it was given
    is read once its command line is the mdq module it runs and its environment is there."""
    deadline = time.monotonic() + within_s
    while True:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        module = cmdline[cmdline.index(b"-m") + 1] if b"-m" in cmdline[:-1] else b""
        if module.startswith((b"services.", b"mdq.")) and raw:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not exec within {within_s} s: {cmdline!r}")
        time.sleep(0.05)
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_embedded_stack_gives_each_process_its_least_role(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("PGPASSWORD", "inherited-and-must-not-pass")  # as if set in the shell
    state = tmp_path / ".mdq"  # the default state folder, seen from tmp_path (the README's)
    stack = Stack(
        state_dir=state,
        nats_url=nats_url,
        services=("watcher", "console"),
        metrics_port=0,
        grace_s=15.0,
    )
    info = await stack.start()
    try:
        secrets_dir = state / SECRETS_DIR / POSTGRES_SECRETS
        files = sorted(secrets_dir.iterdir())
        assert [f.name for f in files] == [
            "admin.password",
            "owner.password",
            "reader.password",
            "writer.password",
        ]
        assert mode(state / SECRETS_DIR) == 0o700 and mode(secrets_dir) == 0o700
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        password = {f.name.split(".")[0]: f.read_text().strip() for f in files}
        assert len(set(password.values())) == 4 and min(map(len, password.values())) >= 40

        # Each child's real environment: the watcher has the writer's URL, nothing else any.
        watcher_pid, agent_pid = stack.child_pid("watcher"), stack.child_pid("local-backend")
        assert watcher_pid is not None and agent_pid is not None
        watcher, agent = process_env(watcher_pid), process_env(agent_pid)
        url = urlsplit(watcher["DATABASE_URL"])
        assert (url.username, url.password) == ("mdq_writer", password["writer"])
        assert not {k for k in DATABASE_VARIABLES if k in agent}, agent.keys()
        assert not {k for k in DATABASE_VARIABLES if k != "DATABASE_URL" and k in watcher}
        for env in (watcher, agent):
            for secret in (password["admin"], password["owner"], password["reader"]):
                assert not [key for key, value in env.items() if secret in value]
        # The web console reads as the reader, and holds no other role's password.
        console_pid = stack.child_pid("console")
        assert console_pid is not None
        console = process_env(console_pid)
        url = urlsplit(console["DATABASE_URL"])
        assert (url.username, url.password) == ("mdq_reader", password["reader"])
        for secret in (password["admin"], password["owner"], password["writer"]):
            assert not [key for key, value in console.items() if secret in value]

        # stack.json: the reader, without its password, and where that password is.
        text = (state / STACK_FILE).read_text()
        assert not [name for name, secret in password.items() if secret in text]
        reader = urlsplit(info.database_url)
        assert (reader.username, reader.password) == ("mdq_reader", None)
        assert Path(info.database_password_file) == secrets_dir / "reader.password"

        # The CLI finds the reader through stack.json, with no flag; it reads, and only reads.
        options = GlobalOptions(nats_url=None, database_url=None, namespace=None, state_dir=state)
        connection = await asyncpg.connect(asyncpg_dsn(resolve_endpoints(options).database_url))
        try:
            assert await connection.fetchval("SELECT current_user") == "mdq_reader"
            assert await connection.fetchval("SELECT count(*) FROM jobs") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await connection.execute("DELETE FROM jobs")
        finally:
            await connection.close()

        # The README's psql example, run as written from the folder the stack was started in.
        [example] = [block for block in README_SH_BLOCKS if "psql" in block]
        assert "reader.password" in example
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-euc", example],
            cwd=tmp_path,
            env={"PATH": f"{PSQL.parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "(0 rows)" in done.stdout

        # Nobody reaches the server without a password, not even as the superuser.
        for user in ("postgres", "mdq_reader"):
            anonymous = info.database_url.replace("mdq_reader@", f"{user}@")
            with pytest.raises(asyncpg.InvalidPasswordError):
                await asyncpg.connect(asyncpg_dsn(anonymous), timeout=10)
    finally:
        await stack.stop()

    # A second start reuses the same passwords (the data folder was made with them).
    again = Stack(state_dir=state, nats_url=nats_url, services=(), backend="kubernetes")
    await again.start()
    try:
        assert (secrets_dir / "writer.password").read_text().strip() == password["writer"]
    finally:
        await again.stop()
