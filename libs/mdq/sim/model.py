"""What a simulation runs: nodes, jobs with their use of CPU and memory over time, failures.

A ``Workload`` is the input of ``mdq.sim.engine.simulate`` whatever its source (the generator,
an SWF trace, mdq's own history); docs/simulate.md describes each field's role in the model.
Times are seconds of virtual time from the workload's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node: its capacity and, for noisy neighbours, the CPU others use on it."""

    name: str
    cpu: float
    memory_mb: int
    background_cpu: float = 0.0
    """Cores used on it by work mdq does not place (a noisy neighbour), all the time."""


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job as submitted, and how it behaves when it runs."""

    job_id: str
    arrival_s: float
    cpu: float
    """Cores requested (hand-set)."""
    memory_mb: int
    """Memory requested (hand-set): also its limit, past which it is OOM-killed."""
    steps: int
    """MD steps to run."""
    steps_per_s: float
    """Steps per second with all the cores it uses and a quiet node."""
    peak_memory_mb: float
    """Resident memory once allocated (reached ``memory_ramp_s`` into each attempt)."""
    cores_used: float
    """Cores it keeps busy when allowed (threads); fewer allowed slow it in proportion."""
    tenant: str = ""
    priority_class: str = "normal"
    depends_on: tuple[str, ...] = ()
    checkpoint_every_steps: int = 0
    """0: no checkpoint (a retry starts over)."""
    crash_at_steps: tuple[int, ...] = ()
    """Steps at which a run crashes (each once: the first attempt to reach it)."""
    kind: str = ""
    """What jobs alike share (the cost fingerprint learned requests group by); "" = own."""
    atoms: int = 0
    """System size, for the physical estimate of learned requests (0: unknown)."""
    max_retries: int = 3
    memory_ramp_s: float = 30.0
    """Seconds from start to peak memory (from half of it: allocation as MD sets up)."""

    @property
    def duration_s(self) -> float:
        """Run time alone on a quiet node with the cores it uses."""
        return self.steps / self.steps_per_s


@dataclass(frozen=True, slots=True)
class NodeOutage:
    """A node lost at ``at_s`` (its attempts fail FAILURE_NODE_LOST) and back ``down_s`` later."""

    node: str
    at_s: float
    down_s: float


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything one simulation runs: the same for every configuration compared."""

    nodes: tuple[SimNode, ...]
    jobs: tuple[SimJob, ...]
    outages: tuple[NodeOutage, ...] = ()
    name: str = ""
    notes: dict[str, str] = field(default_factory=dict)
    """Where it came from (generator parameters, trace file, database), for the report."""
