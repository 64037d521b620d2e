"""``RecommendationMemo`` (mdq.core.recommend), as tables of named cases: it answers exactly as
``recommend_job`` does for the history it is given, forgets on another history, stays within
its size, and its key covers every field a recommendation reads. Pure."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.recommend import (
    History,
    RecommendationMemo,
    UsageHistory,
    UsageSample,
    fingerprint_of,
    recommend_job,
    recommendation_key,
)
from mdq.core.spec import normalize_job
from tests.tables import named_cases


def job(**fields: object) -> pb.JobSpec:
    return normalize_job(pb.JobSpec(name="w", **fields), "jobs[0]")  # type: ignore[arg-type]


def history_of(spec: pb.JobSpec, peak: float = 2000.0, runs: int = 12) -> UsageHistory:
    """``runs`` measured attempts of ``spec``'s kind of job, peaking at ``peak`` MiB."""
    fingerprint = fingerprint_of(spec)
    return UsageHistory.of(
        [UsageSample(fingerprint, peak, 0.9, 4096, spec.resources.cpu) for _ in range(runs)]
    )


BASE = job(steps=1000, resources=pb.Resources(cpu=2, memory_mb=1024))
AUTO = job(resources=pb.Resources(auto=True))
EMPTY = UsageHistory([])
LEARNED = history_of(BASE)

STATED = BASE.resources
CPU_3 = job(resources=pb.Resources(cpu=3, memory_mb=1024))
BOX_4 = job(system=pb.System(water_box=pb.WaterBox(box_nm=4)))
AUTO_CPU_4 = job(resources=pb.Resources(auto=True, cpu=4))
VERLET = job(steps=1000, resources=STATED, integrator=pb.INTEGRATOR_VERLET)
NPT = job(steps=1000, resources=STATED, barostat=pb.Barostat(pressure_bar=1))
INPUT = pb.InputFile(name="a.dat", sha256="0" * 64)
WITH_INPUT = job(steps=1000, resources=STATED, inputs=[INPUT])
WARMER = job(steps=1000, temperature_k=350, resources=STATED)

SEQUENCE_CASES: list[tuple[str, list[tuple[pb.JobSpec, History]]]] = [
    ("the same spec again", [(BASE, EMPTY), (BASE, EMPTY)]),
    ("another cpu", [(BASE, EMPTY), (CPU_3, EMPTY)]),
    ("another box", [(job(), EMPTY), (BOX_4, EMPTY)]),
    ("an auto job, then a stated one", [(AUTO, EMPTY), (job(), EMPTY)]),
    ("auto with its cpu stated", [(AUTO, EMPTY), (AUTO_CPU_4, EMPTY)]),
    ("another integrator", [(BASE, LEARNED), (VERLET, LEARNED)]),
    ("a barostat", [(BASE, LEARNED), (NPT, LEARNED)]),
    ("an input file", [(BASE, LEARNED), (WITH_INPUT, LEARNED)]),
    ("history learned since", [(BASE, EMPTY), (BASE, LEARNED), (BASE, history_of(BASE, 3000))]),
    ("back to an empty history", [(BASE, LEARNED), (BASE, EMPTY)]),
    ("plain samples for a history", [(BASE, LEARNED.samples()), (BASE, [])]),
]


@named_cases(("calls",), SEQUENCE_CASES)
def test_the_memo_answers_as_recommend_job_does(calls: list[tuple[pb.JobSpec, History]]) -> None:
    memo = RecommendationMemo()
    for _ in range(2):  # the second time round from what it remembered
        for spec, history in calls:
            assert memo.recommend_job(spec, history=history) == recommend_job(spec, history=history)


def test_a_history_that_learned_moves_the_recommendation() -> None:
    memo = RecommendationMemo()
    before = memo.recommend_job(BASE, history=EMPTY)[1]
    after = memo.recommend_job(BASE, history=LEARNED)[1]
    assert before.samples == 0
    assert after.samples == 12
    assert after.memory_mb != before.memory_mb


REMEMBER_CASES = [
    ("one spec twice: one entry", [(BASE, EMPTY), (BASE, EMPTY)], 1),
    ("another temperature, same kind of job: one entry", [(BASE, EMPTY), (WARMER, EMPTY)], 1),
    ("two kinds of job: two entries", [(BASE, EMPTY), (AUTO, EMPTY)], 2),
    ("another history forgets the old one's", [(BASE, EMPTY), (AUTO, EMPTY), (BASE, LEARNED)], 1),
]


