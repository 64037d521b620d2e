"""The tables of the projection, as SQLAlchemy 2.x typed declarative models.

Only the watcher writes them, in one transaction per batch of events together with the
consumer offset, so the database is always a consistent prefix of the log. Column names are
meant for plain SQL too (``mdq show`` is only one reader); times are ``timestamptz``, energies
kJ/mol, temperatures K. Empty strings of the events are stored as NULL.

The migration under ``migrations/`` makes these tables from these models, then what models
cannot say (``mdq.store.schema_sql``): row security, partitions, functions, triggers and the
read-only views for the common questions (docs/history.md), ``events`` among them.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    Numeric,
    Text,
    column,
    false,
    literal_column,
    table,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with PostgreSQL types for the annotations used below."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        str: Text(),
        int: BigInteger(),
        float: Double(),
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSONB(),
        list[Any]: JSONB(),
        list[str]: ARRAY(Text()),
    }


class Job(Base):
    """One job: what was submitted and where it is now (the fold of its events)."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index(None, "state"),
        Index(None, "request_id"),
        Index(None, "submitted_at"),
        # mdq ls --state S, newest first
        Index(
            "ix_jobs_state_submitted_at",
            "state",
            text("submitted_at DESC"),
            "job_id",
        ),
        # the console's keyset pages and its label filter
        Index("ix_jobs_submitted_at_job_id", "submitted_at", "job_id"),
        # the jobs cancelled in a window
        Index("ix_jobs_cancelled", "updated_at", postgresql_where=text("state = 'CANCELLED'")),
        # the operator class in postgresql_ops, apart from the expression, so that alembic
        # can compare the expression
        Index(
            "ix_jobs_labels",
            literal_column("(spec -> 'labels')").label("labels"),
            postgresql_using="gin",
            postgresql_ops={"labels": "jsonb_path_ops"},
        ),
    )

    job_id: Mapped[str] = mapped_column(primary_key=True, comment="request_id-name")
    request_id: Mapped[str] = mapped_column(comment="The submit this job came from.")
    name: Mapped[str] = mapped_column(comment="JobSpec.name, unique within the submit.")
    task: Mapped[str] = mapped_column(comment="Task enum name, e.g. TASK_MD.")
    state: Mapped[str] = mapped_column(comment="mdq.core.state.JobState name.")
    attempt: Mapped[int] = mapped_column(Integer, comment="Current attempt, from 1.")
    priority_class: Mapped[str] = mapped_column(comment="high, normal or low.")
    node: Mapped[str | None] = mapped_column(comment="Node of the current attempt, if bound.")
    pod_name: Mapped[str | None] = mapped_column(comment="Pod of the current attempt.")
    spec: Mapped[dict[str, Any]] = mapped_column(comment="JobSpec, protobuf JSON mapping.")
    depends_on: Mapped[list[str]] = mapped_column(comment="Job ids this job waits for.")
    submitted_by: Mapped[str | None]
    submitted_at: Mapped[datetime]
    updated_at: Mapped[datetime] = mapped_column(comment="Time of the last event applied.")
    target_steps: Mapped[int] = mapped_column(comment="Step target (JobSpec.steps).")
    last_step: Mapped[int] = mapped_column(comment="Last MD step reported.")
    last_potential_kj_mol: Mapped[float | None]
    last_temperature_k: Mapped[float | None]
    last_ns_per_day: Mapped[float | None]
    last_progress_at: Mapped[datetime | None]
    done_reason: Mapped[str | None] = mapped_column(comment="steps_reached, converged ...")
    final_reason: Mapped[str | None] = mapped_column(comment="FailureReason name if FAILED.")
    final_message: Mapped[str | None]
    latest_checkpoint_step: Mapped[int | None]
    control: Mapped[dict[str, Any] | None] = mapped_column(
        comment="Job control in force: hold, stop, who asked (JobView.control_dict)."
    )
    units: Mapped[str | None] = mapped_column(
        comment="Units of the job's reported figures: NULL as the column names say; "
        "lj: reduced Lennard-Jones units (docs/engines.md)."
    )


