"""Submitting to a stack that is still starting (end-to-end tests and benchmarks): its services
come up in the background, and intake answers only once it is up."""

from __future__ import annotations

import asyncio

from mdq.contracts import pb
from mdq.sdk.client import IntakeUnavailable, MdqClient


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
