"""File modes of what mdq writes under its data and logs folders: a job's outputs and
checkpoints, the pods' and services' logs. Their owner and its group read them, no other
account of the machine does (docs/security.md, "Files"): folders 0750, files 0640 at most.

The stack makes its folders and log files so (``private_folder``, ``open_log``), and the node
agent starts each runner with ``UMASK``, so that whatever OpenMM and the runner write inside
their job's folder gets no more either.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o750
FILE_MODE = 0o640
UMASK = 0o027
"""What a runner's process creates: at most ``DIR_MODE`` folders and ``FILE_MODE`` files."""


def private_folder(path: Path) -> Path:
    """``path`` as a folder of at most ``DIR_MODE`` (made, with any missing parent, or
    tightened: a folder made looser, 0755 say, is brought to it)."""
    missing = [each for each in (path, *path.parents) if not each.exists()]
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for each in (path, *missing):
        os.chmod(each, DIR_MODE)
    return path


def touch_private(path: Path) -> Path:
    """``path`` as a file of ``FILE_MODE`` (made empty, or tightened), for a program that
    appends to it (nats-server's log)."""
    os.close(_open(path))
    return path


def open_log(path: Path) -> BinaryIO:
    """``path`` opened for appending, a file of ``FILE_MODE`` (made, or tightened)."""
    return os.fdopen(_open(path), "ab")


def _open(path: Path) -> int:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    os.fchmod(descriptor, FILE_MODE)  # whatever the umask, or the mode it was made with
    return descriptor
