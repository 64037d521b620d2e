"""The Standard Workload Format (SWF) of the Parallel Workloads Archive: read a trace into a
``Workload``, and write one (docs/simulate.md, "SWF").

An SWF file is one job per line, 18 whitespace-separated fields, -1 where unknown; lines
starting with ``;`` are the header (``; MaxNodes: 128``, ``; MaxProcs: 1024`` ...). The fields
read are: 1 job number, 2 submit time (s), 4 run time (s), 5 allocated processors, 6 average
CPU time used (s, per processor), 7 used memory (KiB per processor), 8 requested processors,
10 requested memory (KiB per processor), 11 status (1 completed, 0 failed, 5 cancelled), 12 user
id (the tenant: ``u<id>``), 17 preceding job number (a dependency). Others are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from mdq.sim.model import SimJob, SimNode, Workload

FIELDS = 18
STEPS_PER_S = 10.0
"""Simulated steps per second of run time (SWF has no steps: only their rate matters)."""
DEFAULT_MEMORY_MB_PER_CORE = 2_048
"""Memory requested per processor when the trace says nothing of memory."""
COMPLETED, FAILED, CANCELLED = 1, 0, 5


class SwfError(ValueError):
    """A line of the trace that cannot be read, named by its line number and field."""


@dataclass(frozen=True, slots=True)
class SwfOptions:
    """The cluster an SWF trace is replayed on (the trace describes jobs, not nodes)."""

    nodes: int = 0
    """0: the header's MaxNodes, else MaxProcs / ``node_cpu``."""
    node_cpu: float = 32.0
    node_memory_mb: int = 131_072
    limit: int = 0
    """Read at most this many jobs (0: all)."""
    checkpoint_every_s: float = 600.0


