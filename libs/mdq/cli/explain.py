"""``mdq explain JOB``: why placement put each attempt of a job where it did.

Every ``bound`` event carries the nodes placement scored (with their scores), the nodes it
filtered out and why, and on a large cluster the number of nodes filtered per reason and the
number not examined. This command reads the job's events from the log (NATS, no database
needed) and prints one table per attempt: the chosen node first, then the other candidates by
score, then the filtered nodes.

A job that waits (WAITING or PENDING) is explained as a Pending pod is by Kubernetes: what it
waits for (its dependencies and their states, a retry's backoff) and, from the KV bucket
``<namespace>_waiting`` that placement keeps up to date, each node's filter or score at
placement's last try ("0/2 nodes are available: 2 cordoned") and the failure cordons in force
with their end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated

import typer
from google.protobuf import json_format
from nats.errors import NoRespondersError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from rich.console import Console
from rich.table import Table

from mdq.bus.codec import decode_event
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.cli.args import job_id_argument
from mdq.cli.context import GlobalOptions, resolve_endpoints
from mdq.cli.recommend import recorded_choice
from mdq.cli.tables import columns_table
from mdq.contracts import pb
from mdq.core.state import JobBook, JobState, JobView
from mdq.core.timestamps import to_datetime
from mdq.errors import NotFound
from mdq.sdk.client import tenant_of_creds
from mdq.sdk.consumers import read_stored

console = Console(width=160)


async def job_events(
    nats_url: str, namespace: str, job_id: str, *, creds: str = ""
) -> list[pb.Event]:
    """Every event of ``job_id`` in the job log, in order (a tenant's: from its own stream,
    the only one it may read), through one consumer deleted before it returns."""
    subjects = Subjects(namespace=namespace)
    tenant = tenant_of_creds(creds)
    stream = subjects.tenant_stream(tenant) if tenant else subjects.jobs_stream
    nc = await connect(nats_url, name="mdq-explain", creds=creds or None)
    try:
        messages = await read_stored(nc.jetstream(), stream, [subjects.job_all(job_id)])
        return [decode_event(message.data) for message in messages]
    finally:
        await nc.drain()


async def waiting_entry(
    nats_url: str, namespace: str, job_id: str, *, creds: str = ""
) -> pb.JobWaiting | None:
    """Placement's latest word on why ``job_id`` waits, or None if it has none. A tenant reads
    its own job's entry alone, by a direct get of that key's subject (the only way its
    permissions allow: the bucket names every tenant's jobs)."""
    bucket = Subjects(namespace=namespace).waiting_bucket
    nc = await connect(nats_url, name="mdq-explain", creds=creds or None)
    try:
        if tenant_of_creds(creds):
            message = await nc.jetstream().get_last_msg(
                f"KV_{bucket}", f"$KV.{bucket}.{job_id}", direct=True
            )
            if message.headers and message.headers.get("KV-Operation") in ("DEL", "PURGE"):
                return None
            value = message.data or b""
        else:
            kv = await nc.jetstream().key_value(bucket)
            value = (await kv.get(job_id)).value or b""
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError, NoRespondersError):
        return None  # nothing written yet (or a bucket from before tenants could read it)
    finally:
        await nc.drain()
    return pb.JobWaiting.FromString(value)


async def dependency_states(
    nats_url: str, namespace: str, view: JobView, *, creds: str = ""
) -> dict[str, str]:
    """The state of each job ``view`` depends on, from the log ("not in the log" if absent)."""
    states: dict[str, str] = {}
    for dependency in view.depends_on_ids:
        book = JobBook()
        for event in await job_events(nats_url, namespace, dependency, creds=creds):
            book.apply(0, event)
        found = book.jobs.get(dependency)
        states[dependency] = found.state.value if found is not None else "not in the log"
    return states


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S UTC")