class Attempt(Base):
    """One attempt of a job (one pod): where it ran, how it ended."""

    __tablename__ = "attempts"
    __table_args__ = (
        ForeignKeyConstraint(["job_id"], ["jobs.job_id"], ondelete="CASCADE"),
        Index(None, "node", "started_at"),  # node utilisation
        Index("ix_attempts_ended_at", "ended_at"),  # attempts in a window
        # the attempts started in the last hour, per node (the nodes page)
        Index("ix_attempts_started_at", "started_at", postgresql_include=["node"]),
        Index(  # one reason's failed attempts in a window
            "ix_attempts_failures",
            "failure_reason",
            "ended_at",
            postgresql_include=["job_id", "steps_lost"],
            postgresql_where=text("failure_reason IS NOT NULL"),
        ),
    )

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str | None]
    pod_name: Mapped[str | None]
    bound_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    failure_reason: Mapped[str | None] = mapped_column(comment="FailureReason name.")
    failure_message: Mapped[str | None]
    resumed_from_step: Mapped[int] = mapped_column(comment="Checkpoint step resumed from.")
    steps_lost: Mapped[int] = mapped_column(comment="Steps beyond the checkpoint, lost.")
    last_step: Mapped[int] = mapped_column(comment="Last MD step this attempt reached.")
    resumed_from_copy: Mapped[bool] = mapped_column(
        Boolean,
        server_default=false(),
        comment="Resumed from a checkpoint copied to the shared store.",
    )
    copy_lag_steps: Mapped[int] = mapped_column(
        Integer,
        server_default="0",
        comment="Of steps_lost, the steps the resumed-from copy lagged the latest checkpoint.",
    )


class EventRecord(Base):
    """Every event of the JOBS stream, once (the event id is the key).

    Progress reports, the PROGRESS stream, are stored once, in ``progress``; the view
    ``events`` (``EVENTS``) is both, as one table of every event.
    """

    __tablename__ = "job_events"
    __table_args__ = (
        Index(None, "job_id", "time"),
        {"postgresql_partition_by": "RANGE (time)"},  # monthly partitions
    )

    # Not unique by itself: a partitioned table's keys hold its partition key. The projector
    # looks a batch's ids up before it inserts (mdq.store.projection).
    event_id: Mapped[str] = mapped_column(primary_key=True)
    stream: Mapped[str]
    stream_seq: Mapped[int]
    job_id: Mapped[str | None]
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(comment="Event.body case: submitted, bound ...")
    time: Mapped[datetime] = mapped_column(primary_key=True)
    producer: Mapped[str]
    body: Mapped[dict[str, Any]] = mapped_column(comment="The body, protobuf JSON mapping.")


class ProgressRecord(Base):
    """MD progress reports (the energy trace of every attempt), each event stored once here."""

    __tablename__ = "progress"
    __table_args__ = ({"postgresql_partition_by": "RANGE (time)"},)  # monthly partitions

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    time: Mapped[datetime] = mapped_column(primary_key=True)
    time_ps: Mapped[float]
    potential_kj_mol: Mapped[float]
    kinetic_kj_mol: Mapped[float]
    temperature_k: Mapped[float]
    ns_per_day: Mapped[float]
    event_id: Mapped[str] = mapped_column(comment="The report's event id.")
    stream: Mapped[str] = mapped_column(comment="The PROGRESS stream it was read from.")
    stream_seq: Mapped[int]
    producer: Mapped[str]
    target_steps: Mapped[int]
    eta_s: Mapped[float]
    done_reason: Mapped[str] = mapped_column(comment="'' until the report that ends the run.")
    units: Mapped[str | None] = mapped_column(
        comment="Progress.units: NULL as the column names say; lj: reduced LJ units."
    )


EVENTS = table(
    "events",
    column("event_id", Text()),
    column("stream", Text()),
    column("stream_seq", BigInteger()),
    column("job_id", Text()),
    column("attempt", Integer()),
    column("kind", Text()),
    column("time", DateTime(timezone=True)),
    column("producer", Text()),
    column("body", JSONB()),
)
"""The view of every event of both streams (``job_events`` and ``progress``), for queries."""


class CheckpointRecord(Base):
    """Checkpoints written and verified by runners."""

    __tablename__ = "checkpoints"

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(primary_key=True)
    path: Mapped[str]
    sha256: Mapped[str]
    size_bytes: Mapped[int]
    time_ps: Mapped[float]
    time: Mapped[datetime]


