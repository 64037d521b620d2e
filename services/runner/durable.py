"""Making what the runner wrote durable: fsync of a file, and of the folder that names it."""

from __future__ import annotations

import os
from pathlib import Path


def _fsync_opened(path: Path, flags: int) -> None:
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_file(path: Path) -> None:
    """Flush a file's content to its disk."""
    _fsync_opened(path, os.O_RDONLY)


def fsync_dir(directory: Path) -> None:
    """Flush a folder's entries to its disk (a rename into it survives a crash)."""
    _fsync_opened(directory, os.O_RDONLY | os.O_DIRECTORY)
