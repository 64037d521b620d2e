"""The chaos harness's own checks (``tools.chaos``) can fail: two runners of one job are
caught by the sampler, lost work beyond a checkpoint interval is computed from the runners'
logs, a torn energy-table line is not taken for a step, and the schedule hits every kind."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.chaos import (
    FAULT_KINDS,
    LONG_KINDS,
    ONCE_KINDS,
    SHORT_KINDS,
    STRIKE_KINDS,
    Campaign,
    ChaosConfig,
    ChaosReport,
    Sampler,
    SoakReport,
    StepsLost,
    fault_schedule,
    job_spec,
    last_energy_step,
    owed_first,
    part_owed_first,
    runner_log_facts,
    runner_processes,
    short_of_wanted,
    steps_lost,
    thermo_log_attempts,
    thermo_log_losses,
)


@pytest.mark.parametrize(
    ("per_kind", "extra"),
    [pytest.param(1, 0, id="one-of-each"), pytest.param(2, 7, id="two-of-each-plus-random")],
)
def test_the_schedule_hits_every_kind_as_often_as_asked(per_kind: int, extra: int) -> None:
    config = ChaosConfig(faults_per_kind=per_kind, extra_faults=extra)
    schedule = fault_schedule(random.Random(3), config)
    assert len(schedule) == per_kind * len(SHORT_KINDS) + len(ONCE_KINDS) + extra
    assert all(schedule.count(kind) >= per_kind for kind in SHORT_KINDS)
    assert all(schedule.count(kind) == 1 for kind in ONCE_KINDS), "random extras are short"
    assert set(LONG_KINDS) | set(STRIKE_KINDS) == set(ONCE_KINDS) <= set(FAULT_KINDS)
    assert schedule == fault_schedule(random.Random(3), config), "the seed decides"
    half = (len(schedule) - len(LONG_KINDS)) // 2 + len(LONG_KINDS)
    for seed in range(50):
        early = fault_schedule(random.Random(seed), config)[:half]
        assert set(LONG_KINDS) <= set(early), "long episodes leave time after them"


def test_a_soak_passes_only_if_every_campaign_did_and_names_the_failed_seeds() -> None:
    good = ChaosReport(seed=1, jobs=40, succeeded=40, max_steps_lost=400, duration_s=300)
    bad = ChaosReport(seed=2, jobs=40, succeeded=39, failed_for_good=1, max_steps_lost=500)
    bad.problems.append("chaos-007: 0 succeeded and 1 failed/cancelled events")
    both = json.loads(SoakReport([good, bad], checkpoint_interval_steps=500).to_json())
    assert both["ok"] is False and both["seeds"] == [1, 2] and both["passed"] == 1
    assert (both["jobs"], both["succeeded"], both["failed_for_good"]) == (80, 79, 1)
    assert both["max_steps_lost"] == 500 and both["checkpoint_interval_steps"] == 500
    assert both["failed_seeds"] == [{"seed": 2, "work_dir": "", "problems": bad.problems}]
    assert {"double_succeeded", "concurrent_runners"} <= set(both)
    only_good = json.loads(SoakReport([good], checkpoint_interval_steps=500).to_json())
    assert only_good["ok"] is True and only_good["failed_seeds"] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("step,time_ps\n100,0.2\n200,0.4\n", 200, id="whole-rows"),
        pytest.param("step,time_ps\n100,0.2\n200,0.4\n30", 200, id="torn-last-line-ignored"),
        pytest.param("step,time_ps\n", None, id="header-only"),
    ],
)
def test_last_energy_step(tmp_path: Path, text: str, expected: int | None) -> None:
    path = tmp_path / "energies.csv"
    path.write_text(text)
    assert last_energy_step(path) == expected


def test_last_energy_step_of_no_table(tmp_path: Path) -> None:
    assert last_energy_step(tmp_path / "missing.csv") is None


LOSS_CASES = [
    pytest.param(
        {"j": [1, 2]},
        {("j", 1): 5100},
        {("j", 2): 5000},
        {("j", 2): 5000},
        [StepsLost("j", 1, 2, 5100, 5000, "runner log")],
        id="resumed-from-the-last-checkpoint",
    ),
    pytest.param(
        {"j": [1, 2]},
        {("j", 1): 5100},
        {("j", 2): 0},
        {("j", 2): 5000},
        [StepsLost("j", 1, 2, 5100, 0, "runner log")],
        id="started-over-despite-a-checkpoint",
    ),
    pytest.param(
        {"j": [1, 2, 3]},
        {("j", 1): 2300},
        {("j", 3): 2000},
        {("j", 2): 2000, ("j", 3): 2000},
        [StepsLost("j", 1, 3, 2300, 2000, "runner log")],
        id="next-attempt-never-ran",
    ),
    pytest.param(
        {"j": [1, 2]},
        {("j", 1): 900},
        {},
        {("j", 2): 500},
        [StepsLost("j", 1, 2, 900, 500, "postgres attempts")],
        id="no-log-line-postgres-stands-in",
    ),
    pytest.param({"j": [1, 2]}, {}, {("j", 2): 0}, {}, [], id="first-attempt-never-stepped"),
]


@pytest.mark.parametrize(("attempts", "reached", "log", "db", "expected"), LOSS_CASES)
def test_steps_lost(
    attempts: dict[str, list[int]],
    reached: dict[tuple[str, int], int],
    log: dict[tuple[str, int], int],
    db: dict[tuple[str, int], int],
    expected: list[StepsLost],
) -> None:
    assert (
        steps_lost(attempts=attempts, reached=reached, resumed_log=log, resumed_db=db) == expected
    )


@pytest.mark.parametrize(
    ("db", "expected"),
    [
        pytest.param({}, StepsLost("j", 1, 2, 900, 0, "runner log"), id="fresh-start"),
        pytest.param(
            {("j", 2): 500},
            StepsLost("j", 1, 2, 900, 500, "postgres attempts"),
            id="resume-line-lost-postgres-stands-in",
        ),
    ],
)
def test_steps_lost_of_an_attempt_that_only_logged_it_built(
    db: dict[tuple[str, int], int], expected: StepsLost
) -> None:
    [loss] = steps_lost(
        attempts={"j": [1, 2]},
        reached={("j", 1): 900},
        resumed_log={},
        resumed_db=db,
        built={("j", 2)},
    )
    assert loss == expected


def test_a_loss_beyond_the_interval_is_visible() -> None:
    [loss] = steps_lost(
        attempts={"j": [1, 2]}, reached={("j", 1): 5100}, resumed_log={("j", 2): 0}, resumed_db={}
    )
    assert loss.lost == 5100 > ChaosConfig().checkpoint_interval_steps


def test_runner_log_facts(tmp_path: Path) -> None:
    tag = "INFO runner[abc-x#{}] services.runner.md"
    (tmp_path / "mdq-abc-x-1.log").write_text(
        f"t {tag.format(1)}: built 500 atoms on the CPU platform\n"
        f"t {tag.format(1)}: checkpoint at step 500: /x/ckpt-000000000500.xml (1 bytes)\n"
        f"t {tag.format(1)}: checkpoint at step 1000: /x/ckpt-000000001000.xml (1 bytes)\n"
    )
    (tmp_path / "mdq-abc-x-2.log").write_text(
        f"t {tag.format(2)}: built 500 atoms on the CPU platform\n"
        f"t {tag.format(2)}: resuming from /x/ckpt-000000001000.xml at step 1000 (native)\n"
    )
    (tmp_path / "mdq-abc-x-3.log").write_text("")  # killed before it logged anything
    facts = runner_log_facts(tmp_path)
    assert facts.resumed == {("abc-x", 2): 1000}
    assert facts.built == {("abc-x", 1), ("abc-x", 2)}
    assert facts.checkpointed == {("abc-x", 1): 1000}


@pytest.fixture
def fake_runners(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def start_fake_runner(job: str, attempt: int, namespace: str) -> subprocess.Popen[bytes]:
    """A process whose command line and environment look like a runner's."""
    env = dict(os.environ, MDQ_JOB_ID=job, MDQ_ATTEMPT=str(attempt), MDQ_NAMESPACE=namespace)
    return subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(60)", "services.runner"], env=env
    )


