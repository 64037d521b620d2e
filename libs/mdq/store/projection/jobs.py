"""The ``jobs`` and ``attempts`` rows of a batch: read, fold, settle, write back.

The rows of the jobs a batch is about are locked and read back into ``JobRow`` objects, the
batch's events are folded into them in stream order, then the columns that depend on how the
JOBS and PROGRESS streams interleaved are settled from the stored progress reports, so that
the live projection and one rebuilt from the log agree (docs/history.md, "Replay and
rebuild"); only the rows that changed are written. Progress reports are folded apart from
their batch, many batches at once, from the stored reports (``fold_unfolded``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from mdq.contracts import pb
from mdq.core.state import JobView
from mdq.core.timestamps import set_timestamp
from mdq.store.projection.fold import JobRow, fold_batch
from mdq.store.projection.rows import (
    ATTEMPT_COLUMNS,
    INSERT_JOB,
    JOB_COLUMNS,
    UPDATE_ATTEMPTS,
    UPDATE_JOBS,
    UPSERT_ATTEMPTS,
    attempt_row,
    job_insert,
    job_update,
    job_update_arrays,
)

_LATEST_REPORTS = """
SELECT t.job_id, t.attempt, p.step, p.time, p.potential_kj_mol, p.temperature_k, p.ns_per_day,
    p.units
FROM unnest($1::text[], $2::int[], $3::timestamptz[]) AS t(job_id, attempt, until)
CROSS JOIN LATERAL (
    SELECT step, time, potential_kj_mol, temperature_k, ns_per_day, units FROM progress p
    WHERE p.job_id = t.job_id AND p.attempt = t.attempt AND (t.until IS NULL OR p.time <= t.until)
    ORDER BY p.step DESC LIMIT 1  -- the primary key (job_id, attempt, step), read backwards
) AS p
"""


_FIRST_REPORTS = """
SELECT t.job_id, t.attempt, p.time
FROM unnest($1::text[], $2::int[]) AS t(job_id, attempt)
CROSS JOIN LATERAL (
    SELECT time FROM progress p WHERE p.job_id = t.job_id AND p.attempt = t.attempt
    ORDER BY p.step LIMIT 1  -- the primary key (job_id, attempt, step)
) AS p
"""


async def _settle_starts(connection: asyncpg.Connection, rows: dict[str, JobRow]) -> None:
    """Make every attempt's ``started_at`` the earliest of its facts, whatever the order.

    An attempt started at its ``started`` event or at its first progress report, whichever is
    earlier. The fold sees the two in an order that depends on how the streams interleaved:
    a report folded before its ``bound`` is caught up later (the latest report, not the
    first), and a report folded after the attempt ended (a runner that went on) is fenced. So
    the first stored report of each attempt is read back and lowers ``started_at`` if earlier;
    the live projection and one rebuilt from the log then agree (an attempt that crashed
    before its ``started`` was published is started in both, not NULL in one of them)."""
    wanted = [
        (job_id, number)
        for job_id, row in rows.items()
        for number, record in row.view.attempts.items()
        if record.node  # bound: a pod that may have run
    ]
    if not wanted:
        return
    for record in await connection.fetch(_FIRST_REPORTS, *_columns(wanted, 2)):
        attempt = rows[record["job_id"]].view.attempts[record["attempt"]]
        first = record["time"]
        if attempt.started_at is None or first < attempt.started_at:
            attempt.started_at = first


async def _settle_ended(connection: asyncpg.Connection, rows: dict[str, JobRow]) -> None:
    """Give each attempt that ended in this batch the last step it had reached by its end.

    That is the larger of the step its terminal event names and its last stored report up to
    the moment it ended. Reports after the end (a runner that went on before it was stopped)
    are fenced when the fold sees them after the end, but folded when the PROGRESS stream ran
    ahead of JOBS (a rebuild): so the value is computed afresh here from stored facts, not
    carried from whatever the fold saw first, and the live and rebuilt projections agree.
    """
    wanted = [
        (job_id, number, row.view.attempts[number].ended_at)
        for job_id, row in rows.items()
        for number in row.ended_now
    ]
    if not wanted:
        return
    for row in rows.values():
        for number, terminal in row.ended_now.items():
            row.attempt_last_step[number] = terminal
    for record in await connection.fetch(_LATEST_REPORTS, *_columns(wanted, 3)):
        row = rows[record["job_id"]]
        row.units = record["units"] or row.units
        view, number = row.view, record["attempt"]
        step = max(row.attempt_last_step[number], record["step"])
        row.attempt_last_step[number] = step
        if number == view.attempt:  # not requeued yet: the job's own columns end there too
            view.last_step = step
            view.last_potential = record["potential_kj_mol"]
            view.last_progress_at = record["time"]
            row.last_temperature_k = record["temperature_k"]
            row.last_ns_per_day = record["ns_per_day"]


async def _settle_progress(connection: asyncpg.Connection, rows: dict[str, JobRow]) -> None:
    """Make the "last progress" columns independent of how the two streams interleaved.

    The JOBS and PROGRESS streams are consumed independently, so the fold may see a job's
    reports before its ``bound``/``started`` (``started`` then sets ``last_progress_at`` to
    its own time, older or, when the pod was seen running late, newer than the reports) or
    after its terminal event (which accepts nothing). Either way the answer must be the same,
    or a projection rebuilt from the log would differ from the live one: the latest stored
    report (highest step) of the job's current attempt, up to the attempt's end, sets the
    progress columns. Every report the fold holds is stored by then (a batch's reports are
    copied before its fold), so none is later than that one: only ``started`` set a time it
    would overwrite.
    """
    wanted = [
        (job_id, row.view.attempt, row.view.current.ended_at)
        for job_id, row in rows.items()
        if row.view.state.value not in ("WAITING", "PENDING", "HELD")
    ]
    if not wanted:
        return
    for record in await connection.fetch(_LATEST_REPORTS, *_columns(wanted, 3)):
        row = rows[record["job_id"]]
        row.units = record["units"] or row.units
        view, at = row.view, record["time"]
        view.last_step = max(view.last_step, record["step"])
        view.last_potential = record["potential_kj_mol"]
        view.last_progress_at = at
        row.last_temperature_k = record["temperature_k"]
        row.last_ns_per_day = record["ns_per_day"]
        row.updated_at = max(row.updated_at, at)
        attempt = view.attempt
        row.attempt_last_step[attempt] = max(row.attempt_last_step.get(attempt, 0), record["step"])


_LATEST_PROGRESS = """
SELECT p.job_id, p.attempt, p.event_id, p.time, p.producer, p.step, p.target_steps, p.time_ps,
    p.potential_kj_mol, p.kinetic_kj_mol, p.temperature_k, p.ns_per_day, p.eta_s, p.done_reason,
    p.units
