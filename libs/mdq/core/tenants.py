"""Tenants: who submits, and what each may do (pure).

A tenant is a group of users sharing one NATS identity (``mdq tenant add``): the server lets it
publish submits only on its own subject token (``mdq.submit.<tenant>``) and read only its own
jobs' events, so intake takes the tenant from the subject the server enforced, never from
the payload. A tenant's request and job ids start with its name and a dot
(``alice.3f2a9c0d1e4b-relax``, ``mdq.core.ids``). Jobs submitted by the operator's own
identity (``cli``) have no tenant ("").
"""

from __future__ import annotations

import re

TENANT_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,30}")
"""A tenant's name (fullmatch): a subject token, a stream-name suffix and a PostgreSQL role
suffix alike."""
_LOOKS_LIKE_JOB_ID = re.compile(r"[0-9a-f]{12}-")
RESERVED = frozenset(
    {"intake", "placement", "watcher", "recovery", "metrics", "agent", "cli", "runners", "admin"}
    | {"tenant", "operator"}
)
"""Names no tenant may take: the bus identities (a tenant's runners listen on
``_INBOX_<tenant>.<job>``, which must not fall under an identity's ``_INBOX_<identity>.>``),
``tenant`` (the tenants' own identities are ``tenant.<name>``) and ``operator``."""


class TenantNameError(ValueError):
    """A tenant name that cannot be used."""


def validate_tenant_name(name: str) -> str:
    """``name`` if it can name a tenant; raises ``TenantNameError`` saying why not."""
    if not TENANT_PATTERN.fullmatch(name):
        raise TenantNameError(
            f"tenant name {name!r} must be 1 to 31 lowercase letters, digits or '-', "
            "starting with a letter"
        )
    if name in RESERVED:
        raise TenantNameError(f"tenant name {name!r} is reserved (an identity of mdq's own)")
    if _LOOKS_LIKE_JOB_ID.match(name):
        raise TenantNameError(
            f"tenant name {name!r} starts like a job id (12 hex digits and a dash)"
        )
    return name
