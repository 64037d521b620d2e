"""What the CLI prints for what a person types and reads: an option out of its range is a
usage error naming it (not a database traceback); ``mdq show`` of a job without a submitter
or without MD; the wording and the CPU of ``mdq recommend``. Tables of named cases; the
commands run offline (Typer's runner, no server)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mdq.cli.history import show_panel, submitted_label
from mdq.cli.main import app
from mdq.contracts import pb
from mdq.core.recommend import (
    NO_SYSTEM,
    CostFingerprint,
    UsageSample,
    recommend,
    recommend_for_spec,
)
from mdq.core.spec import normalize_job
from mdq.store import queries
from tests.tables import named_cases

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

OUT_OF_RANGE = [
    ("ls-negative-limit", ["ls", "--limit", "-3"], "--limit"),
    ("ls-zero-limit", ["ls", "--limit", "0"], "--limit"),
    ("ls-word-limit", ["ls", "--limit", "many"], "--limit"),
    ("watch-negative-limit", ["watch", "--limit", "-1"], "--limit"),
    ("watch-negative-timeout", ["watch", "a-job", "--timeout", "-5"], "--timeout"),
    ("recommend-no-days", ["recommend", "x.yaml", "--days", "0"], "--days"),
    ("replay-every-zero", ["replay", "a-job", "--progress-every", "0"], "--progress-every"),
]


@pytest.mark.parametrize(
    ("case", "args", "option"), OUT_OF_RANGE, ids=[case[0] for case in OUT_OF_RANGE]
)
def test_an_option_out_of_range_is_a_usage_error_naming_it(
    case: str, args: list[str], option: str
) -> None:
    """Refused before anything is read: no server is given, and none is asked."""
    result = CliRunner().invoke(
        app, args, env={"NATS_URL": "", "DATABASE_URL": "", "COLUMNS": "160"}
    )
    assert result.exit_code == 2, result.output
    assert option in result.output and "Invalid value" in result.output, result.output
    assert "Traceback" not in result.output


SUBMITTED = [
    ("by-a-person", "ada", "2026-11-29T12:00:00+00:00 by ada"),
    ("by-nobody-said", "", "2026-11-29T12:00:00+00:00"),
    ("by-nobody-null", None, "2026-11-29T12:00:00+00:00"),
]


@named_cases(("by", "shown"), SUBMITTED)
def test_who_submitted(by: str | None, shown: str) -> None:
    assert submitted_label(AT, by) == shown


def analysis(submitted_by: str | None) -> queries.JobDetail:
    record = queries.JobRecord(
        job_id="0123456789ab-analyze",
        request_id="0123456789ab",
        name="analyze",
        task="TASK_ANALYZE",
        state="SUCCEEDED",
        attempt=1,
        priority_class="normal",
        node="n1",
        pod_name="mdq-0123456789ab-analyze-1",
        spec={},
        depends_on=("0123456789ab-md",),
        submitted_by=submitted_by,
        submitted_at=AT,
        updated_at=AT,
        target_steps=1,
        last_step=1,
        last_potential_kj_mol=-10.0,
        last_temperature_k=0.0,
        last_ns_per_day=0.0,
        last_progress_at=AT,
        done_reason="analyzed",
        final_reason=None,
        final_message=None,
        latest_checkpoint_step=None,
    )
    last = queries.ProgressPoint(
        attempt=1,
        step=1,
        time=AT,
        time_ps=0.0,
        potential_kj_mol=-10.0,
        kinetic_kj_mol=0.0,
        temperature_k=0.0,
        ns_per_day=0.0,
        target_steps=1,
        eta_s=0.0,
        done_reason="analyzed",
    )
    return queries.JobDetail(job=record, attempts=(), last_progress=last, latest_checkpoint=None)


def shown(detail: queries.JobDetail) -> str:
    console = Console(width=160, record=True)
    console.print(show_panel(detail, []))
    return console.export_text()


def test_show_says_nothing_it_does_not_know() -> None:
    """No "by ?" for a job whose submit named nobody, no 0.0 ns/day or 0.0 K for an
    analysis: what is not there is not printed."""
    text = shown(analysis(None))
    submitted = next(line for line in text.splitlines() if "submitted" in line)
    assert "?" not in submitted and " by" not in submitted, submitted
    assert "ns/day" not in text, text
    assert " 0.0 K" not in text, text
    last = next(line for line in text.splitlines() if line.startswith("last progress"))
    assert last == "last progress: attempt 1, step 1, -10.0 kJ/mol", last
    with_name = shown(analysis("ada"))
    assert "kJ/mol" in with_name and "(lj)" not in with_name
    assert any("by ada" in line for line in with_name.splitlines() if "submitted" in line)


def test_show_gives_a_job_in_reduced_units_its_units() -> None:
    """A LAMMPS job in LJ units stores reduced figures: show says so, never kJ/mol or K."""
    detail = analysis(None)
    record = replace(
        detail.job, units="lj", task="TASK_MD", last_temperature_k=1.5, last_ns_per_day=2.0
    )
    assert detail.last_progress is not None
    last = replace(detail.last_progress, temperature_k=1.5, ns_per_day=2.0)
    text = shown(replace(detail, job=record, last_progress=last))
    assert "kJ/mol" not in text and " K" not in text and "ns/day" not in text, text
    assert "-10.0 ε (lj)" in text and "1.50 ε/k_B (lj)" in text and "2.0 kτ/day (lj)" in text


# -- mdq recommend ---------------------------------------------------------------------------------

ANALYSIS = CostFingerprint(
    system_kind=NO_SYSTEM,
    atom_bucket=-1,
    nonbonded_method=0,
    cutoff_nm=0.0,
    barostat=False,
    integrator=0,
    platform="CPU",
    threads=1,
    trajectory_interval_steps=0,
    checkpoint_interval_steps=0,
)


def runs(fingerprint: CostFingerprint, count: int, cores: float, limit: float) -> list[UsageSample]:
    return [
        UsageSample(
            fingerprint=fingerprint,
            peak_memory_mb=150.0,
            mean_cores=cores,
            memory_limit_mb=512.0,
            cpu_limit=limit,
        )
        for _ in range(count)
    ]


RECOMMENDED = [
    # (history, the cores asked for) -> (cores recommended, words of the evidence)
    (
        "analysis-runs-at-a-whole-core-for-a-job-asking-half",
        runs(ANALYSIS, 26, 0.97, 1.0),
        0.5,
        0.5,
        "p95 of 26 runs of analysis jobs, +10 % memory; p90 of cores used, at most the 0.5 "
        "asked for",
    ),
    (
        "analysis-runs-that-used-less-than-asked",
        runs(ANALYSIS, 26, 0.3, 1.0),
        1.0,
        0.3,
        "p95 of 26 runs of analysis jobs, +10 % memory; p90 of cores used",
    ),
    (
        "no-history-for-an-analysis",
        [],
        0.5,
        0.5,
        "no history: physical estimate for an analysis job, 1 thread, +50 % memory",
    ),
    ("no-history-nothing-asked", [], 0.0, 1.0, "physical estimate for an analysis job"),
]


@named_cases(("history", "asked", "cores", "evidence"), RECOMMENDED)
def test_what_recommend_says(
    history: list[UsageSample], asked: float, cores: float, evidence: str
) -> None:
    recommendation = recommend(ANALYSIS, atoms=0, history=history, cpu_asked=asked)
    assert recommendation.cpu == cores
    assert evidence in recommendation.evidence, recommendation.evidence
    assert "none" not in recommendation.evidence and "unknown)" not in recommendation.evidence


def test_a_job_asking_half_a_core_is_never_recommended_a_whole_one() -> None:
    spec = normalize_job(
        pb.JobSpec(
            name="analyze",
            task=pb.TASK_ANALYZE,
            depends_on=["md"],
            resources=pb.Resources(cpu=0.5),
        ),
        "jobs[0]",
    )
    throttled = [replace(run, mean_cores=1.0) for run in runs(ANALYSIS, 12, 1.0, 1.0)]
    for history in ([], runs(ANALYSIS, 26, 0.97, 1.0), throttled):
        assert recommend_for_spec(spec, history=history).cpu == 0.5