FROM unnest($1::text[], $2::int[]) AS t(job_id, attempt)
CROSS JOIN LATERAL (
    SELECT * FROM progress p WHERE p.job_id = t.job_id AND p.attempt = t.attempt
    ORDER BY p.step DESC LIMIT 1  -- the primary key, read backwards
) AS p
"""


def progress_event(record: asyncpg.Record) -> pb.Event:
    """A stored progress row as the event it was projected from."""
    event = pb.Event(
        event_id=record["event_id"],
        job_id=record["job_id"],
        attempt=record["attempt"],
        producer=record["producer"],
        progress=pb.Progress(
            step=record["step"],
            target_steps=record["target_steps"],
            time_ps=record["time_ps"],
            potential_kj_mol=record["potential_kj_mol"],
            kinetic_kj_mol=record["kinetic_kj_mol"],
            temperature_k=record["temperature_k"],
            ns_per_day=record["ns_per_day"],
            eta_s=record["eta_s"],
            done_reason=record["done_reason"],
            units=record["units"] or "",
        ),
    )
    set_timestamp(event.time, record["time"])
    return event


async def _latest_progress(
    connection: asyncpg.Connection, attempts: dict[str, int]
) -> dict[tuple[str, int], pb.Event]:
    """The highest-step stored report of attempts 1 to ``attempts[job]`` of every job."""
    pairs = [(job, number) for job, last in attempts.items() for number in range(1, last + 1)]
    if not pairs:
        return {}
    records = await connection.fetch(_LATEST_PROGRESS, *_columns(pairs, 2))
    return {(record["job_id"], record["attempt"]): progress_event(record) for record in records}


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Key tuples to columns, for the lookups' ``unnest($1::type[], ...)``."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


def _read_row(job: asyncpg.Record, attempts: Sequence[asyncpg.Record]) -> JobRow:
    """A job's row as read, with its columns as stored, to write back only what changes."""
    row = JobRow.from_record(job, attempts)
    row.stored = job_update(row)
    row.stored_attempts = {number: attempt_row(row, number) for number in row.view.attempts}
    return row