def _number(text: str, line: int, field: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise SwfError(f"line {line}: field {field} is not a number: {text!r}") from None


def read_swf(path: Path, options: SwfOptions = SwfOptions()) -> Workload:
    """The trace at ``path`` as a workload; jobs wider than a node run on one whole node (mdq
    places single-node jobs) and are counted in the notes."""
    return parse_swf(path.read_text().splitlines(), options, name=path.name)


def parse_swf(lines: Iterable[str], options: SwfOptions = SwfOptions(), name: str = "") -> Workload:
    header: dict[str, str] = {}
    jobs: list[SimJob] = []
    narrowed = skipped = 0
    numbers: set[str] = set()
    first_submit: float | None = None
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(";"):
            key, sep, value = line[1:].partition(":")
            if sep:
                header[key.strip()] = value.strip()
            continue
        parts = line.split()
        if len(parts) != FIELDS:
            raise SwfError(f"line {number}: {len(parts)} fields, SWF has {FIELDS}")
        values = [_number(text, number, i + 1) for i, text in enumerate(parts)]
        run_s, status = values[3], int(values[10])
        if run_s <= 0 or status == CANCELLED:
            skipped += 1
            continue
        procs = values[7] if values[7] > 0 else values[4]
        if procs <= 0:
            raise SwfError(f"line {number}: fields 5 and 8 give no processor count")
        cpu = float(procs)
        if cpu > options.node_cpu:
            narrowed += 1
            cpu = options.node_cpu
        per_core_kib = values[9] if values[9] > 0 else -1.0
        memory_mb = (
            math.ceil(per_core_kib * cpu / 1024)
            if per_core_kib > 0
            else DEFAULT_MEMORY_MB_PER_CORE * math.ceil(cpu)
        )
        memory_mb = min(max(memory_mb, 64), options.node_memory_mb)
        used_kib = values[6]
        peak = used_kib * cpu / 1024 if used_kib > 0 else 0.5 * memory_mb
        cores_used = cpu
        if values[5] > 0:
            cores_used = min(cpu, max(0.1, values[5] * cpu / run_s))
        steps = max(1, round(run_s * STEPS_PER_S))
        submit = values[1]
        first_submit = submit if first_submit is None else min(first_submit, submit)
        job_id = f"swf-{int(values[0])}"
        preceding = int(values[16])
        depends = (f"swf-{preceding}",) if preceding > 0 and f"swf-{preceding}" in numbers else ()
        jobs.append(
            SimJob(
                job_id=job_id,
                arrival_s=submit,
                cpu=cpu,
                memory_mb=memory_mb,
                steps=steps,
                steps_per_s=STEPS_PER_S,
                peak_memory_mb=peak,
                cores_used=cores_used,
                tenant=f"u{int(values[11])}" if values[11] >= 0 else "",
                depends_on=depends,
                checkpoint_every_steps=max(1, round(options.checkpoint_every_s * STEPS_PER_S)),
                # a failed job ran its time and failed: once, for good
                crash_at_steps=(steps - 1,) if status == FAILED and steps > 1 else (),
                max_retries=0 if status == FAILED else 3,
                kind=f"swf-u{int(values[11])}-{int(cpu)}",
            )
        )
        numbers.add(job_id)
        if options.limit and len(jobs) >= options.limit:
            break
    offset = first_submit or 0.0
    jobs = [_shift(job, offset) for job in jobs]
    count = options.nodes or _nodes_from_header(header, options)
    nodes = tuple(
        SimNode(f"n{i:05d}", options.node_cpu, options.node_memory_mb) for i in range(count)
    )
    return Workload(
        nodes=nodes,
        jobs=tuple(jobs),
        name=name or "swf",
        notes={
            "source": "swf",
            "narrowed_to_one_node": str(narrowed),
            "skipped_cancelled_or_empty": str(skipped),
        },
    )


def _shift(job: SimJob, offset: float) -> SimJob:
    return replace(job, arrival_s=job.arrival_s - offset)


def _nodes_from_header(header: dict[str, str], options: SwfOptions) -> int:
    for key in ("MaxNodes", "MaxProcs"):
        value = header.get(key, "")
        try:
            count = int(float(value))
        except ValueError:
            continue
        if count > 0:
            return count if key == "MaxNodes" else max(1, math.ceil(count / options.node_cpu))
    raise SwfError("the header gives neither MaxNodes nor MaxProcs: say how many nodes (--nodes)")


def write_swf(workload: Workload, path: Path) -> None:
    """``workload`` as an SWF trace (what ``read_swf`` reads back, less what SWF cannot hold:
    chains beyond one predecessor, crashes part-way, priorities)."""
    users: dict[str, int] = {}
    lines = [
        "; Version: 2.2",
        f"; Computer: mdq simulate ({workload.name or 'generated'})",
        f"; MaxJobs: {len(workload.jobs)}",
        f"; MaxNodes: {len(workload.nodes)}",
        f"; MaxProcs: {int(sum(node.cpu for node in workload.nodes))}",
        "; Note: memory fields are KiB per processor",
    ]
    index = {job.job_id: i + 1 for i, job in enumerate(workload.jobs)}
    for number, job in enumerate(workload.jobs, start=1):
        user = users.setdefault(job.tenant, len(users) + 1)
        procs = max(1, round(job.cpu))
        run_s = job.duration_s
        preceding = index.get(job.depends_on[0], -1) if job.depends_on else -1
        fields = [
            number,
            round(job.arrival_s),
            -1,
            round(run_s),
            procs,
            round(run_s * job.cores_used / procs),
            round(job.peak_memory_mb * 1024 / procs),
            procs,
            round(run_s),
            round(job.memory_mb * 1024 / procs),
            FAILED if job.crash_at_steps and job.max_retries == 0 else COMPLETED,
            user,
            1,
            -1,
            1,
            1,
            preceding,
            -1,
        ]
        lines.append(" ".join(str(value) for value in fields))
    path.write_text("\n".join(lines) + "\n")
