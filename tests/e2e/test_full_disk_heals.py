"""End to end: `mdq up` rides out a full disk under its own files.

The NATS store and the stack's logs each sit on a small ext4 disk of their own, and both are
filled while the stack runs. nats-server 2.15 keeps the error of a stream write that found the disk
full and refuses every later write to that stream with it, however much room comes back, until
it restarts: the stack must restart it once the disk has room again. Meanwhile a service dies,
and the supervisor, which can write neither its log nor its status file, must still start it
again. Then JetStream must take writes again, without anyone touching the stack. And a
supervision step that fails for a reason nobody foresaw must not end the supervision.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import pytest

from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.stack import NATS_SERVER, Stack
from mdq.testing.disks import SmallDisk, fill_file
from tests.helpers import stack_part, wait_for
from tests.stack_health import fail_unless_healthy

pytestmark = pytest.mark.e2e

SERVICE = "console"
"""The service killed while the disk is full (any would do; this one starts quickly)."""


@pytest.fixture
def disks() -> Iterator[dict[str, SmallDisk]]:
    """A state folder whose NATS store and logs are each a small ext4 disk of their own (the
    disks by name; their folder is ``state_dir``)."""
    folder = Path(tempfile.mkdtemp(prefix="mdq-full-"))
    images = Path(tempfile.mkdtemp(prefix="mdq-full-images-"))
    made = {
        name: SmallDisk(mount_point=folder / name, image=images / f"{name}.img", size_mb=size)
        for name, size in (("nats", 64), ("logs", 16))
    }
    try:
        for disk in made.values():
            disk.create()
        yield made
    finally:
        for disk in made.values():
            disk.destroy()
        shutil.rmtree(images, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def state_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The stack's state folder: the disks' when the test asks for ``disks``, else a new one;
    checked for crashes (while the disks are still mounted) before it is removed."""
    if "disks" in request.fixturenames:
        made: dict[str, SmallDisk] = request.getfixturevalue("disks")
        folder, owned = made["nats"].mount_point.parent, False
    else:
        folder, owned = Path(tempfile.mkdtemp(prefix="mdq-stack-")), True
    try:
        yield folder
        fail_unless_healthy(request.node, [folder])
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)


def fill(disk: SmallDisk) -> None:
    """Fill ``disk``, then grow every log on it until it refuses a byte too (a file's last
    block keeps room of its own), so that no write there fits."""
    disk.fill()
    for log in sorted(disk.mount_point.glob("*.log")):
        fill_file(log)


# the stack's kill -9 of NATS, noted in stack.log once there is room; the test's kill -9 of
# the service is noted on the stack's stderr, stack.log being full then (checked below)
@pytest.mark.expected_crashes({NATS_SERVER: 1})
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts small ext4 disks: needs root")
async def test_a_full_disk_under_the_nats_store_and_the_logs_is_ridden_out(
    state_dir: Path,
    disks: dict[str, SmallDisk],
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("NATS_URL", raising=False)  # this stack embeds both servers
    monkeypatch.delenv("DATABASE_URL", raising=False)
    stack = Stack(
        state_dir=state_dir,
        namespace=namespace,
        services=(SERVICE,),
        backend="kubernetes",  # no node agent: nothing here runs a job
        metrics_port=0,
        grace_s=15.0,
    )
    await stack.start()
    try:
        nc = await connect(
            stack.info.nats_url, name="full-disk-test", creds=stack.info.nats_admin_creds
        )
        js = nc.jetstream()
        subject = Subjects(namespace).job("full-disk-probe", "note")  # the jobs stream
        await js.publish(subject, b"before", timeout=5)
        for disk in disks.values():
            fill(disk)
        status_in_the_way = state_dir / "status.json.tmp"
        status_in_the_way.mkdir()  # and status.json cannot be written either

        with pytest.raises((TimeoutError, nats.errors.Error)):
            # larger than the room a page of the stream's last block may still have
            await js.publish(subject, b"x" * 200_000, timeout=2)
        _, restarts, pid = stack_part(stack, SERVICE)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        async def service_back() -> bool:
            running, now_restarts, now_pid = stack_part(stack, SERVICE)
            return running and now_restarts == restarts + 1 and now_pid != pid

        await wait_for(service_back, timeout=30, what=f"{SERVICE} restarted on a full disk")
        said = capfd.readouterr().err
        assert f"{SERVICE}: exited with -9" in said and "(stack.log: [Errno 28]" in said, said
        _, nats_restarts, _ = stack_part(stack, NATS_SERVER)
        assert nats_restarts == 0, "the disk is still full: nothing to heal yet"

        for disk in disks.values():
            disk.free()
        status_in_the_way.rmdir()

        async def writes() -> bool:
            try:
                await js.publish(subject, b"after", timeout=1)
            except (TimeoutError, nats.errors.Error):
                return False
            return True

        await wait_for(writes, timeout=60, interval=0.5, what="the jobs stream to take writes")
        await asyncio.sleep(1.0)  # four supervision steps: healed once, not again and again
        await js.publish(subject, b"still", timeout=5)
        running, nats_restarts, _ = stack_part(stack, NATS_SERVER)
        assert running and nats_restarts == 1
        log = (state_dir / "logs" / "stack.log").read_text()
        assert "has room again; restarting it" in log
        await nc.close()
    finally:
        await asyncio.shield(stack.stop())


class StackWithAFailingStep(Stack):
    """A stack whose status file write fails once, with an error nobody foresaw, when armed:
    a bug in one supervision step."""

    armed = False

    def _write_status(self) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("a bug in a supervision step")
        super()._write_status()


@pytest.mark.expected_crashes({SERVICE: 1})  # the test's kill -9
async def test_a_failing_supervision_step_does_not_end_the_supervision(
    state_dir: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step that finds a service gone fails; the next one restarts it all the same, and the
    failure is said in stack.log."""
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    stack = StackWithAFailingStep(
        state_dir=state_dir,
        namespace=namespace,
        services=(SERVICE,),
        backend="kubernetes",
        metrics_port=0,
        grace_s=15.0,
    )
    await stack.start()
    try:
        _, restarts, pid = stack_part(stack, SERVICE)
        assert pid is not None
        stack.armed = True
        os.kill(pid, signal.SIGKILL)

        async def service_back() -> bool:
            running, now_restarts, now_pid = stack_part(stack, SERVICE)
            return running and now_restarts == restarts + 1 and now_pid != pid

        await wait_for(service_back, timeout=30, what=f"{SERVICE} restarted after a failed step")
        assert not stack.armed, "the failing step ran"
        log = (state_dir / "logs" / "stack.log").read_text()
        assert "a supervision step failed: RuntimeError('a bug in a supervision step')" in log
    finally:
        await asyncio.shield(stack.stop())
