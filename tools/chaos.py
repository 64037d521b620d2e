"""``make chaos``: a campaign of MD jobs on the embedded stack while everything fails at random.

The harness owns every part so it can break every part:

* its own NATS JetStream (``start_nats``) and PostgreSQL (``start_postgres``) in a temporary
  folder, killed with SIGKILL and started again on the same port and folder;
* the job data folder (``MDQ_DATA_DIR``: checkpoints, trajectories, energy tables, pod logs) on
  a small filesystem of its own (an ext4 loop file, else a size-limited tmpfs), filled to the
  last byte by a file and freed again — the disk a scientist's jobs write to is the one that
  fills in practice; the servers' stores stay on the machine's disk (in production they are
  separate volumes);
* ``mdq up`` with ``NATS_URL`` / ``DATABASE_URL`` set (services + local node agent, supervised),
  whose processes (intake, placement, watcher, recovery, metrics, the node agent, the runners)
  are found by the process tree and their command lines and killed with SIGKILL, or stopped
  with SIGSTOP for the stack to find stuck and restart;
* job control: a ``cancel`` fault cancels a running job through placement (docs/control.md),
  as its owner would, while the other faults go on.

Faults come from a seeded schedule (the seed is printed): every kind at least
``faults_per_kind`` times, in random order, a random pause between them. A kill that finds no
process is recorded under ``missed`` and tried again later, never skipped silently.

Meanwhile a sampler thread lists the runner processes every ``sample_s`` seconds (job id and
attempt from their environment) to catch two live runners of one job, and reads the tail of
each running job's energy table (``energies.csv``, written by the runner itself every report
interval) for the step each attempt reached.

At the end it checks, from the log (JetStream) and from PostgreSQL:

* every job SUCCEEDED, with the exact final step (PostgreSQL ``jobs.last_step``, and the last
  progress report of the log), but a job the campaign cancelled: that one ends CANCELLED, or
  SUCCEEDED when it succeeded before its stop took effect, with no runner left;
* exactly one terminal event per job in the log (``double_succeeded`` counts the jobs with more
  than one ``succeeded``);
* no job ever had two live runners (``concurrent_runners``: samples that saw two);
* steps lost per retry ≤ the checkpoint interval: the step an attempt reached (the most of its
  energy table's tail, sampled, and the checkpoints its own log announces) minus the step the
  next attempt resumed from (its own log: "resuming from … at step N", or "starting over from
  step 0"; PostgreSQL ``attempts.resumed_from_step`` only where the log line is missing); and
  for the LAMMPS jobs (every ``lammps_every``-th job runs LAMMPS's Lennard-Jones melt of
  ``examples/lammps``, its script uploaded as ``mdq submit`` does) again from outside, in the
  thermo log each one leaves on disk: an attempt's last thermo line minus the step the next
  one's ``mdq: attempt N resumes from step S`` line names;
* ``mdq replay --rebuild --compare`` finds the rebuilt projection equal to the live one.

It prints one JSON line of figures (``ChaosReport.to_json``); ``ok`` is false and the reasons
are listed under ``problems`` when a check fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from mdq.embedded import EmbeddedNats, EmbeddedPostgres, free_port, start_nats, start_postgres
from mdq.health import DEFAULT_MAX_AGE_S
from mdq.testing.disks import fill_file
from tools.processes import runner_environments

SERVICE_KINDS: tuple[str, ...] = ("intake", "placement", "watcher", "recovery", "metrics")
PROCESS_KINDS: tuple[str, ...] = (*SERVICE_KINDS, "agent", "runner")
SHORT_KINDS: tuple[str, ...] = (*PROCESS_KINDS, "nats", "postgres", "disk_full", "cancel")
"""Kills and short outages: ``faults_per_kind`` of each, and the random extra faults."""
LONG_KINDS: tuple[str, ...] = ("disk_full_long", "nats_long", "postgres_long", "freeze_long")
"""Long episodes (``ChaosConfig.long_s``): the data disk full, NATS or PostgreSQL down, a
service or the node agent stopped (SIGSTOP) until the stack restarts it."""
STRIKE_KINDS: tuple[str, ...] = (
    "strike_pod_start",
    "strike_checkpoint",
    "strike_snapshot",
    "strike_backoff",
)
"""Kills at the worst moments: the node agent while a pod starts, a runner while it writes a
checkpoint, placement while it writes its snapshot, placement and recovery while a job waits
out a backoff."""
ONCE_KINDS: tuple[str, ...] = (*LONG_KINDS, *STRIKE_KINDS)
"""Kinds injected ``once_per_kind`` times (not among the random extra faults)."""
FAULT_KINDS: tuple[str, ...] = (*SHORT_KINDS, *ONCE_KINDS)
"""Every kind of fault the campaign injects."""

PART_HELD_DOWN = {
    "nats": "nats",
    "nats_long": "nats",
    "postgres": "postgres",
    "postgres_long": "postgres",
    "disk_full": "disk",
    "disk_full_long": "disk",
    "freeze_long": "freeze",
}
"""The part of the campaign an outage holds down; one outage of a part at a time."""

MIN_PAUSE_S = 0.3
"""The shortest pause between two faults (when the faults have fallen behind the jobs)."""
OWED_FIRST_FROM = 0.5
"""Once this share of the jobs has ended, the faults a kind still owes come before the random
extra ones (``owed_first``)."""

_RESUMED = re.compile(
    r"runner\[(?P<job>[^#\]]+)#(?P<attempt>\d+)\].*resuming from .* at step (?P<step>\d+)"
)
_STARTED_OVER = re.compile(
    r"runner\[(?P<job>[^#\]]+)#(?P<attempt>\d+)\].*starting over from step 0"
)
_BUILT = re.compile(r"runner\[(?P<job>[^#\]]+)#(?P<attempt>\d+)\].*: built \d+ atoms")
_CHECKPOINTED = re.compile(
    r"runner\[(?P<job>[^#\]]+)#(?P<attempt>\d+)\].*checkpoint at step (?P<step>\d+)"
)


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """What the campaign runs and how hard it is hit."""

    jobs: int = 40
    seed: int | None = None
    """None: a random seed (printed in the report)."""
    steps: int = 3000
    checkpoint_interval_steps: int = 500
    report_interval_steps: int = 100
    atoms: int = 500
    """Atoms of each job's Lennard-Jones fluid (small: a job takes seconds)."""
    lammps_every: int = 2
    """Every this many jobs one runs on LAMMPS (0: none): the Lennard-Jones melt of
    examples/lammps/in.lj-melt, ``lammps_cells`` fcc cells a side (4 N³ atoms)."""
    lammps_cells: int = 5
    nodes: int = 2
    kinds: tuple[str, ...] = FAULT_KINDS
    """The kinds of fault injected (default: every kind)."""
    faults_per_kind: int = 1
    once_per_kind: int = 1
    """How many of each long episode and worst-moment strike (``ONCE_KINDS``)."""
    extra_faults: int = 0
    """Faults of random kinds on top of ``faults_per_kind`` of each kind."""
    max_faults_ahead: int | None = None
    """Spread the faults over the campaign: at most this many more faults injected than the
    share of jobs ended calls for (None: as fast as ``pause_s`` allows)."""
    pause_s: tuple[float, float] = (2.0, 5.0)
    """Random pause between two faults."""
    outage_s: tuple[float, float] = (1.0, 3.0)
    """How long NATS or PostgreSQL stays down."""
    disk_full_s: tuple[float, float] = (2.0, 4.0)
    """How long the data disk stays full."""
    long_s: dict[str, float] = field(
        default_factory=lambda: {
            "disk_full_long": 30.0,
            "nats_long": 20.0,
            "postgres_long": 60.0,
            "freeze_long": 90.0,
        }
    )
    """How long each long episode lasts (``freeze_long``: at most; the stack ends it, by
    restarting what is stopped, after ``mdq.health.DEFAULT_MAX_AGE_S``)."""
    strike_wait_s: float = 30.0
    """How long a strike waits for its moment before it counts as missed (and is tried
    again later)."""
    disk_mb: int = 128
    deadline_s: float = 900.0
    """The whole campaign (faults, jobs, checks) ends by then, whatever happens."""
    check_reserve_s: float = 120.0
    """Of the deadline, kept for the checks after the jobs (projection catch-up, rebuild)."""
    sample_s: float = 0.2
    work_dir: Path | None = None
    """Where servers, state and the data disk live (default: a new folder under /tmp)."""
    keep: bool = False
    """Keep the work folder afterwards (for reading the logs); a failed campaign keeps it
    anyway."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the stack's services (MDQ_* settings)."""


