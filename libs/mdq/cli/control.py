"""``mdq cancel | hold | release | requeue | reprioritize | extend``: job control from the shell.

Each command sends one ``ControlRequest`` for the jobs named by id, a submit (``--request``) or
labels (``-l k=v``), prints each job's outcome and exits 0 (done), 1 (some job not changed, or
``--wait`` ran out), 2 (refused), 3 (nobody answered) or 5 (a submit or a label selector that
matched no job, as ``mdq show`` of an unknown job); ``--wait`` waits for the effect.
Design: docs/control.md, "Clients".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mdq.cli.context import user_name
from mdq.contracts import pb
from mdq.errors import EXIT_FAILED, EXIT_OK, MdqError, NotFound
from mdq.sdk.client import MdqClient, WaitTimeout

IN_HAND = (pb.CONTROL_DONE, pb.CONTROL_STOPPING, pb.CONTROL_UNCHANGED)
"""Outcomes of a job the request took care of."""

Jobs = Annotated[list[str] | None, typer.Argument(help="Job ids.", show_default=False)]
Request = Annotated[
    str, typer.Option("--request", help="Every job of this submit (its request id).")
]
Labels = Annotated[
    list[str] | None,
    typer.Option("-l", "--label", help="Every job with this label, KEY=VALUE (repeatable)."),
]
Reason = Annotated[str, typer.Option("--reason", help="Why, kept in the history.")]
Key = Annotated[
    str | None, typer.Option("--key", help="Control key (default: a new one); resend-safe.")
]
Wait = Annotated[bool, typer.Option("--wait", help="Wait until the effect is there.")]
Timeout = Annotated[float, typer.Option(help="Seconds to wait with --wait.")]


def labels_of(pairs: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` options as a selector; ``typer.BadParameter`` naming a malformed one."""
    labels: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"a label is KEY=VALUE, got {pair!r}", param_hint="-l")
        labels[key] = value
    return labels


def outcome_table(verb: str, reply: pb.ControlReply) -> Table:
    table = Table(title=f"{verb}: {reply.matched} job(s)", title_justify="left")
    for column in ("job", "outcome", "state", "message"):
        table.add_column(column, overflow="fold")
    for outcome in reply.outcomes:
        name = pb.ControlResult.Name(outcome.result).removeprefix("CONTROL_").lower()
        table.add_row(outcome.job_id, name, outcome.state or "—", outcome.message)
    if reply.omitted:
        table.caption = f"{reply.omitted} more not listed; all: {dict(reply.counts)}"
    return table


def exit_code_of(reply: pb.ControlReply) -> int:
    """0 when every job is in hand, else 1 (not found, another tenant's, not applicable)."""
    in_hand = sum(reply.counts.get(pb.ControlResult.Name(r), 0) for r in IN_HAND)
    return EXIT_OK if in_hand == reply.matched else EXIT_FAILED


def nothing_matched(request_id: str, labels: dict[str, str]) -> str:
    """What to say when a submit or a label selector matched no job ('' when one was named by
    id, or something matched)."""
    if labels:
        selector = ", ".join(f"{key}={value}" for key, value in labels.items())
        what = f"the label{'s' if len(labels) > 1 else ''} {selector}"
    elif request_id:
        what = f"submit {request_id}"
    else:
        return ""
    return (
        f"no job matched {what}: nothing was changed (a submit or a selector matches your "
        "jobs that have not ended)"
    )


Send = Callable[..., None]


