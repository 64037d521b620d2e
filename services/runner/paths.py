"""Where a runner may read and write: the job's own folder, its working folder, and its
dependencies' folders (docs/security.md, "Files"), whatever the engine.

A name handed to the runner (an output's, a dependency's file, an input file's) is checked
after following symlinks, so a symlink planted in a folder cannot lead the runner elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from services.runner.errors import InvalidInputError

WORK_FOLDER = "work"
"""The job's working folder (``<job folder>/work``): its input files, fetched and verified, and
for a LAMMPS job the files its script writes (the engine's working directory)."""


def output_path(job_dir: Path, name: str) -> Path:
    """``job_dir/name`` and nowhere else: a symlink planted under that name is removed first,
    so writing to it cannot reach outside the job's folder."""
    path = job_dir / name
    if path.is_symlink():
        path.unlink()
    if path.name != name or path.parent.resolve() != job_dir.resolve():
        raise InvalidInputError(f"output {name!r} would leave the job folder {job_dir}")
    return path


def dependency_file(folder: Path, name: str) -> Path:
    """``folder/name`` of a dependency's folder, InvalidInputError if it resolves elsewhere
    (a symlink planted there)."""
    path = (folder / name).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise InvalidInputError(f"{folder / name} leads outside the dependency's folder")
    return path


def work_dir(job_dir: Path) -> Path:
    """The job's working folder (not created here)."""
    return job_dir / WORK_FOLDER
