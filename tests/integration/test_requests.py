"""``mdq.bus.requests.Requests`` against a real NATS JetStream: the same acks and errors as
nats-py's ``JetStreamContext.publish`` and ``KeyValue``, over one reply subscription."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError

from mdq.bus.requests import (
    CREATE_ONLY,
    MAX_ATOMIC_BATCH,
    PLAIN_UP_TO,
    AtomicGroupCommit,
    GroupCommit,
    Requests,
)
from mdq.bus.subjects import Subjects


@pytest.fixture
async def requests(nc: Client) -> AsyncIterator[Requests]:
    client = await Requests(nc, timeout_s=2.0).start()
    yield client
    await client.close()


async def test_publish_is_acknowledged_like_jetstream_publish(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    subject = subjects.job("0123456789ab-a", "submitted")
    first = await requests.publish(subject, b"one", headers={"Nats-Msg-Id": "m1"})
    again = await requests.publish(subject, b"one", headers={"Nats-Msg-Id": "m1"})
    stored = await nc.jetstream().get_msg(subjects.jobs_stream, first.seq)

    assert first.stream == subjects.jobs_stream and not first.duplicate
    assert again.duplicate and again.seq == first.seq
    assert stored.data == b"one"


async def test_a_failed_expectation_is_an_api_error(requests: Requests, subjects: Subjects) -> None:
    subject = subjects.job("0123456789ab-a", "bound")
    await requests.publish(subject, b"first", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    with pytest.raises(APIError) as refused:
        await requests.publish(
            subject, b"second", headers={"Nats-Expected-Last-Subject-Sequence": "0"}
        )
    assert refused.value.err_code == 10071  # wrong last sequence


async def test_no_stream_for_the_subject(requests: Requests, namespace: str) -> None:
    with pytest.raises(NoStreamResponseError):
        await requests.publish(f"{namespace}.requests.nowhere", b"x")


async def test_a_request_nobody_answers_times_out(
    requests: Requests, nc: Client, namespace: str
) -> None:
    sink = await nc.subscribe(f"{namespace}.requests.silent")  # listens, never answers
    with pytest.raises(nats.errors.TimeoutError):
        await requests.request(f"{namespace}.requests.silent", b"hello", timeout_s=0.2)
    await sink.unsubscribe()


async def test_a_request_to_nobody_has_no_responders(requests: Requests, namespace: str) -> None:
    with pytest.raises(nats.errors.NoRespondersError):
        await requests.request(f"{namespace}.requests.nobody", b"hello")


async def test_publish_many_gives_each_message_its_ack_or_error(
    requests: Requests, nc: Client, subjects: Subjects, namespace: str
) -> None:
    fenced = subjects.job("0123456789ab-b", "bound")
    await requests.publish(fenced, b"taken")
    expect_none = {"Nats-Expected-Last-Subject-Sequence": "0"}
    results = await requests.publish_many(
        [
            (subjects.job("0123456789ab-a", "bound"), b"a", {"Nats-Msg-Id": "a"}),
            (fenced, b"b", expect_none),  # someone wrote there first: refused
            (subjects.job("0123456789ab-a", "bound"), b"a", {"Nats-Msg-Id": "a"}),  # duplicate
            (f"{namespace}.requests.nowhere", b"c", None),  # no stream
            (subjects.job("0123456789ab-c", "bound"), b"c", expect_none),
        ]
    )

    first, refused, duplicate, nowhere, last = results
    assert isinstance(first, PubAck) and not first.duplicate
    assert isinstance(refused, APIError) and refused.err_code == 10071
    assert isinstance(duplicate, PubAck) and duplicate.duplicate and duplicate.seq == first.seq
    assert isinstance(nowhere, NoStreamResponseError)
    assert isinstance(last, PubAck) and last.seq > first.seq
    stored = await nc.jetstream().get_msg(subjects.jobs_stream, last.seq)
    assert stored.data == b"c"


async def test_publish_batch_stores_a_batch_at_once_with_each_message_s_sequence(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    """An atomic batch: every message stored, one after another, each ack naming its own
    sequence; the server's stream info agrees."""
    jobs = [f"0123456789ab-{index}" for index in range(PLAIN_UP_TO + 2)]
    results = await requests.publish_batch(
        [
            (
                subjects.job(job, "submitted"),
                job.encode(),
                {"Nats-Msg-Id": f"s:{job}"} | CREATE_ONLY,
            )
            for job in jobs
        ]
    )

    assert all(isinstance(result, PubAck) for result in results)
    sequences = [result.seq for result in results if isinstance(result, PubAck)]
    assert sequences == list(range(sequences[0], sequences[0] + len(jobs)))
    for job, sequence in zip(jobs, sequences, strict=True):
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, sequence)
        assert stored.subject == subjects.job(job, "submitted") and stored.data == job.encode()
        assert stored.headers is not None and stored.headers["Nats-Batch-Id"]  # one batch