@dataclass(slots=True)
class ChaosReport:
    """The figures of one campaign; ``to_json`` is the line ``make chaos`` prints."""

    seed: int
    jobs: int = 0
    succeeded: int = 0
    failed_for_good: int = 0
    """Jobs that ended without succeeding, other than those the campaign cancelled
    (``cancelled``)."""
    final_step_exact: int = 0
    kills: dict[str, int] = field(default_factory=dict)
    strikes: dict[str, int] = field(default_factory=dict)
    """Long episodes and worst-moment strikes, by kind."""
    missed: dict[str, int] = field(default_factory=dict)
    nats_restarts: int = 0
    postgres_restarts: int = 0
    disk_full_episodes: int = 0
    disk_full_mode: str = ""
    cancels: int = 0
    """Cancels the campaign sent that placement took in hand (a running job each)."""
    cancelled: int = 0
    """Jobs that ended CANCELLED (the others it cancelled succeeded before their stop)."""
    double_succeeded: int = 0
    concurrent_runners: int = 0
    retries: int = 0
    max_steps_lost: int = 0
    steps_lost_source: str = ""
    lammps_jobs: int = 0
    max_steps_lost_thermo_log: int = 0
    """Of the LAMMPS jobs' retries, the most steps computed twice, read in their thermo logs."""
    checkpoint_interval_steps: int = 0
    rebuild_equal: bool = False
    runner_samples: int = 0
    duration_s: float = 0.0
    work_dir: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        document: dict[str, Any] = {
            "ok": self.ok,
            "seed": self.seed,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "failed_for_good": self.failed_for_good,
            "final_step_exact": self.final_step_exact,
            "kills": dict(sorted(self.kills.items())),
            "strikes": dict(sorted(self.strikes.items())),
            "missed": dict(sorted(self.missed.items())),
            "nats_restarts": self.nats_restarts,
            "postgres_restarts": self.postgres_restarts,
            "disk_full_episodes": self.disk_full_episodes,
            "disk_full_mode": self.disk_full_mode,
            "cancels": self.cancels,
            "cancelled": self.cancelled,
            "double_succeeded": self.double_succeeded,
            "concurrent_runners": self.concurrent_runners,
            "retries": self.retries,
            "max_steps_lost": self.max_steps_lost,
            "steps_lost_source": self.steps_lost_source,
            "lammps_jobs": self.lammps_jobs,
            "max_steps_lost_thermo_log": self.max_steps_lost_thermo_log,
            "checkpoint_interval_steps": self.checkpoint_interval_steps,
            "rebuild_equal": self.rebuild_equal,
            "runner_samples": self.runner_samples,
            "duration_s": round(self.duration_s, 1),
            "work_dir": self.work_dir,
            "problems": self.problems,
        }
        return json.dumps(document, sort_keys=False)


class Deadline:
    """The campaign's one clock: every wait is bounded by what is left of it."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())

    def bound(self, seconds: float) -> float:
        return min(seconds, self.left())

    @property
    def passed(self) -> bool:
        return self.left() <= 0.0


# -- the data disk ---------------------------------------------------------------------------
class DataDisk:
    """A small filesystem mounted on the job data folder, so it can be filled and freed.

    An ext4 loop file (a real block filesystem: fsync, ENOSPC as on a disk) when ``mount -o
    loop`` is permitted, else a size-limited tmpfs; ``mode`` says which, or why neither.
    """

    def __init__(self, *, mount_point: Path, image: Path, size_mb: int) -> None:
        self.mount_point = mount_point
        self._image = image
        self._size_mb = size_mb
        self._filler = mount_point / ".chaos-fill"
        self.mode = ""
        self.mounted = False

    def mount(self) -> None:
        self.mount_point.mkdir(parents=True, exist_ok=True)
        tried: list[str] = []
        try:
            with self._image.open("wb") as handle:
                handle.truncate(self._size_mb * 1024 * 1024)
            subprocess.run(
                ["mkfs.ext4", "-q", "-F", "-m", "0", str(self._image)],
                check=True,
                capture_output=True,
                timeout=60,
            )
            subprocess.run(
                ["mount", "-o", "loop", str(self._image), str(self.mount_point)],
                check=True,
                capture_output=True,
                timeout=30,
            )
            self.mode, self.mounted = "ext4-loop", True
            return
        except (OSError, subprocess.SubprocessError) as error:
            tried.append(f"ext4 loop: {_why(error)}")
            self._image.unlink(missing_ok=True)
        try:
            subprocess.run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"size={self._size_mb}m",
                    "tmpfs",
                    str(self.mount_point),
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
            self.mode, self.mounted = "tmpfs", True
        except (OSError, subprocess.SubprocessError) as error:
            tried.append(f"tmpfs: {_why(error)}")
            self.mode = "unavailable (" + "; ".join(tried) + ")"

    def fill(self) -> int:
        """Write a file until the filesystem refuses another byte; the bytes written."""
        return fill_file(self._filler)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.mount_point).free

    def unmount(self) -> None:
        self.free()
        if self.mounted:
            for _ in range(20):
                done = subprocess.run(
                    ["umount", str(self.mount_point)], capture_output=True, timeout=30
                )
                if done.returncode == 0:
                    break
                time.sleep(0.25)
            else:
                subprocess.run(["umount", "-l", str(self.mount_point)], capture_output=True)
            self.mounted = False
        self._image.unlink(missing_ok=True)


def _why(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        text = (error.stderr or b"").decode(errors="replace").strip().splitlines()
        return text[-1] if text else f"exit {error.returncode}"
    return str(error)


# -- processes -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunnerProcess:
    pid: int
    job_id: str
    attempt: int


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kind_of(cmdline: Sequence[str]) -> str | None:
    """Which part of mdq a command line runs, or None."""
    joined = " ".join(cmdline)
    if "services.runner" in joined:
        return "runner"
    if "mdq.backends.local" in joined:
        return "agent"
    for name in SERVICE_KINDS:
        if f"services.{name}" in joined:
            return name
    return None


def stack_processes(root_pid: int) -> dict[str, list[psutil.Process]]:
    """The live processes under ``root_pid`` (the ``mdq up`` process), by kind."""
    found: dict[str, list[psutil.Process]] = defaultdict(list)
    try:
        children = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            kind = _kind_of(child.cmdline())
        except psutil.Error:
            continue
        if kind is not None and _alive(child):
            found[kind].append(child)
    return found


def runner_processes(namespace: str) -> list[RunnerProcess]:
    """The live runners of this campaign on this machine (job id and attempt from their
    environment). Every process is looked at, not only the stack's tree: a runner that
    outlived its node agent (re-parented to init) is exactly the one to catch."""
    runners: list[RunnerProcess] = []
    for process, env in runner_environments():
        if env.get("MDQ_NAMESPACE") != namespace or "MDQ_JOB_ID" not in env:
            continue
        if not _alive(process):
            continue
        runners.append(
            RunnerProcess(
                pid=process.pid,
                job_id=env["MDQ_JOB_ID"],
                attempt=int(env.get("MDQ_ATTEMPT") or 0),
            )
        )
    return runners


def last_energy_step(path: Path) -> int | None:
    """The step of the last whole row of an energy table (the runner's own file), or None."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return None
    lines = tail.split("\n")
    for line in reversed(lines[:-1]):  # the text after the last newline may be torn
        first = line.split(",", 1)[0].strip()
        if first.isdigit():
            return int(first)
    return None


class Sampler:
    """A thread that lists the campaign's runners and the steps they reached."""

    def __init__(self, *, namespace: str, jobs_dir: Path, every_s: float) -> None:
        self._namespace = namespace
        self._jobs_dir = jobs_dir
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)
        self.samples = 0
        self.concurrent: list[dict[str, object]] = []
        self.reached: dict[tuple[str, int], int] = {}
        """(job, attempt) → the most step seen in the energy table while it ran."""
        self.live: dict[str, int] = {}
        """Job → the pid of its one live runner, as last sampled."""
        self.error: str = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as error:  # recorded; the sampler must not die silently
                self.error = repr(error)
            self._stop.wait(self._every_s)

    def sample(self) -> None:
        runners = runner_processes(self._namespace)
        self.samples += 1
        by_job: dict[str, list[RunnerProcess]] = defaultdict(list)
        for runner in runners:
            by_job[runner.job_id].append(runner)
        self.live = {job: live[0].pid for job, live in by_job.items() if len(live) == 1}
        for job, live in by_job.items():
            if len(live) > 1:
                self.concurrent.append(
                    {"job": job, "runners": [(r.pid, r.attempt) for r in live], "at": time.time()}
                )
            if len(live) == 1:
                step = last_energy_step(self._jobs_dir / job / "energies.csv")
                key = (job, live[0].attempt)
                if step is not None and step > self.reached.get(key, -1):
                    self.reached[key] = step


