"""The job's own input files, fetched into its working folder before the engine starts.

Each file of ``JobSpec.inputs`` is asked of intake (``mdq.bus.inputs.InputFetch``: the job's
runner may ask for its own job's files only), written to a temporary file, checked against the
spec's sha256 and size, fsynced and renamed to its name in the working folder, read-only (an
engine writing over an input fails instead of changing what a retry would read). A file that is
already there with the right sha256 (a retry on the same cluster) is not fetched again; one
that is not is replaced. A file intake refuses or that does not match is the job's input being
unusable: ``InvalidInputError`` (not retried). A bus that does not answer is retried by the
attempt's retry like any failure to start.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from mdq.bus.inputs import FetchRefused, InputFetch
from mdq.contracts import pb
from services.runner.checkpoints import sha256_of
from services.runner.errors import InvalidInputError

log = logging.getLogger(__name__)

READ_ONLY = 0o444


def input_path(folder: Path, name: str) -> Path:
    """Where the input file ``name`` goes in ``folder``; InvalidInputError if the name would
    leave it (intake refuses such names; the runner trusts nothing it is handed)."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
        raise InvalidInputError(f"input file name {name!r} must be relative, without '..'")
    path = folder.joinpath(*parts)
    for parent in (path, *path.parents):
        if parent == folder:
            break
        if parent.is_symlink():
            raise InvalidInputError(f"input file {name!r}: {parent} is a symlink")
    return path


def holds(path: Path, wanted: pb.InputFile) -> bool:
    """Whether ``path`` is a regular file with the input's size and sha256."""
    try:
        return (
            path.is_file()
            and not path.is_symlink()
            and path.stat().st_size == wanted.size_bytes
            and sha256_of(path) == wanted.sha256
        )
    except OSError:
        return False


class InputFetcher:
    """Fetches one job's input files."""

    def __init__(self, fetch: InputFetch) -> None:
        self._fetch = fetch
        self.fetched = 0
        """Files fetched (not already there)."""

    async def fetch_all(self, inputs: Sequence[pb.InputFile], folder: Path) -> None:
        """Every input file in place in ``folder``, verified."""
        missing = await asyncio.to_thread(_missing, inputs, folder)
        for wanted, path in missing:
            await self._fetch_one(wanted, path)
            self.fetched += 1

    async def _fetch_one(self, wanted: pb.InputFile, path: Path) -> None:
        temp = path.with_name(f".fetch-{path.name}.{os.getpid()}")
        digest = hashlib.sha256()
        descriptor = await asyncio.to_thread(
            os.open, temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )
        try:

            def write(data: bytes) -> None:
                digest.update(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(descriptor, view) :]

            try:
                size = await self._fetch.fetch(wanted.sha256, write)
            except FetchRefused as error:
                raise InvalidInputError(f"input file {wanted.name!r}: {error}") from None
            await asyncio.to_thread(os.fsync, descriptor)
        finally:
            os.close(descriptor)
        await asyncio.to_thread(_install, temp, path, wanted, size, digest.hexdigest())


def _missing(inputs: Sequence[pb.InputFile], folder: Path) -> list[tuple[pb.InputFile, Path]]:
    """The inputs ``folder`` does not hold yet (or holds changed), with their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = []
    for wanted in inputs:
        path = input_path(folder, wanted.name)
        if not holds(path, wanted):
            path.parent.mkdir(parents=True, exist_ok=True)
            missing.append((wanted, path))
    return missing


def _install(temp: Path, path: Path, wanted: pb.InputFile, size: int, sha256: str) -> None:
    """Check the fetched file, make it read-only and rename it into place."""
    if size != wanted.size_bytes or sha256 != wanted.sha256:
        temp.unlink(missing_ok=True)
        raise InvalidInputError(
            f"input file {wanted.name!r} arrived as {size} bytes with sha256 {sha256[:12]}, "
            f"expected {wanted.size_bytes} bytes with sha256 {wanted.sha256[:12]}"
        )
    os.chmod(temp, READ_ONLY)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.replace(temp, path)
    log.info("fetched input %s (%d bytes, sha256 %s)", wanted.name, size, sha256[:12])