@pytest.mark.parametrize(
    "more", [0, PLAIN_UP_TO], ids=["few-published-plainly", "many-batched-then-one-by-one"]
)
async def test_a_refused_message_gets_its_own_answer_and_keeps_no_other_out(
    requests: Requests, nc: Client, subjects: Subjects, more: int
) -> None:
    """A message the server refuses (a fence that does not hold, a duplicate id) gets its own
    answer, and every other message its ack, exactly as ``publish_many`` gives them: a few
    messages are published plainly; many go as one atomic batch, which the refusal refuses
    whole, and then one by one. Nothing is stored twice."""
    fenced = subjects.job("0123456789ab-b", "bound")
    taken = await requests.publish(fenced, b"taken")
    earlier = await requests.publish(
        subjects.job("0123456789ab-d", "bound"), b"d", headers={"Nats-Msg-Id": "d"}
    )
    messages = [
        (subjects.job("0123456789ab-a", "bound"), b"a", {"Nats-Msg-Id": "a"}),
        (fenced, b"b", CREATE_ONLY),  # someone wrote there first: refused
        (subjects.job("0123456789ab-d", "bound"), b"d", {"Nats-Msg-Id": "d"}),  # duplicate
        (subjects.job("0123456789ab-c", "bound"), b"c", CREATE_ONLY),
    ]
    messages += [
        (subjects.job(f"0123456789ab-m{index}", "bound"), b"m", CREATE_ONLY)
        for index in range(more)
    ]
    results = await requests.publish_batch(messages)

    first, refused, duplicate, last, *others = results
    assert isinstance(first, PubAck) and not first.duplicate
    assert isinstance(refused, APIError) and refused.err_code == 10071
    assert isinstance(duplicate, PubAck) and duplicate.duplicate and duplicate.seq == earlier.seq
    assert isinstance(last, PubAck) and last.seq == first.seq + 1
    assert [ack.seq for ack in others if isinstance(ack, PubAck)] == [
        last.seq + 1 + index for index in range(more)
    ]
    # stored: the two written before, and each message the server took, once
    info = await nc.jetstream().stream_info(subjects.jobs_stream)
    assert info.state.messages == 4 + more and info.state.last_seq == last.seq + more
    assert taken.seq < earlier.seq < first.seq
    for result in (first, last):
        assert isinstance(result, PubAck)
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, result.seq)
        assert "Nats-Batch-Id" not in (stored.headers or {})  # plainly, or one by one after


async def test_group_commit_shares_one_batch_among_callers_and_answers_each(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    """Callers that hand in messages while a batch is in flight go out together in the next
    one: one batch id for several callers, each caller's messages in order, each its own
    results (a refused message sends the whole batch one by one, each still answered)."""
    group = GroupCommit(requests)
    taken = subjects.job("0123456789ab-taken", "bound")
    await requests.publish(taken, b"first")

    def messages(caller: int, count: int) -> list[tuple[str, bytes, dict[str, str] | None]]:
        return [
            (subjects.job(f"0123456789ab-c{caller}x{i}", "bound"), f"{caller}.{i}".encode(), None)
            for i in range(count)
        ]

    first, second, third = await asyncio.gather(
        group.publish(messages(1, 3)), group.publish(messages(2, 5)), group.publish(messages(3, 6))
    )
    assert all(isinstance(r, PubAck) for r in [*first, *second, *third])
    sequences = [r.seq for r in [*first, *second, *third] if isinstance(r, PubAck)]
    assert sequences == list(range(2, 2 + 14))  # stored one after another, callers in order
    batch_ids = set()
    for sequence in sequences:
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, sequence)
        batch_ids.add((stored.headers or {})["Nats-Batch-Id"])
    assert len(batch_ids) == 1  # the callers of the moment shared one batch: one flush

    # callers of the moment with PLAIN_UP_TO messages or fewer together: published plainly
    few = await asyncio.gather(group.publish(messages(5, 2)), group.publish(messages(6, 3)))
    acks = [result for results in few for result in results]
    assert all(isinstance(result, PubAck) for result in acks)
    for ack in acks:
        assert isinstance(ack, PubAck)
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, ack.seq)
        assert "Nats-Batch-Id" not in (stored.headers or {})

    refused, fine = await asyncio.gather(
        group.publish([(taken, b"again", CREATE_ONLY)]), group.publish(messages(4, 2))
    )
    assert isinstance(refused[0], APIError) and refused[0].err_code in (10071, 10164)
    assert all(isinstance(result, PubAck) for result in fine)


