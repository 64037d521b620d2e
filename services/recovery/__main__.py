"""Entrypoint: ``python -m services.recovery`` (composition root)."""

from __future__ import annotations

from mdq.bus.publisher import EventPublisher
from mdq.bus.runtime import Service, serve
from mdq.bus.snapshots import SnapshotStore
from services.recovery.app import Recovery
from services.recovery.settings import RecoverySettings


async def compose(service: Service) -> None:
    settings, subjects = RecoverySettings(), service.subjects
    js = (await service.connect()).jetstream()
    recovery = Recovery(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=js, subjects=subjects, producer="recovery"),
        policy=settings.policy(),
        snapshots=SnapshotStore(
            js,
            bucket=subjects.recovery_snapshot_bucket,
            stream=subjects.jobs_stream,
            replicas=service.common.stream_replicas,
        ),
        snapshot_interval_s=settings.snapshot_interval_s,
    )
    service.part("recovery", recovery.run)


if __name__ == "__main__":
    serve("recovery", compose)
