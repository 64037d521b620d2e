"""Entrypoint: ``python -m services.recovery`` (composition root)."""

from __future__ import annotations

from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.runtime import configure_logging, run_service
from mdq.bus.snapshots import SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.settings import CommonSettings
from services.recovery.app import Recovery
from services.recovery.settings import RecoverySettings


async def main() -> None:
    common, settings = CommonSettings(), RecoverySettings()
    subjects = Subjects(common.namespace)
    nc = await connect(
        common.nats_url,
        name="mdq-recovery",
        subjects=subjects,
        replicas=common.stream_replicas,
        wait=True,
    )
    js = nc.jetstream()
    recovery = Recovery(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=js, subjects=subjects, producer="recovery"),
        policy=settings.policy(),
        snapshots=SnapshotStore(
            js,
            bucket=subjects.recovery_snapshot_bucket,
            stream=subjects.jobs_stream,
            replicas=common.stream_replicas,
        ),
        snapshot_interval_s=settings.snapshot_interval_s,
    )
    try:
        await recovery.run()
    finally:
        await nc.drain()


if __name__ == "__main__":
    configure_logging()
    run_service(main)