async def test_groups_are_stored_all_or_nothing_and_a_refused_one_keeps_no_other_out(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    """``publish_groups``: one group the server refuses (its first message's fence does not
    hold) is stored not at all, not even its other messages; every other group is stored
    whole, in order, each its acks."""
    claimed = subjects.claim("0123456789ab")
    await requests.publish(claimed, b"first")

    def group(name: str, claim: str) -> list[tuple[str, bytes, dict[str, str] | None]]:
        return [
            (claim, name.encode(), CREATE_ONLY),
            (subjects.job(f"{name}-a", "submitted"), b"a", CREATE_ONLY),
            (subjects.job(f"{name}-b", "submitted"), b"b", CREATE_ONLY),
        ]

    names = ["1111111111aa", "0123456789ab", "2222222222bb", "3333333333cc", "4444444444dd"]
    groups = [group(name, subjects.claim(name)) for name in names]
    results = await requests.publish_groups(groups)

    refused = results[1]
    assert isinstance(refused, APIError) and refused.err_code == 10071
    stored: list[str] = []
    for name, result in zip(names, results, strict=True):
        if name == "0123456789ab":
            continue
        assert not isinstance(result, Exception) and len(result) == 3
        for ack in result:
            message = await nc.jetstream().get_msg(subjects.jobs_stream, ack.seq)
            stored.append(message.subject or "")
    assert stored == [
        subject
        for name, each in zip(names, groups, strict=True)
        if name != names[1]
        for subject, _, _ in each
    ]
    info = await nc.jetstream().stream_info(subjects.jobs_stream)
    assert info.state.messages == 1 + 4 * 3  # the first claim, and four whole groups


async def test_small_group_commits_go_in_order_and_big_ones_all_or_nothing(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    """``AtomicGroupCommit``: callers of the same moment with more than ``PLAIN_UP_TO``
    messages together share one atomic batch, each caller whole or not at all; with fewer,
    each caller's messages are written one by one, in order, and it learns how far it got."""
    commit = AtomicGroupCommit(requests)
    taken = subjects.job("0123456789ab-taken", "submitted")
    await requests.publish(taken, b"first")

    alone = await commit.publish(
        [
            (subjects.claim("0123456789ab"), b"claim", CREATE_ONLY),
            (subjects.job("0123456789ab-new", "submitted"), b"new", CREATE_ONLY),
            (taken, b"again", CREATE_ONLY),  # refused: the job is there
            (subjects.job("0123456789ab-never", "submitted"), b"never", CREATE_ONLY),
        ]
    )
    assert len(alone.stored) == 2 and isinstance(alone.error, APIError)
    assert alone.error.err_code == 10071
    assert not await stored_on(nc, subjects, subjects.job("0123456789ab-never", "submitted"))
    for ack in alone.stored:
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, ack.seq)
        assert "Nats-Batch-Id" not in (stored.headers or {})  # one by one

    def claim_and_job(name: str) -> list[tuple[str, bytes, dict[str, str] | None]]:
        return [
            (subjects.claim(name), b"claim", CREATE_ONLY),
            (subjects.job(f"{name}-md", "submitted"), b"md", CREATE_ONLY),
        ]

    few = await asyncio.gather(*(commit.publish(claim_and_job(n)) for n in ("b" * 12, "c" * 12)))
    assert all(result.error is None and len(result.stored) == 2 for result in few)
    for ack in [*few[0].stored, *few[1].stored]:
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, ack.seq)
        assert "Nats-Batch-Id" not in (stored.headers or {})  # few: one by one, side by side

    names = [letter * 12 for letter in "defgh"]
    many = await asyncio.gather(*(commit.publish(claim_and_job(name)) for name in names))
    assert all(result.error is None and len(result.stored) == 2 for result in many)
    batch_ids = set()
    for ack in [ack for result in many for ack in result.stored]:
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, ack.seq)
        batch_ids.add((stored.headers or {}).get("Nats-Batch-Id"))
    assert len(batch_ids) == 1 and None not in batch_ids  # one atomic batch

    *fine, refused = await asyncio.gather(
        *(commit.publish(claim_and_job(letter * 12)) for letter in "ijkl"),
        commit.publish(claim_and_job("0123456789ab")),  # claimed above: refused whole
    )
    assert all(result.error is None and len(result.stored) == 2 for result in fine)
    assert refused.stored == [] and isinstance(refused.error, APIError)
    assert not await stored_on(nc, subjects, subjects.job("0123456789ab-md", "submitted"))

    big = [(subjects.claim("e" * 11 + "f"), b"claim", CREATE_ONLY)]
    big += [(subjects.job(f"{'e' * 11}f-{i}", "submitted"), b"x", CREATE_ONLY) for i in range(8)]
    big.append((taken, b"again", CREATE_ONLY))  # refused: a big caller alone, all or nothing
    whole = await commit.publish(big)
    assert whole.stored == [] and isinstance(whole.error, APIError)
    assert not await stored_on(nc, subjects, subjects.claim("e" * 11 + "f"))


