"""Placement's state saved to and restored from its snapshot bucket, so a start folds only the
log after it (docs/placement.md, "Restarting from a snapshot")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from nats.js import JetStreamContext

from mdq.bus.snapshots import SnapshotKeeper, SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.core.node_health import NodeHealthPolicy
from mdq.core.placement import PlacementConfig
from mdq.core.placement_state import PlacementState
from services.placement.settings import PlacementSettings

log = logging.getLogger("mdq.placement")


class StateSnapshots:
    """Restores placement's state on start; writes it after passes, now and then."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        replicas: int,
        settings: PlacementSettings,
        config: PlacementConfig,
        health_policy: NodeHealthPolicy,
        clock: Callable[[], datetime],
    ) -> None:
        self._keeper = SnapshotKeeper(
            SnapshotStore(
                js,
                bucket=subjects.placement_snapshot_bucket,
                stream=subjects.jobs_stream,
                replicas=replicas,
            ),
            logger=log,
        )
        self._settings = settings
        self._config = config
        self._health_policy = health_policy
        self._clock = clock
        self._written_at: float | None = None
        """The event loop's time of the last interval that passed."""
        self.snapshots_written = 0
        self.snapshot_decisions = 0
        """How many times an interval passed and the snapshot was written or found unchanged."""

    async def restore(self) -> tuple[PlacementState, int] | None:
        """The state of the snapshot if it may be used (``mdq.core.snapshot.resume``), with
        the jobs-stream sequence it reflects; None when the whole log is to be replayed. Logs
        one line either way."""
        return await self._keeper.restore(
            lambda data: PlacementState.from_snapshot(
                data,
                self._config,
                load_settle_s=self._settings.load_settle_s,
                health_policy=self._health_policy,
                fail_on_dependency_failure=self._settings.fail_on_dependency_failure,
                ended_memory=self._settings.ended_memory,
            )
        )

    async def write(self, state: PlacementState) -> None:
        """Write the snapshot, at most every ``snapshot_interval_s`` and only when the state
        changed since it was last written (or restored). Best effort: a snapshot that cannot
        be written only makes the next restart replay more of the log."""
        interval = self._settings.snapshot_interval_s
        now = asyncio.get_running_loop().time()
        if interval <= 0 or (self._written_at is not None and now - self._written_at < interval):
            return
        self._written_at = now
        if not state.book.last_sequence:
            return
        written = await self._keeper.write(state.snapshot(), now=self._clock())
        self.snapshot_decisions += 1
        if written:
            self.snapshots_written += 1
