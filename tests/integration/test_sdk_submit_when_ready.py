"""``MdqClient.submit_when_ready`` on a real NATS server: it tries again while nobody answers,
with the same idempotency key every time, and gives up with ``IntakeUnavailable`` once its time
is over. An answerer of its own plays an intake that starts late."""

from __future__ import annotations

import time

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mdq.bus.codec import encode
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.sdk import MdqClient
from mdq.sdk.client import IntakeUnavailable


async def test_it_waits_for_a_late_intake_with_one_key(nc: Client, subjects: Subjects) -> None:
    keys: list[str] = []

    async def late_intake(message: Msg) -> None:
        request = pb.SubmitRequest.FromString(message.data)
        keys.append(request.idempotency_key)
        if len(keys) < 3:
            return  # still starting: no answer, the client times out
        await nc.publish(message.reply, encode(pb.SubmitReply(job_ids=["r-1-a"])))

    answering = await nc.subscribe(subjects.api_submit, cb=late_intake)
    try:
        client = MdqClient(nc=nc, subjects=subjects)
        request = pb.SubmitRequest(jobs=[pb.JobSpec(name="a")])  # no key of its own
        ids = await client.submit_when_ready(
            request, within_s=30, answer_within_s=0.3, every_s=0.05
        )
    finally:
        await answering.unsubscribe()
    assert ids == ["r-1-a"]
    assert len(keys) == 3
    assert keys[0] and len(set(keys)) == 1, "every try is the same submit"


async def test_it_gives_up_when_no_intake_answers(nc: Client, subjects: Subjects) -> None:
    client = MdqClient(nc=nc, subjects=subjects)
    started = time.monotonic()
    with pytest.raises(IntakeUnavailable):
        await client.submit_when_ready(
            pb.SubmitRequest(idempotency_key="k", jobs=[pb.JobSpec(name="a")]),
            within_s=1.0,
            answer_within_s=0.2,
            every_s=0.05,
        )
    assert 1.0 <= time.monotonic() - started < 10.0