class Placement(Base):
    """Why an attempt went where it went: the scores of job.bound."""

    __tablename__ = "placements"

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str]
    candidates: Mapped[list[Any]] = mapped_column(comment="NodeScore list, JSON mapping.")
    time: Mapped[datetime]


class UsageSampleRecord(Base):
    """What each measured attempt used, by system: one row per ``usage`` event
    of ``job_events``, written by a trigger on it, and one per OOM-killed attempt, written by a
    trigger on ``attempts``, for the memory questions and the recommender."""

    __tablename__ = "usage_samples"
    __table_args__ = (
        Index(  # one system's measured samples in a window
            "ix_usage_samples_recent",
            "system_kind",
            "time",
            postgresql_include=["box_nm", "peak_memory_mb", "memory_limit_mb", "mean_cores"],
            postgresql_where=text("NOT oom_killed"),
        ),
        Index("ix_usage_samples_time", "oom_killed", "time"),
        # a kind's newest samples (its owner: the job id's tenant, '' none)
        Index(
            "ix_usage_samples_kind",
            "spec_key",
            "cpu_limit",
            "oom_killed",
            # as PostgreSQL prints it, so that alembic compares it as the same expression
            literal_column(
                "(\nCASE\n    WHEN strpos(job_id, '.'::text) > 0 THEN "
                "split_part(job_id, '.'::text, 1)\n    ELSE ''::text\nEND)"
            ).label("owner"),
            text("time DESC"),
        ),
        {"comment": "One row per usage event: what each attempt used, by system."},
    )

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime]
    system_kind: Mapped[str] = mapped_column(
        comment="The spec's system case: water_box, structure, lammps, ... ('' none)."
    )
    box_nm: Mapped[float | None] = mapped_column(comment="A water box's edge, nm.")
    peak_memory_mb: Mapped[float]
    mean_cores: Mapped[float]
    cpu_seconds: Mapped[float]
    wall_seconds: Mapped[float]
    memory_limit_mb: Mapped[int]
    cpu_limit: Mapped[float]
    spec_key: Mapped[str] = mapped_column(
        comment="md5 of the fields of the job's spec that the cost fingerprint reads."
    )
    oom_killed: Mapped[bool] = mapped_column(
        comment="An OOM-killed attempt: no measured figures, the limits it was bound with."
    )


class UsageSummaryRecord(Base):
    """The newest samples of each kind of job: per ``spec_key``, CPU limit,
    measured or OOM-killed, and owner, the newest samples of ``usage_samples`` as arrays
    (newest first) and the kind's fingerprint inputs, kept by a trigger on it; what the
    recommender reads."""

    __tablename__ = "usage_summaries"
    __table_args__ = (
        Index("ix_usage_summaries_newest", "newest"),
        {"comment": "The newest samples of each kind of job, newest first."},
    )

    spec_key: Mapped[str] = mapped_column(primary_key=True, comment="usage_samples.spec_key.")
    cpu_limit: Mapped[float] = mapped_column(primary_key=True)
    oom_killed: Mapped[bool] = mapped_column(primary_key=True)
    owner: Mapped[str] = mapped_column(
        primary_key=True, comment="The tenant whose jobs these are ('' the operator's)."
    )
    job_id: Mapped[str] = mapped_column(
        comment="The job of the kind's newest sample (whose rows these are)."
    )
    newest: Mapped[datetime]
    spec: Mapped[str | None] = mapped_column(
        comment="The fingerprint inputs of the kind's spec (JSON); NULL: none found."
    )
    peak_memory_mb: Mapped[list[float]] = mapped_column(ARRAY(Double()))
    mean_cores: Mapped[list[float]] = mapped_column(ARRAY(Double()))
    memory_limit_mb: Mapped[list[float]] = mapped_column(ARRAY(Double()))


