"""The analyze task: statistics of the dependencies' energy tables, into ``analysis.json``.

For every input folder (a dependency's job folder, in depends_on order) it reads
``energies.csv`` and records the number of samples, mean and standard deviation of the
potential energy and the temperature, and the final step. A missing or empty table is the
job's input being unusable: InvalidInputError, named by its path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.runner.checkpoints import write_atomically
from services.runner.energies import FILE_NAME as ENERGIES_FILE
from services.runner.energies import read_samples
from services.runner.errors import InvalidInputError
from services.runner.paths import dependency_file
from services.runner.samples import EnergySample

FILE_NAME = "analysis.json"


def mean_and_std(values: Sequence[float]) -> dict[str, float]:
    """Mean and population standard deviation (0 for a single value)."""
    mean = math.fsum(values) / len(values)
    variance = math.fsum((value - mean) ** 2 for value in values) / len(values)
    return {"mean": mean, "std": math.sqrt(variance)}


def summarize(samples: Sequence[EnergySample]) -> dict[str, Any]:
    """The statistics of one energy table (at least one sample)."""
    return {
        "samples": len(samples),
        "potential_kj_mol": mean_and_std([sample.potential_kj_mol for sample in samples]),
        "temperature_k": mean_and_std([sample.temperature_k for sample in samples]),
        "final_step": max(sample.step for sample in samples),
    }


def analyze(input_dirs: Sequence[Path], *, output: Path) -> dict[str, Any]:
    """Summarise every input's energy table into ``output`` (written atomically)."""
    if not input_dirs:
        raise InvalidInputError("an analyze job needs the output folders of its dependencies")
    inputs: list[dict[str, Any]] = []
    for folder in input_dirs:
        table = dependency_file(folder, ENERGIES_FILE)
        if not table.is_file():
            raise InvalidInputError(f"missing input: {table} does not exist")
        try:
            samples = read_samples(table)
        except (OSError, ValueError) as error:
            raise InvalidInputError(f"unreadable input {table}: {error}") from None
        if not samples:
            raise InvalidInputError(f"empty input: {table} has no samples")
        inputs.append({"job_id": folder.name, "job_dir": str(folder), **summarize(samples)})
    document = {"inputs": inputs}
    write_atomically(output, (json.dumps(document, indent=2) + "\n").encode())
    return document
