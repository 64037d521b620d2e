"""Checks of the ``mdq`` command's arguments before anything is asked of NATS or PostgreSQL.

A job id is checked against the ids intake makes (``mdq.core.tenants.check_job_id``): a
wildcard, a space or a stray dot is refused naming the argument (``InvalidInput``, exit 2),
never sent as a subject the server would reject or, worse, match.
"""

from __future__ import annotations

from collections.abc import Iterable

from mdq.core.tenants import check_job_id


def job_ids_argument(values: Iterable[str], name: str = "JOB") -> list[str]:
    """``values``, each checked to be a job id; ``InvalidInput`` naming ``name`` and the value
    otherwise."""
    return [check_job_id(value, field=name) for value in values]


def job_id_argument(value: str, name: str = "JOB") -> str:
    """``value`` if it is a job id; ``InvalidInput`` naming ``name`` and the value otherwise."""
    return check_job_id(value, field=name)
