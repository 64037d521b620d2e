"""Intake's checks of a submit's input files, against the submitter's inputs bucket.

Before a submit is accepted, every input file a job names must be in the submitter's bucket
(``mdq.bus.inputs``: the operator's, or the tenant's) with the sha256 and size the spec says,
and every LAMMPS script (the job's ``system.lammps.script`` and the input files it includes by
name) must pass ``mdq.core.lammps_script``. The refusal names the field and, for a script, the
line: ``jobs[0].system.lammps.script: in.melt line 12: shell rm -rf /: 'shell' is refused: it
runs programs on the host``. Objects are content-addressed, so what was checked is what every
attempt of the job will read: a script's verdict is remembered by its sha256.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import ObjectInfo

from mdq.bus.inputs import NoInputsBucket, lookup, matches, read_chunk
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.lammps_script import (
    MAX_SCRIPT_BYTES,
    Command,
    ScriptError,
    check_script,
    includes,
)
from mdq.core.spec import SpecError

log = logging.getLogger("mdq.intake.inputs")

CACHED_VERDICTS = 4096


class InputsCheck:
    """Checks submits' input files (one per intake process; remembers scripts' verdicts)."""

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._subjects = subjects
        self._verdicts: OrderedDict[str, list[Command] | ScriptError] = OrderedDict()

    async def refusal(self, tenant: str, jobs: Sequence[pb.JobSpec]) -> SpecError | None:
        """Why the submit of ``jobs`` (in submitted order, normalized) cannot be accepted,
        or None."""
        bucket = self._subjects.inputs_bucket(tenant)
        for index, job in enumerate(jobs):
            if not job.inputs:
                continue
            found: dict[str, ObjectInfo] = {}
            for position, each in enumerate(job.inputs):
                here = f"jobs[{index}].inputs[{position}]"
                try:
                    info = await lookup(self._js, bucket, each.sha256)
                except NoInputsBucket:
                    return SpecError(
                        f"{here}.sha256",
                        f"there is no inputs bucket {bucket} to hold {each.name} (the admin "
                        "makes it: mdq up, mdq tenant add)",
                    )
                if info is None:
                    return SpecError(
                        f"{here}.sha256",
                        f"{each.name} ({each.sha256[:12]}) is not in {bucket}: upload it first "
                        "(mdq submit uploads the files a job names)",
                    )
                if not matches(info, each.sha256, each.size_bytes):
                    return SpecError(
                        f"{here}.size_bytes",
                        f"{each.name}: the stored object has {info.size} bytes, the spec says "
                        f"{each.size_bytes}",
                    )
                found[each.name] = info
            if job.system.WhichOneof("kind") == "lammps" and job.task != pb.TASK_ANALYZE:
                problem = await self._check_scripts(job, index, bucket, found)
                if problem is not None:
                    return problem
        return None

    async def _check_scripts(
        self, job: pb.JobSpec, index: int, bucket: str, found: dict[str, ObjectInfo]
    ) -> SpecError | None:
        """The script and the input files it includes by name (recursively), checked."""
        positions = {each.name: position for position, each in enumerate(job.inputs)}
        script = job.system.lammps.script
        pending = [(script, f"jobs[{index}].system.lammps.script")]
        seen: set[str] = set()
        while pending:
            name, field = pending.pop()
            if name in seen or name not in found:
                continue  # an include of a file that is not an input: the runner says so
            seen.add(name)
            info = found[name]
            sha256 = next(each.sha256 for each in job.inputs if each.name == name)
            try:
                commands = await self._checked(bucket, info, sha256)
            except ScriptError as error:
                return SpecError(field, f"{name} {error}")
            for command in commands:
                included = includes(command)
                if included is not None and included in positions:
                    pending.append((included, f"jobs[{index}].inputs[{positions[included]}]"))
        return None

    async def _checked(self, bucket: str, info: ObjectInfo, sha256: str) -> list[Command]:
        """The commands of a script object, checked (ScriptError); the verdict is remembered
        by the script's sha256 (objects never change under it)."""
        verdict = self._verdicts.get(sha256)
        if verdict is None:
            verdict = await self._verdict(bucket, info)
            self._verdicts[sha256] = verdict
            while len(self._verdicts) > CACHED_VERDICTS:
                self._verdicts.popitem(last=False)
        if isinstance(verdict, ScriptError):
            raise verdict
        return verdict

    async def _verdict(self, bucket: str, info: ObjectInfo) -> list[Command] | ScriptError:
        if (info.size or 0) > MAX_SCRIPT_BYTES:
            return ScriptError(0, "", f"a script is at most {MAX_SCRIPT_BYTES} bytes")
        data = await self._read(bucket, info)
        try:
            return check_script(data.decode())
        except UnicodeDecodeError:
            return ScriptError(0, "", "a script is text (UTF-8)")
        except ScriptError as error:
            return error

    async def _read(self, bucket: str, info: ObjectInfo) -> bytes:
        parts: list[bytes] = []
        after = 0
        while sum(len(part) for part in parts) < (info.size or 0):
            chunk = await read_chunk(self._js, bucket, info, after_seq=after)
            if chunk is None:
                break
            data, after = chunk
            parts.append(data)
        return b"".join(parts)
