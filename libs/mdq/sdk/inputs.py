"""The files a job file names: read next to it, checked, hashed, and then uploaded.

``mdq submit job.yaml`` (and ``MdqClient.submit_with_inputs``) turn each job's ``inputs``
(names, paths relative to the job file) into ``InputFile`` entries with their sha256 and size,
upload those files into the submitter's inputs bucket (``mdq.bus.inputs``: nothing is sent for
a file that is there already) and then submit. A LAMMPS job's script is one of its inputs even
when the job file lists only ``system.lammps.script``. Before anything is sent, every LAMMPS
script (and the input files it includes) is checked as intake will check it
(``mdq.core.lammps_script``), so a refused line is named at once, with the file and line.

Problems are ``JobFileError`` naming the field, like any other problem of a job file: a name
that intake would refuse (too long, a NUL, ``..``) is refused by the same rule
(``mdq.core.spec``) before any path is built from it, and a file that cannot be read (no
permission, a symlink loop, an I/O error) is named with the reason, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mdq.bus.inputs import sha256_file
from mdq.contracts import pb
from mdq.core.lammps_script import MAX_SCRIPT_BYTES, ScriptError, check_script, includes
from mdq.core.spec import SpecError
from mdq.core.spec import _normalize_inputs as check_input_entries
from mdq.sdk.jobfile import JobFileError

UNREAD_SHA256 = "0" * 64
"""Stands for a sha256 not filled in yet while the input names are checked."""

FILE_ERRORS = (OSError, ValueError, RuntimeError)
"""What reading a local file can raise besides its contents: OSError (permission, I/O, a name
too long), ValueError (a NUL in the path), RuntimeError (a symlink loop, Path.resolve)."""


@dataclass(frozen=True, slots=True)
class LocalInput:
    """One input file on this machine, as a job names it."""

    path: Path
    sha256: str
    size_bytes: int


def resolve_inputs(request: pb.SubmitRequest, base: Path, *, source: str = "") -> list[LocalInput]:
    """Fill in, in place, the sha256 and size of every input file the jobs of ``request``
    name without one, read from ``base`` (the job file's folder); add a LAMMPS job's script
    to its inputs when the job file left it out; check every LAMMPS script. The files to
    upload, once each."""
    files: dict[str, LocalInput] = {}
    try:
        root = base.resolve()
    except FILE_ERRORS as error:
        raise JobFileError(
            "", f"cannot read the job file's folder {base}: {_reason(error)}", source=source
        ) from None
    for index, job in enumerate(request.jobs):
        script = job.system.lammps.script if job.system.WhichOneof("kind") == "lammps" else ""
        if script and script not in {each.name for each in job.inputs}:
            job.inputs.add(name=script)
        _check_names(job, index, source=source)
        for position, each in enumerate(job.inputs):
            here = f"jobs[{index}].inputs[{position}]"
            if each.sha256:
                continue  # uploaded before: intake checks that the bucket has it
            try:
                path = (base / each.name).resolve()
                inside = path.is_relative_to(root)
                found = inside and path.is_file()
                sha256, size = sha256_file(path) if found else ("", 0)
            except FILE_ERRORS as error:
                raise JobFileError(
                    f"{here}.name",
                    f"{each.name!r}: cannot read {base / each.name}: {_reason(error)}",
                    source=source,
                ) from None
            if not inside:
                raise JobFileError(
                    f"{here}.name",
                    f"{each.name!r} is not inside the job file's folder {base}",
                    source=source,
                )
            if not found:
                raise JobFileError(
                    f"{here}.name",
                    f"{each.name!r}: no such file next to the job file (in {base})",
                    source=source,
                )
            each.sha256, each.size_bytes = sha256, size
            files[sha256] = LocalInput(path, sha256, size)
        if script:
            _check_scripts(job, index, base, source=source)
    return list(files.values())


def _check_names(job: pb.JobSpec, index: int, *, source: str) -> None:
    """JobFileError unless the job's input entries pass intake's rule (names: relative paths
    of at most 255 safe characters; unique; at most 64), before a path is made of any."""
    probe = pb.JobSpec()
    for each in job.inputs:
        probe.inputs.add(
            name=each.name, sha256=each.sha256 or UNREAD_SHA256, size_bytes=each.size_bytes
        )
    try:
        check_input_entries(probe, f"jobs[{index}]")
    except SpecError as error:
        raise JobFileError(error.field, error.message, source=source) from None


def _reason(error: BaseException) -> str:
    """An error reading a file, as a person reads it (its strerror where it has one)."""
    return (error.strerror if isinstance(error, OSError) else None) or str(error)


def _check_scripts(job: pb.JobSpec, index: int, base: Path, *, source: str) -> None:
    """The job's script and the input files it includes by name, as intake checks them."""
    positions = {each.name: position for position, each in enumerate(job.inputs)}
    pending = [(job.system.lammps.script, f"jobs[{index}].system.lammps.script")]
    seen: set[str] = set()
    while pending:
        name, field = pending.pop()
        if name in seen or name not in positions:
            continue
        seen.add(name)
        path = base / name
        try:
            if not path.is_file():
                continue  # uploaded before: intake checks it
            if path.stat().st_size > MAX_SCRIPT_BYTES:
                raise JobFileError(
                    field, f"{name}: a script is at most {MAX_SCRIPT_BYTES} bytes", source=source
                )
            data = path.read_bytes()
        except FILE_ERRORS as error:
            raise JobFileError(
                field, f"{name}: cannot read {path}: {_reason(error)}", source=source
            ) from None
        try:
            commands = check_script(data.decode())  # as intake reads it
        except (ScriptError, UnicodeDecodeError) as error:
            raise JobFileError(field, f"{name} {error}", source=source) from None
        for command in commands:
            included = includes(command)
            if included is not None and included in positions:
                pending.append((included, f"jobs[{index}].inputs[{positions[included]}]"))
