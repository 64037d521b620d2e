"""The fold of a batch's events into the jobs they are about, in memory.

A ``JobRow`` is one row of ``jobs`` (with its ``attempts``) turned back into a
``mdq.core.state.JobView`` plus the columns the view does not track; events are folded into it
with ``JobView.apply``, the same state machine as placement, recovery and ``mdq replay``
(docs/architecture.md). Which of its columns are written, and how: ``rows``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
from google.protobuf import json_format
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.state import AttemptRecord, JobState, JobView, event_time


def blank(text: str) -> str | None:
    """An empty string of an event as the NULL it is stored as."""
    return text or None


def message_json(message: Message) -> str:
    """A protobuf message as the JSON mapping stored in a ``jsonb`` column."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None)


@dataclass(slots=True)
class JobRow:
    """A job being projected: its ``JobView`` plus the columns the view does not track."""

    view: JobView
    name: str
    task: str
    priority_class: str
    spec_json: str | None
    """The spec as stored, for the insert of a new row; None for a row read back (its spec is
    never rewritten)."""
    submitted_by: str
    target_steps: int
    updated_at: datetime
    last_temperature_k: float | None = None
    last_ns_per_day: float | None = None
    units: str = ""
    """``Progress.units`` of the job's reports ("" as the column names say, "lj")."""
    bound_at: dict[int, datetime] = field(default_factory=dict)
    attempt_last_step: dict[int, int] = field(default_factory=dict)
    ended_now: dict[int, int] = field(default_factory=dict)
    is_new: bool = False
    stored: tuple[Any, ...] | None = None
    """The row as read from ``jobs`` (``rows.job_update``), to write back only a change."""
    stored_attempts: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    """Each attempt as read from ``attempts`` (``rows.attempt_row``)."""

    @classmethod
    def from_submitted(cls, event: pb.Event) -> JobRow:
        body = event.submitted
        return cls(
            view=JobView.from_submitted(event),
            name=body.spec.name,
            task=pb.Task.Name(body.spec.task or pb.TASK_MD),  # unset means MD (the proto)
            priority_class=body.spec.priority_class or "normal",
            spec_json=message_json(body.spec),
            submitted_by=body.submitted_by,
            target_steps=body.spec.steps,
            updated_at=event_time(event),
            is_new=True,
        )

    @classmethod
    def from_record(cls, job: asyncpg.Record, attempts: Sequence[asyncpg.Record]) -> JobRow:
        # The fold never reads the spec (placement does) and an update never writes it, so it
        # is not even selected (``rows.JOB_COLUMNS``).
        spec = pb.JobSpec()
        checkpoint_step = job["latest_checkpoint_step"]
        view = JobView(
            job_id=job["job_id"],
            spec=spec,
            request_id=job["request_id"],
            depends_on_ids=tuple(job["depends_on"]),
            submitted_at=job["submitted_at"],
            state=JobState(job["state"]),
            attempt=job["attempt"],
            node=job["node"] or "",
            pod_name=job["pod_name"] or "",
            last_step=job["last_step"],
            last_progress_at=job["last_progress_at"],
            last_potential=job["last_potential_kj_mol"],
            done_reason=job["done_reason"] or "",
            latest_checkpoint=(
                None if checkpoint_step is None else pb.Checkpoint(step=checkpoint_step)
            ),
            final_reason=job["final_reason"] or "",
            final_message=job["final_message"] or "",
        )
        spec.priority_class = job["priority_class"]  # what a reprioritize compares with
        if job["control"]:
            view.apply_control_dict(json.loads(job["control"]))
        row = cls(
            view=view,
            name=job["name"],
            task=job["task"],
            priority_class=job["priority_class"],
            spec_json=None,
            submitted_by=job["submitted_by"] or "",
            target_steps=job["target_steps"],
            updated_at=job["updated_at"],
            last_temperature_k=job["last_temperature_k"],
            last_ns_per_day=job["last_ns_per_day"],
            units=job["units"] or "",
        )
        for attempt in attempts:
            number = attempt["attempt"]
            failure = None
            if attempt["failure_reason"] is not None:
                failure = pb.AttemptFailed(
                    reason=attempt["failure_reason"],
                    exit_code=attempt["exit_code"] or 0,
                    message=attempt["failure_message"] or "",
                    node=attempt["node"] or "",
                )
            view.attempts[number] = AttemptRecord(
                attempt=number,
                node=attempt["node"] or "",
                pod_name=attempt["pod_name"] or "",
                resumed_from_step=attempt["resumed_from_step"],
                started_at=attempt["started_at"],
                ended_at=attempt["ended_at"],
                failure=failure,
                steps_lost=attempt["steps_lost"],
                copy_lag_steps=attempt["copy_lag_steps"],
                resumed_from_copy=attempt["resumed_from_copy"],
            )
            if attempt["bound_at"] is not None:
                row.bound_at[number] = attempt["bound_at"]
            row.attempt_last_step[number] = attempt["last_step"]
        return row

    def _late_report(self, event: pb.Event) -> None:
        """A report the fold fenced because its attempt had ended, but made before that end
        (a runner cut off from the bus, its reports published late, after the job was even
        requeued): it counts toward that attempt's last step, as it does when the PROGRESS
        stream is folded first (a rebuild, ``jobs._settle_ended``); one made after the end counts
        in neither order. A report of the job's last attempt also gives its done reason, as
        when it is folded before the end (a runner that reached its target while a cancel was
        on its way: the job ends CANCELLED, its last report said ``steps_reached``)."""
        if event.WhichOneof("body") != "progress":
            return
        record = self.view.attempts.get(event.attempt)
        if record is None or record.ended_at is None or event_time(event) > record.ended_at:
            return
        known = self.attempt_last_step.get(event.attempt, 0)
        self.attempt_last_step[event.attempt] = max(known, event.progress.step)
        if event.attempt == self.view.attempt:
            self.view.done_reason = event.progress.done_reason or self.view.done_reason

    def apply(self, event: pb.Event) -> None:
        """Fold one event with the core state machine; record what the view does not keep."""
        was_open = self.view.current.ended_at is None
        if event.progress.units:  # a job's units: whichever of its reports is folded (a rebuild)
            self.units = event.progress.units
        if not self.view.apply(event):
            self._late_report(event)
            return
        at = event_time(event)
        self.updated_at = at
        attempt = self.view.attempt
        if was_open and self.view.current.ended_at is not None:
            terminal = event.succeeded.final_step or event.attempt_failed.last_step
            self.ended_now[attempt] = terminal  # settled by jobs._settle_ended
        match event.WhichOneof("body"):
            case "bound":
                self.bound_at[attempt] = at
            case "progress":
                body = event.progress
                self.last_temperature_k = body.temperature_k
                self.last_ns_per_day = body.ns_per_day
                self.target_steps = body.target_steps or self.target_steps
                self.attempt_last_step[attempt] = body.step
            case "succeeded":
                previous = self.attempt_last_step.get(attempt, 0)
                self.attempt_last_step[attempt] = max(previous, event.succeeded.final_step)
            case "attempt_failed":
                previous = self.attempt_last_step.get(attempt, 0)
                self.attempt_last_step[attempt] = max(previous, event.attempt_failed.last_step)
            case "requeued":
                self.attempt_last_step[attempt] = self.view.last_step
                # the new attempt has reported nothing yet (whichever stream came first)
                self.last_temperature_k = self.last_ns_per_day = None
            case "reprioritized":
                self.priority_class = event.reprioritized.priority_class
            case "extended":
                self.target_steps = event.extended.spec.steps
                self.priority_class = event.extended.spec.priority_class or self.priority_class
                self.attempt_last_step[attempt] = self.view.last_step
                self.last_temperature_k = self.last_ns_per_day = None
            case _:
                pass

    def runs(self, attempt: int) -> bool:
        """Whether ``attempt`` is the job's attempt and runs (RUNNING: it started and did not
        end); the state half of ``superseded``."""
        return self.view.state is JobState.RUNNING and attempt == self.view.attempt

    def catch_up(self, latest: dict[tuple[str, int], pb.Event]) -> None:
        """Fold the latest stored progress report of the current attempt, if not yet seen."""
        report = latest.get((self.view.job_id, self.view.attempt))
        if report is None:
            return
        if self.view.last_progress_at is None or report.progress.step > self.view.last_step:
            self.apply(report)


