"""The bus adapter: subjects, streams, codecs and publishing on NATS JetStream.

What every service shares: how a service process runs (``runtime``: its connections, parts,
periodic loops, stop and liveness), the subject names of a namespace, the stream definitions,
the protobuf/JSON codec of the edge, publishing with Nats-Msg-Id deduplication, and reading a
stream's history (replay) before following it live.
"""

from mdq.bus import nats_fixes as _nats_fixes  # noqa: F401 (a fix to nats-py, applied on import)
