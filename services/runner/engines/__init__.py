"""The engine port: what the runner's loops ask of an MD engine, whichever it is.

The loops in :mod:`services.runner.md` report, checkpoint and honour SIGTERM; an engine only
does the physics and its files (``prepare``, ``advance``, ``minimize``, ``sample``,
``checkpoint``, ``interrupt``, ``finish``, ``outputs``). The engine is chosen by the job's system
and its module imported only then. Design: docs/engines.md, "The engine port" and "Adding an
engine".
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mdq.contracts import pb
from mdq.core.engines import LAMMPS, OPENMM, engine_of
from mdq.core.runner_task import RunnerTask
from services.runner.checkpoints import CheckpointFile
from services.runner.copies import CheckpointFolder
from services.runner.samples import EnergySample
from services.runner.settings import RunnerSettings


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where an attempt starts: the step it resumed from (None for a new run)."""

    resumed_step: int | None


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """A file an attempt leaves (``pb.OutputFile`` less its hash and size)."""

    path: Path
    kind: str
    format: str
    frames: int = 0


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """What an engine is built from."""

    task: RunnerTask
    settings: RunnerSettings
    data_dir: Path | None
    """The data folder (MDQ_DATA_DIR), where the operator's ``inputs/`` live."""
    work_dir: Path
    """The job's working folder, holding its input files (fetched and verified)."""


class Engine(Protocol):
    """One attempt's MD engine (see the module's docstring)."""

    name: str
    atoms: int
    timestep_ps: float
    units: str
    """"" or "lj" (``Progress.units``)."""
    boundaries: tuple[int, ...]
    """Step intervals the engine wants chunks to end on (OpenMM: trajectory frames)."""
    checkpoints: CheckpointFolder
    interruptible: bool
    """Whether ``interrupt`` can end a running chunk early (LAMMPS); else a stop request
    waits for the chunk's end."""

    @property
    def step(self) -> int: ...

    def prepare(self) -> StartPoint: ...

    def advance(self, steps: int) -> None: ...

    def interrupt(self) -> None: ...

    def after_chunk(self, step: int) -> None: ...

    def sample(self) -> EnergySample: ...

    def minimizer_sample(self, iteration: int) -> EnergySample: ...

    def minimize(
        self, iterations: int, *, on_report: Callable[[int, float], None], stop: threading.Event
    ) -> int: ...

    def checkpoint(self, step: int) -> CheckpointFile: ...

    def finish(self) -> None: ...

    def outputs(self) -> list[EngineOutput]: ...

    def close(self) -> None: ...


_MODULES = {
    OPENMM: "services.runner.engines.openmm_engine",
    LAMMPS: "services.runner.engines.lammps_engine",
}


ENGINE_TASKS = frozenset({pb.TASK_UNSPECIFIED, pb.TASK_MD, pb.TASK_MINIMIZE})
"""The tasks that run an engine (``analyze`` reads energy tables only)."""


def load_engine(spec: pb.JobSpec) -> None:
    """Import the module of the job's engine and load its library, touching nothing of the
    job (synchronous: the runner calls it in a worker thread while it connects to NATS and
    fetches the inputs, so that ``open_engine`` then only builds the job's instance)."""
    module = importlib.import_module(_MODULES[engine_of(spec)])
    load_library: Callable[[], object] | None = getattr(module, "load_library", None)
    if load_library is not None:
        load_library()


def open_engine(setup: EngineSetup) -> Engine:
    """The engine of the job's system, built (synchronous: call it in a worker thread)."""
    module = importlib.import_module(_MODULES[engine_of(setup.task.spec)])
    engine: Engine = module.open_engine(setup)
    return engine


def unstable(error: BaseException) -> bool:
    """Whether an error an engine raised means a blown-up simulation (asked of the engines
    imported in this process only: the runner's exit code for an error that escaped)."""
    for name in _MODULES.values():
        module = sys.modules.get(name)
        if module is not None and module.unstable(error):
            return True
    return False
