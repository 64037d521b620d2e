"""The energy table of a job: ``job_dir/energies.csv``, one row per progress report.

Columns: step, time_ps, potential_kj_mol, kinetic_kj_mol, temperature_k, volume_nm3,
density_g_cm3 (0 for a non-periodic system), total_kj_mol, pressure_bar (empty where the engine
computes no pressure); tables without the later columns still read. The same table for every
engine (docs/engines.md). An attempt that resumes from a checkpoint first drops the rows after
the checkpoint's step (work the failed attempt did that is being redone), so the table describes
one trajectory.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from types import TracebackType
from typing import TextIO

from services.runner.checkpoints import write_atomically
from services.runner.samples import EnergySample

FILE_NAME = "energies.csv"
COLUMNS = (
    "step",
    "time_ps",
    "potential_kj_mol",
    "kinetic_kj_mol",
    "temperature_k",
    "volume_nm3",
    "density_g_cm3",
    "total_kj_mol",
    "pressure_bar",
)


def row_of(sample: EnergySample) -> tuple[object, ...]:
    """The table's row of ``sample`` (in ``COLUMNS`` order)."""
    return (
        sample.step,
        sample.time_ps,
        sample.potential_kj_mol,
        sample.kinetic_kj_mol,
        sample.temperature_k,
        sample.volume_nm3,
        sample.density_g_cm3,
        sample.total_kj_mol,
        "" if sample.pressure_bar is None else sample.pressure_bar,
    )


class EnergyLog:
    """Appends samples to the energy table of one attempt."""

    def __init__(self, *, path: Path, keep_through_step: int | None) -> None:
        """Open the table; keep the rows up to ``keep_through_step`` (None: start empty)."""
        self._path = path
        kept = (
            []
            if keep_through_step is None
            else read_samples(path, through=keep_through_step, skip_malformed=True)
        )
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(COLUMNS)
        writer.writerows(row_of(sample) for sample in kept)
        write_atomically(path, buffer.getvalue().encode())
        self._handle: TextIO = path.open("a", newline="")
        self._writer = csv.writer(self._handle)
        self.rows = len(kept)
        """Rows in the table now."""

    def append(self, sample: EnergySample) -> None:
        self._writer.writerow(row_of(sample))
        self._handle.flush()
        self.rows += 1

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> EnergyLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_samples(
    path: Path, *, through: int | None = None, skip_malformed: bool = False
) -> list[EnergySample]:
    """The rows of an energy table (up to step ``through``); [] if there is no table.

    A malformed row (e.g. the torn last line of a killed attempt) is skipped with
    ``skip_malformed``, else it raises ValueError.
    """
    if not path.is_file():
        return []
    samples: list[EnergySample] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                sample = EnergySample(
                    step=int(row["step"]),
                    time_ps=float(row["time_ps"]),
                    potential_kj_mol=float(row["potential_kj_mol"]),
                    kinetic_kj_mol=float(row["kinetic_kj_mol"]),
                    temperature_k=float(row["temperature_k"]),
                    volume_nm3=float(row.get("volume_nm3") or 0.0),
                    density_g_cm3=float(row.get("density_g_cm3") or 0.0),
                    pressure_bar=float(pressure) if (pressure := row.get("pressure_bar")) else None,
                )
            except (KeyError, TypeError, ValueError) as error:
                if skip_malformed:
                    continue
                raise ValueError(f"{path}: malformed row {row}: {error}") from None
            if through is None or sample.step <= through:
                samples.append(sample)
    return samples
