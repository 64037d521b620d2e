"""The whole of mdq on one machine: embedded NATS and PostgreSQL and every service, supervised.

``Stack`` (``mdq.stack.supervisor``) is what ``mdq up`` and ``mdq demo`` start and stop; a
running stack's files, ``stack.json`` and ``status.json``, are ``mdq.stack.files``'; the ports
it claims for /metrics and the console, ``mdq.stack.ports``'. How it starts, restarts and stops
each part: docs/architecture.md, "On one machine: the stack".
"""

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
    pid_alive,
    read_stack_info,
    read_stack_status,
    reload_embedded_nats,
)
from mdq.stack.ports import DEFAULT_CONSOLE_PORT, DEFAULT_METRICS_PORT, claim_port
from mdq.stack.supervisor import (
    BACKENDS,
    CHILD_IDENTITY,
    CONSOLE_TOKEN_ENV,
    DATABASE_ENV,
    LOCAL_CLUSTER_PREFIX,
    METRICS_TOKEN_ENV,
    SERVICES,
    ChildProcess,
    Stack,
)

__all__ = [
    "BACKENDS",
    "CHILD_IDENTITY",
    "CONSOLE_TOKEN_ENV",
    "CONSOLE_TOKEN_FILE",
    "DATABASE_ENV",
    "DEFAULT_CONSOLE_PORT",
    "DEFAULT_METRICS_PORT",
    "LOCAL_AGENT",
    "LOCAL_CLUSTER_PREFIX",
    "METRICS_TOKEN_ENV",
    "NATS_SERVER",
    "POSTGRES",
    "SERVICES",
    "STACK_FILE",
    "STATUS_FILE",
    "ChildProcess",
    "ChildStatus",
    "Stack",
    "StackError",
    "StackInfo",
    "claim_port",
    "default_state_dir",
    "pid_alive",
    "read_stack_info",
    "read_stack_status",
    "reload_embedded_nats",
]