def unlisted(candidates: list[pb.NodeScore], counts: dict[str, int]) -> list[tuple[str, int]]:
    """Per filter reason, how many filtered nodes ``counts`` has beyond those named."""
    named: dict[str, int] = {}
    for candidate in candidates:
        if candidate.filtered:
            named[candidate.filtered] = named.get(candidate.filtered, 0) + 1
    return [
        (reason, count - named.get(reason, 0))
        for reason, count in sorted(counts.items())
        if count > named.get(reason, 0)
    ]


SCALE_NOTE = (
    "score: higher wins. With the default settings it is 100 x (1 - the node's utilisation "
    "with the job) (100: an idle node), less up to 10 for CPU and memory out of balance, less "
    "50 on a node above 80 % load, plus up to 20 for a preferred cluster and 15 for the "
    "dependencies' outputs, less up to 10 for a busy cluster: from about -70 to 135. "
    "cpu, memory: the figures each decision used: for a scored node its utilisation with the "
    "job; filtered for load, its live load plus what was bound there since its report (the "
    "limit is 95 %); filtered for room, its reservations plus the job over its capacity "
    "(above 100 %); other filters, its utilisation before the job. docs/placement.md, "
    '"What mdq explain shows".'
)
"""What the numbers of the node and cluster tables mean (printed under them)."""


def _share(value: float) -> str:
    """A utilisation as a percentage: whole numbers, but never rounded onto a limit it
    passed (0.951 is 95.1 %, not 95 %)."""
    whole = f"{value:.0%}"
    return whole if abs(round(value * 100) - value * 100) < 0.05 else f"{value:.1%}"


def candidates_table(title: str, candidates: list[pb.NodeScore], chosen: str = "") -> Table:
    """Nodes with their scores, then the filtered ones with their reasons; cpu and memory
    are the figures each decision used (``SCALE_NOTE``)."""
    table = columns_table(
        title,
        (
            ("node", "left"),
            ("score", "right"),
            ("cpu", "right"),
            ("memory", "right"),
            ("verdict", "left"),
        ),
    )
    scored = sorted(
        (c for c in candidates if not c.filtered), key=lambda c: (c.node != chosen, -c.score)
    )
    for candidate in scored:
        verdict = "[green]chosen[/]" if candidate.node == chosen else "candidate"
        table.add_row(
            candidate.node,
            f"{candidate.score:.1f}",
            _share(candidate.cpu_load),
            _share(candidate.memory_load),
            verdict,
        )
    for candidate in (c for c in candidates if c.filtered):
        table.add_row(
            candidate.node,
            "-",
            _share(candidate.cpu_load),
            _share(candidate.memory_load),
            f"[red]filtered: {candidate.filtered}[/]",
        )
    return table


def clusters_table(
    title: str, clusters: Sequence[pb.ClusterScore], chosen: str | None = None
) -> Table:
    """The cluster choice: each cluster's best node and score, or why none of its nodes
    could take the job (its filtered nodes per reason)."""
    table = columns_table(
        title,
        (
            ("cluster", "left"),
            ("best node", "left"),
            ("score", "right"),
            ("candidates", "right"),
            ("cpu reserved", "right"),
            ("verdict", "left"),
        ),
        title_justify="left",
    )
    for cluster in clusters:
        filtered = ", ".join(
            f"{n} {reason}" for reason, n in sorted(cluster.filtered_counts.items())
        )
        if cluster.cluster == chosen:
            verdict = "[green]chosen[/]"
        elif cluster.best_node:
            verdict = "candidate"
        else:
            verdict = f"[red]no node: {filtered or 'none known'}[/]"
        table.add_row(
            cluster.cluster or "(unnamed)",
            cluster.best_node or "-",
            f"{cluster.best_score:.1f}" if cluster.best_node else "-",
            str(cluster.candidates),
            f"{cluster.cpu_reserved:.0%}",
            verdict,
        )
    return table


