"""The files a job file names: read next to it, checked, hashed, and then uploaded.

``mdq submit job.yaml`` (and ``MdqClient.submit_with_inputs``) turn each job's ``inputs``
(names, paths relative to the job file) into ``InputFile`` entries with their sha256 and size,
upload those files into the submitter's inputs bucket (``mdq.bus.inputs``: nothing is sent for
a file that is there already) and then submit. A LAMMPS job's script is one of its inputs even
when the job file lists only ``system.lammps.script``. Before anything is sent, every LAMMPS
script (and the input files it includes) is checked as intake will check it
(``mdq.core.lammps_script``), so a refused line is named at once, with the file and line.

Problems are ``JobFileError`` naming the field, like any other problem of a job file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mdq.bus.inputs import sha256_file
from mdq.contracts import pb
from mdq.core.lammps_script import MAX_SCRIPT_BYTES, ScriptError, check_script, includes
from mdq.sdk.jobfile import JobFileError


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
    root = base.resolve()
    for index, job in enumerate(request.jobs):
        script = job.system.lammps.script if job.system.WhichOneof("kind") == "lammps" else ""
        if script and script not in {each.name for each in job.inputs}:
            job.inputs.add(name=script)
        for position, each in enumerate(job.inputs):
            here = f"jobs[{index}].inputs[{position}]"
            if each.sha256:
                continue  # uploaded before: intake checks that the bucket has it
            path = (base / each.name).resolve()
            if not path.is_relative_to(root):
                raise JobFileError(
                    f"{here}.name",
                    f"{each.name!r} is not inside the job file's folder {base}",
                    source=source,
                )
            if not path.is_file():
                raise JobFileError(
                    f"{here}.name",
                    f"{each.name!r}: no such file next to the job file (in {base})",
                    source=source,
                )
            sha256, size = sha256_file(path)
            each.sha256, each.size_bytes = sha256, size
            files[sha256] = LocalInput(path, sha256, size)
        if script:
            _check_scripts(job, index, base, source=source)
    return list(files.values())


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
        if not path.is_file():
            continue  # uploaded before: intake checks it
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            raise JobFileError(field, f"{name}: a script is at most {MAX_SCRIPT_BYTES} bytes")
        try:
            commands = check_script(path.read_text())
        except (ScriptError, UnicodeDecodeError) as error:
            raise JobFileError(field, f"{name} {error}", source=source) from None
        for command in commands:
            included = includes(command)
            if included is not None and included in positions:
                pending.append((included, f"jobs[{index}].inputs[{positions[included]}]"))