@named_cases(("calls", "entries"), REMEMBER_CASES)
def test_what_the_memo_remembers(calls: list[tuple[pb.JobSpec, History]], entries: int) -> None:
    memo = RecommendationMemo()
    for spec, history in calls:
        memo.recommend_job(spec, history=history)
    assert len(memo) == entries


def test_the_memo_keeps_the_most_recently_used_within_its_size() -> None:
    memo = RecommendationMemo(size=2)
    first, second, third = (job(resources=pb.Resources(cpu=cpu)) for cpu in (1, 2, 3))
    for spec in (first, second, first, third):
        memo.recommend_job(spec, history=EMPTY)
    assert len(memo) == 2
    known = memo.recommendation(first, EMPTY)
    assert memo.recommendation(first, EMPTY) is known  # still remembered
    memo.recommendation(second, EMPTY)  # forgotten: made again, and the third goes
    assert memo.recommendation(first, EMPTY) is known
    assert len(memo) == 2


def test_a_spec_that_is_not_auto_comes_back_as_itself() -> None:
    spec, _ = RecommendationMemo().recommend_job(BASE, history=EMPTY)
    assert spec is BASE
    filled, _ = RecommendationMemo().recommend_job(AUTO, history=EMPTY)
    assert filled is not AUTO
    assert filled.resources.memory_mb > 0


KEYED = {
    "task",
    "system",
    "resources",
    "nonbonded_method",
    "cutoff_nm",
    "integrator",
    "platform",
    "trajectory_interval_steps",
    "checkpoint_interval_steps",
    "inputs",
}
"""The JobSpec fields ``recommendation_key`` holds whole (of ``barostat``, its pressure)."""


def _changed(spec: pb.JobSpec, field: FieldDescriptor) -> pb.JobSpec:
    """``spec`` with ``field`` set to a value other than its own."""
    changed = pb.JobSpec()
    changed.CopyFrom(spec)
    _change(changed, field)
    assert changed != spec, field.name
    return changed


def _change(message: Message, field: FieldDescriptor) -> None:
    """Change ``field`` of ``message`` in place (a message field: its first field that can be
    changed; of ``barostat``, not its pressure, which the key holds)."""
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        getattr(message, name)["changed"] = "changed"
    elif field.is_repeated and field.type == FieldDescriptor.TYPE_STRING:
        getattr(message, name).append("changed")
    elif field.is_repeated:
        getattr(message, name).add()
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        inner = getattr(message, name)
        sub = next(f for f in inner.DESCRIPTOR.fields if f.name != "pressure_bar")
        _change(inner, sub)
    else:
        setattr(message, name, _scalar(field, getattr(message, name)))


def _scalar(field: FieldDescriptor, value: object) -> object:
    if field.type == FieldDescriptor.TYPE_STRING:
        return f"{value}x"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return not value
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values]
        return next(number for number in numbers if number != value)
    assert isinstance(value, int | float)
    return value + 7


OTHER_FIELDS = [f for f in pb.JobSpec.DESCRIPTOR.fields if f.name not in KEYED]


@pytest.mark.parametrize("field", OTHER_FIELDS, ids=[f.name for f in OTHER_FIELDS])
@pytest.mark.parametrize(
    ("spec", "history"),
    [(BASE, LEARNED), (BASE, EMPTY), (AUTO, EMPTY)],
    ids=["from history", "physical estimate", "auto"],
)
def test_a_field_outside_the_key_does_not_move_the_recommendation(
    field: FieldDescriptor, spec: pb.JobSpec, history: History
) -> None:
    """If this fails, ``recommend_job`` reads ``field``: add it to ``recommendation_key``."""
    changed = _changed(spec, field)
    assert recommendation_key(changed) == recommendation_key(spec) or field.name == "barostat"
    assert recommend_job(changed, history=history)[1] == recommend_job(spec, history=history)[1]


KEY_FIELDS = [f for f in pb.JobSpec.DESCRIPTOR.fields if f.name in KEYED]


@pytest.mark.parametrize("field", KEY_FIELDS, ids=[f.name for f in KEY_FIELDS])
def test_a_field_in_the_key_changes_the_key(field: FieldDescriptor) -> None:
    changed = _changed(BASE, field)
    assert recommendation_key(changed) != recommendation_key(BASE)