# -- steps lost ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunnerLogFacts:
    """What the runners' own logs (``<data>/pods/*.log``) say, by (job, attempt)."""

    resumed: dict[tuple[str, int], int]
    """The step the attempt says it resumed from ("resuming from … at step N"; "starting over
    from step 0" is 0)."""
    built: set[tuple[str, int]]
    """Attempts that built their system (so they ran, from step 0 unless they resumed)."""
    checkpointed: dict[tuple[str, int], int]
    """The last checkpoint it wrote."""


def runner_log_facts(pods_dir: Path) -> RunnerLogFacts:
    """Read every runner log under ``pods_dir`` (lines tagged ``runner[JOB#ATTEMPT]``)."""
    resumed: dict[tuple[str, int], int] = {}
    built: set[tuple[str, int]] = set()
    checkpointed: dict[tuple[str, int], int] = {}
    for path in sorted(pods_dir.glob("*.log")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if match := _RESUMED.search(line):
                resumed[(match["job"], int(match["attempt"]))] = int(match["step"])
            elif match := _STARTED_OVER.search(line):
                resumed[(match["job"], int(match["attempt"]))] = 0
            elif match := _BUILT.search(line):
                built.add((match["job"], int(match["attempt"])))
            elif match := _CHECKPOINTED.search(line):
                key = (match["job"], int(match["attempt"]))
                checkpointed[key] = max(checkpointed.get(key, 0), int(match["step"]))
    return RunnerLogFacts(resumed=resumed, built=built, checkpointed=checkpointed)


@dataclass(frozen=True, slots=True)
class StepsLost:
    """The MD work one failed attempt lost: what it reached minus where the next one resumed."""

    job: str
    attempt: int
    next_attempt: int
    reached: int
    resumed: int
    source: str

    @property
    def lost(self) -> int:
        return max(0, self.reached - self.resumed)


def steps_lost(
    *,
    attempts: dict[str, list[int]],
    reached: dict[tuple[str, int], int],
    resumed_log: dict[tuple[str, int], int],
    resumed_db: dict[tuple[str, int], int],
    built: frozenset[tuple[str, int]] | set[tuple[str, int]] = frozenset(),
) -> list[StepsLost]:
    """For each attempt that reached a step and was followed by another: the steps lost.

    The next attempt compared with is the next one that ran (its runner's log says where it
    started: a "resuming"/"starting over" line, or only "built", which is step 0 for a fresh
    start). Where the log is silent — no later attempt left a line, or one built its system
    but its resume line is missing although a resume was asked (a full disk swallows lines)
    — the ``resumed_from_step`` projected into PostgreSQL stands in."""
    losses: list[StepsLost] = []
    for job, found in attempts.items():
        numbers = sorted(found)
        for index, attempt in enumerate(numbers[:-1]):
            step = reached.get((job, attempt), -1)
            if step < 0:
                continue  # never stepped (killed while starting): nothing to lose
            later = numbers[index + 1 :]
            ran = [n for n in later if (job, n) in resumed_log or (job, n) in built]
            if ran and (job, ran[0]) in resumed_log:
                start = resumed_log[(job, ran[0])]
                losses.append(StepsLost(job, attempt, ran[0], step, start, "runner log"))
            elif ran and not resumed_db.get((job, ran[0]), 0):
                losses.append(StepsLost(job, attempt, ran[0], step, 0, "runner log"))
            elif ran:
                start = resumed_db[(job, ran[0])]
                losses.append(StepsLost(job, attempt, ran[0], step, start, "postgres attempts"))
            else:
                following = later[0]
                start = resumed_db.get((job, following), 0)
                losses.append(StepsLost(job, attempt, following, step, start, "postgres attempts"))
    return losses


# -- the LAMMPS jobs' thermo logs -------------------------------------------------------------
_ATTEMPT_LINE = re.compile(
    r"^mdq: attempt (?P<attempt>\d+) (?:resumes from step (?P<step>\d+)|starts)"
)


@dataclass(slots=True)
class ThermoAttempt:
    """What one attempt of a LAMMPS job wrote into its thermo log."""

    resumed_from: int | None
    """The step its marker line says it resumed from (None: it started fresh)."""
    steps: list[int] = field(default_factory=list)
    """The steps of its thermo lines, in order."""


def thermo_log_attempts(text: str) -> dict[int, ThermoAttempt]:
    """Each attempt's part of a LAMMPS job's ``log.lammps``: the runner's marker line, then
    LAMMPS's thermo lines (a ``Step ...`` header, then rows of as many numbers)."""
    attempts: dict[int, ThermoAttempt] = {}
    current: ThermoAttempt | None = None
    columns = 0
    for line in text.splitlines():
        if match := _ATTEMPT_LINE.match(line):
            step = match["step"]
            current = ThermoAttempt(resumed_from=int(step) if step is not None else None)
            attempts[int(match["attempt"])] = current
            continue
        words = line.split()
        if words[:1] == ["Step"]:
            columns = len(words)
            continue
        if current is not None and columns and len(words) == columns and words[0].isdigit():
            try:
                [float(word) for word in words]
            except ValueError:
                continue  # a torn line
            current.steps.append(int(words[0]))
    return attempts


def thermo_log_losses(job: str, attempts: dict[int, ThermoAttempt]) -> list[StepsLost]:
    """For each attempt that computed steps and was followed by one that ran: the steps the
    next one computed again (from where it resumed, or from 0 when it started fresh)."""
    losses: list[StepsLost] = []
    numbers = sorted(attempts)
    for attempt, following in itertools.pairwise(numbers):
        steps = attempts[attempt].steps
        if not steps:
            continue
        resumed = attempts[following].resumed_from or 0
        losses.append(StepsLost(job, attempt, following, max(steps), resumed, "thermo log"))
    return losses


LAMMPS_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "lammps" / "in.lj-melt"


# -- the campaign ----------------------------------------------------------------------------
def wanted(kind: str, config: ChaosConfig) -> int:
    """How many faults of ``kind`` the campaign injects (before the random extra ones)."""
    return config.once_per_kind if kind in ONCE_KINDS else config.faults_per_kind


def short_of_wanted(
    left: Sequence[str], injected: Mapping[str, int], config: ChaosConfig
) -> list[str]:
    """Of the faults ``left`` in the schedule when the jobs were done, those of a kind that hit
    fewer than ``wanted`` times (each once): a campaign that never struck a kind as often as
    it promised. A random extra one of a kind that hit its share is no such loss."""
    short: list[str] = []
    for kind in dict.fromkeys(left):
        if injected.get(kind, 0) < wanted(kind, config):
            short.append(kind)
    return short


def owed_first(schedule: list[str], injected: Mapping[str, int], config: ChaosConfig) -> None:
    """Reorder ``schedule`` in place: first the faults a kind still owes (each kind up to
    ``wanted`` hits, counting those ``injected``), in their order, then the rest (the random
    extras, in their order). Late in a campaign what it promised comes before the extras, while
    jobs are left to hit: a cancel or a runner's kill needs a running job."""
    counted = Counter(injected)
    owed: list[str] = []
    rest: list[str] = []
    for kind in schedule:
        if counted[kind] < wanted(kind, config):
            counted[kind] += 1
            owed.append(kind)
        else:
            rest.append(kind)
    schedule[:] = owed + rest


def part_owed_first(
    schedule: list[str], long_kind: str, injected: Mapping[str, int], config: ChaosConfig
) -> bool:
    """Before the long episode ``long_kind`` starts: when a short fault of the part it holds
    down is still owed, put the first one at the front of ``schedule`` and the episode right
    behind it, and say so (True). The episode may outlast the jobs, and every fault of its
    part waits for its end."""
    part = PART_HELD_DOWN.get(long_kind)
    for index, kind in enumerate(schedule):
        if (
            kind not in LONG_KINDS
            and PART_HELD_DOWN.get(kind) == part
            and injected.get(kind, 0) < wanted(kind, config)
        ):
            del schedule[index]
            schedule[:0] = [kind, long_kind]
            return True
    return False


def fault_schedule(rng: random.Random, config: ChaosConfig) -> list[str]:
    """Every kind ``wanted`` times plus ``extra_faults`` random short ones, shuffled; the long
    episodes in the first half, so that the faults of the part one holds down (which wait for
    its end) still land while jobs run."""
    unknown = set(config.kinds) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")
    kinds = [kind for kind in config.kinds for _ in range(wanted(kind, config))]
    short = [kind for kind in config.kinds if kind in SHORT_KINDS] or list(config.kinds)
    kinds += [rng.choice(short) for _ in range(config.extra_faults)]
    rng.shuffle(kinds)
    rest = [kind for kind in kinds if kind not in LONG_KINDS]
    for kind in (kind for kind in kinds if kind in LONG_KINDS):
        rest.insert(rng.randrange(len(rest) // 2 + 1), kind)
    return rest


def is_lammps_job(index: int, config: ChaosConfig) -> bool:
    return config.lammps_every > 0 and index % config.lammps_every == config.lammps_every - 1


def job_spec(index: int, config: ChaosConfig) -> dict[str, object]:
    if is_lammps_job(index, config):
        return {
            "name": f"chaos-{index:03d}",
            "task": "TASK_MD",
            "system": {
                "lammps": {
                    "script": LAMMPS_SCRIPT.name,
                    "variables": {"N": str(config.lammps_cells)},
                }
            },
            "inputs": [{"name": LAMMPS_SCRIPT.name}],
            "steps": config.steps,
            "report_interval_steps": config.report_interval_steps,
            "checkpoint_interval_steps": config.checkpoint_interval_steps,
            "resources": {"cpu": 1, "memory_mb": 1024},
        }
    return {
        "name": f"chaos-{index:03d}",
        "task": "TASK_MD",
        "system": {"lennard_jones": {"atoms": config.atoms}},
        "temperature_k": 120.0,
        "steps": config.steps,
        "report_interval_steps": config.report_interval_steps,
        "checkpoint_interval_steps": config.checkpoint_interval_steps,
        "resources": {"cpu": 1, "memory_mb": 1024},
        # kill -9 of a runner is charged to its job as a crash (mdq cannot tell it from the
        # job's own); room for the dice picking one job again and again, never for the faults
        # mdq must not charge (those spend no retry at all: docs/architecture.md, invariant 4)
        "max_retries": 10,
    }


class Campaign:
    """One chaos campaign; ``run`` returns its report (and cleans up whatever happens)."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        seed = config.seed if config.seed is not None else random.SystemRandom().randrange(1 << 31)
        self.rng = random.Random(seed)
        self.report = ChaosReport(
            seed=seed, checkpoint_interval_steps=config.checkpoint_interval_steps
        )
        self.deadline = Deadline(config.deadline_s)
        self.run_deadline = Deadline(max(1.0, config.deadline_s - config.check_reserve_s))
        # Its own namespace, even for a seed another campaign on this machine replays at the
        # same time: the runners it samples and kills are found by it.
        self.namespace = f"ch{seed:x}{random.SystemRandom().randrange(1 << 24):06x}"
        from mdq.bus.subjects import Subjects

        self.subjects = Subjects(self.namespace)
        self.work = config.work_dir or Path(tempfile.mkdtemp(prefix="mdq-chaos-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.report.work_dir = str(self.work)
        self.state_dir = self.work / "state"
        self.data_dir = self.state_dir / "data"
        self.nats: EmbeddedNats | None = None
        self.nats_port = 0
        self.postgres: EmbeddedPostgres | None = None
        self.database_url = ""
        self.stack: subprocess.Popen[bytes] | None = None
        self.disk = DataDisk(
            mount_point=self.data_dir, image=self.work / "data.img", size_mb=config.disk_mb
        )
        self.sampler: Sampler | None = None
        self.job_ids: list[str] = []
        self.finished_jobs = 0
        self.events: list[str] = []
        self._kills: Counter[str] = Counter()
        self._missed: Counter[str] = Counter()
        self.cancels: dict[str, str] = {}
        """job -> the outcome of the cancel the campaign sent it (``CONTROL_STOPPING`` ...)."""

    # -- logging of what the harness did ---------------------------------------------------
    def note(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.events.append(f"{stamp} {line}")
        with (self.work / "chaos.log").open("a", encoding="utf-8") as log:
            log.write(f"{stamp} {line}\n")

    # -- servers ---------------------------------------------------------------------------
    def start_nats(self) -> None:
        self.nats = start_nats(
            self.work / "nats", port=self.nats_port or None, log_file=self.work / "nats.log"
        )
        self.nats_port = self.nats.port

    def start_postgres(self) -> None:
        import pgserver.postgres_server as pgs  # the embedded default's server

        folder = (self.work / "pg").resolve()
        # pgserver keeps one handle per folder in this process; after a crash it must look
        # at the folder again (postmaster.pid names a dead process) and start a server.
        pgs.PostgresServer._instances.pop(folder, None)
        self.postgres = start_postgres(folder, database="mdq", keep=True)
        self.database_url = self.postgres.url

    def postgres_processes(self) -> list[psutil.Process]:
        folder = str((self.work / "pg").resolve())
        found = []
        for process in psutil.process_iter(["name", "cmdline"]):
            try:
                if process.info["name"] == "postgres" and folder in " ".join(
                    process.info["cmdline"] or ()
                ):
                    found.append(process)
                    found.extend(process.children(recursive=True))
            except psutil.Error:
                continue
        return found

    def kill_postgres(self) -> int:
        """SIGKILL the postmaster and its backends (the container dies); how many died."""
        processes = self.postgres_processes()
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(processes, timeout=10)
        return len(processes)

    # -- the stack -------------------------------------------------------------------------
    def stack_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "NATS_URL": self.nats.url if self.nats else "",
                "DATABASE_URL": self.database_url,
                "MDQ_NAMESPACE": self.namespace,
                "MDQ_STATE_DIR": str(self.state_dir),
                "MDQ_METRICS_PORT": str(free_port()),
                "MDQ_LOCAL_CPU_PER_NODE": "1",
                "MDQ_METRICS_INTERVAL_S": "1",
                "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
                "MDQ_RECOVERY_BACKOFF_MAX_S": "5",
                # snapshots often, so that a strike can meet one being written
                "MDQ_PLACEMENT_SNAPSHOT_INTERVAL_S": "5",
                "MDQ_RECOVERY_SNAPSHOT_INTERVAL_S": "5",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.config.env)
        return env

    def start_stack(self) -> None:
        mdq = Path(sys.executable).with_name("mdq")
        argv = [str(mdq)] if mdq.exists() else [sys.executable, "-m", "mdq.cli"]
        log = (self.work / "mdq-up.log").open("ab")
        self.stack = subprocess.Popen(
            [*argv, "up", "--nodes", str(self.config.nodes)],
            env=self.stack_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def stop_stack(self) -> None:
        if self.stack is None:
            return
        leftovers = list(_descendants(self.stack.pid))
        if self.stack.poll() is None:
            self.stack.send_signal(signal.SIGTERM)
            try:
                self.stack.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.note("mdq up did not stop within 30 s of SIGTERM: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.stack.pid, signal.SIGKILL)
        if self.stack.poll() is None:
            self.stack.kill()
        self.stack.wait()
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(leftovers, timeout=10)

    # -- faults ----------------------------------------------------------------------------
    def kill_process(self, kind: str) -> bool:
        assert self.stack is not None
        if kind == "runner":
            candidates = []
            for runner in sorted(runner_processes(self.namespace), key=lambda r: r.pid):
                with contextlib.suppress(psutil.Error):
                    candidates.append(psutil.Process(runner.pid))
        else:
            candidates = sorted(stack_processes(self.stack.pid).get(kind, []), key=lambda p: p.pid)
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        detail = ""
        if kind == "runner":
            with contextlib.suppress(psutil.Error):
                env = victim.environ()
                detail = f" ({env.get('MDQ_JOB_ID')}#{env.get('MDQ_ATTEMPT')})"
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            return False
        self.note(f"kill -9 {kind} pid {victim.pid}{detail}")
        return True

    async def inject(self, kind: str) -> bool:
        """One fault of ``kind``; False when there was nothing to hit."""
        if kind in PROCESS_KINDS:
            return self.kill_process(kind)
        long = self.config.long_s.get(kind)
        if kind == "nats" or kind == "nats_long":
            return await self.nats_down(long or self.rng.uniform(*self.config.outage_s))
        if kind == "postgres" or kind == "postgres_long":
            return await self.postgres_down(long or self.rng.uniform(*self.config.outage_s))
        if kind == "disk_full" or kind == "disk_full_long":
            return await self.disk_full(long or self.rng.uniform(*self.config.disk_full_s))
        if kind == "freeze_long":
            return await self.freeze(long or DEFAULT_MAX_AGE_S * 3)
        if kind == "strike_pod_start":
            return await self.strike_pod_start()
        if kind == "strike_checkpoint":
            return await self.strike_checkpoint()
        if kind == "strike_snapshot":
            return await self.strike_on_subject(
                f"$KV.{self.subjects.placement_snapshot_bucket}.>",
                lambda subject, _data: not subject.endswith(".head"),
                victims=("placement",),
                moment="while it writes its snapshot",
            )
        if kind == "strike_backoff":
            return await self.strike_on_subject(
                self.subjects.job("*", "requeued"),
                self._backs_off,
                victims=("placement", "recovery"),
                moment="while a job waits out its backoff",
                make_it=lambda: self.kill_process("runner"),  # a crash: retried after a backoff
            )
        if kind == "cancel":
            return await self.cancel_one()
        raise ValueError(f"unknown fault kind {kind!r}")

    async def nats_down(self, down: float) -> bool:
        assert self.nats is not None
        self.nats.kill()
        self.note(f"kill -9 nats-server; down for {down:.1f} s")
        await asyncio.sleep(self.deadline.bound(down))
        await asyncio.to_thread(self.start_nats)
        self.report.nats_restarts += 1
        self.note("nats-server restarted on the same port and store")
        return True

    async def postgres_down(self, down: float) -> bool:
        killed = await asyncio.to_thread(self.kill_postgres)
        if not killed:
            return False
        self.note(f"kill -9 postgres ({killed} processes); down for {down:.1f} s")
        await asyncio.sleep(self.deadline.bound(down))
        await asyncio.to_thread(self.start_postgres)
        self.report.postgres_restarts += 1
        self.note("postgres restarted on the same folder")
        return True

    async def disk_full(self, hold: float) -> bool:
        if not self.disk.mounted:
            return False
        written = await asyncio.to_thread(self.disk.fill)
        left = self.disk.free_bytes()
        self.note(f"data disk full ({written} bytes written, {left} free); for {hold:.1f} s")
        await asyncio.sleep(self.deadline.bound(hold))
        self.disk.free()
        self.report.disk_full_episodes += 1
        self.note("data disk freed")
        return True

    async def freeze(self, wait_s: float) -> bool:
        """SIGSTOP one random service or node agent and leave it stopped: alive but stuck, it
        renews its liveness file no more, and the stack is to kill it and start it again, both
        within ``wait_s``; else a problem (a stopped one still there is resumed)."""
        assert self.stack is not None
        found = stack_processes(self.stack.pid)
        candidates = sorted(
            (process for kind in (*SERVICE_KINDS, "agent") for process in found.get(kind, [])),
            key=lambda process: process.pid,
        )
        if not candidates:
            return False
        victim = self.rng.choice(candidates)
        try:
            kind = _kind_of(victim.cmdline())
            victim.suspend()
        except psutil.Error:
            return False
        self.note(f"SIGSTOP {kind} pid {victim.pid}; left stopped for the stack to restart")
        stopped_at = time.monotonic()
        _, alive = await asyncio.to_thread(
            psutil.wait_procs, [victim], timeout=self.deadline.bound(wait_s)
        )
        if alive:
            with contextlib.suppress(psutil.Error):
                victim.resume()
            self.report.problems.append(
                f"the stack did not kill the stopped {kind} (pid {victim.pid}) in {wait_s:g} s"
            )
            return True
        gone_after = time.monotonic() - stopped_at
        left = self.deadline.bound(max(0.0, wait_s - gone_after))
        if await asyncio.to_thread(self._started_again, kind, victim.pid, left):
            self.note(f"{kind} pid {victim.pid} killed {gone_after:.1f} s later and started again")
        else:
            self.report.problems.append(
                f"the stack killed the stopped {kind} (pid {victim.pid}) but did not start it "
                f"again in {wait_s:g} s"
            )
        return True

    def _started_again(self, kind: str | None, old_pid: int, within_s: float) -> bool:
        """Whether a process of ``kind`` other than ``old_pid`` runs under the stack within
        ``within_s`` (blocking: run in a thread)."""
        assert self.stack is not None
        deadline = time.monotonic() + within_s
        while True:
            running = stack_processes(self.stack.pid).get(kind or "", [])
            if any(process.pid != old_pid for process in running):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    # -- strikes at the worst moments ------------------------------------------------------
    async def strike_pod_start(self) -> bool:
        """kill -9 the node agent the moment a pod starts: its log file appears (the agent
        opens it right before it spawns the runner), so the claim, the spawn and the runner's
        first moments are all in flight."""
        pods = self.data_dir / "pods"
        known = set(_names(pods))
        until = time.monotonic() + self.deadline.bound(self.config.strike_wait_s)
        while time.monotonic() < until:
            new = set(_names(pods)) - known
            if new:
                if not self.kill_process("agent"):
                    return False
                self.note(f"  (the pod {sorted(new)[0].removesuffix('.log')} was starting)")
                return True
            await asyncio.sleep(0.005)
        return False

    async def strike_checkpoint(self) -> bool:
        """kill -9 a runner while it writes a checkpoint (its temporary file is there)."""
        assert self.sampler is not None
        until = time.monotonic() + self.deadline.bound(self.config.strike_wait_s)
        jobs_dir = self.data_dir / "jobs"
        while time.monotonic() < until:
            for job, pid in list(self.sampler.live.items()):
                folder = jobs_dir / job / "checkpoints"
                if any(name.startswith(".tmp-") for name in _names(folder)):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    self.note(f"kill -9 runner pid {pid} ({job}) while it writes a checkpoint")
                    return True
            await asyncio.sleep(0.002)
        return False

    def _backs_off(self, _subject: str, data: bytes) -> bool:
        """A ``requeued`` event whose job may not be bound for a while yet."""
        from mdq.bus.codec import decode_event

        requeued = decode_event(data).requeued
        return (
            requeued.HasField("not_before")
            and requeued.not_before.ToMilliseconds() / 1000 > time.time() + 0.05
        )

    async def strike_on_subject(
        self,
        subject: str,
        moment_came: Any,
        *,
        victims: tuple[str, ...],
        moment: str,
        make_it: Any = None,
    ) -> bool:
        """kill -9 ``victims`` the moment a message on ``subject`` satisfies ``moment_came``
        (subject, data), after ``make_it()`` (if given) brought one about; False if none came
        within ``strike_wait_s``."""
        import nats

        assert self.stack is not None
        came = asyncio.Event()

        async def on_message(message: Any) -> None:
            with contextlib.suppress(Exception):  # a message it cannot read is not the moment
                if not came.is_set() and moment_came(message.subject, message.data):
                    came.set()

        wait = self.deadline.bound(self.config.strike_wait_s)
        try:
            nc = await asyncio.wait_for(
                nats.connect(f"nats://127.0.0.1:{self.nats_port}", name="chaos-strike"), wait
            )
        except (TimeoutError, OSError, nats.errors.Error):
            return False
        try:
            await nc.subscribe(subject, cb=on_message)
            await nc.flush()
            if make_it is not None and not make_it():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(came.wait(), wait)
            if not came.is_set():
                return False
            hit = [kind for kind in victims if self.kill_process(kind)]
            if hit:
                self.note(f"  ({'+'.join(hit)} killed {moment})")
            return bool(hit)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 10)

    async def cancel_one(self) -> bool:
        """Cancel one running job of the campaign, as its owner would (``mdq cancel``); False
        when none runs now or nobody answered (placement or NATS down: tried again later)."""
        from mdq.contracts import pb
        from mdq.sdk.client import MdqClient

        running = sorted({r.job_id for r in runner_processes(self.namespace)} - self.cancels.keys())
        if not running or self.nats is None:
            return False
        job = self.rng.choice(running)
        try:
            client = await asyncio.wait_for(
                MdqClient.connect(self.nats.url, self.namespace), self.deadline.bound(10)
            )
        except Exception:
            return False
        try:
            reply = await client.cancel(
                [job],
                reason="chaos",
                control_key=f"chaos-cancel-{job}",
                timeout=self.deadline.bound(20),
            )
        except Exception as error:  # nobody answered in time: another job, later
            self.note(f"cancel {job}: no answer ({error!r})")
            return False
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 10)
        [outcome] = reply.outcomes
        result = pb.ControlResult.Name(outcome.result)
        self.cancels[job] = result
        self.note(f"cancel {job}: {result} ({outcome.state}) {outcome.message}")
        return True

    async def run_faults(self, done: asyncio.Event) -> None:
        """The schedule, until it is through, the jobs are done, or the deadline. A long
        episode runs beside the schedule (the other kinds go on hitting meanwhile, as they
        would in a bad hour); a fault of the part it holds down waits for its end."""
        schedule = fault_schedule(self.rng, self.config)
        self.note(f"fault schedule: {' '.join(schedule)}")
        retries: Counter[str] = Counter()
        total = len(schedule)
        busy: set[str] = set()
        episodes: set[asyncio.Task[None]] = set()
        try:
            await self._run_schedule(schedule, total, retries, done, busy, episodes)
        finally:
            await asyncio.gather(*episodes, return_exceptions=True)
        if schedule:
            self.note(f"faults not injected (jobs done or deadline): {' '.join(schedule)}")
            if short := short_of_wanted(schedule, self._kills, self.config):
                self.report.problems.append(f"faults never injected: {' '.join(short)}")

    async def _long_episode(self, kind: str, part: str, busy: set[str]) -> None:
        try:
            if await self.inject(kind):
                self._kills[kind] += 1
            else:
                self._missed[kind] += 1
        except BaseException as error:
            self.broke_off(f"the long episode {kind}", error)
        finally:
            busy.discard(part)

    async def _run_schedule(
        self,
        schedule: list[str],
        total: int,
        retries: Counter[str],
        done: asyncio.Event,
        busy: set[str],
        episodes: set[asyncio.Task[None]],
    ) -> None:
        while schedule and not done.is_set() and not self.run_deadline.passed:
            pause = self.rng.uniform(*self.config.pause_s)
            # Keep the faults ahead of the jobs: when a larger share of the jobs has ended
            # than of the schedule has been injected, the next fault comes at once (a fast
            # machine must not finish the campaign before every kind has hit).
            jobs_ended = self.finished_jobs / max(1, len(self.job_ids))
            injected = total - len(schedule)
            if jobs_ended > injected / total:
                pause = MIN_PAUSE_S
            ahead = self.config.max_faults_ahead
            if ahead is not None and injected >= jobs_ended * total + ahead:
                # Spread over the campaign: wait for more jobs to end before the next fault.
                await asyncio.sleep(self.run_deadline.bound(0.5))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=self.run_deadline.bound(pause))
            if done.is_set():
                break
            if jobs_ended >= OWED_FIRST_FROM:
                owed_first(schedule, self._kills, self.config)
            kind = schedule.pop(0)
            part = PART_HELD_DOWN.get(kind)
            if part in busy:  # a long episode holds it down: this one comes after it
                schedule.insert(min(len(schedule), 1 + self.rng.randrange(3)), kind)
                continue
            if kind in LONG_KINDS and part is not None:
                if part_owed_first(schedule, kind, self._kills, self.config):
                    continue
                busy.add(part)
                episodes.add(asyncio.create_task(self._long_episode(kind, part, busy)))
                continue
            if await self.inject(kind):
                self._kills[kind] += 1
            else:
                self._missed[kind] += 1
                self.note(f"{kind}: nothing to hit now; tried again later")
                retries[kind] += 1
                if retries[kind] <= 20:
                    schedule.insert(min(len(schedule), 1 + self.rng.randrange(3)), kind)

    # -- the jobs --------------------------------------------------------------------------
    async def submit(self) -> None:
        from google.protobuf import json_format

        from mdq.contracts import pb
        from mdq.sdk.client import IntakeUnavailable, MdqClient
        from mdq.sdk.inputs import resolve_inputs

        request = json_format.ParseDict(
            {
                "idempotency_key": f"chaos-{self.report.seed}",
                "jobs": [job_spec(i, self.config) for i in range(self.config.jobs)],
            },
            pb.SubmitRequest(),
        )
        files = resolve_inputs(request, LAMMPS_SCRIPT.parent)  # the LAMMPS jobs' script
        self.report.lammps_jobs = sum(
            1 for i in range(self.config.jobs) if is_lammps_job(i, self.config)
        )
        assert self.nats is not None
        async with await MdqClient.connect(self.nats.url, self.namespace) as client:
            while True:
                try:
                    if files:
                        await client.upload_inputs(files)
                    break
                except Exception as error:  # the bus is there, the bucket may be made yet
                    if self.deadline.passed:
                        raise
                    self.note(f"uploading the LAMMPS script: {error!r}; again")
                    await asyncio.sleep(0.5)
            while True:
                try:
                    self.job_ids = await client.submit(request, timeout=5)
                    break
                except IntakeUnavailable:
                    if self.deadline.passed:
                        raise
                    await asyncio.sleep(0.5)
        self.report.jobs = len(self.job_ids)
        self.note(f"submitted {len(self.job_ids)} jobs")

    async def terminal_counts(self, nc: Any) -> tuple[Counter[str], Counter[str]]:
        """Per job: succeeded events and failed/cancelled events in the log now."""
        from mdq.bus.subjects import Subjects

        subjects = Subjects(self.namespace)
        js = nc.jetstream()
        succeeded: Counter[str] = Counter()
        ended: Counter[str] = Counter()
        for kind, counter in (("succeeded", succeeded), ("failed", ended), ("cancelled", ended)):
            info = await js.stream_info(
                subjects.jobs_stream, subjects_filter=subjects.job("*", kind)
            )
            for subject, count in (info.state.subjects or {}).items():
                counter[subject.split(".")[-2]] += count
        return succeeded, ended

    async def wait_for_jobs(self, done: asyncio.Event) -> None:
        from mdq.bus.connect import connect

        assert self.nats is not None
        nc = await connect(f"nats://127.0.0.1:{self.nats_port}", name="chaos-watch")
        try:
            while not self.run_deadline.passed:
                try:
                    succeeded, ended = await asyncio.wait_for(self.terminal_counts(nc), 10)
                except Exception:  # NATS is down for the moment: ask again
                    await asyncio.sleep(0.5)
                    continue
                finished = [j for j in self.job_ids if succeeded[j] or ended[j]]
                self.finished_jobs = len(finished)
                if len(finished) == len(self.job_ids):
                    done.set()
                    self.note("every job is terminal in the log")
                    return
                await asyncio.sleep(0.5)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 10)

    # -- checks ----------------------------------------------------------------------------
    async def check(self) -> None:
        import asyncpg

        from mdq.bus.codec import decode_event
        from mdq.bus.connect import connect
        from mdq.bus.subjects import Subjects
        from mdq.store.projection import JOBS_CONSUMER, PROGRESS_CONSUMER

        problems = self.report.problems
        subjects = Subjects(self.namespace)
        nc = await asyncio.wait_for(
            connect(f"nats://127.0.0.1:{self.nats_port}", name="chaos-check"),
            max(30.0, self.deadline.left()),
        )
        try:
            succeeded, ended = await self.terminal_counts(nc)
            js = nc.jetstream()
            wanted = {
                JOBS_CONSUMER: (await js.stream_info(subjects.jobs_stream)).state.last_seq,
                PROGRESS_CONSUMER: (await js.stream_info(subjects.progress_stream)).state.last_seq,
            }
            last_progress: dict[str, int] = {}
            final_step: dict[str, int] = {}
            for job in self.job_ids:
                with contextlib.suppress(Exception):
                    message = await js.get_last_msg(
                        subjects.progress_stream, subjects.progress(job)
                    )
                    last_progress[job] = int(decode_event(message.data or b"").progress.step)
                with contextlib.suppress(Exception):
                    message = await js.get_last_msg(
                        subjects.jobs_stream, subjects.job(job, "succeeded")
                    )
                    final_step[job] = int(decode_event(message.data or b"").succeeded.final_step)
        finally:
            await nc.close()
        self.report.succeeded = sum(1 for j in self.job_ids if succeeded[j] >= 1 and not ended[j])
        self.report.double_succeeded = sum(1 for j in self.job_ids if succeeded[j] > 1)
        stopped = self.stopped_jobs()
        # a job the campaign cancelled ended for its person's reason, not failed
        self.report.failed_for_good = sum(1 for j in self.job_ids if ended[j] and j not in stopped)
        for job in stopped:  # ends CANCELLED, or SUCCEEDED when it succeeded before its stop
            if succeeded[job] + ended[job] != 1:
                problems.append(
                    f"{job} (cancelled): {succeeded[job]} succeeded and {ended[job]} "
                    "failed/cancelled events"
                )
            elif ended[job]:
                self.report.cancelled += 1
        for job in self.job_ids:
            if job in stopped and not succeeded[job]:
                continue
            if succeeded[job] != 1 or ended[job]:
                problems.append(
                    f"{job}: {succeeded[job]} succeeded and {ended[job]} failed/cancelled events"
                )
            if last_progress.get(job) != self.config.steps:
                problems.append(f"{job}: last progress in the log at step {last_progress.get(job)}")
            if final_step.get(job) != self.config.steps:
                problems.append(f"{job}: succeeded with final step {final_step.get(job)}")
            on_disk = last_energy_step(self.data_dir / "jobs" / job / "energies.csv")
            if on_disk != self.config.steps:
                problems.append(f"{job}: the runner's energy table ends at step {on_disk}")

        # PostgreSQL: wait until the watcher has projected everything the log holds.
        connection = None
        rows: dict[str, Any] = {}
        while True:
            try:
                connection = await asyncpg.connect(self.database_url, timeout=5)
                offsets = {
                    r["consumer"]: r["last_seq"]
                    for r in await connection.fetch(
                        "SELECT consumer, last_seq FROM consumer_offsets"
                    )
                }
                if all(offsets.get(c, 0) >= seq for c, seq in wanted.items()):
                    break
            except (OSError, asyncpg.PostgresError):
                pass
            finally:
                if connection is not None:
                    await connection.close()
                    connection = None
            if self.deadline.passed:
                problems.append(f"PostgreSQL never caught up with the log ({wanted})")
                break
            await asyncio.sleep(0.5)
        connection = await asyncpg.connect(self.database_url, timeout=10)
        try:
            rows = {
                r["job_id"]: r
                for r in await connection.fetch(
                    "SELECT job_id, state, last_step FROM jobs WHERE job_id = ANY($1::text[])",
                    self.job_ids,
                )
            }
            succeeded_rows = {
                r["job_id"]: r["n"]
                for r in await connection.fetch(
                    "SELECT job_id, count(*) AS n FROM events WHERE kind = 'succeeded' "
                    "AND job_id = ANY($1::text[]) GROUP BY job_id",
                    self.job_ids,
                )
            }
            attempts = await connection.fetch(
                "SELECT job_id, attempt, resumed_from_step FROM attempts "
                "WHERE job_id = ANY($1::text[]) ORDER BY job_id, attempt",
                self.job_ids,
            )
        finally:
            await connection.close()
        exact = 0
        for job in self.job_ids:
            row = rows.get(job)
            if job in stopped and row is not None and row["state"] == "CANCELLED":
                if succeeded_rows.get(job, 0):
                    problems.append(f"{job}: CANCELLED in PostgreSQL, with a succeeded row")
                continue
            if row is None or row["state"] != "SUCCEEDED":
                problems.append(f"{job}: PostgreSQL says {row['state'] if row else 'no row'}")
            elif row["last_step"] != self.config.steps:
                problems.append(f"{job}: PostgreSQL last_step {row['last_step']}")
            else:
                exact += 1
            if succeeded_rows.get(job, 0) != 1:
                problems.append(f"{job}: {succeeded_rows.get(job, 0)} succeeded rows in events")
        self.report.final_step_exact = exact
        self.check_steps_lost(attempts)
        await self.check_rebuild()

    def stopped_jobs(self) -> set[str]:
        """The jobs the campaign's cancels stopped (or ended at once)."""
        return {
            job
            for job, result in self.cancels.items()
            if result in ("CONTROL_DONE", "CONTROL_STOPPING", "CONTROL_UNCHANGED")
        }

    def check_no_runner_of_a_cancelled_job(self) -> None:
        """Once every job is terminal: no runner of a job the campaign cancelled is alive (the
        process table, zombies excluded)."""
        stopped = self.stopped_jobs()
        for runner in runner_processes(self.namespace):
            if runner.job_id in stopped:
                self.report.problems.append(
                    f"a runner of cancelled job {runner.job_id} is alive: pid {runner.pid}"
                )

    def check_steps_lost(self, attempts: Sequence[Any]) -> None:
        assert self.sampler is not None
        facts = runner_log_facts(self.data_dir / "pods")
        reached = dict(self.sampler.reached)
        for key, step in facts.checkpointed.items():
            reached[key] = max(reached.get(key, -1), step)
        numbers: dict[str, list[int]] = defaultdict(list)
        from_db: dict[tuple[str, int], int] = {}
        for row in attempts:
            numbers[row["job_id"]].append(int(row["attempt"]))
            from_db[(row["job_id"], int(row["attempt"]))] = int(row["resumed_from_step"] or 0)
        self.report.retries = sum(len(found) - 1 for found in numbers.values())
        losses = steps_lost(
            attempts=numbers,
            reached=reached,
            resumed_log=facts.resumed,
            resumed_db=from_db,
            built=facts.built,
        )
        interval = self.config.checkpoint_interval_steps
        self.report.max_steps_lost = max((loss.lost for loss in losses), default=0)
        for loss in losses:
            if loss.lost > interval:
                self.report.problems.append(
                    f"{loss.job}: attempt {loss.attempt} reached step {loss.reached}, attempt "
                    f"{loss.next_attempt} resumed from {loss.resumed} ({loss.source}): "
                    f"{loss.lost} steps lost > {interval}"
                )
        sources = Counter(loss.source for loss in losses)
        self.report.steps_lost_source = (
            "reached: energies.csv tail (sampled) and the runner's logged checkpoints; "
            "resumed: " + ", ".join(f"{name} x{count}" for name, count in sorted(sources.items()))
        )
        self.check_thermo_logs()

    def check_thermo_logs(self) -> None:
        """The LAMMPS jobs' losses, measured from outside: their thermo logs on disk."""
        interval = self.config.checkpoint_interval_steps
        for index, job in enumerate(self.job_ids):
            if not is_lammps_job(index, self.config):
                continue
            path = self.data_dir / "jobs" / job / "log.lammps"
            try:
                attempts = thermo_log_attempts(path.read_text(errors="replace"))
            except FileNotFoundError as error:
                if job in self.cancels:  # cancelled before LAMMPS wrote a line: nothing lost
                    self.note(f"{job}: cancelled before its thermo log was written")
                    continue
                self.report.problems.append(f"{job}: no thermo log ({error})")
                continue
            except OSError as error:
                self.report.problems.append(f"{job}: no thermo log ({error})")
                continue
            for loss in thermo_log_losses(job, attempts):
                self.report.max_steps_lost_thermo_log = max(
                    self.report.max_steps_lost_thermo_log, loss.lost
                )
                if loss.lost > interval:
                    self.report.problems.append(
                        f"{job}: its thermo log has attempt {loss.attempt} at step "
                        f"{loss.reached} and attempt {loss.next_attempt} resuming from "
                        f"{loss.resumed}: {loss.lost} steps lost > {interval}"
                    )

    async def check_rebuild(self) -> None:
        mdq = Path(sys.executable).with_name("mdq")
        argv = [str(mdq)] if mdq.exists() else [sys.executable, "-m", "mdq.cli"]
        env = dict(os.environ)
        env.update(
            {
                "NATS_URL": f"nats://127.0.0.1:{self.nats_port}",
                "DATABASE_URL": self.database_url,
                "MDQ_NAMESPACE": self.namespace,
            }
        )
        process = await asyncio.create_subprocess_exec(
            *argv,
            "replay",
            "--rebuild",
            "--compare",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            output, _ = await asyncio.wait_for(
                process.communicate(), timeout=max(30.0, self.deadline.left())
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            self.report.problems.append("mdq replay --rebuild --compare did not finish in time")
            return
        text = output.decode(errors="replace")
        (self.work / "rebuild.log").write_text(text)
        self.report.rebuild_equal = process.returncode == 0
        if process.returncode != 0:
            self.report.problems.append(
                f"mdq replay --rebuild --compare exited {process.returncode}: "
                + " | ".join(text.strip().splitlines()[-4:])
            )

    # -- the whole -------------------------------------------------------------------------
    async def run(self) -> ChaosReport:
        """The campaign, whatever happens: an exception anywhere in the harness (or a
        cancellation) is a problem of the report, with its traceback, never a crash."""
        started = time.monotonic()
        with harness_logs(self.work / "harness.log"):
            try:
                await self._run()
            except (asyncio.CancelledError, KeyboardInterrupt):
                self.report.problems.append("interrupted (Ctrl-C or cancelled)")
                raise  # after the clean-up below: an interrupted soak stops
            except BaseException as error:  # every failure of the harness is reported
                self.broke_off("the campaign broke off", error)
            finally:
                try:
                    await asyncio.to_thread(self.cleanup)
                except BaseException as error:
                    self.broke_off("cleaning up failed", error)
                self.report.duration_s = time.monotonic() - started
        return self.report

    def broke_off(self, what: str, error: BaseException) -> None:
        """Record ``error`` (with its traceback) as a problem of the campaign."""
        trace = "".join(traceback.format_exception(error)).rstrip()
        self.report.problems.append(f"{what}: {error!r}\n{trace}")
        with contextlib.suppress(OSError):
            self.note(f"{what}: {error!r}\n{trace}")

    async def _run(self) -> None:
        self.note(f"seed {self.report.seed}, namespace {self.namespace}, work {self.work}")
        self.disk.mount()
        self.report.disk_full_mode = self.disk.mode
        self.note(f"data disk: {self.disk.mode}")
        await asyncio.to_thread(self.start_nats)
        await asyncio.to_thread(self.start_postgres)
        self.start_stack()
        assert self.stack is not None
        await self.submit()
        self.sampler = Sampler(
            namespace=self.namespace,
            jobs_dir=self.data_dir / "jobs",
            every_s=self.config.sample_s,
        )
        self.sampler.start()
        done = asyncio.Event()
        waiter = asyncio.create_task(self.wait_for_jobs(done))
        try:
            await self.run_faults(done)
            await waiter
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            self.sampler.stop()
        self.report.kills = {
            kind: self._kills[kind] for kind in FAULT_KINDS if kind in PROCESS_KINDS
        }
        self.report.missed = dict(self._missed)
        self.report.cancels = len(self.cancels)
        if done.is_set():
            self.check_no_runner_of_a_cancelled_job()
        self.report.runner_samples = self.sampler.samples
        self.report.concurrent_runners = len(self.sampler.concurrent)
        for seen in self.sampler.concurrent[:5]:
            self.report.problems.append(f"two live runners of one job: {seen}")
        if self.sampler.error:
            self.report.problems.append(f"the runner sampler failed: {self.sampler.error}")
        if not done.is_set():
            self.report.problems.append(
                f"not every job was terminal within the deadline ({self.config.deadline_s:g} s)"
            )
        self.report.strikes = {
            kind: self._kills[kind] for kind in FAULT_KINDS if kind in ONCE_KINDS
        }
        for kind in self.config.kinds:
            hits = self._kills[kind]
            if hits < wanted(kind, self.config):
                self.report.problems.append(
                    f"{kind}: hit {hits} times, wanted {wanted(kind, self.config)}"
                )
        await self.check()

    def cleanup(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        with contextlib.suppress(Exception):
            self.stop_stack()
        for runner in runner_processes(self.namespace):
            self.report.problems.append(f"a runner outlived the stack: {runner}")
            with contextlib.suppress(psutil.Error):
                psutil.Process(runner.pid).kill()
        if self.nats is not None:
            with contextlib.suppress(Exception):
                self.nats.stop()
        with contextlib.suppress(Exception):
            if self.postgres is not None:
                self.postgres.stop()
        with contextlib.suppress(Exception):
            for process in self.postgres_processes():
                process.kill()
        # A failed campaign keeps its evidence (the report names the folder).
        keep = self.config.keep or self.config.work_dir is not None or not self.report.ok
        if keep:
            with contextlib.suppress(OSError, shutil.Error):
                shutil.copytree(self.data_dir, self.work / "data-kept", dirs_exist_ok=True)
        with contextlib.suppress(Exception):
            self.disk.unmount()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)


@contextlib.contextmanager
def harness_logs(path: Path) -> Iterator[None]:
    """Send what the libraries the harness uses log (nats-py's reconnect errors while NATS is
    down, asyncio's) to ``path`` instead of the terminal: the report is the one line printed."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
        handler.close()


def _names(folder: Path) -> list[str]:
    """The names in ``folder`` now ([] if it is not there)."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _descendants(pid: int) -> Iterator[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        yield from psutil.Process(pid).children(recursive=True)


async def run_campaign(config: ChaosConfig) -> ChaosReport:
    """Run one campaign and return its report (every process it started is gone after)."""
    return await Campaign(config).run()


@dataclass(slots=True)
class SoakReport:
    """Several campaigns, one after the other; ``to_json`` is the line ``make chaos-soak``
    prints."""

    campaigns: list[ChaosReport] = field(default_factory=list)
    checkpoint_interval_steps: int = 0
    problems: list[str] = field(default_factory=list)
    """What broke the soak itself (a campaign's own problems are in ``failed_seeds``)."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(report.ok for report in self.campaigns)

    def to_json(self) -> str:
        reports = self.campaigns
        document: dict[str, Any] = {
            "ok": self.ok,
            "seeds": [report.seed for report in reports],
            "passed": sum(1 for report in reports if report.ok),
            "jobs": sum(report.jobs for report in reports),
            "succeeded": sum(report.succeeded for report in reports),
            "failed_for_good": sum(report.failed_for_good for report in reports),
            "double_succeeded": sum(report.double_succeeded for report in reports),
            "concurrent_runners": sum(report.concurrent_runners for report in reports),
            "max_steps_lost": max((report.max_steps_lost for report in reports), default=0),
            "checkpoint_interval_steps": self.checkpoint_interval_steps,
            "failed_seeds": [
                {"seed": report.seed, "work_dir": report.work_dir, "problems": report.problems}
                for report in reports
                if not report.ok
            ],
            "durations_s": {str(report.seed): round(report.duration_s, 1) for report in reports},
            "duration_s": round(sum(report.duration_s for report in reports), 1),
            "problems": self.problems,
        }
        return json.dumps(document)


async def run_soak(
    config: ChaosConfig,
    seeds: Sequence[int],
    *,
    on_report: Any = None,
) -> SoakReport:
    """One campaign per seed, each in a work folder of its own; ``on_report(index, report)``
    is called after each. Never raises: whatever goes wrong between campaigns is a problem of
    the soak, with its traceback."""
    soak = SoakReport(checkpoint_interval_steps=config.checkpoint_interval_steps)
    for index, seed in enumerate(seeds):
        campaign: Campaign | None = None
        try:
            work = None
            if config.work_dir is not None:
                work = config.work_dir / f"campaign-{index + 1}"
            campaign = Campaign(replace(config, seed=seed, work_dir=work))
            report = await campaign.run()
            soak.campaigns.append(report)
            if on_report is not None:
                on_report(index, report)
        except (asyncio.CancelledError, KeyboardInterrupt):
            if campaign is not None:
                soak.campaigns.append(campaign.report)
            soak.problems.append(f"interrupted in campaign {index + 1} (seed {seed})")
            break
        except BaseException as error:  # a soak reports, it never dies with a traceback
            trace = "".join(traceback.format_exception(error)).rstrip()
            soak.problems.append(f"campaign {index + 1} (seed {seed}): {error!r}\n{trace}")
    return soak
