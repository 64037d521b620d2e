"""The runner on a data disk that fails under it: full (ENOSPC), over its quota (EDQUOT),
read-only (EROFS), dying (EIO).

The data folder is a real filesystem of its own, failed for real while a real runner
(``python -m services.runner``, real OpenMM, real NATS) integrates: an ext4 loop mount
(``mdq.testing.disks.SmallDisk``), or for the quota a btrfs subvolume under a qgroup limit
(``QuotaDisk``). The runner stops with the environment's exit code and a log line naming the
failure, the last checkpoint it announced is intact on disk (sha256), nothing half-written is
left that a retry could take for a checkpoint, and once the disk is back a retry resumes from
that checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import openmm
import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.testing.disks import SmallDisk
from services.runner.checkpoints import CheckpointStore, checkpoint_name
from tests.disks import Disk, made_disk, on_ext4
from tests.integration.test_runner import (
    StartRunner,
    make_task,
    md_spec,
    start_runner,
    tap,
)
from tests.tables import named_cases

__all__ = ["start_runner"]  # the fixture, used by name


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    yield from made_disk(request, tmp_path, "disk")


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_half_checkpoints(folder: Path) -> None:
    """Every checkpoint XML in ``folder`` has its sidecar and matches it; no temporaries."""
    assert not list(folder.glob(".tmp-*")), list(folder.glob(".tmp-*"))
    for xml in folder.glob("ckpt-*.xml"):
        sidecar = json.loads(xml.with_suffix(".json").read_text())
        assert sidecar["sha256"] == sha256_of(xml), xml


CASES: list[tuple[str, str, Callable[[Disk], None], Callable[[Disk], None], int, str]] = [
    (
        "disk full",
        "ext4",
        lambda d: d.fill_up(),
        lambda d: d.free(),
        RunnerExit.NO_SPACE,
        "data disk full (ENOSPC)",
    ),
    (
        "quota exceeded",
        "quota",
        lambda d: d.fill_up(),
        lambda d: d.free(),
        RunnerExit.NO_SPACE,
        "data disk quota exceeded (EDQUOT)",
    ),
    (
        "disk read-only",
        "ext4",
        on_ext4(SmallDisk.make_read_only),
        on_ext4(SmallDisk.remount),
        RunnerExit.DISK_FAILED,
        "data disk read-only (EROFS)",
    ),
    (
        "disk dying",
        "ext4",
        on_ext4(SmallDisk.shut_down),
        on_ext4(SmallDisk.remount),
        RunnerExit.DISK_FAILED,
        "data disk I/O error (EIO)",
    ),
]


@named_cases(("disk", "fail", "heal", "code", "logged"), CASES, indirect=["disk"])
async def test_a_runner_whose_disk_fails_stops_keeps_its_checkpoint_and_resumes(
    nc: Client,
    subjects: Subjects,
    disk: Disk,
    start_runner: StartRunner,
    fail: Callable[[Disk], None],
    heal: Callable[[Disk], None],
    code: int,
    logged: str,
) -> None:
    data_dir = disk.mount_point / "data"
    data_dir.mkdir()
    spec = md_spec("md", steps=1_000_000, report_interval_steps=20, checkpoint_interval_steps=100)
    task = make_task(data_dir, "job-disk", spec)
    events = await tap(nc, subjects, task.job_id)
    first = await start_runner(task)
    await events.wait_until(lambda: len(events.checkpoints) >= 2)
    fail(disk)
    assert await first.wait() == code, first.stderr
    assert logged in first.stderr, first.stderr
    assert "Traceback" not in first.stderr, "a failing disk is reported, not a crash"
    _, announced = events.of_attempt(1)
    last = announced[-1]
    heal(disk)

    folder = data_dir / "jobs" / task.job_id / "checkpoints"
    path = folder / checkpoint_name(last.step)
    assert sha256_of(path) == last.sha256, "the last announced checkpoint is intact"
    no_half_checkpoints(folder)
    assert CheckpointStore(directory=folder).steps()[-1] >= last.step

    short = md_spec("md", steps=last.step + 200, report_interval_steps=20)
    retry = await start_runner(make_task(data_dir, task.job_id, short, attempt=2, resume_from=last))
    assert await retry.wait() == RunnerExit.OK, retry.stderr
    assert f"resuming from {path} at step {last.step}" in retry.stderr, retry.stderr
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    resumed, _ = events.of_attempt(2)
    assert resumed[0].step == last.step + 20
    assert resumed[-1].step == last.step + 200


def test_a_checkpoint_that_does_not_fit_leaves_the_earlier_ones_as_they_were(
    disk: SmallDisk,
) -> None:
    """The write of a checkpoint bigger than the room left fails with ENOSPC: it leaves no
    temporary and no file of its step, prunes nothing, and the earlier checkpoints stay."""
    folder = disk.mount_point / "checkpoints"
    store = CheckpointStore(directory=folder)
    for step in (100, 200):
        store.write(state_xml=_state_xml(step, padding=1000), step=step, time_ps=step / 500)
    before = {p.name: sha256_of(p) for p in folder.iterdir()}
    too_big = shutil.disk_usage(folder).free + (1 << 20)
    with pytest.raises(OSError) as raised:
        store.write(state_xml=_state_xml(300, padding=too_big), step=300, time_ps=0.6)
    assert raised.value.errno == errno.ENOSPC
    assert {p.name: sha256_of(p) for p in folder.iterdir()} == before
    assert store.steps() == [100, 200]


def test_a_checkpoint_without_its_sidecar_is_never_taken(tmp_path: Path) -> None:
    """The set of step 300 lost its sidecar (its write stopped before the sidecar, which comes
    last): a resume that looks for a checkpoint in the folder skips it for step 200."""
    store = CheckpointStore(directory=tmp_path / "checkpoints")
    for step in (200, 300):
        store.write(state_xml=_real_state_xml(step), step=step, time_ps=step / 500)
    (tmp_path / "checkpoints" / checkpoint_name(300)).with_suffix(".json").unlink()
    gone = pb.Checkpoint(step=400, path=str(tmp_path / "checkpoints" / checkpoint_name(400)))
    loaded = store.load(gone)
    assert loaded is not None and loaded.file.step == 200


def _state_xml(step: int, *, padding: int) -> str:
    return f"<State stepCount='{step}'>{'0' * padding}</State>"


def _real_state_xml(step: int) -> str:
    """An OpenMM State of one particle at ``step``."""
    system = openmm.System()
    system.addParticle(1.0)
    context = openmm.Context(
        system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference")
    )
    context.setPositions([openmm.Vec3(0, 0, 0)])
    context.setStepCount(step)
    return str(openmm.XmlSerializer.serialize(context.getState(getPositions=True)))
