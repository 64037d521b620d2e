"""``SpecMemo`` (mdq.core.spec), as tables of named cases: it answers exactly as
``normalize_job`` does, remembers only what it accepted, and stays within its size. Pure."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from mdq.core.spec import (
    SPEC_MEMO_MAX_BYTES,
    SpecError,
    SpecMemo,
    normalize_job,
)
from tests.tables import named_cases


def spec(name: str = "a", **fields: object) -> pb.JobSpec:
    return pb.JobSpec(name=name, **fields)  # type: ignore[arg-type]


def outcome(normalize: object, job: pb.JobSpec) -> pb.JobSpec | tuple[str, str]:
    """What normalizing ``job`` gives: the spec, or the refusal's field and message."""
    assert callable(normalize)
    try:
        result = normalize(job, "jobs[0]")
    except SpecError as error:
        return (error.field, error.message)
    assert isinstance(result, pb.JobSpec)
    return result


BASE = spec(steps=1000, resources=pb.Resources(cpu=2, memory_mb=1024))
WATER_3 = spec(system=pb.System(water_box=pb.WaterBox(box_nm=3.0)))
STATED = BASE.resources
NO_SCRIPT = spec(system=pb.System(lammps=pb.LammpsInput(script="in.lj")))
ATOM = "ATOM      1  O   HOH A   1       0.000   0.000   0.000  1.00  0.00           O\n"
LONG = spec(system=pb.System(structure=pb.Structure(pdb_content=ATOM * 80)))
"""An inline structure longer than ``SPEC_MEMO_MAX_BYTES``."""
# Each spec after the first differs from one before it in one field: a memo that answered from
# a stale entry would give the earlier spec's defaults (or accept what it should refuse).
SEQUENCE_CASES = [
    ("the same spec again", [BASE, BASE]),
    ("another name: its own name", [BASE, spec("b", steps=1000, resources=BASE.resources)]),
    ("another step count", [BASE, spec(steps=2000, resources=BASE.resources)]),
    ("another cpu", [BASE, spec(steps=1000, resources=pb.Resources(cpu=3, memory_mb=1024))]),
    ("another box: another default cutoff", [spec(), WATER_3]),
    ("a label", [BASE, spec(steps=1000, resources=BASE.resources, labels={"k": "v"})]),
    ("max_retries 0 is not unset", [spec(), spec(max_retries=0)]),
    ("an invalid value after a valid one", [BASE, spec(steps=1000, temperature_k=-5.0)]),
    ("the valid one after an invalid one", [spec(temperature_k=-5.0), spec(temperature_k=310.0)]),
    ("a bad name for a remembered spec", [BASE, spec("Bad Name", steps=1000, resources=STATED)]),
    ("no name for a remembered spec", [BASE, spec("", steps=1000, resources=STATED)]),
    ("a LAMMPS job without its script input", [NO_SCRIPT]),
    ("a long spec, twice", [LONG, LONG]),
]


@named_cases(("specs",), SEQUENCE_CASES)
def test_the_memo_answers_as_normalize_job_does(specs: list[pb.JobSpec]) -> None:
    memo = SpecMemo()
    for _ in range(2):  # the second time round from what it remembered
        for job in specs:
            assert outcome(memo.normalize, job) == outcome(normalize_job, job)
            expected = outcome(normalize_job, job)
            if isinstance(expected, tuple):
                with pytest.raises(SpecError) as refused:
                    memo.check(job, "jobs[0]")
                assert (refused.value.field, refused.value.message) == expected
            else:
                memo.check(job, "jobs[0]")


REMEMBER_CASES = [
    ("one spec twice: one entry", [BASE, BASE], 1),
    ("names apart only: one entry", [BASE, spec("b", steps=1000, resources=BASE.resources)], 1),
    ("two kinds of job: two entries", [BASE, WATER_3], 2),
    ("a refused spec is not remembered", [spec(temperature_k=-5.0)], 0),
    ("a long spec is not remembered", [LONG, LONG], 0),
]


@named_cases(("specs", "entries"), REMEMBER_CASES)
def test_what_the_memo_remembers(specs: list[pb.JobSpec], entries: int) -> None:
    memo = SpecMemo()
    for job in specs:
        outcome(memo.normalize, job)
    assert len(memo) == entries


def test_a_long_spec_is_longer_than_the_limit() -> None:
    assert len(LONG.SerializeToString()) > SPEC_MEMO_MAX_BYTES
    assert normalize_job(LONG, "jobs[0]") == SpecMemo().normalize(LONG, "jobs[0]")


def test_the_memo_keeps_the_most_recently_used_within_its_size() -> None:
    memo = SpecMemo(size=2)
    first, second, third = spec(steps=100), spec(steps=200), spec(steps=300)
    memo.normalize(first, "jobs[0]")
    memo.normalize(second, "jobs[0]")
    memo.normalize(first, "jobs[0]")  # used last: kept, the second goes
    memo.normalize(third, "jobs[0]")
    assert len(memo) == 2
    calls: list[str] = []

    def counting(name: str) -> bool:
        calls.append(name)
        return True

    # which entries are left shows in what is normalized again: a memo that checks force
    # fields calls the check only for a spec it does not remember
    checked = SpecMemo(force_field_exists=counting, size=2)
    structure = pb.System(structure=pb.Structure(pdb_path="a.pdb", force_fields=["x.xml"]))
    jobs = [spec(steps=steps, system=structure) for steps in (100, 200, 300)]
    for job in (jobs[0], jobs[1], jobs[0], jobs[2]):
        checked.normalize(job, "jobs[0]")
    assert calls == ["x.xml"] * 3
    checked.normalize(jobs[0], "jobs[0]")  # remembered
    assert calls == ["x.xml"] * 3
    checked.normalize(jobs[1], "jobs[0]")  # forgotten: normalized again
    assert calls == ["x.xml"] * 4


def test_the_memo_checks_force_fields_as_told() -> None:
    memo = SpecMemo(force_field_exists=lambda name: name == "ok.xml")
    structure = pb.Structure(pdb_path="a.pdb", force_fields=["missing.xml"])
    with pytest.raises(SpecError, match=r"missing\.xml"):
        memo.normalize(spec(system=pb.System(structure=structure)), "jobs[0]")
    assert len(memo) == 0


def test_what_the_memo_returns_is_the_callers_own() -> None:
    memo = SpecMemo()
    first = memo.normalize(BASE, "jobs[0]")
    first.steps = 5
    first.resources.cpu = 9
    again = memo.normalize(BASE, "jobs[0]")
    assert again == normalize_job(BASE, "jobs[0]")
    assert again is not first
