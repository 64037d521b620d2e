"""Submitting to a stack that is still starting (end-to-end tests and benchmarks): the request of
a campaign written as its file would be, and its submit once intake answers (a stack's services
come up in the background)."""

from __future__ import annotations

import asyncio

from google.protobuf import json_format

from mdq.contracts import pb
from mdq.sdk.client import IntakeUnavailable, MdqClient


def water_job(
    name: str,
    *,
    steps: int,
    report_interval_steps: int,
    checkpoint_interval_steps: int,
    memory_mb: int = 1024,
    box_nm: float = 1.6,
    **fields: object,
) -> dict[str, object]:
    """A one-core OpenMM job on a box of water, as a campaign file writes it (``fields``: any
    more of its fields)."""
    return {
        "name": name,
        "system": {"water_box": {"box_nm": box_nm}},
        "steps": steps,
        "report_interval_steps": report_interval_steps,
        "checkpoint_interval_steps": checkpoint_interval_steps,
        "resources": {"cpu": 1, "memory_mb": memory_mb},
        **fields,
    }


def submit_request(*jobs: dict[str, object], key: str) -> pb.SubmitRequest:
    """The submit request of ``jobs`` (as a campaign file writes them) under the idempotency
    key ``key``."""
    return json_format.ParseDict({"idempotency_key": key, "jobs": list(jobs)}, pb.SubmitRequest())


class IntakeSilent(RuntimeError):
    """Intake answered none of the tries of a submit."""


async def submit_when_ready(
    client: MdqClient,
    request: pb.SubmitRequest,
    *,
    tries: int = 60,
    answer_within_s: float = 5.0,
    every_s: float = 0.5,
) -> list[str]:
    """The job ids of ``request``, submitted once intake answers: up to ``tries`` times,
    ``every_s`` apart, each waiting ``answer_within_s`` seconds for an answer."""
    for _ in range(tries):
        try:
            return await client.submit(request, timeout=answer_within_s)
        except IntakeUnavailable:
            await asyncio.sleep(every_s)
    raise IntakeSilent("intake never answered")
