"""Job control's entrance in placement: request-reply on ``NS.api.control[.<tenant>]``.

Placement's leader answers job-control requests, deciding them in its own loop between passes
with the pure ``mdq.core.control``; this module is the I/O around them: ``ControlDesk`` takes
the requests while this replica leads and answers them, ``ControlRegistry`` makes each
idempotent under its control key.

Who acts and why, the contract and its idempotency: docs/control.md, "Who acts" and "The
contract".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from mdq.bus.codec import encode, to_json
from mdq.bus.storage import DAY_S, StorageSettings
from mdq.bus.streams import open_bucket
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.control import (
    ControlRefused,
    check_names,
    check_request,
    control_id_for_key,
    decode_request,
    fingerprint,
    fitted,
    is_json,
    refusal,
)

log = logging.getLogger("mdq.placement.control")

QUEUE_GROUP = "placement"
CONCURRENCY = 64
"""Requests handled at once by the leader (each waits for its turn in placement's loop)."""
JSON_HEADERS = {"content-type": "application/json"}
PROTOBUF_HEADERS = {"content-type": "application/x-protobuf"}
REPLY_HEADROOM = 4096
"""Bytes of the bus's largest message left for a reply's subject and headers."""

Decide = Callable[[pb.ControlRequest, str, str], Awaitable[pb.ControlReply]]
"""(request, tenant, control id) -> the reply: ``Placement.control``."""
Allowed = Callable[[str], bool]
"""tenant -> whether it may use the high priority class."""


class NotLeader(RuntimeError):
    """This replica no longer leads: the request is left unanswered (the client resends)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What the registry holds for a control id."""

    fingerprint: str
    reply: pb.ControlReply | None
    """The answer given, None while only claimed."""


class ControlRegistry:
    """Control ids -> their request's fingerprint and answer, in the bucket
    ``Subjects.control_bucket`` (age limit: the duplicate window)."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        replicas: int = 1,
        storage: StorageSettings | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._replicas = replicas
        self._storage = storage or StorageSettings()
        self._kv: KeyValue | None = None

    async def bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await open_bucket(
                self._js,
                KeyValueConfig(
                    bucket=self._subjects.control_bucket,
                    history=1,
                    ttl=self._storage.registry_days * DAY_S,
                    max_bytes=int(self._storage.registry_bytes),
                    replicas=self._replicas,
                ),
                storage=self._storage,
            )
        return self._kv

    @staticmethod
    def _key(control_id: str) -> str:
        return f"ctl.{control_id}"

    @staticmethod
    def _encode(mark: str, reply: pb.ControlReply | None) -> bytes:
        record: dict[str, str | None] = {"fingerprint": mark, "reply": None}
        if reply is not None:
            record["reply"] = base64.b64encode(zlib.compress(encode(reply))).decode()
        return json.dumps(record).encode()

    @staticmethod
    def _decode(data: bytes) -> Claim:
        record = json.loads(data)
        reply = None
        if record.get("reply"):
            reply = pb.ControlReply()
            reply.ParseFromString(zlib.decompress(base64.b64decode(record["reply"])))
        return Claim(str(record["fingerprint"]), reply)

    async def claim(self, control_id: str, mark: str) -> Claim | None:
        """Claim ``control_id`` for the request of fingerprint ``mark``; None when it is new
        (claimed now), else what was there."""
        kv = await self.bucket()
        key = self._key(control_id)
        try:
            await kv.create(key, self._encode(mark, None))
            return None
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # aged out between the two: claim again
            return await self.claim(control_id, mark)
        return self._decode(entry.value or b"{}")

    async def record(self, control_id: str, mark: str, reply: pb.ControlReply) -> None:
        """Keep the answer given to ``control_id``."""
        kv = await self.bucket()
        await kv.put(self._key(control_id), self._encode(mark, reply))


class ControlDesk:
    """Answers job-control requests while this placement replica leads."""

    def __init__(
        self,
        *,
        nc: Client,
        subjects: Subjects,
        registry: ControlRegistry,
        decide: Decide,
        allow_high: Allowed,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._registry = registry
        self._decide = decide
        self._allow_high = allow_high
        self._subscriptions: list[Subscription] = []
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self._deciding: dict[str, asyncio.Task[tuple[str, pb.ControlReply]]] = {}
        """control id -> its decision under way here (a resend waits for it)."""
        self.answered = 0
        self.refused = 0

    @property
    def open(self) -> bool:
        return bool(self._subscriptions)

    @property
    def deciding(self) -> int:
        """Decisions under way here (each ends with an answer, or unanswered)."""
        return len(self._deciding)

    async def open_if(self, leading: bool) -> None:
        """Listen while ``leading``, not otherwise."""
        if leading and not self._subscriptions:
            await self._registry.bucket()  # made before the first request, as its owner
            for subject in self._subjects.api_control_subjects:
                self._subscriptions.append(
                    await self._nc.subscribe(subject, queue=QUEUE_GROUP, cb=self._arrived)
                )
            log.info("answering job control on %s", ", ".join(self._subjects.api_control_subjects))
        elif not leading and self._subscriptions:
            await self.close()

    async def close(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        for task in list(self._tasks):
            task.cancel()

    async def _arrived(self, message: Msg) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, message: Msg) -> None:
        async with self._slots:
            try:
                reply = await self.handle(message.data, message.subject)
            except NotLeader:
                return  # unanswered: the client sends it again, to the next leader
            except Exception:
                log.exception("job-control request on %s failed; unanswered", message.subject)
                return
        if not message.reply:
            return
        as_json = is_json(message.data)

        def encoded(reply: pb.ControlReply) -> bytes:
            return to_json(reply).encode() if as_json else encode(reply)

        reply = fitted(reply, lambda r: len(encoded(r)), self._nc.max_payload - REPLY_HEADROOM)
        data = encoded(reply)
        await self._nc.publish(
            message.reply, data, headers=JSON_HEADERS if as_json else PROTOBUF_HEADERS
        )

    async def handle(self, data: bytes, subject: str) -> pb.ControlReply:
        """The answer to one request (refusals included); raises what leaves it unanswered.
        A resend of a request still being decided here (a client that stopped waiting and
        sent it again) waits for that decision and gets its answer."""
        tenant = self._subjects.tenant_of_control(subject)
        control_id = ""
        try:
            request = decode_request(data)
            control_id = control_id_for_key(request.control_key, tenant)
            check_request(request, tenant=tenant, allow_high=self._allow_high(tenant))
            check_names(request, tenant=tenant)
        except ControlRefused as error:
            self.refused += 1
            return refusal(control_id, error)
        mark = fingerprint(request)
        deciding = self._deciding.get(control_id)
        if deciding is None:
            deciding = asyncio.get_running_loop().create_task(
                self._decide_once(request, tenant, control_id, mark)
            )
            self._deciding[control_id] = deciding
            deciding.add_done_callback(lambda task: self._decided(control_id, task))
        decided_mark, reply = await asyncio.shield(deciding)
        if decided_mark != mark:
            self.refused += 1
            return refusal(control_id, _used_for_another(request.control_key))
        return reply

    def _decided(self, control_id: str, task: asyncio.Task[tuple[str, pb.ControlReply]]) -> None:
        """A decision ended: forgotten here, and its error taken (those who waited for it have
        it; when none is left, this replica stopped leading and cancelled them, and the
        request goes unanswered for the client to send again)."""
        self._deciding.pop(control_id, None)
        if not task.cancelled():
            task.exception()

    async def _decide_once(
        self, request: pb.ControlRequest, tenant: str, control_id: str, mark: str
    ) -> tuple[str, pb.ControlReply]:
        """(the fingerprint the answer is for, the answer): the recorded one, or a decision
        made now and recorded."""
        claim = await self._registry.claim(control_id, mark)
        if claim is not None:
            if claim.fingerprint != mark:
                return claim.fingerprint, pb.ControlReply()
            if claim.reply is not None:
                return mark, claim.reply
        reply = await self._decide(request, tenant, control_id)
        await self._registry.record(control_id, mark, reply)
        self.answered += 1
        return mark, reply


def _used_for_another(key: str) -> ControlRefused:
    return ControlRefused("control_key", f"{key!r} was used for another request; use a new key")
