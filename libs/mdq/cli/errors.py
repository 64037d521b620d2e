"""The one place the ``mdq`` command turns an error into a message and an exit code.

Every command runs inside ``Commands``: an ``mdq.errors.MdqError`` that leaves a command is
printed to stderr (a refusal as its field and message, anything else as its text) and ends the
command with the error's ``exit_code``; ``--help`` lists the codes (``EXIT_CODES``).
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from mdq.errors import (
    EXIT_FAILED,
    EXIT_OK,
    Conflict,
    InvalidInput,
    MdqError,
    NotFound,
    PermissionDenied,
    Unavailable,
)

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done (every job waited for succeeded)"),
    (EXIT_FAILED, "a job waited for did not succeed, or another error"),
    (InvalidInput.exit_code, "refused: the field and message say what to change"),
    (Unavailable.exit_code, "NATS, PostgreSQL, intake, placement or the stack does not answer"),
    (PermissionDenied.exit_code, "these credentials may not do or read this"),
    (NotFound.exit_code, "what was named does not exist"),
    (Conflict.exit_code, "it contradicts what exists"),
)
"""Every exit code of ``mdq`` and what it means."""


def exit_codes_text() -> str:
    """``EXIT_CODES`` as the end of ``mdq --help``."""
    return "Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES) + "."


def report(error: MdqError, console: Console, *, command: str = "") -> int:
    """Print ``error`` for a person on ``console`` and return its exit code. A refusal that
    names its field prints it on a line of its own, under "<command> refused"."""
    if isinstance(error, InvalidInput) and error.field:
        console.print(f"[bold red]{command + ' ' if command else ''}refused[/]")
        console.print(f"  field:   {escape(error.field)}")
        where = f"{error.source}: " if error.source else ""
        console.print(f"  message: {escape(where + (error.message or str(error)))}")
    else:
        console.print(f"[red]{escape(str(error))}[/]")
    return error.exit_code


class Commands(TyperGroup):
    """The ``mdq`` group: its commands' ``MdqError`` becomes a message and an exit code."""

    # typer.Context is the context typer makes; its base is typer's vendored click's
    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except MdqError as error:
            command = ctx.invoked_subcommand or ""
            console = Console(stderr=True, soft_wrap=True)  # a path or command stays whole
            raise typer.Exit(report(error, console, command=command)) from None
