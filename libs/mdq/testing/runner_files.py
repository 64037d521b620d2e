"""What a runner's own files say, read from outside (benches and end-to-end tests).

A runner's energy table (``energies.csv``), its checkpoint files and its log are the outside
measure of how far an attempt got and where the next one resumed: never a figure mdq reports
about itself.
"""

from __future__ import annotations

import re
from pathlib import Path

RESUMED = re.compile(r"resuming from \S+ at step (\d+)")
STARTED_OVER = "starting over from step 0"


def last_energy_step(path: Path) -> int:
    """The step of the last complete row of a runner's energy table (-1 if none)."""
    last = -1
    with path.open() as table:
        for line in table:
            if not line.endswith("\n"):
                break  # a row cut by a kill: not written
            head = line.split(",", 1)[0]
            if head.isdigit():
                last = int(head)
    return last


def newest_checkpoint_step(folder: Path) -> int:
    """The step of the newest checkpoint file in a job's checkpoint folder (-1 if none)."""
    steps = [int(path.stem.split("-")[1]) for path in folder.glob("ckpt-*.xml")]
    return max(steps, default=-1)


def logged_resume(log_path: Path) -> int | None:
    """The step a runner's log says it resumed from (0: started over), None if not yet."""
    if not log_path.is_file():
        return None
    text = log_path.read_text(errors="replace")
    if found := RESUMED.search(text):
        return int(found.group(1))
    return 0 if STARTED_OVER in text else None


def energy_rows(path: Path) -> list[tuple[int, str]]:
    """(step, the whole line) of every complete row of a runner's energy table, in file order
    (a row cut by a kill is left out)."""
    rows: list[tuple[int, str]] = []
    with path.open() as table:
        for line in table:
            if not line.endswith("\n"):
                break
            head = line.split(",", 1)[0]
            if head.isdigit():
                rows.append((int(head), line))
    return rows


def checkpoint_steps(folder: Path) -> set[int]:
    """The steps of every checkpoint file (State XML) in a job's checkpoint folder."""
    return {int(path.stem.split("-")[1]) for path in folder.glob("ckpt-*.xml")}


def retry_table_problem(
    killed: list[tuple[int, str]], now: list[tuple[int, str]], resumed: int, interval: int
) -> str | None:
    """What is wrong, if anything, with a job's energy table after its retry resumed from step
    ``resumed`` (0: started over), against the table its killed attempt left (``killed``,
    read when it died): the table must be one trajectory (every ``interval`` steps from the
    first report on, no step twice, none missing), keep exactly the killed attempt's rows up
    to ``resumed``, and hold the retry's rows past it. None when all holds."""
    steps = [step for step, _ in now]
    if steps != list(range(interval, interval * len(steps) + 1, interval)):
        return f"the table is not one trajectory every {interval} steps: {steps[:3]}…{steps[-3:]}"
    kept_before = [line for step, line in killed if step <= resumed]
    kept_now = [line for step, line in now if step <= resumed]
    if kept_now != kept_before:
        return f"the rows up to step {resumed} are not those the killed attempt wrote"
    if not steps or steps[-1] <= resumed:
        return f"no row of the retry past step {resumed}"
    return None
