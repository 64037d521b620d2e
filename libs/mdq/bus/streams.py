"""The JetStream streams (and KV buckets) of a namespace, created or updated idempotently."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from mdq.bus.subjects import Subjects

MAX_SUBMIT_BYTES = 1024 * 1024
DAY = 24 * 3600.0


def stream_configs(subjects: Subjects) -> list[StreamConfig]:
    """Definitions of every stream: history is kept (limits retention) so replay works."""
    return [
        StreamConfig(
            name=subjects.submit_stream,
            subjects=[subjects.submit],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=30 * DAY,
            max_msg_size=MAX_SUBMIT_BYTES,
            duplicate_window=3600.0,
            discard=DiscardPolicy.OLD,
        ),
        StreamConfig(
            name=subjects.jobs_stream,
            subjects=[subjects.job_all("*"), subjects.rejected("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=365 * DAY,
            duplicate_window=3600.0,
        ),
        StreamConfig(
            name=subjects.progress_stream,
            subjects=[subjects.progress("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=90 * DAY,
            duplicate_window=600.0,
        ),
        StreamConfig(
            name=subjects.nodes_stream,
            subjects=[subjects.node_load("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            max_age=DAY,
            duplicate_window=60.0,
        ),
    ]


async def ensure_streams(js: JetStreamContext, subjects: Subjects) -> None:
    """Create the namespace's streams, or bring existing ones up to date."""
    for config in stream_configs(subjects):
        try:
            await js.add_stream(config=config)
        except BadRequestError:
            await js.update_stream(config=config)
