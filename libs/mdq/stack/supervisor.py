"""``Stack``: start, supervise and stop every part of mdq on this machine (docs/architecture.md,
"On one machine: the stack")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self

import psutil

from mdq.backends.local.agent import REAP_AFTER_KILL_S
from mdq.backends.local.settings import LocalAgentSettings
from mdq.bus.connect import CREDS_ENV
from mdq.bus.security.auth import (
    RUNNER_ISSUER_ENV,
    RUNNER_ISSUER_FILE,
    SECRETS_DIR,
    Generated,
    TrustMismatch,
    ensure_token_file,
    generate,
    nats_secrets_dir,
)
from mdq.bus.setup import prepare_bus
from mdq.bus.storage import StorageSettings
from mdq.embedded import (
    EmbeddedNats,
    EmbeddedPostgres,
    nats_store_failure,
    start_nats,
    start_postgres,
)
from mdq.files import open_log, private_folder, touch_private
from mdq.health import DEFAULT_MAX_AGE_S, HEALTH_FILE_ENV, RENEW_EVERY_S
from mdq.store.roles import close_other_databases
from mdq.store.stack_database import (
    StackDatabase,
    load_or_create_passwords,
    prepare,
    private_dir,
    role_names_from_env,
)

if TYPE_CHECKING:
    from mdq.backends.clusters import ClusterEntry

from mdq.stack.files import (
    CONSOLE_TOKEN_FILE,
    LOCAL_AGENT,
    NATS_SERVER,
    POSTGRES,
    STACK_FILE,
    STATUS_FILE,
    ChildStatus,
    StackError,
    StackInfo,
    default_state_dir,
    read_stack_info,
)
from mdq.stack.ports import DEFAULT_CONSOLE_PORT, DEFAULT_METRICS_PORT, claim_port
from mdq.stack.probes import nats_answers, postgres_answers

CONSOLE_TOKEN_ENV = "MDQ_CONSOLE_ACCESS_TOKEN_FILE"
METRICS_TOKEN_ENV = "MDQ_METRICS_TOKEN_FILE"
"""/metrics asks for the console's token (``Authorization: Bearer``), on one machine."""
SERVICES: tuple[str, ...] = ("intake", "placement", "watcher", "recovery", "metrics", "console")
"""The services of a stack, started as ``python -m services.<name>``."""
BACKENDS: tuple[str, ...] = ("local", "kubernetes")
LOCAL_CLUSTER_PREFIX = "lab"
"""Named local clusters are ``lab1``, ``lab2``, ... (labelled ``site=lab1``, ...)."""
CHILD_IDENTITY = {LOCAL_AGENT: "agent"}
"""The NATS identity of each child whose name is not its identity (services: their name)."""
DATABASE_ENV = frozenset(
    {"DATABASE_URL", "MDQ_DATABASE_URL", "PGPASSWORD", "PGUSER", "PGPASSFILE", "PGSERVICE"}
)
"""Database credentials a child must not inherit from the environment of ``mdq up``."""

# pgserver asks platformdirs for a runtime folder; without XDG_RUNTIME_DIR that is /tmp/…,
# which is fine, and the warning would only clutter `make run`.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


AGENT_REPORT_S = 3.0
"""What a node agent takes, once its pods are gone, to report its nodes not ready and drain."""
STORE_FULL_BELOW_BYTES = 4 * 2**20
"""Free space under the NATS store below which its disk counts as full (``_store_healed``)."""
STORE_ROOM_BYTES = 16 * 2**20
"""Free space under the NATS store at which a server whose store met a full disk is restarted."""
SERVER_LOG_READ_BYTES = 2**20
"""The most of the NATS server's log read for store failures at one supervision step."""
SERVER_PROBE_EVERY_S = 5.0
"""How often the stack asks each embedded server whether it answers (``mdq.stack.probes``)."""
SERVER_PROBE_LIMIT_S = 2.0
"""How long one such question may take."""
FAILED_STEP_SAID_EVERY_S = 60.0
"""How often the same failure of a supervision step is said again (``Stack._supervise``)."""


@dataclass(slots=True)
class ChildProcess:
    """One supervised child: its argv, its log, its current process, its restarts."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    started_at: float = 0.0
    started_wall: float | None = None
    restarts: int = 0
    consecutive_failures: int = 0
    next_start_at: float = 0.0
    last_exit_code: int | None = None
    health_file: Path | None = None
    """The liveness file the child renews while its event loop runs (``mdq.health``)."""
    renewed_mtime: float | None = None
    renewed_at: float = 0.0
    """When (monotonic) the supervision last saw the liveness file's time change: a clock
    that jumps changes no child's silence."""

    def silent_for(self, now: float) -> float:
        """Seconds (monotonic) since the child last renewed its liveness file, or since it
        started when it has not renewed it since."""
        if self.health_file is not None:
            with contextlib.suppress(OSError):
                mtime = self.health_file.stat().st_mtime
                if mtime != self.renewed_mtime:
                    self.renewed_mtime, self.renewed_at = mtime, now
        return now - max(self.renewed_at, self.started_at)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def _exit_text(code: int | None) -> str | None:
    """``exit N`` or ``signal N`` for a process's return code; None for no exit yet."""
    if code is None:
        return None
    return f"signal {-code}" if code < 0 else f"exit {code}"


