"""A PROGRESS batch of reports alone goes to its COPY rows in one pass (``Feed.report_rows``):
the rows the general way makes (``Feed.decode``, then ``progress_rows``), and no rows at all,
so that the batch takes the general way, for any batch that way would treat otherwise."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import cast

import asyncpg
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mdq.bus.codec import encode
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.store.projection.facts import progress_rows
from mdq.store.projection.feed import Feed

SUBJECTS = Subjects("mdq")
STREAM = "MDQ_PROGRESS"
JOB = "0123456789ab-md"
AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def report(step: int, job: str = JOB) -> pb.Event:
    body = pb.Progress(step=step, target_steps=1000, potential_kj_mol=-5.0 - step)
    return make_event("progress", body, job_id=job, attempt=1, producer="runner", at=AT)


def delivered(event: pb.Event, sequence: int, subject: str = "") -> Msg:
    """``event`` as a JetStream pull consumer delivers it, at stream ``sequence``."""
    reply = f"$JS.ACK.{STREAM}.watcher-progress.1.{sequence}.{sequence}.1764936000000000000.0"
    return Msg(
        cast(Client, None),
        subject=subject or SUBJECTS.for_event(event),
        reply=reply,
        data=encode(event),
    )


def feed() -> Feed:
    return Feed(
        stream=STREAM,
        consumer="watcher-progress",
        js=cast(JetStreamContext, None),
        pool=cast(asyncpg.Pool, None),
        batch_size=100,
        batch_wait_s=0.1,
        ack_wait_s=30,
        continuity_check_s=10,
        records_prefix=SUBJECTS.claim(""),
    )


def clean_batch() -> list[Msg]:
    events = [report(step) for step in (100, 200, 300)]
    events[1].event_id = ""  # named by its place in the stream, as the general way names it
    return [delivered(event, 41 + index) for index, event in enumerate(events)]


def test_a_batch_of_reports_gives_the_rows_of_the_general_way() -> None:
    messages = clean_batch()
    general = feed()
    events = [(41 + i, general.decode(41 + i, message)) for i, message in enumerate(messages)]
    expected = progress_rows(STREAM, [(seq, event) for seq, event in events if event])

    rows = feed().report_rows(messages)

    assert rows is not None
    assert rows.rows == expected
    assert expected[1][9] == f"{STREAM}:42"  # the event id the stream's place gives
    assert (rows.first_seq, rows.last_seq, rows.last) == (41, 43, messages[-1])


def replace(index: int, message: Msg) -> Callable[[list[Msg]], None]:
    def change(messages: list[Msg]) -> None:
        messages[index] = message

    return change


def swap(messages: list[Msg]) -> None:
    messages[0], messages[1] = messages[1], messages[0]


def impossible_time() -> pb.Event:
    event = report(200)
    event.time.seconds = 253_402_300_800  # after 9999-12-31
    return event


def without_job() -> pb.Event:
    event = report(200)
    event.job_id = ""
    return event


def not_a_report() -> pb.Event:
    body = pb.JobStarted(node="n1", pod_name="p")
    return make_event("started", body, job_id=JOB, attempt=1, producer="watcher", at=AT)


def undecodable() -> Msg:
    message = delivered(report(200), 42)
    message.data = b"\xff\xff\xff"
    return message


GENERAL_WAY = {
    "a gap in the stream sequences": replace(1, delivered(report(200), 43)),
    "a redelivery out of order": swap,
    "a record the stream keeps beside its events": replace(
        1, delivered(report(200), 42, subject=SUBJECTS.claim("abc"))
    ),
    "an undecodable message": replace(1, undecodable()),
    "a report on another job's subject": replace(
        1, delivered(report(200), 42, subject=SUBJECTS.progress("fedcba987654-md"))
    ),
    "a report from a producer that may not report": replace(
        1,
        delivered(
            make_event(
                "progress", pb.Progress(step=200), job_id=JOB, attempt=1, producer="intake", at=AT
            ),
            42,
        ),
    ),
    "a report with an impossible time": replace(1, delivered(impossible_time(), 42)),
    "a report without a job id": replace(
        1, delivered(without_job(), 42, subject=SUBJECTS.progress(""))
    ),
    "an event that is no report": replace(1, delivered(not_a_report(), 42)),
}


@pytest.mark.parametrize("change", list(GENERAL_WAY.values()), ids=list(GENERAL_WAY))
def test_any_other_batch_takes_the_general_way(change: Callable[[list[Msg]], None]) -> None:
    messages = clean_batch()
    change(messages)
    assert feed().report_rows(messages) is None
