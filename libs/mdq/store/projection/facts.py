"""The append-only facts of a batch and the statements that store them, one per table.

``job_events`` (every event but progress reports, once by event id), ``progress`` (every
report, by COPY), ``checkpoints``, ``placements`` and ``rejections``: each a ``BatchInsert``
whose columns, order and types are those of its table in ``mdq.store.models``; this module
says how an event gives each column. What each table holds: docs/history.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from google.protobuf import json_format

from mdq.contracts import pb
from mdq.core.timestamps import EPOCH
from mdq.store.batch_insert import BatchInsert
from mdq.store.models import (
    CheckpointRecord,
    EventRecord,
    Placement,
    ProgressRecord,
    Rejection,
)
from mdq.store.projection.fold import blank, message_json


class Fact(NamedTuple):
    """An event of the batch with what every table needs of it, computed once."""

    sequence: int
    event: pb.Event
    kind: str
    at: datetime


class Stored(NamedTuple):
    """A fact of the batch with the stream it was read from."""

    stream: str
    fact: Fact


def _body_json(stored: Stored) -> str:
    return message_json(getattr(stored.fact.event, stored.fact.kind))


EVENTS: BatchInsert[Stored] = BatchInsert.of(
    EventRecord,
    {
        "event_id": lambda s: s.fact.event.event_id,
        "stream": lambda s: s.stream,
        "stream_seq": lambda s: s.fact.sequence,
        "job_id": lambda s: s.fact.event.job_id or None,
        "attempt": lambda s: s.fact.event.attempt,
        "kind": lambda s: s.fact.kind,
        "time": lambda s: s.fact.at,
        "producer": lambda s: s.fact.event.producer,
        "body": _body_json,
    },
)
INSERT_EVENTS = f"""
WITH incoming AS (
    SELECT * FROM {EVENTS.unnest("e", ordinality="n")}
), fresh AS (
    SELECT DISTINCT ON (i.event_id) i.* FROM incoming i
    WHERE NOT EXISTS (SELECT FROM job_events j WHERE j.event_id = i.event_id)
    ORDER BY i.event_id, i.n
)
INSERT INTO job_events ({", ".join(EVENTS.names)})
SELECT {EVENTS.select_list("f")}
FROM fresh f
ON CONFLICT DO NOTHING
RETURNING event_id
"""
"""Every event id once: ``job_events`` is partitioned by time, so its key is (event_id, time)
and a republished copy with a new time would not conflict; the ids are looked up first (one
writer per stream, under the consumer offset's lock)."""


def _report(stored: Stored) -> pb.Progress:
    return stored.fact.event.progress


PROGRESS: BatchInsert[Stored] = BatchInsert.of(
    ProgressRecord,
    {
        "job_id": lambda s: s.fact.event.job_id,
        "attempt": lambda s: s.fact.event.attempt,
        "step": lambda s: _report(s).step,
        "time": lambda s: s.fact.at,
        "time_ps": lambda s: _report(s).time_ps,
        "potential_kj_mol": lambda s: _report(s).potential_kj_mol,
        "kinetic_kj_mol": lambda s: _report(s).kinetic_kj_mol,
        "temperature_k": lambda s: _report(s).temperature_k,
        "ns_per_day": lambda s: _report(s).ns_per_day,
        "event_id": lambda s: s.fact.event.event_id,
        "stream": lambda s: s.stream,
        "stream_seq": lambda s: s.fact.sequence,
        "producer": lambda s: s.fact.event.producer,
        "target_steps": lambda s: _report(s).target_steps,
        "eta_s": lambda s: _report(s).eta_s,
        "done_reason": lambda s: _report(s).done_reason,
        "units": lambda s: blank(_report(s).units),
    },
    returning=("job_id", "attempt", "step"),
)
PROGRESS_COLUMNS = PROGRESS.names
"""The columns of ``progress`` in the order the watcher's COPY writes them."""
_JOB, _ATTEMPT = PROGRESS_COLUMNS.index("job_id"), PROGRESS_COLUMNS.index("attempt")


Report = tuple[int, pb.Event]
"""A progress report of the batch: its stream sequence and its event."""


def report_row(event: pb.Event, event_id: str, stream: str, sequence: int) -> tuple[Any, ...]:
    """The row of ``progress`` of a report (``event``, its ``event_id``, read from ``stream`` at
    ``sequence``): ``PROGRESS.rows``' tuple built at once, in the order of ``PROGRESS_COLUMNS``
    (which ``tests/unit/test_projection_rows.py`` checks), the time as
    ``mdq.core.timestamps.to_datetime`` makes it. The hot path of the watcher: a call per
    column, or a ``Fact`` per report, would be a fifth of its CPU."""
    report = event.progress
    at = event.time
    return (
        event.job_id,
        event.attempt,
        report.step,
        EPOCH + timedelta(0, at.seconds, at.nanos // 1000),
        report.time_ps,
        report.potential_kj_mol,
        report.kinetic_kj_mol,
        report.temperature_k,
        report.ns_per_day,
        event_id,
        stream,
        sequence,
        event.producer,
        report.target_steps,
        report.eta_s,
        report.done_reason,
        report.units or None,
    )


def progress_rows(stream: str, reports: Iterable[Report]) -> list[tuple[Any, ...]]:
    """The rows of ``reports`` read from ``stream`` (``report_row``)."""
    return [report_row(event, event.event_id, stream, sequence) for sequence, event in reports]


CHECKPOINTS: BatchInsert[Fact] = BatchInsert.of(
    CheckpointRecord,
    {
        "job_id": lambda f: f.event.job_id,
        "attempt": lambda f: f.event.attempt,
        "step": lambda f: f.event.checkpoint.step,
        "path": lambda f: f.event.checkpoint.path,
        "sha256": lambda f: f.event.checkpoint.sha256,
        "size_bytes": lambda f: f.event.checkpoint.size_bytes,
        "time_ps": lambda f: f.event.checkpoint.time_ps,
        "time": lambda f: f.at,
    },
)


def _placement_candidates(fact: Fact) -> str:
    candidates = [
        json_format.MessageToDict(c, preserving_proto_field_name=True)
        for c in fact.event.bound.candidates
    ]
    return json.dumps(candidates, sort_keys=True)


PLACEMENTS: BatchInsert[Fact] = BatchInsert.of(
    Placement,
    {
        "job_id": lambda f: f.event.job_id,
        "attempt": lambda f: f.event.attempt,
        "node": lambda f: f.event.bound.node,
        "candidates": _placement_candidates,
        "time": lambda f: f.at,
    },
)
REJECTIONS: BatchInsert[Fact] = BatchInsert.of(
    Rejection,
    {
        "request_id": lambda f: f.event.rejected.request_id,
        "idempotency_key": lambda f: blank(f.event.rejected.idempotency_key),
        "field": lambda f: blank(f.event.rejected.error.field),
        "message": lambda f: f.event.rejected.error.message,
        "time": lambda f: f.at,
    },
)
FACT_TABLES: dict[str, BatchInsert[Fact]] = {
    "checkpoint": CHECKPOINTS,
    "bound": PLACEMENTS,
    "rejected": REJECTIONS,
}
"""The append-only facts: the event kind that makes a row, and its table."""


def attempts_of_rows(rows: Iterable[tuple[Any, ...]]) -> set[tuple[str, int]]:
    """The (job id, attempt) pairs of the rows of ``progress_rows``."""
    return {(row[_JOB], row[_ATTEMPT]) for row in rows}