class FailureTally(Base):
    """Failed attempts per owner and reason, kept by triggers on ``attempts``:
    what the view ``failures_by_reason`` adds up."""

    __tablename__ = "failure_tallies"
    __table_args__ = ({"comment": "Failed attempts per owner and reason, kept by triggers."},)

    tenant_prefix: Mapped[str] = mapped_column(
        primary_key=True,
        comment="Whose attempts: 'alice.' for tenant alice's jobs, '' for the operator's.",
    )
    reason: Mapped[str] = mapped_column(primary_key=True, comment="FailureReason name.")
    attempts: Mapped[int] = mapped_column(BigInteger, comment="Failed attempts.")
    jobs: Mapped[int] = mapped_column(BigInteger, comment="Jobs they belong to.")
    steps_lost: Mapped[int] = mapped_column(BigInteger, comment="Sum of their steps lost.")
    last_at: Mapped[datetime | None] = mapped_column(comment="The latest end.")


class NodeHour(Base):
    """What ended attempts added to one node's hour, per owner, kept by
    triggers on ``attempts``: what ``node_utilisation`` adds up."""

    __tablename__ = "node_hours"
    __table_args__ = ({"comment": "What ended attempts added to each node's hours, by triggers."},)

    hour: Mapped[datetime] = mapped_column(primary_key=True, comment="The hour's start.")
    node: Mapped[str] = mapped_column(primary_key=True)
    tenant_prefix: Mapped[str] = mapped_column(
        primary_key=True,
        comment="Whose attempts: 'alice.' for tenant alice's jobs, '' for the operator's.",
    )
    attempts: Mapped[int] = mapped_column(comment="Ended attempts in the hour.")
    busy_s: Mapped[Decimal] = mapped_column(Numeric(), comment="Their seconds in the hour.")
    cpu_core_s: Mapped[Decimal] = mapped_column(
        Numeric(), comment="Their seconds in the hour times their jobs' requested cores."
    )


class ProgressRollup(Base):
    """Per job, attempt and month: the reports of a rolled-up month of ``progress``
    (``mdq_rollup_progress``), which keeps every Nth of them."""

    __tablename__ = "progress_rollups"
    __table_args__ = ({"comment": "A rolled-up month of progress, per job and attempt."},)

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    month: Mapped[date] = mapped_column(primary_key=True, comment="The month's first day (UTC).")
    reports: Mapped[int] = mapped_column(comment="Reports the month held.")
    kept: Mapped[int] = mapped_column(comment="Of those, kept in progress.")
    first_step: Mapped[int]
    last_step: Mapped[int]
    first_time: Mapped[datetime]
    last_time: Mapped[datetime]
    min_potential_kj_mol: Mapped[float]
    max_potential_kj_mol: Mapped[float]
    mean_potential_kj_mol: Mapped[float]
    mean_temperature_k: Mapped[float]
    mean_ns_per_day: Mapped[float]


class Rejection(Base):
    """Submits that intake refused, with the field at fault."""

    __tablename__ = "rejections"

    request_id: Mapped[str] = mapped_column(primary_key=True)
    idempotency_key: Mapped[str | None]
    field: Mapped[str | None]
    message: Mapped[str]
    time: Mapped[datetime]


class ConsumerOffset(Base):
    """The last stream sequence projected per consumer, committed with the batch's effect."""

    __tablename__ = "consumer_offsets"

    consumer: Mapped[str] = mapped_column(primary_key=True)
    stream: Mapped[str]
    last_seq: Mapped[int]
    updated_at: Mapped[datetime]
    stream_created: Mapped[datetime | None] = mapped_column(
        comment="Creation time of the stream the offset was projected from"
    )
    last_digest: Mapped[str | None] = mapped_column(
        comment="sha256 of subject and data of the message at last_seq"
    )


class UnfoldedProgress(Base):
    """The attempts whose stored progress reports the jobs' rows have not caught up with yet.

    A batch of the PROGRESS stream stores its reports and its offset and queues here each
    (job, attempt) it reported on, in its transaction; the projection's coalescing fold
    (``mdq.store.projection.jobs.fold_unfolded``) folds them into ``jobs`` and ``attempts``
    and deletes them, in its own. Empty whenever the watcher is caught up."""

    __tablename__ = "progress_unfolded"
    __table_args__ = ({"comment": "Attempts with reports not folded into jobs yet."},)

    job_id: Mapped[str] = mapped_column(primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