@dataclass(slots=True)
class ServerWatch:
    """One embedded server under supervision: when it ends it is started again in place."""

    name: str
    log_path: Path
    started_at: float | None
    restarts: int = 0
    consecutive_failures: int = 0
    next_start_at: float = 0.0
    down_since: float | None = None
    """Monotonic time the server was found gone; None while it runs."""
    last_exit: str | None = None
    restarting: asyncio.Task[None] | None = None
    store: Path | None = None
    """The folder of the server's store whose disk is watched (NATS only,
    ``Stack._store_healed``)."""
    log_offset: int = 0
    """How far its log has been read for store failures."""
    store_fault: str | None = None
    """Why the server is to be restarted once its store's disk has room again (a write that
    found the disk full); None: nothing to heal."""
    answered_at: float = field(default_factory=time.monotonic)
    """When (monotonic) it last answered a probe (``mdq.stack.probes``), or started."""


@dataclass(slots=True)
class _Servers:
    nats: EmbeddedNats | None = None
    postgres: EmbeddedPostgres | None = None
    owned: list[str] = field(default_factory=list)


class Stack:
    """Start, supervise and stop every part of mdq on this machine."""

    def __init__(
        self,
        *,
        state_dir: Path | None = None,
        namespace: str | None = None,
        backend: str = "local",
        nats_url: str | None = None,
        database_url: str | None = None,
        local_nodes: int = 2,
        clusters: int = 0,
        remote_clusters: Sequence[ClusterEntry] = (),
        metrics_port: int | None = None,
        services: Sequence[str] = SERVICES,
        extra_env: dict[str, str] | None = None,
        grace_s: float = 10.0,
        poll_s: float = 0.25,
        max_backoff_s: float = 10.0,
        healthy_after_s: float = 30.0,
        stuck_after_s: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.state_dir = (state_dir or default_state_dir()).resolve()
        self.logs_dir = self.state_dir / "logs"
        self.data_dir = self.state_dir / "data"
        self.namespace = namespace or os.environ.get("MDQ_NAMESPACE") or "mdq"
        self.backend = backend
        self._nats_url = nats_url or os.environ.get("NATS_URL") or ""
        self._database_url = database_url or os.environ.get("DATABASE_URL") or ""
        """The administrator's URL (given, or the embedded superuser's): the roles are set up
        with it, and it goes to no child and not into stack.json."""
        self._database: StackDatabase | None = None
        self.local_nodes = local_nodes
        if clusters and backend != "local":
            raise ValueError("--clusters runs local clusters: it needs the local backend")
        self.local_clusters = tuple(f"{LOCAL_CLUSTER_PREFIX}{n}" for n in range(1, clusters + 1))
        """Named local clusters of ``local_nodes`` nodes each, one node agent each (``mdq up
        --clusters``); () for the one unnamed cluster."""
        if remote_clusters and backend != "local":
            raise ValueError("remote clusters join the local backend's named clusters")
        self.remote_clusters = tuple(remote_clusters)
        """Clusters of the clusters file beside the named local ones (a Kubernetes API of
        somewhere else), each run by its own backend; the stack starts nothing for them."""
        self._metrics_port = metrics_port
        self._metrics_port_claim: IO[str] | None = None
        self._console_port = 0
        self._console_token_file = self.state_dir / SECRETS_DIR / CONSOLE_TOKEN_FILE
        self._console_port_claim: IO[str] | None = None
        self._services = tuple(services)
        self._extra_env = dict(extra_env or {})
        self._grace_s = grace_s
        self._poll_s = poll_s
        self._max_backoff_s = max_backoff_s
        self._healthy_after_s = healthy_after_s
        self._stuck_after_s = stuck_after_s
        """A running child that has not renewed its liveness file for this long is stuck (a
        blocked event loop, a stopped process) and is killed, then restarted as after a crash."""
        self.health_dir = self.state_dir / "health"
        self._servers = _Servers()
        self._server_watches: list[ServerWatch] = []
        self._status_unwritten = False
        """Whether the last ``status.json`` could not be written (said once in stack.log)."""
        self._children: list[ChildProcess] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None
        self._stopping = False
        self._info: StackInfo | None = None
        self._env: dict[str, str] = {}
        self._creds: dict[str, Path] = {}
        self._bus_setup: asyncio.Task[None] | None = None
        """Each identity's credentials file, when this stack's NATS authenticates."""

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def info(self) -> StackInfo:
        if self._info is None:
            raise StackError("the stack is not started")
        return self._info

    async def start(self) -> StackInfo:
        """Start the servers (or use the given ones), migrate, start and supervise every
        child; return where everything is."""
        running = read_stack_info(self.state_dir)
        if running is not None and running.pid != os.getpid():
            raise StackError(
                f"a stack already runs on {self.state_dir} (pid {running.pid}, NATS "
                f"{running.nats_url}); use it, or stop it first"
            )
        private_dir(self.state_dir / SECRETS_DIR)  # 0700, before anything is written in it
        private_folder(self.logs_dir)
        private_folder(self.data_dir)
        private_folder(self.health_dir)
        if self.local_clusters or self.remote_clusters:
            self._write_clusters_file()
        try:
            await self._start_servers()
            if self._servers.nats is not None:
                await self._prepare_bus()  # before any service: they may only read stream info
            else:  # a server of the user's, maybe not there yet: services wait for it too
                self._bus_setup = asyncio.create_task(self._prepare_bus_later(), name="bus-setup")
            await asyncio.to_thread(self._migrate)
            metrics_port = self._choose_metrics_port()
            # the console's token also guards /metrics: every account reaches the loopback
            self._console_token_file = self._console_token()
            if "console" in self._services:
                self._console_port = self._choose_console_port()
            self._env = self._child_env(metrics_port)
            self._children = [self._child(name, argv) for name, argv in self._programs()]
            for child in self._children:
                self._spawn(child)
            self._info = StackInfo(
                nats_url=self._nats_url,
                database_url=self._database.reader_url if self._database else "",
                database_password_file=str(self._database.reader_password_file)
                if self._database
                else "",
                namespace=self.namespace,
                metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
                console_url=f"http://127.0.0.1:{self._console_port}/" if self._console_port else "",
                console_token_file=str(self._console_token_file) if self._console_port else "",
                state_dir=str(self.state_dir),
                logs_dir=str(self.logs_dir),
                data_dir=str(self.data_dir),
                backend=self.backend,
                pid=os.getpid(),
                embedded_nats=self._servers.nats is not None,
                embedded_postgres=self._servers.postgres is not None,
                nats_creds=str(self._creds.get("cli", "")),
                nats_admin_creds=str(self._creds.get("admin", "")),
            )
            (self.state_dir / STACK_FILE).write_text(self._info.to_json(), encoding="utf-8")
            self._write_status()
            self._supervisor = asyncio.create_task(self._supervise(), name="mdq-stack-supervisor")
            self._prober = asyncio.create_task(self._probe_servers(), name="mdq-stack-prober")
        except BaseException:
            await self.stop()
            raise
        self._note(f"stack started: NATS {self._nats_url}, namespace {self.namespace}")
        return self._info

    async def stop(self) -> None:
        """Stop every child (SIGTERM, then SIGKILL after the grace period), then the embedded
        servers; remove ``stack.json``. Safe to call more than once."""
        self._stopping = True
        if self._bus_setup is not None:
            self._bus_setup.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._bus_setup
            self._bus_setup = None
        for task in (self._supervisor, self._prober):
            if task is not None:
                task.cancel()
                # whatever ended the supervision, the children and the servers are stopped below
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._supervisor = self._prober = None
        for watch in self._server_watches:  # a restart in a thread cannot be cancelled
            if watch.restarting is not None:
                with contextlib.suppress(Exception):
                    await watch.restarting
                watch.restarting = None
        await asyncio.to_thread(self._stop_children)
        await asyncio.to_thread(self._stop_servers)
        if self._metrics_port_claim is not None:
            self._metrics_port_claim.close()
            self._metrics_port_claim = None
        if self._console_port_claim is not None:
            self._console_port_claim.close()
            self._console_port_claim = None
        info_path = self.state_dir / STACK_FILE
        with contextlib.suppress(OSError, ValueError, TypeError):
            if StackInfo.from_json(info_path.read_text(encoding="utf-8")).pid == os.getpid():
                info_path.unlink()
                (self.state_dir / STATUS_FILE).unlink(missing_ok=True)
        if self._info is not None:
            self._note("stack stopped")
        self._info = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        await self.stop()

    def status(self) -> list[ChildStatus]:
        """Every supervised part, embedded servers first: pid, running or not, restarts so
        far, last exit, start time of the current process, log file."""
        servers = [
            ChildStatus(
                name=watch.name,
                kind="server",
                pid=self._server_pid(watch.name),
                running=watch.down_since is None,
                restarts=watch.restarts,
                last_exit_code=None,
                last_exit=watch.last_exit,
                started_at=watch.started_at if watch.down_since is None else None,
                log_path=watch.log_path,
            )
            for watch in self._server_watches
        ]
        return servers + [
            ChildStatus(
                name=child.name,
                kind="agent" if child.name.startswith(LOCAL_AGENT) else "service",
                pid=child.pid,
                running=child.running,
                restarts=child.restarts,
                last_exit_code=child.last_exit_code,
                last_exit=None
                if child.last_exit_code is None
                else _exit_text(child.last_exit_code),
                started_at=child.started_wall if child.running else None,
                log_path=child.log_path,
            )
            for child in self._children
        ]

    def _write_status(self) -> None:
        """``status.json``: written whole to a temporary file, then renamed over the old one."""
        body = {
            "updated_at": time.time(),
            "pid": os.getpid(),
            "children": [part.to_dict() for part in self.status()],
        }
        path = self.state_dir / STATUS_FILE
        temporary = path.with_suffix(".json.tmp")
        try:
            temporary.write_text(json.dumps(body, indent=2), encoding="utf-8")
            temporary.replace(path)
        except OSError as error:  # a full disk: the next change writes it whole again
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            if not self._status_unwritten:
                self._note(f"could not write {path}: {error}")
            self._status_unwritten = True
            return
        self._status_unwritten = False

    def child_pid(self, name: str) -> int | None:
        """The pid of the named child's process while it runs; None once it has exited and
        until it is started again (for fault tests: a kill is counted only where it hits a
        running process, never the dead one the supervision has not restarted yet)."""
        for child in self._children:
            if child.name == name:
                return child.pid if child.running else None
        raise KeyError(name)

    # -- servers ---------------------------------------------------------------------------
    def _secure_bus(self) -> Generated:
        """The embedded server's trust chain and every identity's credentials, made on first
        start (0600 files in a 0700 folder under ``<state>/secrets/nats``) and kept after: the
        same generator as compose's and the manifests' (``mdq.bus.security.auth.generate``)."""
        try:
            generated = generate(
                nats_secrets_dir(self.state_dir),
                self.namespace,
                local_clusters=self.local_clusters,
            )
        except TrustMismatch as error:
            raise StackError(f"{error} (or use another --state-dir)") from error
        self._creds.update(generated.creds)
        return generated

    async def _prepare_bus(self) -> None:
        """Create or update the namespace's streams (and the local backend's buckets) as the
        admin identity, before any service starts: services may only read their info."""
        from mdq.settings import CommonSettings

        await prepare_bus(
            self._nats_url,
            namespace=self.namespace,
            replicas=CommonSettings().stream_replicas,
            local_backend=self.backend == "local",
            local_clusters=self.local_clusters,
            creds=self._creds.get("admin"),
        )

    async def _prepare_bus_later(self) -> None:
        try:
            await self._prepare_bus()
        except Exception as error:  # the services still check (and wait for) the streams
            self._note(f"creating the streams failed: {error!r}")

    async def _start_servers(self) -> None:
        if not self._nats_url:
            generated = await asyncio.to_thread(self._secure_bus)
            self._warn_if_the_disk_is_short(self.state_dir / "nats")
            self._servers.nats = await asyncio.to_thread(
                start_nats,
                self.state_dir / "nats",
                log_file=touch_private(self.logs_dir / "nats-server.log"),
                # included, not copied: a revocation (`mdq tenant rm`, a rotation) applies
                # when the server reloads (``reload_embedded_nats``)
                auth_file=generated.server_block,
            )
            self._nats_url = self._servers.nats.url
            log_file = self._servers.nats.log_file
            self._server_watches.append(
                ServerWatch(
                    NATS_SERVER,
                    log_file,
                    time.time(),
                    store=self._servers.nats.store_dir,
                    log_offset=log_file.stat().st_size,  # what earlier servers said is done
                )
            )
        if not self._database_url:
            self._servers.postgres = await asyncio.to_thread(
                start_postgres,
                self.state_dir / "postgres",
                database="mdq",
                keep=False,
                admin_password=load_or_create_passwords(self.state_dir).admin,
            )
            self._database_url = self._servers.postgres.url
            self._server_watches.append(
                ServerWatch(POSTGRES, self._servers.postgres.data_dir / "log", time.time())
            )

    def _warn_if_the_disk_is_short(self, store: Path) -> None:
        """Say so when the streams' limits (``MDQ_STORAGE_*``) add up to more than the disk
        under the NATS store has free: JetStream would find the disk full before a limit."""
        store.mkdir(parents=True, exist_ok=True)
        needed, free = StorageSettings().server_bytes(), shutil.disk_usage(store).free
        if needed > free:
            line = (
                f"the streams' size limits (MDQ_STORAGE_*) add up to {needed / 2**30:.1f} GiB, "
                f"more than the {free / 2**30:.1f} GiB free under {store}: lower them "
                "(docs/durability.md, Bounded storage)"
            )
            self._note(line)
            print(f"mdq up: warning: {line}", file=sys.stderr, flush=True)

    def _server_pid(self, name: str) -> int | None:
        server = self._servers.nats if name == NATS_SERVER else self._servers.postgres
        return None if server is None else server.pid

    def _server_exit_status(self, name: str) -> str | None:
        server = self._servers.nats if name == NATS_SERVER else self._servers.postgres
        return None if server is None else server.exit_status()

    def _restart_server(self, name: str) -> None:
        """Start the named embedded server again, in place (blocking: run in a thread)."""
        if name == NATS_SERVER:
            assert self._servers.nats is not None
            self._servers.nats = self._servers.nats.restarted()
        else:
            assert self._servers.postgres is not None
            self._servers.postgres.restart()

    def _migrate(self) -> None:
        """Roles, migrations (as the owner) and grants; remember each role's URL."""
        self._database = prepare(
            self._database_url, load_or_create_passwords(self.state_dir), role_names_from_env()
        )
        if self._servers.postgres is not None:  # the whole server is the stack's
            asyncio.run(close_other_databases(self._database_url))

    def _stop_servers(self) -> None:
        if self._servers.nats is not None:
            self._servers.nats.stop()
            self._servers.nats = None
        if self._servers.postgres is not None:
            with contextlib.suppress(Exception):
                self._servers.postgres.stop()
            self._servers.postgres = None

    def _choose_metrics_port(self) -> int:
        """The given port (0: the first free one from 9464), else ``MDQ_METRICS_PORT``, else
        the first free one from 9464, claimed until the stack stops."""
        if self._metrics_port:
            return self._metrics_port
        if self._metrics_port is None and (configured := os.environ.get("MDQ_METRICS_PORT")):
            return int(configured)
        port, self._metrics_port_claim = claim_port(DEFAULT_METRICS_PORT)
        return port

    def _console_token(self) -> Path:
        """The console's access token (``services.console.access``): made once under the
        secrets folder (0600) and kept, so a link keeps working across restarts of the
        stack."""
        return ensure_token_file(self.state_dir / SECRETS_DIR / CONSOLE_TOKEN_FILE)

    def _choose_console_port(self) -> int:
        """``MDQ_CONSOLE_PORT``, else the first free one from 8089, claimed until the stack
        stops (as the metrics port is)."""
        if configured := os.environ.get("MDQ_CONSOLE_PORT"):
            return int(configured)
        port, self._console_port_claim = claim_port(DEFAULT_CONSOLE_PORT, purpose="the console")
        return port

    # -- children --------------------------------------------------------------------------
    def _programs(self) -> list[tuple[str, tuple[str, ...]]]:
        python = sys.executable
        programs: list[tuple[str, tuple[str, ...]]] = [
            (name, (python, "-m", f"services.{name}")) for name in self._services
        ]
        if self.backend == "local":
            agent = (python, "-m", "mdq.backends.local")
            if not self.local_clusters:
                programs.append((LOCAL_AGENT, agent))
            for cluster in self.local_clusters:
                programs.append((f"{LOCAL_AGENT}-{cluster}", agent))
        return programs

    @property
    def backend_kind(self) -> str:
        """What the services are told to use: the backend, or "clusters" (``ClusterRouter``)
        when the stack runs named local clusters or has remote ones."""
        return "clusters" if self.local_clusters or self.remote_clusters else self.backend

    @property
    def clusters_file(self) -> Path:
        return self.state_dir / "clusters.json"

    def _write_clusters_file(self) -> None:
        from mdq.backends.clusters import ClusterEntry, clusters_json

        entries = [
            *(
                ClusterEntry(name=cluster, kind="local", labels={"site": cluster})
                for cluster in self.local_clusters
            ),
            *self.remote_clusters,
        ]
        self.clusters_file.write_text(clusters_json(entries) + "\n", encoding="utf-8")

    def _child_env(self, metrics_port: int) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in DATABASE_ENV}
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
        env.update(
            {
                "NATS_URL": self._nats_url,
                "MDQ_NAMESPACE": self.namespace,
                "MDQ_DATA_DIR": str(self.data_dir),
                "MDQ_STATE_DIR": str(self.state_dir),
                "MDQ_BACKEND": self.backend_kind,
                "MDQ_PLACEMENT_BACKEND": self.backend_kind,
                "MDQ_WATCHER_BACKEND": self.backend_kind,
                "MDQ_METRICS_BACKEND": self.backend_kind,
                "MDQ_METRICS_PORT": str(metrics_port),
                "MDQ_METRICS_HTTP_HOST": "127.0.0.1",  # on one machine, nobody else scrapes it
                "MDQ_LOCAL_NODES": str(self.local_nodes),
                "MDQ_CONSOLE_PORT": str(self._console_port),
                "MDQ_CONSOLE_HOST": "127.0.0.1",  # this machine only, and only with its token
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.local_clusters or self.remote_clusters:
            env["MDQ_CLUSTERS_FILE"] = str(self.clusters_file)
        env.update(self._extra_env)
        return env

    def child_env(self, name: str) -> dict[str, str]:
        """The environment the named child is started with: its own NATS identity; a database
        for the watcher (the writer's URL) and the console (the read-only role's) alone
        (``DATABASE_ENV`` is taken out of everyone else's)."""
        env = {**self._env, **self._identity_env(name)}
        env[HEALTH_FILE_ENV] = str(self._health_file(name))
        if name.startswith(f"{LOCAL_AGENT}-"):
            env["MDQ_LOCAL_CLUSTER"] = name.removeprefix(f"{LOCAL_AGENT}-")
        if name == "watcher" and self._database is not None:
            env["DATABASE_URL"] = self._database.urls.writer
        if name == "console" and self._database is not None:
            env["DATABASE_URL"] = self._database.urls.reader
        if name == "console":
            env[CONSOLE_TOKEN_ENV] = str(self._console_token_file)
        if name == "metrics":
            env[METRICS_TOKEN_ENV] = str(self._console_token_file)
        return env

    def _identity_env(self, child: str) -> dict[str, str]:
        """The NATS credentials of one child (none when the server needs none); placement
        alone also gets the runner issuer: it mints every runner's own credentials, the
        node agents' included (they ask it, holding no key: docs/security.md)."""
        identity = "agent" if child.startswith(LOCAL_AGENT) else CHILD_IDENTITY.get(child, child)
        if identity not in self._creds:
            return {}
        env = {CREDS_ENV: str(self._creds[identity])}
        if identity == "placement":
            issuer = nats_secrets_dir(self.state_dir) / RUNNER_ISSUER_FILE
            env[RUNNER_ISSUER_ENV] = str(issuer)
        return env

    def _child(self, name: str, argv: tuple[str, ...]) -> ChildProcess:
        return ChildProcess(
            name=name,
            argv=argv,
            log_path=self.logs_dir / f"{name}.log",
            health_file=self._health_file(name),
        )

    def _health_file(self, name: str) -> Path:
        return self.health_dir / f"{name}.alive"

    def _spawn(self, child: ChildProcess) -> None:
        """Start ``child`` with its output appended to its log; started all the same, its
        output lost, when the log cannot be opened (a full disk must not stop a restart)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        header = f"---- {stamp} mdq stack starts {' '.join(child.argv)}\n".encode()
        try:
            if child.log_file is None or child.log_file.closed:
                child.log_file = open_log(child.log_path)
            os.write(child.log_file.fileno(), header)  # unbuffered: nothing left to flush later
        except OSError as error:
            self._note(f"{child.name}: could not write {child.log_path} ({error}); starting it")
        if child.health_file is not None:  # made here, so that renewing it needs no room
            with contextlib.suppress(OSError):
                touch_private(child.health_file)
        log_file = child.log_file
        output = log_file if log_file is not None and not log_file.closed else subprocess.DEVNULL
        child.process = subprocess.Popen(
            child.argv,
            env=self.child_env(child.name),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        child.started_at = time.monotonic()
        child.started_wall = time.time()

    async def _supervise(self) -> None:
        """Supervision steps every ``poll_s`` until the stack stops. A step that fails is said
        (at most once a minute for the same failure) and the next step goes on: nothing ends
        the supervision but ``stop``."""
        said: tuple[str, float] = ("", 0.0)
        while not self._stopping:
            try:
                self._supervise_step(time.monotonic())
            except Exception as error:
                what = f"a supervision step failed: {error!r}"
                if what != said[0] or time.monotonic() - said[1] >= FAILED_STEP_SAID_EVERY_S:
                    said = (what, time.monotonic())
                    self._note(f"{what}; supervising on")
                    with contextlib.suppress(OSError, ValueError):
                        traceback.print_exc(file=sys.stderr)
            await asyncio.sleep(self._poll_s)

    def _supervise_step(self, now: float) -> None:
        """One look at every server and child: restart what ended, after its backoff."""
        changed = False
        for watch in self._server_watches:
            changed |= self._supervise_server(watch, now)
        for child in self._children:
            process = child.process
            if process is None:
                if now >= child.next_start_at:
                    child.restarts += 1
                    self._note(f"{child.name}: restart #{child.restarts}")
                    self._spawn(child)
                    changed = True
                continue
            code = process.poll()
            if code is None:
                if (silent := child.silent_for(now)) > self._stuck_after_s:
                    self._kill_stuck(child, process, silent, now)
                elif now - child.started_at >= self._healthy_after_s:
                    child.consecutive_failures = 0
                continue
            child.last_exit_code = code
            child.process = None
            self._kill_group(process.pid, signal.SIGKILL)
            child.consecutive_failures += 1
            child.next_start_at = self._restart_later(
                child.name, f"exited with {code}", child.consecutive_failures, child.log_path
            )
            changed = True
        if changed:
            self._write_status()

    def _kill_stuck(
        self, child: ChildProcess, process: subprocess.Popen[bytes], silent: float, now: float
    ) -> None:
        """kill -9 a child that runs but renews its liveness file no more; the next steps find
        it exited and restart it, as after any crash."""
        self._note(
            f"{child.name}: running but silent for {silent:.0f} s (it renews {child.health_file} "
            f"every {RENEW_EVERY_S:g} s while its loop runs): stuck or stopped; killing it"
        )
        self._kill_group(process.pid, signal.SIGKILL)
        child.renewed_at = now  # one kill, not one a step until the exit is seen

    def _backoff(self, consecutive_failures: int) -> float:
        return min(self._max_backoff_s, 0.5 * 2.0 ** (consecutive_failures - 1))

    def _restart_later(self, name: str, how: str, consecutive_failures: int, log: Path) -> float:
        """Note that a part ended; return when (monotonic) to start it again (the backoff)."""
        delay = self._backoff(consecutive_failures)
        self._note(f"{name}: {how}; restarting in {delay:.1f} s (log: {log})")
        return time.monotonic() + delay

    def _supervise_server(self, watch: ServerWatch, now: float) -> bool:
        """One supervision step for an embedded server; True if its status changed."""
        if watch.restarting is not None:
            if not watch.restarting.done():
                return False
            task, watch.restarting = watch.restarting, None
            error = task.exception()
            if error is None:
                down_for = now - (watch.down_since or now)
                watch.down_since = None
                watch.started_at = time.time()
                watch.answered_at = now
                self._note(
                    f"{watch.name}: running again (pid {self._server_pid(watch.name)}), "
                    f"{down_for:.1f} s after it went down"
                )
                return True
            watch.consecutive_failures += 1
            delay = self._backoff(watch.consecutive_failures)
            watch.next_start_at = now + delay
            self._note(f"{watch.name}: restart failed ({error}); next try in {delay:.1f} s")
            return False
        ended = self._server_exit_status(watch.name)
        if ended is None and watch.store is not None and self._store_healed(watch):
            return True
        if ended is None and (silent := now - watch.answered_at) > self._stuck_after_s:
            self._note(
                f"{watch.name}: running but has answered no probe for {silent:.0f} s (asked "
                f"every {SERVER_PROBE_EVERY_S:g} s): stuck or stopped; killing it"
            )
            self._kill_server(watch.name)
            watch.answered_at = now  # one kill, not one a step until the exit is seen
            return False
        if ended is None:
            if watch.started_at is not None and time.time() - watch.started_at >= (
                self._healthy_after_s
            ):
                watch.consecutive_failures = 0
            return False
        if watch.down_since is None:
            watch.down_since = now
            watch.last_exit = ended
            watch.consecutive_failures += 1
            watch.next_start_at = self._restart_later(
                watch.name, f"exited ({ended})", watch.consecutive_failures, watch.log_path
            )
            return True
        if now >= watch.next_start_at:
            watch.restarts += 1
            self._note(f"{watch.name}: restart #{watch.restarts}")
            watch.restarting = asyncio.create_task(
                asyncio.to_thread(self._restart_server, watch.name),
                name=f"mdq-stack-restart-{watch.name}",
            )
        return False

    async def _probe_servers(self) -> None:
        """Ask each running embedded server, every ``SERVER_PROBE_EVERY_S``, whether it
        answers at all (``mdq.stack.probes``); the supervision restarts one silent for
        ``stuck_after_s`` (``_supervise_server``)."""
        while not self._stopping:
            for watch in self._server_watches:
                running = watch.restarting is None and watch.down_since is None
                if running and await self._server_answers(watch.name):
                    watch.answered_at = time.monotonic()
            await asyncio.sleep(SERVER_PROBE_EVERY_S)

    async def _server_answers(self, name: str) -> bool:
        if name == NATS_SERVER and self._servers.nats is not None:
            return await nats_answers(self._servers.nats.port, limit_s=SERVER_PROBE_LIMIT_S)
        if name == POSTGRES and self._servers.postgres is not None:
            socket = self._servers.postgres.socket
            return socket is not None and await postgres_answers(
                socket, limit_s=SERVER_PROBE_LIMIT_S
            )
        return True

    def _kill_server(self, name: str) -> None:
        """kill -9 an embedded server, PostgreSQL's backends with its postmaster (nothing
        acknowledged is lost: fsync-always; PostgreSQL's own crash recovery); the next steps
        find it gone and start it again in place."""
        pid = self._server_pid(name)
        if pid is None:
            return
        with contextlib.suppress(psutil.Error):
            server = psutil.Process(pid)
            for process in [*server.children(recursive=True), server]:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGKILL)

    def _store_healed(self, watch: ServerWatch) -> bool:
        """Restart a NATS server whose store met a full disk, once the disk has room again;
        True when it was killed (the next step starts it again, as after any exit).

        nats-server keeps the error of a stream's write that found the disk full and refuses
        every later write to that stream with it, whatever room comes back, until it restarts
        (2.15; docs/architecture.md, "A full disk under the NATS store"). The disk is found full
        by its free space (every supervision step) or by the server's own log line (which a
        full disk may also have kept from being written). kill -9 loses nothing acknowledged
        (fsync-always)."""
        assert watch.store is not None
        try:
            free = shutil.disk_usage(watch.store).free
        except OSError:
            return False
        if watch.store_fault is None:
            fault = nats_store_failure(self._read_server_log(watch))
            if fault is None and free < STORE_FULL_BELOW_BYTES:
                fault = f"the disk under {watch.store} is full ({free} bytes free)"
            if fault is not None:
                watch.store_fault = fault
                self._note(
                    f"{watch.name}: {fault}; JetStream refuses every later write of a stream "
                    "that met a full disk until it restarts: restarting it once the disk has "
                    f"{STORE_ROOM_BYTES // 2**20} MiB free"
                )
            return False
        if free < STORE_ROOM_BYTES:
            return False
        self._note(f"{watch.name}: the disk under {watch.store} has room again; restarting it")
        watch.store_fault = None
        with contextlib.suppress(OSError):  # what this server said is about this server
            watch.log_offset = watch.log_path.stat().st_size
        self._kill_server(watch.name)
        return True

    @staticmethod
    def _read_server_log(watch: ServerWatch) -> str:
        """The whole lines the server's log gained since the last read (at most the last
        ``SERVER_LOG_READ_BYTES`` of them)."""
        try:
            size = watch.log_path.stat().st_size
            if size < watch.log_offset:  # a new file
                watch.log_offset = 0
            start = max(watch.log_offset, size - SERVER_LOG_READ_BYTES)
            if size == start:
                return ""
            with watch.log_path.open("rb") as log:
                log.seek(start)
                data = log.read(size - start)
        except OSError:
            return ""
        whole = data[: data.rfind(b"\n") + 1]
        watch.log_offset = start + len(whole)
        return whole.decode("utf-8", "replace")

    def _stop_grace_s(self, name: str) -> float:
        """How long the named child may take to stop: the stack's grace, and for a node agent
        at least its own worst case (its pods' grace, the wait to reap them and a margin to
        report its nodes), so that a stop never SIGKILLs an agent still stopping its pods."""
        if not name.startswith(LOCAL_AGENT):
            return self._grace_s
        pod_grace_s = float(LocalAgentSettings.model_fields["grace_s"].default)
        with contextlib.suppress(ValueError):  # such an agent does not start anyway
            pod_grace_s = float(self._env.get("MDQ_LOCAL_GRACE_S", pod_grace_s))
        return max(self._grace_s, pod_grace_s + REAP_AFTER_KILL_S + AGENT_REPORT_S)

    def _stop_children(self) -> None:
        running = [child for child in self._children if child.process is not None]
        for child in running:
            assert child.process is not None
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for child in running:
            assert child.process is not None
            grace_s = self._stop_grace_s(child.name)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=max(0.0, signalled + grace_s - time.monotonic()))
            hung = child.process.poll() is None
            if hung:
                self._note(f"{child.name}: no exit {grace_s:g} s after SIGTERM; SIGKILL")
            self._kill_group(child.process.pid, signal.SIGKILL)
            child.process.wait()
            child.last_exit_code = child.process.returncode
            # 0: a clean stop; -SIGTERM: ended by the signal itself, before the service set
            # up its handling (a stop while it still imports its modules)
            if not hung and child.last_exit_code not in (0, -signal.SIGTERM):
                self._note(f"{child.name}: exited with {child.last_exit_code} on stop")
        for child in self._children:
            if child.log_file is not None:
                child.log_file.close()

    @staticmethod
    def _kill_group(pid: int, sig: signal.Signals) -> None:
        """Signal the child's whole process group (it leads its own session), e.g. runner
        processes left behind by a node agent."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _note(self, line: str) -> None:
        """A line in ``stack.log``; on stderr when it cannot be written there (a full disk
        must not stop the supervision)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            private_folder(self.logs_dir)
            with open_log(self.logs_dir / "stack.log") as log:
                log.write(f"{stamp} {line}\n".encode())
        except OSError as error:
            with contextlib.suppress(OSError, ValueError):
                print(f"mdq up: {stamp} {line} (stack.log: {error})", file=sys.stderr, flush=True)