def test_the_sampler_sees_two_live_runners_of_one_job(
    tmp_path: Path, fake_runners: list[subprocess.Popen[bytes]]
) -> None:
    fake_runners.append(start_fake_runner("job-a", 1, "ns1"))
    fake_runners.append(start_fake_runner("job-a", 2, "ns1"))
    fake_runners.append(start_fake_runner("job-b", 1, "ns1"))
    fake_runners.append(start_fake_runner("job-c", 1, "other-namespace"))
    (tmp_path / "job-b").mkdir()
    (tmp_path / "job-b" / "energies.csv").write_text("step,time_ps\n100,0.2\n")
    found = runner_processes("ns1")
    assert sorted((r.job_id, r.attempt) for r in found) == [
        ("job-a", 1),
        ("job-a", 2),
        ("job-b", 1),
    ]
    sampler = Sampler(namespace="ns1", jobs_dir=tmp_path, every_s=1.0)
    sampler.sample()
    assert [seen["job"] for seen in sampler.concurrent] == ["job-a"]
    assert sampler.reached == {("job-b", 1): 100}


THERMO_LOG = """\
mdq: attempt 1 starts fresh
   Step          Time           Temp          PotEng
         0   0              3             -27093.472
       100   0.5            1.67          -19149.602
       200   1              1.64          -19000.054
       300   1.5
mdq: attempt 2 resumes from step 200 (ckpt-000000000200.restart)
   Step          Time           Temp          PotEng
       200   1              1.64          -19000.054
       300   1.5            1.66          -19108.849
mdq: attempt 3 starts fresh
"""