async def _read_rows(connection: asyncpg.Connection, job_ids: list[str]) -> dict[str, JobRow]:
    """The rows of ``job_ids`` (sorted: the locks are taken in key order) that exist, locked,
    with their attempts."""
    records = await connection.fetch(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ANY($1::text[]) ORDER BY job_id FOR UPDATE",
        job_ids,
    )
    attempt_records: dict[str, list[asyncpg.Record]] = {}
    if records:
        for record in await connection.fetch(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ANY($1::text[])",
            [record["job_id"] for record in records],
        ):
            attempt_records.setdefault(record["job_id"], []).append(record)
    return {
        record["job_id"]: _read_row(record, attempt_records.get(record["job_id"], []))
        for record in records
    }


async def _settle_and_write(connection: asyncpg.Connection, rows: dict[str, JobRow]) -> None:
    """Settle the columns that depend on how the streams interleaved, then write back what
    changed."""
    await _settle_ended(connection, rows)
    await _settle_progress(connection, rows)
    await _settle_starts(connection, rows)
    inserts, updates = [], []
    new_attempts, changed_attempts = [], []
    for row in rows.values():
        if row.is_new:
            inserts.append(job_insert(row))
        elif (update := job_update(row)) != row.stored:
            updates.append(update)
        for number in row.view.attempts:
            attempt = attempt_row(row, number)
            stored = row.stored_attempts.get(number)
            if stored is None:
                new_attempts.append(attempt)
            elif attempt != stored:
                changed_attempts.append(attempt)
    if inserts:
        await connection.executemany(INSERT_JOB, inserts)
    if updates:
        await connection.execute(UPDATE_JOBS, *job_update_arrays(updates))
    # New and changed attempts in a statement each: the tallies' statement triggers on
    # ``attempts`` (``failure_tallies``) count a job from the table as the statement left it, so one
    # statement that both inserts and updates a job's attempts would hide each half from the
    # other's count.
    for attempts, statement in (
        (changed_attempts, UPDATE_ATTEMPTS),
        (new_attempts, UPSERT_ATTEMPTS.sql),
    ):
        if attempts:
            await connection.execute(statement, *UPSERT_ATTEMPTS.arrays_of_rows(attempts))


async def fold_jobs(
    connection: asyncpg.Connection,
    events: list[pb.Event],
    *,
    catch_up: bool = False,
) -> None:
    """Fold the events into the rows of the jobs they are about, with ``JobView.apply``.

    With ``catch_up`` (batches of the JOBS stream), the latest stored progress report of
    the job's current attempt is folded in before each lifecycle event and at the end, if
    the job has not seen it: the two streams are consumed independently, and a PROGRESS
    batch's reports are folded later than they are stored (``fold_unfolded``), so a report
    may be stored while the job's row has not seen it.
    """
    job_ids = sorted({event.job_id for event in events if event.job_id})
    if not job_ids:
        return
    rows = await _read_rows(connection, job_ids)
    latest: dict[tuple[str, int], pb.Event] = {}
    if catch_up:
        last_attempt = {job: row.view.attempt for job, row in rows.items()}
        for event in events:
            if event.job_id:
                known = last_attempt.get(event.job_id, 1)
                last_attempt[event.job_id] = max(known, event.attempt)
        latest = await _latest_progress(connection, last_attempt)
    fold_batch(rows, events, latest)
    await _settle_and_write(connection, rows)