ReportKey = tuple[str, int | None, int, str, str | None, int]
"""What decides whether a report supersedes the one before it: (job id, attempt, step, done
reason, units or None, target steps); the attempt is None for an event that is no report."""


def report_keys(events: Sequence[pb.Event]) -> list[ReportKey]:
    """Each event's ``ReportKey``, read from the event."""
    keys: list[ReportKey] = []
    for event in events:
        if event.WhichOneof("body") != "progress":
            keys.append((event.job_id, None, 0, "", None, 0))
            continue
        body = event.progress
        keys.append(
            (
                event.job_id,
                event.attempt,
                body.step,
                body.done_reason,
                body.units or None,
                body.target_steps,
            )
        )
    return keys


def superseded_reports(events: Sequence[pb.Event]) -> list[bool]:
    """``superseded`` of the events' keys."""
    return superseded(report_keys(events))


def superseded(keys: Sequence[ReportKey]) -> list[bool]:
    """For each event (by its ``ReportKey``), whether it is a progress report that the next
    event of its job in the batch supersedes: a report of the same attempt, of no lower step,
    that keeps what the first one sets and a later fold keeps (a done reason, units, a target).

    While that attempt runs (``JobRow.runs``), folding such a report and then the next one
    leaves the row as folding the next one alone would: whether the first is accepted or
    ignored, the next is accepted whenever the first would have been (its step is no lower)
    and overwrites every column the first would set. So the fold skips it, which spares it
    most of a PROGRESS batch (each job reports many times)."""
    flags = [False] * len(keys)
    later: dict[str, ReportKey] = {}  # job -> its next event's key, when a report
    for index in range(len(keys) - 1, -1, -1):
        mine = keys[index]
        job, attempt = mine[0], mine[1]
        if attempt is None:
            later.pop(job, None)
            continue
        theirs = later.get(job)
        later[job] = mine
        if theirs is None or theirs[1] != attempt:
            continue
        flags[index] = (
            theirs[2] >= mine[2]
            and (not mine[3] or bool(theirs[3]))
            and (mine[4] is None or theirs[4] is not None)
            and (not mine[5] or bool(theirs[5]))
        )
    return flags


def fold_batch(
    rows: dict[str, JobRow],
    events: Sequence[pb.Event],
    latest: dict[tuple[str, int], pb.Event],
) -> None:
    """Fold a batch's events (in stream order) into ``rows``, adding the rows of the jobs
    submitted in it; before each event and at the end, a row catches up with ``latest``
    (the stored reports of ``jobs.fold_jobs``'s catch-up). A report the job's next event
    supersedes (``superseded``) is skipped while its attempt runs, when there is nothing to
    catch up with."""
    skippable: list[bool] | None = None
    keys: list[ReportKey] | None = None
    if not latest:
        keys = report_keys(events)
        skippable = superseded(keys)
    for index, event in enumerate(events):
        if skippable is not None and keys is not None and skippable[index]:
            key = keys[index]
            row = rows.get(key[0])
            if row is None or row.runs(key[1] or 0):
                continue
        elif event.WhichOneof("body") == "submitted":
            if event.job_id and event.job_id not in rows:
                rows[event.job_id] = JobRow.from_submitted(event)
            continue
        row = rows.get(event.job_id)
        if row is None:
            continue
        row.catch_up(latest)
        row.apply(event)
    for row in rows.values():
        row.catch_up(latest)