def test_the_thermo_log_says_what_each_lammps_attempt_computed() -> None:
    attempts = thermo_log_attempts(THERMO_LOG)
    assert {n: (a.resumed_from, a.steps) for n, a in attempts.items()} == {
        1: (None, [0, 100, 200]),  # the torn last line is no step
        2: (200, [200, 300]),
        3: (None, []),
    }
    losses = thermo_log_losses("j", attempts)
    assert [(loss.attempt, loss.next_attempt, loss.lost) for loss in losses] == [
        (1, 2, 0),
        (2, 3, 300),  # a fresh start after a resumed attempt loses all it computed
    ]


def test_every_other_chaos_job_runs_on_lammps() -> None:
    config = ChaosConfig(jobs=4, lammps_every=2)
    specs = [job_spec(index, config) for index in range(4)]
    assert ["lammps" in str(spec["system"]) for spec in specs] == [False, True, False, True]
    assert specs[1]["inputs"] == [{"name": "in.lj-melt"}]
    assert not any("lammps" in str(job_spec(i, ChaosConfig(lammps_every=0))) for i in range(4))


@pytest.mark.parametrize(
    "mode", [pytest.param([], id="one-campaign"), pytest.param(["--soak", "2"], id="soak")]
)
def test_the_harness_never_ends_with_a_bare_traceback(mode: list[str], tmp_path: Path) -> None:
    """The harness itself fails (its work folder cannot be made): one JSON line on stdout
    whose problems hold the traceback, nothing else, and exit 1."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = subprocess.run(
        [sys.executable, "bench/chaos.py", "--jobs", "1", "--work-dir", str(blocker / "x"), *mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 1, done
    [line] = done.stdout.splitlines()
    report = json.loads(line)
    assert report["ok"] is False
    problems = report["problems"]
    assert any("Traceback" in p and "NotADirectoryError" in p for p in problems), problems
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "cancelled, problem",
    [
        pytest.param(False, True, id="running-job-without-a-log"),
        pytest.param(True, False, id="cancelled-before-lammps-wrote-a-line"),
    ],
)
def test_a_lammps_job_without_a_thermo_log_is_a_problem_unless_it_was_cancelled_first(
    tmp_path: Path, cancelled: bool, problem: bool
) -> None:
    campaign = Campaign(ChaosConfig(jobs=2, lammps_every=2, work_dir=tmp_path))
    campaign.job_ids = ["j0", "j1"]  # j1 runs on LAMMPS
    if cancelled:
        campaign.cancels["j1"] = "CONTROL_STOPPING"
    campaign.check_thermo_logs()
    assert bool(campaign.report.problems) is problem, campaign.report.problems
    if problem:
        assert campaign.report.problems == [
            f"j1: no thermo log ([Errno 2] No such file or directory: "
            f"'{campaign.data_dir / 'jobs' / 'j1' / 'log.lammps'}')"
        ]


SHORT_CASES: dict[str, tuple[list[str], dict[str, int], int, list[str]]] = {
    "every kind hit its share; an extra one left": (["metrics"], {"metrics": 2}, 2, []),
    "a kind hit fewer times than wanted": (["metrics"], {"metrics": 1}, 2, ["metrics"]),
    "a kind never hit": (["agent", "agent"], {}, 1, ["agent"]),
    "a long episode left, hit none": (["nats_long"], {"metrics": 3}, 1, ["nats_long"]),
    "nothing left": ([], {}, 1, []),
}


@pytest.mark.parametrize(
    ("left", "injected", "per_kind", "short"), SHORT_CASES.values(), ids=SHORT_CASES.keys()
)
def test_faults_left_at_the_end_are_a_problem_only_below_their_share(
    left: list[str], injected: dict[str, int], per_kind: int, short: list[str]
) -> None:
    """The jobs were done before the schedule: a campaign that struck every kind as often as
    it promised passes, whatever random extra faults were left; a kind struck fewer times
    than promised fails it."""
    config = ChaosConfig(faults_per_kind=per_kind, once_per_kind=1)
    assert short_of_wanted(left, injected, config) == short


OWED_CASES: dict[str, tuple[list[str], dict[str, int], list[str]]] = {
    "an owed cancel comes before the extras": (
        ["metrics", "intake", "cancel"],
        {"metrics": 2, "intake": 2, "cancel": 1},
        ["cancel", "metrics", "intake"],
    ),
    "owed faults keep their order": (
        ["agent", "metrics", "cancel"],
        {"metrics": 2},
        ["agent", "cancel", "metrics"],
    ),
    "a kind owed once with two left: one comes first": (
        ["cancel", "metrics", "cancel"],
        {"cancel": 1, "metrics": 2},
        ["cancel", "metrics", "cancel"],
    ),
    "nothing owed: the order stays": (
        ["intake", "metrics"],
        {"intake": 2, "metrics": 2},
        ["intake", "metrics"],
    ),
    "a strike is owed once": (
        ["metrics", "strike_snapshot"],
        {"metrics": 2},
        ["strike_snapshot", "metrics"],
    ),
}


@pytest.mark.parametrize(
    ("schedule", "injected", "expected"), OWED_CASES.values(), ids=OWED_CASES.keys()
)
def test_late_in_a_campaign_what_is_owed_comes_before_the_extras(
    schedule: list[str], injected: dict[str, int], expected: list[str]
) -> None:
    owed_first(schedule, injected, ChaosConfig(faults_per_kind=2, once_per_kind=1))
    assert schedule == expected


PART_CASES: dict[str, tuple[list[str], str, dict[str, int], list[str], bool]] = {
    "an owed restart of its part comes first": (
        ["metrics", "postgres", "intake"],
        "postgres_long",
        {"postgres": 1},
        ["postgres", "postgres_long", "metrics", "intake"],
        True,
    ),
    "its part's faults all hit: the episode goes now": (
        ["metrics", "postgres"],
        "postgres_long",
        {"postgres": 2},
        ["metrics", "postgres"],
        False,
    ),
    "another part's owed fault does not hold it": (
        ["nats", "metrics"],
        "disk_full_long",
        {},
        ["nats", "metrics"],
        False,
    ),
    "the first owed one of the part is taken": (
        ["disk_full", "metrics", "disk_full"],
        "disk_full_long",
        {},
        ["disk_full", "disk_full_long", "metrics", "disk_full"],
        True,
    ),
}


@pytest.mark.parametrize(
    ("schedule", "long_kind", "injected", "expected", "moved"),
    PART_CASES.values(),
    ids=PART_CASES.keys(),
)
def test_a_long_episode_waits_for_the_faults_its_part_still_owes(
    schedule: list[str],
    long_kind: str,
    injected: dict[str, int],
    expected: list[str],
    moved: bool,
) -> None:
    """The jobs may all end during a long outage, while the faults of its part wait for it:
    what that part still owes goes first."""
    config = ChaosConfig(faults_per_kind=2, once_per_kind=1)
    assert part_owed_first(schedule, long_kind, injected, config) is moved
    assert schedule == expected