async def stored_on(nc: Client, subjects: Subjects, subject: str) -> bool:
    """Whether the jobs stream holds a message on ``subject``."""
    info = await nc.jetstream().stream_info(subjects.jobs_stream, subjects_filter=subject)
    return bool(info.state.subjects)


async def test_publish_batch_splits_at_the_server_s_batch_limit(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    count = MAX_ATOMIC_BATCH + 3
    results = await requests.publish_batch(
        [(subjects.job(f"0123456789ab-{index}", "bound"), b"x", None) for index in range(count)]
    )
    sequences = [result.seq for result in results if isinstance(result, PubAck)]
    assert sequences == list(range(1, count + 1))


async def test_publish_many_times_out_as_a_whole(
    requests: Requests, nc: Client, namespace: str
) -> None:
    sink = await nc.subscribe(f"{namespace}.requests.silent")  # a "stream" that never acks
    results = await requests.publish_many(
        [
            (f"{namespace}.requests.silent", b"x", None),
            (f"{namespace}.requests.silent", b"y", None),
        ],
        timeout_s=0.2,
    )
    await sink.unsubscribe()
    assert all(isinstance(result, nats.errors.TimeoutError) for result in results)


async def test_requests_with_the_default_timeout_share_one_timer(
    nc: Client, namespace: str
) -> None:
    """Many requests nobody answers all time out (shortly after their deadline, not before),
    and an answered request sent among them is not disturbed."""
    client = await Requests(nc, timeout_s=0.3).start()
    sink = await nc.subscribe(f"{namespace}.requests.silent")  # listens, never answers

    async def echo(message: Msg) -> None:
        await message.respond(message.data)

    responder = await nc.subscribe(f"{namespace}.requests.echo", cb=echo)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        silent = [client.request(f"{namespace}.requests.silent", b"x") for _ in range(50)]
        results = await asyncio.gather(
            *silent, client.request(f"{namespace}.requests.echo", b"hi"), return_exceptions=True
        )
        elapsed = loop.time() - started
        later = await client.request(f"{namespace}.requests.echo", b"again")
    finally:
        await sink.unsubscribe()
        await responder.unsubscribe()
        await client.close()

    assert all(isinstance(result, nats.errors.TimeoutError) for result in results[:-1])
    assert isinstance(results[-1], Msg) and results[-1].data == b"hi"
    assert 0.3 <= elapsed < 1.5
    assert later.data == b"again"