def make_command(verb: str, *, run: Callable[..., int], console: Console, err: Console) -> Send:
    """The typer command of ``verb``; ``run(ctx, work)`` runs ``work(client)`` with a client
    of the context's endpoints and exits with its code."""

    def send(
        ctx: typer.Context,
        job_ids: list[str] | None,
        request_id: str,
        labels: list[str] | None,
        reason: str,
        key: str | None,
        wait: bool,
        timeout: float,
        **extra: object,
    ) -> None:
        selector = labels_of(labels)

        async def work(client: MdqClient) -> int:
            reply = await client.control(
                verb,
                job_ids or [],
                request_id=request_id,
                labels=selector,
                reason=reason,
                requested_by=user_name(),
                control_key=key,
                **extra,  # type: ignore[arg-type]
            )
            console.print(outcome_table(verb, reply))
            if (
                reply.matched == 0
                and not job_ids
                and (said := nothing_matched(request_id, selector))
            ):
                err.print(f"[red]{escape(said)}[/]")
                return NotFound.exit_code
            code = exit_code_of(reply)
            if not wait:
                return code
            try:
                views = await client.wait_control(verb, reply, timeout)
            except WaitTimeout as error:
                err.print(f"[red]{escape(str(error))}[/]")
                return EXIT_FAILED
            except MdqError:
                err.print(f"{verb} was answered (above); following the jobs failed:")
                raise
            for job_id, view in sorted(views.items()):
                console.print(f"{job_id} {view.state.value} (attempt {view.attempt})")
            return code

        raise typer.Exit(run(ctx, work))

    return send


PLAIN_VERBS = {
    "cancel": "Cancel jobs: at once when not running; a running one checkpoints first and keeps "
    "its outputs. Jobs waiting for them are cancelled too.",
    "hold": "Hold jobs: not placed until released; a running one stops at a checkpoint.",
    "release": "Release held jobs: they wait for their dependencies or are placed again.",
    "requeue": "Stop running jobs at a checkpoint and place them anew (another node if one fits).",
}
"""The verbs that take no value of their own, each with its help text."""


def register(app: typer.Typer, *, run: Callable[..., int], console: Console, err: Console) -> None:
    """Add the six commands to ``app``."""
    send = make_command  # one body, six signatures (typer reads each command's parameters)

    def add_plain_verb(verb: str, help_text: str) -> None:
        """Register ``verb`` with the options every verb shares and no value of its own."""
        command = send(verb, run=run, console=console, err=err)

        def plain(
            ctx: typer.Context,
            job_ids: Jobs = None,
            request_id: Request = "",
            labels: Labels = None,
            reason: Reason = "",
            key: Key = None,
            wait: Wait = False,
            timeout: Timeout = 600.0,
        ) -> None:
            command(ctx, job_ids, request_id, labels, reason, key, wait, timeout)

        plain.__doc__ = help_text
        app.command(verb)(plain)

    for verb, help_text in PLAIN_VERBS.items():
        add_plain_verb(verb, help_text)

    @app.command("reprioritize")
    def reprioritize(
        ctx: typer.Context,
        job_ids: Jobs = None,
        priority: Annotated[
            str, typer.Option("--priority", help="The new class: high, normal or low.")
        ] = "",
        request_id: Request = "",
        labels: Labels = None,
        reason: Reason = "",
        key: Key = None,
        wait: Wait = False,
        timeout: Timeout = 600.0,
    ) -> None:
        """Change jobs' priority class; placement re-ranks, nothing restarts."""
        command = send("reprioritize", run=run, console=console, err=err)
        command(
            ctx, job_ids, request_id, labels, reason, key, wait, timeout, priority_class=priority
        )

    @app.command("extend")
    def extend(
        ctx: typer.Context,
        job_ids: Jobs = None,
        steps: Annotated[int, typer.Option("--steps", help="Steps to add.")] = 0,
        reason: Reason = "",
        key: Key = None,
        wait: Wait = False,
        timeout: Timeout = 3600.0,
    ) -> None:
        """Continue SUCCEEDED MD jobs for --steps more steps from their final checkpoint, as a
        new attempt of the same job (--wait: until the extended run ends)."""
        command = send("extend", run=run, console=console, err=err)
        command(ctx, job_ids, "", None, reason, key, wait, timeout, extend_steps=steps)
