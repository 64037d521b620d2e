"""Where a job's force-field files may come from: OpenMM's own data, or one operator folder.

A force-field XML can hold Python that OpenMM executes (``<Script>``), and OpenMM's
``ForceField`` looks a name up in the current directory before its data folders. So a name
from a job spec is never handed to OpenMM as it is: ``ForceFieldFolders.resolve`` turns it
into the absolute path of a file inside one of the trusted folders (after following symlinks)
or refuses it, and the runner gives OpenMM only that path. The trusted folders are OpenMM's
data folders (those of the ``openmm`` package and of packages that register one, such as
openmmforcefields) and, when the operator sets it, ``MDQ_FORCEFIELD_DIR``. Intake checks the
same way (``exists``), so a job naming a file that is not there is refused at submit, with
the field named, and again by the runner.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

from mdq.errors import InvalidInput

ENV_FORCEFIELD_DIR = "MDQ_FORCEFIELD_DIR"
"""The operator's folder of extra force-field files; empty or unset: none."""


class ForceFieldRefused(InvalidInput):
    """The name is not a force-field file in a trusted folder."""


@cache
def openmm_data_dirs() -> tuple[Path, ...]:
    """OpenMM's force-field folders, as its ``ForceField`` searches them (without the
    current directory)."""
    try:
        from openmm.app import forcefield

        found = getattr(forcefield, "_getDataDirectories", None)
        if callable(found):
            return tuple(Path(str(folder)) for folder in found())
    except ImportError:
        pass
    spec = importlib.util.find_spec("openmm")
    if spec is None or spec.origin is None:
        return ()
    return (Path(spec.origin).parent / "app" / "data",)


def _syntax_problem(name: str) -> str:
    """Why ``name`` cannot be a force-field name at all ("" if it can)."""
    if not name or not name.isprintable():
        return "must be a non-empty printable file name"
    if "\\" in name or name.startswith(("/", "~")) or (len(name) > 1 and name[1] == ":"):
        return f"must be a name relative to OpenMM's force-field folder, got {name!r}"
    parts = PurePosixPath(name).parts
    if ".." in parts or "." in name.split("/"):
        return f"must not contain '..' or '.', got {name!r}"
    if not name.endswith(".xml"):
        return f"must name an .xml force-field file, got {name!r}"
    return ""


@dataclass(frozen=True, slots=True)
class ForceFieldFolders:
    """The folders force-field names are looked up in, in order."""

    openmm: tuple[Path, ...]
    allowed: Path | None = None
    """The operator's folder (``MDQ_FORCEFIELD_DIR``), or None."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ForceFieldFolders:
        """OpenMM's folders and ``MDQ_FORCEFIELD_DIR`` of ``env`` (default: this process)."""
        folder = (os.environ if env is None else env).get(ENV_FORCEFIELD_DIR, "").strip()
        return cls(openmm=openmm_data_dirs(), allowed=Path(folder) if folder else None)

    @property
    def folders(self) -> tuple[Path, ...]:
        return (*self.openmm, *([self.allowed] if self.allowed is not None else []))

    def resolve(self, name: str) -> Path:
        """The absolute path of force field ``name`` inside a trusted folder (symlinks
        followed before the check); ForceFieldRefused otherwise. The working directory is
        never searched."""
        if problem := _syntax_problem(name):
            raise ForceFieldRefused(problem)
        for folder in self.folders:
            base = folder.resolve()
            candidate = (base / name).resolve()
            if not candidate.is_relative_to(base):
                continue  # a symlink out of the folder: not this folder's file
            if candidate.is_file():
                return candidate
        where = "OpenMM's force fields" + (
            f" or {ENV_FORCEFIELD_DIR} ({self.allowed})" if self.allowed else ""
        )
        raise ForceFieldRefused(f"{name!r} is not one of {where}")

    def exists(self, name: str) -> bool:
        """Whether ``resolve(name)`` would succeed."""
        try:
            self.resolve(name)
        except ForceFieldRefused:
            return False
        return True
