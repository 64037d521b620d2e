"""A running stack's files: ``<state>/stack.json`` (where its parts are) and ``<state>/status.json``
(how each part is doing), written by the supervisor and read by the client commands."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psutil

from mdq.errors import Unavailable

CONSOLE_TOKEN_FILE = "console.token"
"""The console's access token, under ``<state>/secrets/`` (``services.console.access``)."""
STACK_FILE = "stack.json"
STATUS_FILE = "status.json"
NATS_SERVER = "nats-server"
POSTGRES = "postgres"
LOCAL_AGENT = "local-backend"
"""The node agent's child name (``local-backend-<cluster>`` for each named local cluster)."""


def default_state_dir() -> Path:
    """``MDQ_STATE_DIR``, or ``.mdq`` in the working directory."""
    return Path(os.environ.get("MDQ_STATE_DIR") or ".mdq").resolve()


class StackError(Unavailable, RuntimeError):
    """The stack cannot start (another one runs on the same state folder, a server failed)."""


@dataclass(frozen=True, slots=True)
class StackInfo:
    """Where a running stack's parts are; the content of ``<state>/stack.json``."""

    nats_url: str
    database_url: str
    namespace: str
    metrics_url: str
    state_dir: str
    logs_dir: str
    data_dir: str
    backend: str
    pid: int
    embedded_nats: bool
    embedded_postgres: bool
    nats_creds: str = ""
    """The CLI's NATS credentials ("" when the server needs none): what ``mdq`` commands and
    the SDK use when they find the stack here."""
    nats_admin_creds: str = ""
    """Credentials that may manage streams (``mdq replay --rebuild``); keep them to yourself."""
    database_password_file: str = ""
    """The file holding the password of ``database_url``'s role (the reader: ``database_url``
    is written without it); '' when the URL needs none."""
    console_url: str = ""
    """The web console ("" when the stack runs none)."""
    console_token_file: str = ""
    """The file holding the console's access token (0600, under the secrets folder): only who
    can read it gets in (``console_link``)."""

    def console_link(self, path: str = "") -> str:
        """The console's address of ``path`` (e.g. ``jobs``) with its access token: what a
        person opens; "" when the stack runs no console."""
        if not self.console_url:
            return ""
        link = f"{self.console_url}{path.lstrip('/')}"
        if not self.console_token_file:
            return link
        token = Path(self.console_token_file).read_text(encoding="utf-8").strip()
        separator = "&" if "?" in link else "?"
        return f"{link}{separator}{urlencode({'token': token})}"

    def database_dsn(self) -> str:
        """``database_url`` with its password (read from ``database_password_file``): what
        the CLI connects with; '' when there is no database."""
        if not self.database_url or not self.database_password_file:
            return self.database_url
        from mdq.store.roles import role_url, url_user

        password = Path(self.database_password_file).read_text(encoding="utf-8").strip()
        return role_url(self.database_url, user=url_user(self.database_url), password=password)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StackInfo:
        known = {name for name in cls.__dataclass_fields__}
        data = {key: value for key, value in json.loads(text).items() if key in known}
        return cls(**data)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie of ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_stack_info(state_dir: Path) -> StackInfo | None:
    """The info of the stack running on ``state_dir``, or None (none, or its owner died)."""
    path = state_dir / STACK_FILE
    try:
        info = StackInfo.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    return info if pid_alive(info.pid) else None


@dataclass(frozen=True, slots=True)
class ChildStatus:
    """What ``Stack.status`` says about one supervised part (a server or a child process)."""

    name: str
    pid: int | None
    running: bool
    restarts: int
    last_exit_code: int | None
    log_path: Path
    kind: str = "service"
    """``server`` (embedded NATS or PostgreSQL), ``service`` or ``agent`` (the node agent)."""
    last_exit: str | None = None
    """How the previous process ended: ``exit 1``, ``signal 9``, ``gone``; None if none has."""
    started_at: float | None = None
    """Wall-clock time (epoch seconds) the current process started; None while it is down."""

    def uptime_s(self, now: float) -> float | None:
        """Seconds the current process has been running at ``now``; None while it is down."""
        return None if self.started_at is None or not self.running else now - self.started_at

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "pid": self.pid,
            "running": self.running,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "last_exit": self.last_exit,
            "started_at": self.started_at,
            "log_path": str(self.log_path),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChildStatus:
        return cls(
            name=str(data["name"]),
            kind=str(data.get("kind", "service")),
            pid=data.get("pid"),
            running=bool(data.get("running")),
            restarts=int(data.get("restarts", 0)),
            last_exit_code=data.get("last_exit_code"),
            last_exit=data.get("last_exit"),
            started_at=data.get("started_at"),
            log_path=Path(str(data.get("log_path", ""))),
        )


def read_stack_status(state_dir: Path) -> tuple[float, list[ChildStatus]] | None:
    """When the running stack on ``state_dir`` last wrote its status, and every part's status;
    None when there is no such file (no stack)."""
    try:
        data = json.loads((state_dir / STATUS_FILE).read_text(encoding="utf-8"))
        return float(data["updated_at"]), [ChildStatus.from_dict(c) for c in data["children"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def reload_embedded_nats(state_dir: Path) -> bool:
    """Have the embedded nats-server of the stack running on ``state_dir`` reload its
    configuration (SIGHUP): a revocation written into ``nats-auth.conf`` applies at once. False
    when no stack with an embedded server runs there (a server of the user's, say)."""
    found = read_stack_status(state_dir)
    if found is None or read_stack_info(state_dir) is None:
        return False
    for part in found[1]:
        if part.name != NATS_SERVER or not part.running or part.pid is None:
            continue
        try:
            if "nats-server" not in psutil.Process(part.pid).name():
                return False  # the pid is someone else's now
            os.kill(part.pid, signal.SIGHUP)
        except (psutil.Error, OSError):
            return False
        return True
    return False
