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
