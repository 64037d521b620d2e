"""The watcher's progress rows, built at once, are the rows its column table describes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.state import event_time
from mdq.store.projection.facts import PROGRESS, Fact, Stored, progress_rows

AT = datetime(2026, 1, 1, tzinfo=UTC)


def report(**fields: object) -> pb.Event:
    return make_event(
        "progress",
        pb.Progress(**fields),  # type: ignore[arg-type]
        job_id="0123456789ab-md",
        attempt=2,
        producer="runner",
        at=AT,
        detail=fields.get("step", 0),  # type: ignore[arg-type]
    )


def with_nanoseconds(event: pb.Event, nanos: int) -> pb.Event:
    event.time.nanos = nanos
    return event


CASES = {
    "every field set": report(
        step=1000,
        target_steps=50_000,
        time_ps=2.0,
        potential_kj_mol=-12_345.5,
        kinetic_kj_mol=678.25,
        temperature_k=300.1,
        ns_per_day=14.2,
        eta_s=3600.0,
        done_reason="steps_reached",
    ),
    "defaults only": report(step=0),
    "a minimiser's report": report(step=250, potential_kj_mol=-9.0, done_reason="converged"),
    "a LAMMPS report in reduced units": report(step=100, potential_kj_mol=-3.2, units="lj"),
    "a time with nanoseconds, cut to microseconds": with_nanoseconds(report(step=5), 123_456_789),
}


@pytest.mark.parametrize("event", list(CASES.values()), ids=list(CASES))
def test_progress_rows_are_the_column_table_s_rows(event: pb.Event) -> None:
    fact = Fact(17, event, "progress", event_time(event))
    expected = PROGRESS.rows([Stored("T_PROGRESS", fact)])
    assert progress_rows("T_PROGRESS", [(17, event)]) == expected
