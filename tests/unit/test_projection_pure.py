"""Pure parts of the history tooling: the fast progress JSON equals the protobuf mapping, the
sparkline of ``mdq show``."""

from __future__ import annotations

import math
import random

import pytest
from google.protobuf import json_format

from mdq.cli.sparkline import BLOCKS, sparkline
from mdq.contracts import pb
from mdq.store.projection import progress_json


def mapping(body: pb.Progress) -> str:
    return json_format.MessageToJson(body, preserving_proto_field_name=True, indent=None)


@pytest.mark.parametrize(
    "body",
    [
        pb.Progress(),
        pb.Progress(step=100, target_steps=1000, potential_kj_mol=-41_000.25),
        pb.Progress(step=1, time_ps=1e-7, eta_s=3e20, done_reason='steps "reached"\n'),
        pb.Progress(potential_kj_mol=-0.0, kinetic_kj_mol=0.0, ns_per_day=31.5),
        pb.Progress(temperature_k=math.nan, step=5),
        pb.Progress(potential_kj_mol=-math.inf),
        pb.Progress(done_reason="größer"),
    ],
    ids=["empty", "typical", "tiny-huge-escaped", "zeros", "nan", "infinity", "unicode"],
)
def test_progress_json_is_the_protobuf_json_mapping(body: pb.Progress) -> None:
    assert progress_json(body) == mapping(body)


def test_progress_json_matches_on_random_reports() -> None:
    generator = random.Random(7)
    for _ in range(2000):
        body = pb.Progress(
            step=generator.choice([0, generator.randrange(1, 10**12)]),
            target_steps=generator.choice([0, generator.randrange(1, 10**12)]),
            time_ps=generator.uniform(-1e6, 1e6),
            potential_kj_mol=generator.choice([0.0, generator.uniform(-1e7, 1e3)]),
            kinetic_kj_mol=generator.expovariate(1e-4),
            temperature_k=generator.uniform(0, 1000),
            ns_per_day=generator.choice([0.0, generator.lognormvariate(3, 2)]),
            eta_s=generator.choice([0.0, generator.uniform(0, 1e9)]),
            done_reason=generator.choice(["", "converged", "steps_reached"]),
        )
        assert progress_json(body) == mapping(body)


@pytest.mark.parametrize(
    ("values", "width", "expected"),
    [
        ([], 10, ""),
        ([5.0, 5.0, 5.0], 10, BLOCKS[0] * 3),
        ([0.0, 1.0], 10, BLOCKS[0] + BLOCKS[-1]),
        ([-10.0, -5.0, 0.0], 10, BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]),
        ([0.0, 0.0, 1.0, 1.0], 2, BLOCKS[0] + BLOCKS[-1]),  # averaged into two buckets
    ],
    ids=["empty", "flat", "two", "three", "bucketed"],
)
def test_sparkline(values: list[float], width: int, expected: str) -> None:
    assert sparkline(values, width=width) == expected


def test_sparkline_is_never_wider_than_asked() -> None:
    line = sparkline([float(i % 17) for i in range(1000)], width=40)
    assert len(line) == 40 and set(line) <= set(BLOCKS)