_UNFOLDED_REPORTS = """
SELECT t.job_id, t.attempt, p.event_id, p.time, p.producer, p.step, p.time_ps,
    p.potential_kj_mol, p.kinetic_kj_mol, p.temperature_k, p.ns_per_day, p.eta_s, p.units,
    COALESCE(NULLIF(p.done_reason, ''), d.done_reason, '') AS done_reason,
    COALESCE(NULLIF(p.target_steps, 0), g.target_steps, 0) AS target_steps
FROM unnest($1::text[], $2::int[], $3::timestamptz[], $4::bigint[])
    AS t(job_id, attempt, until, above)
CROSS JOIN LATERAL (
    SELECT * FROM progress p
    WHERE p.job_id = t.job_id AND p.attempt = t.attempt AND (t.until IS NULL OR p.time <= t.until)
    ORDER BY p.step DESC LIMIT 1  -- the primary key, read backwards
) AS p
LEFT JOIN LATERAL (  -- read only when the latest report has no done reason of its own
    SELECT q.done_reason FROM progress q
    WHERE p.done_reason = '' AND q.job_id = t.job_id AND q.attempt = t.attempt
        AND q.step >= t.above AND q.done_reason <> '' AND (t.until IS NULL OR q.time <= t.until)
    ORDER BY q.step DESC LIMIT 1
) AS d ON true
LEFT JOIN LATERAL (  -- read only when the latest report names no target
    SELECT q.target_steps FROM progress q
    WHERE p.target_steps = 0 AND q.job_id = t.job_id AND q.attempt = t.attempt
        AND q.step >= t.above AND q.target_steps <> 0 AND (t.until IS NULL OR q.time <= t.until)
    ORDER BY q.step DESC LIMIT 1
) AS g ON true
"""


def _seen_step(view: JobView) -> int:
    """The lowest step of a report ``view`` still folds (``JobView.apply``): any (-1) before
    its first report."""
    return view.last_step if view.last_progress_at is not None else -1


async def fold_unfolded(
    connection: asyncpg.Connection, attempts: Collection[tuple[str, int]]
) -> None:
    """The coalescing fold: the jobs' rows catch up with the stored reports of ``attempts``
    ((job id, attempt) pairs whose reports were stored since the jobs last caught up),
    each folded from one report that stands for all of them (a row of ``_UNFOLDED_REPORTS``: the
    highest-step report, with the done reason and target of the highest-step report that names
    them, read as ``progress_event``).

    The equivalence with folding every report as it is stored (``JobRow.apply``): an
    attempt's reports are published in step order by its one runner, and a job's reports
    name one unit system. Then, of an attempt that is open, the reports the fold would
    accept leave the row as its highest-step report does, but for the done reason and the
    target, which stay from the last report that named one: the report folded is the
    highest-step one with those two taken from the highest-step report that names them, of
    the reports from the step the row has seen up (``_seen_step``: a report below it the row
    has folded, its done reason and target in the row already, or refuses), so that a fold
    reads an open attempt's new reports, never its whole history. Of an attempt that has
    ended, the reports made up to its end from its ``attempt_last_step`` up (those the row
    may not have counted: its terminal event may name the step of a report still on its
    way) raise that to the highest of their steps and give their done reason, as
    ``JobRow._late_report`` does report by report. Whatever the fold would
    do with a report of an attempt the job has not reached yet, the JOBS stream's catch-up
    does when the job gets there (``fold_jobs``). Folding twice is folding once: the row
    folds an open attempt's report only above the step it has seen, and counting an ended
    attempt's report again changes nothing (its done reason is the one it gave). Then the
    rows are settled and written as a batch's are (``_settle_and_write``).
    """
    rows = await _read_rows(connection, sorted({job for job, _ in attempts}))
    wanted: list[tuple[str, int, datetime | None, int]] = []
    for job, number in attempts:
        row = rows.get(job)
        if row is None:
            continue
        view = row.view
        record = view.attempts.get(number)
        if record is not None and record.ended_at is not None:
            wanted.append((job, number, record.ended_at, row.attempt_last_step.get(number, 0)))
        elif number == view.attempt:  # another open attempt's reports change nothing
            wanted.append((job, number, None, _seen_step(view)))
    if not wanted:
        return
    for record in await connection.fetch(_UNFOLDED_REPORTS, *_columns(wanted, 4)):
        row = rows[record["job_id"]]
        report = progress_event(record)  # the row stands for the attempt's unfolded reports
        if report.progress.units:
            row.units = report.progress.units
        number, view = report.attempt, row.view
        attempt = view.attempts.get(number)
        if attempt is not None and attempt.ended_at is not None:
            if report.progress.step >= row.attempt_last_step.get(number, 0):
                row.apply(report)  # fenced: counted as a late report
        elif number == view.attempt:
            row.catch_up({(view.job_id, number): report})
    await _settle_and_write(connection, rows)
