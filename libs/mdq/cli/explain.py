"""``mdq explain JOB``: why placement put each attempt of a job where it did.

Every ``bound`` event carries the nodes placement scored (with their scores), the nodes it
filtered out and why, and on a large cluster the number of nodes filtered per reason and the
number not examined. This command reads the job's events from the log (NATS, no database
needed) and prints one table per attempt: the chosen node first, then the other candidates by
score, then the filtered nodes. A job not bound yet is shown with its state.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from nats.js.api import DeliverPolicy
from rich.console import Console
from rich.table import Table

from mdq.bus.codec import decode_event
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.cli.context import GlobalOptions, NoEndpoint, resolve_endpoints
from mdq.contracts import pb
from mdq.core.state import JobBook

console = Console(width=160)


async def job_events(nats_url: str, namespace: str, job_id: str) -> list[pb.Event]:
    """Every event of ``job_id`` in the job log, in order."""
    subjects = Subjects(namespace=namespace)
    nc = await connect(nats_url, name="mdq-explain")
    try:
        js = nc.jetstream()
        subscription = await js.subscribe(
            subjects.job_all(job_id), ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        try:
            info = await subscription.consumer_info()
            delivered = info.delivered.consumer_seq if info.delivered else 0
            total = (info.num_pending or 0) + (delivered or 0)
            events: list[pb.Event] = []
            while len(events) < total:
                message = await subscription.next_msg(timeout=5.0)
                events.append(decode_event(message.data))
            return events
        finally:
            await subscription.unsubscribe()
    finally:
        await nc.drain()


def bound_table(event: pb.Event) -> Table:
    """One attempt's placement: chosen node, other candidates by score, filtered nodes."""
    bound = event.bound
    title = f"attempt {event.attempt}: bound to {bound.node}"
    if bound.nodes_total:
        title += f" ({bound.nodes_total} nodes known"
        if bound.not_examined:
            title += f", {bound.not_examined} eligible not examined"
        title += ")"
    table = Table(title=title)
    for column, justify in (
        ("node", "left"),
        ("score", "right"),
        ("cpu load", "right"),
        ("memory load", "right"),
        ("verdict", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    scored = sorted(
        (c for c in bound.candidates if not c.filtered),
        key=lambda c: (c.node != bound.node, -c.score),
    )
    for candidate in scored:
        verdict = "[green]chosen[/]" if candidate.node == bound.node else "candidate"
        table.add_row(
            candidate.node,
            f"{candidate.score:.1f}",
            f"{candidate.cpu_load:.0%}",
            f"{candidate.memory_load:.0%}",
            verdict,
        )
    for candidate in (c for c in bound.candidates if c.filtered):
        table.add_row(
            candidate.node,
            "-",
            f"{candidate.cpu_load:.0%}",
            f"{candidate.memory_load:.0%}",
            f"[red]filtered: {candidate.filtered}[/]",
        )
    listed = {c.filtered: 0 for c in bound.candidates if c.filtered}
    for candidate in bound.candidates:
        if candidate.filtered:
            listed[candidate.filtered] += 1
    for reason, count in sorted(bound.filtered_counts.items()):
        if count > listed.get(reason, 0):
            table.add_row(
                f"… {count - listed.get(reason, 0)} more", "-", "", "", f"filtered: {reason}"
            )
    return table


def explain(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job id.")],
) -> None:
    """Why placement chose the node of each attempt of a job (scores and filtered nodes)."""
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    try:
        endpoints = resolve_endpoints(options)
    except NoEndpoint as error:
        Console(stderr=True).print(f"[red]{error}[/]")
        raise typer.Exit(3) from None
    events = asyncio.run(job_events(endpoints.nats_url, endpoints.namespace, job_id))
    if not events:
        Console(stderr=True).print(f"[red]no job {job_id} in the log[/]")
        raise typer.Exit(1)
    book = JobBook()
    for event in events:
        book.apply(0, event)
    view = book.jobs.get(job_id)
    bound = [event for event in events if event.WhichOneof("body") == "bound"]
    state = view.state.value if view is not None else "unknown"
    console.print(f"job {job_id}: {state}, attempt {view.attempt if view else '?'}")
    if not bound:
        console.print("not bound yet: no placement decision to explain")
        return
    for event in bound:
        console.print(bound_table(event))