def print_waiting(
    view: JobView,
    dependencies: dict[str, str],
    waiting: pb.JobWaiting | None,
    now: datetime,
) -> None:
    """What a waiting job waits for, and placement's last word on every node."""
    if view.state is JobState.WAITING:
        listed = ", ".join(f"{job} ({state})" for job, state in dependencies.items())
        console.print(f"waits for its dependencies to succeed: {listed}")
        return
    if view.not_before is not None and view.not_before > now:
        console.print(f"backing off after a failure: not placed before {_clock(view.not_before)}")
    if waiting is None or waiting.attempt != view.attempt:
        console.print(
            f"attempt {view.attempt} not bound yet; placement has not explained it yet (it "
            "writes why a job waits every few seconds while it does)"
        )
        return
    at = to_datetime(waiting.at)
    console.print(f"attempt {view.attempt} not bound at {_clock(at)}: {waiting.summary}")
    if waiting.clusters:
        console.print(clusters_table(f"clusters at {_clock(at)}", list(waiting.clusters)))
    if waiting.candidates:  # none when it waits for its tenant's quota, not for a node
        console.print(candidates_table(f"nodes at {_clock(at)}", list(waiting.candidates)))
    for reason, more in unlisted(list(waiting.candidates), dict(waiting.filtered_counts)):
        console.print(f"… and {more} more nodes: {reason}")
    for cordon in waiting.cordons:
        console.print(
            f"node {cordon.node} cordoned by placement until {_clock(to_datetime(cordon.until))}"
            f" ({cordon.failures} jobs crashed there)"
        )


def bound_table(event: pb.Event) -> Table:
    """One attempt's placement: chosen node, other candidates by score, filtered nodes."""
    bound = event.bound
    title = f"attempt {event.attempt}: bound to {bound.node}"
    if bound.nodes_total:
        title += f" ({bound.nodes_total} nodes known"
        if bound.not_examined:
            title += f", {bound.not_examined} eligible not examined"
        title += ")"
    table = candidates_table(title, list(bound.candidates), bound.node)
    for reason, more in unlisted(list(bound.candidates), dict(bound.filtered_counts)):
        table.add_row(f"… {more} more", "-", "", "", f"filtered: {reason}")
    return table


def explain(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job id.")],
) -> None:
    """Why placement chose the node of each attempt of a job (scores and filtered nodes)."""
    job_id = job_id_argument(job_id)
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    endpoints = resolve_endpoints(options)
    creds = endpoints.nats_creds
    events = asyncio.run(job_events(endpoints.nats_url, endpoints.namespace, job_id, creds=creds))
    if not events:
        Console(stderr=True).print(f"[red]no job {job_id} in the log[/]")
        raise typer.Exit(NotFound.exit_code)
    book = JobBook()
    for event in events:
        book.apply(0, event)
    view = book.jobs.get(job_id)
    bound = [event for event in events if event.WhichOneof("body") == "bound"]
    state = view.state.value if view is not None else "unknown"
    console.print(f"job {job_id}: {state}, attempt {view.attempt if view else '?'}")
    for event in events:
        if event.WhichOneof("body") == "submitted" and event.submitted.HasField("recommended"):
            body = json_format.MessageToDict(event.submitted, preserving_proto_field_name=True)
            if (line := recorded_choice(body)) is not None:
                console.print(line, highlight=False)
    for event in bound:
        if event.bound.clusters:
            title = f"attempt {event.attempt}: cluster {event.bound.cluster}"
            console.print(clusters_table(title, list(event.bound.clusters), event.bound.cluster))
        console.print(bound_table(event))
    if view is not None and view.state is JobState.HELD:
        console.print(f"held: it is not placed until released (mdq release {job_id})")
    if view is not None and view.stop.value:
        console.print(f"being stopped for a {view.stop.value} (docs/control.md)")
    waiting = None
    if view is not None and view.state in (JobState.WAITING, JobState.PENDING):
        url, namespace = endpoints.nats_url, endpoints.namespace
        dependencies = asyncio.run(dependency_states(url, namespace, view, creds=creds))
        waiting = asyncio.run(waiting_entry(url, namespace, job_id, creds=creds))
        print_waiting(view, dependencies, waiting, datetime.now(UTC))
    if bound or (waiting is not None and waiting.candidates):
        console.print(SCALE_NOTE, style="dim", highlight=False)
