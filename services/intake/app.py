"""Composition root of intake: settings, its two connections, and the entrances.

``subjects.submit`` through the submit stream (a durable push consumer, deliver group shared by
replicas), each tenant's ``subjects.submit_for(tenant)`` through the tenant's own submit stream
(a durable pull consumer each, shared by replicas, read at the tenant's rate:
``services.intake.paced``), ``subjects.api_submit`` by request-reply (a queue subscription,
batches of requests that arrive together), and the runners' input files
(``subjects.api_inputs``): how each is served and why, docs/intake.md ("The service and its
entrances").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.kv import KeyValue
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.bus.connect import connect
from mdq.bus.inputs import InputDesk
from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.storage import StorageSettings
from mdq.bus.streams import INTAKE_CONSUMER
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory
from mdq.core.fair_queue import FairQueue
from mdq.core.spec import SpecError
from mdq.core.tenants import RunawayLimits, TenantUsage, usage_key
from mdq.settings import CommonSettings, LimitSettings
from services.intake.handlers import (
    JSON_CONTENT_TYPE,
    PROTOBUF_CONTENT_TYPE,
    Arrival,
    Outcome,
    SubmitHandler,
    is_json,
    refusal,
    serialize_reply,
)
from services.intake.held import HeldAnswers
from services.intake.history import HistoryReader
from services.intake.inputs import InputsCheck
from services.intake.paced import TenantSubmits
from services.intake.registry import SubmitRegistry
from services.intake.room import JobsLogRoom, LogSize
from services.intake.tenants import TenantGate, UsageReader

log = logging.getLogger(__name__)

TENANT_POLICIES_WAIT_S = 5.0
"""How long intake waits at start for the tenants' policies (then starts with the defaults)."""
JSON_REPLY_HEADERS = {"content-type": JSON_CONTENT_TYPE}
PROTOBUF_REPLY_HEADERS = {"content-type": PROTOBUF_CONTENT_TYPE}


# Errors that say NATS is (briefly) unreachable or overloaded: the submit is tried again later.
# Anything else is a bug or a permanent problem, and the submit is refused instead.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    TimeoutError,  # includes nats.errors.TimeoutError and FlushTimeoutError
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
)


class IntakeSettings(BaseSettings):
    """Settings of intake (environment variables ``MDQ_INTAKE_*``)."""

    model_config = SettingsConfigDict(env_prefix="MDQ_INTAKE_", extra="ignore")

    durable: str = Field(
        default=INTAKE_CONSUMER,
        description="Name (and deliver group) of the durable consumer of the submit stream, "
        "and name of intake's consumer of each tenant's submit stream.",
    )
    tenant_scan_s: float = Field(
        default=2.0,
        gt=0,
        description="How often intake looks for tenants' submit streams made or removed (at "
        "once, too, when the tenants' policies change).",
    )
    queue_group: str = Field(
        default="intake",
        description="Queue group of the request-reply subscription; replicas share the load.",
    )
    rate_hold_s: float = Field(
        default=1.0,
        ge=0,
        le=5.0,
        description=(
            "A request-reply submit past its tenant's rate is answered when the tenant may "
            "submit again, at most this many seconds later (0: at once); a client that waits "
            "for its answers is paced to its rate (docs/security.md, Limits)."
        ),
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        description="Stream submits delivered to intake and not yet acked, at most (per "
        "consumer: the submit stream's, each tenant's).",
    )
    concurrency: int = Field(
        default=128,
        ge=1,
        le=10_000,
        description=(
            "Request-reply submits handled at once by one replica. Each waits on NATS round "
            "trips (registry claim, publish), so handling them side by side, in batches of "
            "those that arrived together, is what keeps a replica busy; submits with the same "
            "key still go one at a time."
        ),
    )
    ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="A delivered stream submit not acked within this time is delivered again.",
    )
    retry_delay_s: float = Field(
        default=1.0,
        ge=0,
        description="Delay before a submit that failed on a NATS error is delivered again.",
    )
    log_room_refresh_s: float = Field(
        default=1.0,
        ge=0,
        description="How often intake reads the jobs stream's size to check it against "
        "MDQ_STORAGE_JOBS_HIGH_WATER (0: before every batch of submits).",
    )
    recommend_resources: bool = Field(
        default=True,
        description="Recommend each job's resources from measured history (docs/requests.md): "
        "fill in a job's resources.auto, record what history would have chosen for the others. "
        "False: record nothing and refuse resources.auto.",
    )
    auto_resources: bool = Field(
        default=False,
        description="Treat a job that states neither resources.cpu nor resources.memory_mb as "
        "resources.auto (else it gets the defaults, 1 core and 1024 MiB).",
    )
    history_database_url: str = Field(
        default="",
        description="PostgreSQL URL (a read-only role) to read the measured usage from; empty: "
        "recommend from the physical estimate alone.",
    )
    history_refresh_s: float = Field(
        default=300.0, gt=0, description="How often the usage history is read again."
    )
    history_days: int = Field(
        default=90, ge=1, description="How far back the usage history reaches, in days."
    )
    log_level: str = Field(default="INFO", description="Level of intake's own log.")


class RefusalReplies:
    """Serialized "rate limit" replies, made once per message and encoding: a flood's
    refusals within a tenth of a second say the same, and JSON costs more than the rest of
    answering one."""

    def __init__(self, *, most: int = 1024) -> None:
        self._made: dict[tuple[str, bool], bytes] = {}
        self._most = most

    def reply(self, error: SpecError, *, as_json: bool) -> bytes:
        key = (error.message, as_json)
        made = self._made.get(key)
        if made is None:
            if len(self._made) >= self._most:
                self._made.clear()
            made = self._made[key] = serialize_reply(refusal("", error), as_json=as_json)
        return made


class Intake:
    """The intake service: its entrances' subscriptions and the handler they call."""

    def __init__(self, *, common: CommonSettings, settings: IntakeSettings) -> None:
        self.common = common
        self.settings = settings
        self.subjects = Subjects(common.namespace)
        self._entrances: Client | None = None
        """The connection the entrances are served on (``prepare``)."""
        self._stream_subscription: JetStreamContext.PushSubscription | None = None
        self._handler: SubmitHandler | None = None
        self._history: HistoryReader | None = None
        self._arrived: FairQueue[Msg] = FairQueue()
        """Request-reply submits waiting for room, taking turns between tenants: one
        tenant's flood of them delays another's by a turn (``mdq.core.fair_queue``)."""
        self._batch_scheduled = False
        self.ignored_without_reply = 0
        """Messages on a request-reply entrance that named no reply subject, dropped unread."""
        self.refused_unread = 0
        """Request-reply submits answered "rate limit" before they were read (their tenant
        had no token left when they arrived)."""
        self._gate: TenantGate | None = None
        self._writes: Client | None = None
        """The connection intake writes over (``prepare``)."""
        self._rate_refusals = RefusalReplies()
        self._held = HeldAnswers(self._send_answer, hold_s=settings.rate_hold_s)
        """Answers to requests past their tenant's rate, sent when it may submit again."""
        self._in_flight = 0
        """Request-reply submits in batches being handled (at most ``concurrency``)."""
        self._requests: set[asyncio.Task[None]] = set()
        self._request_subscriptions: list[Subscription] = []
        self._tenants: TenantDirectory | None = None
        self._desk: InputDesk | None = None
        """Answers runners asking for their input files (``mdq.bus.inputs``)."""
        self._tenant_submits: TenantSubmits | None = None
        """Readers of each tenant's submit stream, at the tenant's rate (``serve_tenants``)."""
        self._tenant_task: asyncio.Task[None] | None = None

    @property
    def handler(self) -> SubmitHandler:
        if self._handler is None:
            raise RuntimeError("intake is not prepared: call start() or run()")
        return self._handler

    async def serve_stream(self) -> None:
        """Subscribe to the submit stream through intake's durable consumer: the operator's
        submits, delivered to the consumer's deliver group (replicas share it), one at a time
        per replica, acked by the handler."""
        js = self._connection().jetstream()
        self._stream_subscription = await js.subscribe(
            self.subjects.submit,
            queue=self.settings.durable,  # the consumer's deliver group
            durable=self.settings.durable,
            stream=self.subjects.submit_stream,
            config=self._consumer_config(),
            cb=self.consume,
            manual_ack=True,
        )

    def _answer(self, data: bytes, outcome: Outcome) -> tuple[bytes, dict[str, str]] | None:
        """The reply (payload, headers) to one request-reply submit, in the encoding of the
        request; None after a NATS error (the client times out and retries with its key)."""
        if isinstance(outcome, TRANSIENT_ERRORS):
            log.warning("a request-reply submit met a NATS error; not answering: %r", outcome)
            return None
        if isinstance(outcome, Exception):
            log.error("a request-reply submit could not be handled", exc_info=outcome)
            outcome = self.handler.internal_error(outcome)
        as_json = is_json(data)
        headers = JSON_REPLY_HEADERS if as_json else PROTOBUF_REPLY_HEADERS
        return serialize_reply(outcome, as_json=as_json), headers

    async def _serve(self, batch: list[Msg]) -> None:
        """Handle a batch of request-reply submits and answer each exactly once: with its
        outcome, or, should handling the batch fail in an unexpected way, with an internal
        error for each one not answered yet."""
        connection = self._connection()

        answered: set[int] = set()

        async def answer(index: int, outcome: Outcome) -> None:
            if index in answered:  # never a second answer
                return
            answered.add(index)
            message = batch[index]
            try:
                reply = self._answer(message.data, outcome)
                if reply is not None and message.reply:
                    with contextlib.suppress(*TRANSIENT_ERRORS):
                        await connection.publish(message.reply, reply[0], headers=reply[1])
            except Exception:  # the reply could not be sent: the client times out and retries
                log.exception("could not answer a request-reply submit")
            finally:
                self._in_flight -= 1
                self._schedule_batch()

        tenant_of = self.subjects.tenant_of_submit
        rate_taken = self._gate is not None
        arrivals = [
            Arrival(message.data, tenant_of(message.subject), rate_taken) for message in batch
        ]
        try:
            await self.handler.on_api_submits(arrivals, answer)
        except Exception as error:
            # each is answered with the error; NATS away is one line, anything else a traceback
            warn_try_failed(log, f"a batch of {len(batch)} request-reply submit(s) failed", error)
            for index in range(len(batch)):
                await answer(index, error)
        finally:  # cancelled, say: those not answered leave the count too
            self._in_flight -= len(batch) - len(answered)
            answered.update(range(len(batch)))

    async def _on_request(self, message: Msg) -> None:
        if not message.reply:
            # Not a request: nobody would hear the answer. Such a message is what lands here
            # when a client names an entrance as the reply subject of another request (a
            # JetStream API answer, say, aimed at another tenant's entrance); it is dropped
            # unread (docs/security.md, "Tenants").
            self.ignored_without_reply += 1
            return
        tenant = self.subjects.tenant_of_submit(message.subject)
        if tenant and self._gate is not None and (too_fast := self._gate.rate_refusal(tenant)):
            # past its rate: answered before it is read, so that a tenant's flood costs intake
            # an answer each and delays nobody else's submits (docs/security.md, "Limits");
            # the token of one within its rate is taken now, as it arrives
            self.refused_unread += 1
            as_json = is_json(message.data)
            await self._held.answer(
                message.reply,
                self._rate_refusals.reply(too_fast, as_json=as_json),
                JSON_REPLY_HEADERS if as_json else PROTOBUF_REPLY_HEADERS,
                wait_s=too_fast.wait_s,
            )
            return
        # Requests that arrive together are handled together: nats-py hands over every message
        # already read before the loop runs anything else, and the batch starts after that.
        self._arrived.append(tenant, message)
        self._schedule_batch()

    async def _send_answer(self, reply: str, payload: bytes, headers: dict[str, str]) -> None:
        """Publish one answer; after a NATS error none is sent (the client times out)."""
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await self._connection().publish(reply, payload, headers=headers)

    def _schedule_batch(self) -> None:
        """Start a batch once the loop has run what is ready now (more requests read, more
        answers sent): a batch takes everything that arrived by then."""
        if not self._batch_scheduled:
            self._batch_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_batch)

    def _start_batch(self) -> None:
        """Hand the requests that arrived to a batch, as far as the concurrency allows."""
        self._batch_scheduled = False
        room = self.settings.concurrency - self._in_flight
        if room <= 0 or not self._arrived:
            return
        batch = self._arrived.take(room)
        self._in_flight += len(batch)
        task = asyncio.create_task(self._serve(batch))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def serve_tenants(self) -> None:
        """Follow every tenant's submit stream (``services.intake.paced``) until stopped: each
        through intake's durable pull consumer of it (replicas share it), read one submit at a
        time at the tenant's rate, acked by the handler."""
        js = self._connection().jetstream()
        directory = self._tenants
        self._tenant_submits = TenantSubmits(
            js,
            self.subjects,
            consume=self.consume_paced,
            take_token=self._gate.take_token if self._gate is not None else lambda _: 0.0,
            changed=directory.wait_changed if directory is not None else None,
            name=self.settings.durable,
            ack_wait_s=self.settings.ack_wait_s,
            max_ack_pending=self.settings.max_in_flight,
            scan_s=self.settings.tenant_scan_s,
        )
        self._tenant_task = asyncio.create_task(self._tenant_submits.run(), name="intake-tenants")
        await self._tenant_submits.wait_scanned(5.0)

    @property
    def tenant_submits(self) -> TenantSubmits:
        if self._tenant_submits is None:
            raise RuntimeError("intake is not serving tenants' streams: call start() or run()")
        return self._tenant_submits

    async def stop_tenants(self) -> None:
        """Stop pulling tenants' submits; those in hand are handled and acked first."""
        task, self._tenant_task = self._tenant_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._tenant_submits is not None:
            await self._tenant_submits.stop()

    async def serve_requests(self) -> None:
        """Subscribe to request-reply submits, the operator's and every tenant's (queue group:
        replicas share them)."""
        self._request_subscriptions = [
            await self._connection().subscribe(
                subject,
                queue=self.settings.queue_group,
                cb=self._on_request,
                pending_msgs_limit=max(65_536, 16 * self.settings.concurrency),
            )
            for subject in self.subjects.api_submit_subjects
        ]
        if self._desk is not None:
            await self._desk.start(queue=self.settings.queue_group)

    async def stop_requests(self) -> None:
        """Stop taking requests and let those in hand finish."""
        subscriptions, self._request_subscriptions = self._request_subscriptions, []
        if self._desk is not None:
            with contextlib.suppress(Exception):
                await self._desk.stop()
        for subscription in subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        await self._held.release_all()
        deadline = asyncio.get_running_loop().time() + 10
        while self._requests or self._arrived:  # an answer makes room for those that arrived
            timeout = deadline - asyncio.get_running_loop().time()
            if timeout <= 0:
                break
            if self._requests:
                await asyncio.wait(set(self._requests), timeout=timeout)
            else:
                await asyncio.sleep(0.01)  # the next batch is about to start

    def _connection(self) -> Client:
        if self._entrances is None:
            raise RuntimeError("intake is not prepared: call start() or run()")
        return self._entrances

    async def consume(self, raw: Msg) -> None:
        """Handle one stream submit; ack it once done, nak it (retry later) on a NATS error."""
        sequence = raw.metadata.sequence.stream
        try:
            await self._consume_one(
                raw.data, sequence=sequence, tenant=self.subjects.tenant_of_submit(raw.subject)
            )
        except TRANSIENT_ERRORS as error:
            log.warning("submit #%d: NATS error, will retry: %r", sequence, error)
            await raw.nak(delay=self.settings.retry_delay_s)
            return
        await raw.ack()

    async def consume_paced(self, raw: Msg, tenant: str) -> None:
        """Handle one submit of ``tenant``'s own stream, its rate token taken before it was
        pulled; ack it once done, nak it (retry later) on a NATS error."""
        sequence = raw.metadata.sequence.stream
        try:
            await self._consume_one(raw.data, sequence=sequence, tenant=tenant, rate_taken=True)
        except TRANSIENT_ERRORS as error:
            log.warning("submit #%d of %s: NATS error, will retry: %r", sequence, tenant, error)
            await raw.nak(delay=self.settings.retry_delay_s)
            return
        await raw.ack()

    async def _consume_one(
        self, data: bytes, *, sequence: int, tenant: str, rate_taken: bool = False
    ) -> None:
        try:
            await self.handler.on_stream_submit(
                data, sequence=sequence, tenant=tenant, rate_taken=rate_taken
            )
        except TRANSIENT_ERRORS:
            raise
        except Exception as error:  # a bug in one submit must not block the stream
            log.exception("submit #%d could not be handled; refusing it", sequence)
            await self.handler.refuse_unhandled(sequence=sequence, error=error, tenant=tenant)

    async def prepare(self) -> None:
        """Connect (the namespace's streams made if missing), open the registry, build the handler.

        While no NATS server answers, or JetStream is still starting, wait (with backoff and
        one log line per try, ``mdq.bus.connect``) rather than exit."""
        url = self.common.nats_url
        connection = self._entrances = await connect(
            url,
            name=f"mdq-intake-{self.common.namespace}",
            subjects=self.subjects,
            replicas=self.common.stream_replicas,
            wait=True,
        )
        js = connection.jetstream()
        await self._align_durable(js)
        # What a submit waits for (registry claims and lookups, events, the jobs log's size,
        # the tenant's usage, its input files) goes over a connection of its own: a flood on
        # the entrances queues in the entrances' connection, not ahead of the answers another
        # tenant's submit waits for (docs/intake.md, "Two connections").
        self._writes = await connect(
            url, name=f"mdq-intake-{self.common.namespace}-writes", wait=True
        )
        requests = await Requests(self._writes).start()
        waited_on = self._writes.jetstream()
        storage = StorageSettings()
        registry = await SubmitRegistry.open(
            js=js, requests=requests, subjects=self.subjects, storage=storage
        )
        room = JobsLogRoom(
            self._jobs_log_size(waited_on),
            high_water=storage.jobs_high_water,
            refresh_s=self.settings.log_room_refresh_s,
        )
        publisher = EventPublisher(js=requests, subjects=self.subjects, producer="intake")
        self._tenants = TenantDirectory(js, self.subjects)
        if not await self._tenants.wait_synced(TENANT_POLICIES_WAIT_S):
            log.warning("tenant policies not read yet: tenants get the default until they are")
        gate = self._gate = TenantGate(
            directory=self._tenants, read_usage=self._usage_reader(waited_on)
        )
        self._history = HistoryReader(
            database_url=self.settings.history_database_url,
            refresh_s=self.settings.history_refresh_s,
            days=self.settings.history_days,
            kinds=20_000,
        )
        self._history.start()
        self._handler = SubmitHandler(
            publisher=publisher,
            registry=registry,
            gate=gate,
            room=room,
            history=self._history.history if self.settings.recommend_resources else None,
            auto_resources=self.settings.auto_resources,
            limits=self._runaway_limits(LimitSettings().defaults()),
            inputs=InputsCheck(waited_on, self.subjects),
        )
        self._desk = InputDesk(connection, self.subjects)

    def _runaway_limits(self, defaults: RunawayLimits) -> Callable[[str], RunawayLimits]:
        """tenant ("" the operator) -> its runaway limits: its policy's (read live from the
        tenants bucket), the operator's ``defaults`` where it sets none."""

        def limits(tenant: str) -> RunawayLimits:
            if not tenant or self._tenants is None:
                return defaults
            return RunawayLimits.of(self._tenants.policy(tenant), defaults)

        return limits

    def _jobs_log_size(self, js: JetStreamContext) -> Callable[[], Awaitable[LogSize]]:
        """Reads the jobs stream's size and size limit from the server."""
        stream = self.subjects.jobs_stream

        async def read() -> LogSize:
            info = await js.stream_info(stream)
            return LogSize(held=info.state.bytes, limit=info.config.max_bytes or -1)

        return read

    def _usage_reader(self, js: JetStreamContext) -> UsageReader:
        """Reads a tenant's usage as placement last wrote it into its waiting bucket."""
        bucket: list[KeyValue] = []

        async def read(tenant: str) -> TenantUsage | None:
            if not bucket:
                try:
                    bucket.append(await js.key_value(self.subjects.waiting_bucket))
                except nats.js.errors.BucketNotFoundError:  # placement never ran: nothing queued
                    return None
            try:
                entry = await bucket[0].get(usage_key(tenant))
            except nats.js.errors.KeyNotFoundError:
                return None
            try:
                return TenantUsage.from_json(entry.value or b"")
            except ValueError:
                log.warning("tenant %s: unreadable usage in the waiting bucket", tenant)
                return None

        return read

    def _consumer_config(self) -> ConsumerConfig:
        """What intake's durable consumer of the submit stream is: the operator's submits, the
        settings' ack wait and most submits in flight."""
        return ConsumerConfig(
            filter_subjects=[self.subjects.submit],
            ack_wait=self.settings.ack_wait_s,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=self.settings.max_in_flight,
        )

    async def _align_durable(self, js: JetStreamContext) -> None:
        """Bring an existing durable consumer in line with ``_consumer_config`` (its subjects,
        ack wait and most in flight), in place, so a change of the settings takes effect at
        the next start and no submit waiting in it is lost. A missing one is made when the
        stream entrance subscribes."""
        stream, durable = self.subjects.submit_stream, self.settings.durable
        try:
            info = await js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            return
        config, wanted = info.config, self._consumer_config()
        has = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
        if (sorted(has), config.ack_wait, config.max_ack_pending) == (
            sorted(wanted.filter_subjects or []),
            wanted.ack_wait,
            wanted.max_ack_pending,
        ):
            return
        config.filter_subject, config.filter_subjects = None, wanted.filter_subjects
        config.ack_wait, config.max_ack_pending = wanted.ack_wait, wanted.max_ack_pending
        await js.add_consumer(stream, config=config)
        log.info("intake's consumer %s follows the settings again", durable)

    async def start(self) -> None:
        """Prepare and start consuming (for embedding, e.g. in tests)."""
        await self.prepare()
        await self.serve_stream()
        await self.serve_tenants()
        await self.serve_requests()
        # The server has our subscriptions once this returns. nats-py 2.16's flush() writes its
        # PING ahead of commands still buffered, so one flush can return before the SUBs went
        # out; the first one kicks the buffer out, the second PING follows it.
        for _ in range(2):
            await self._connection().flush()

    async def stop(self) -> None:
        """Stop taking submits, finish those in hand, and close both connections."""
        await self.stop_tenants()
        await self.stop_requests()
        if self._entrances is not None:
            with contextlib.suppress(Exception):
                # the stream submit in hand is handled and acked before the connection closes
                await self._entrances.drain()
        if self._writes is not None:
            with contextlib.suppress(Exception):
                await self._writes.drain()
        if self._tenants is not None:
            await self._tenants.close()

    async def run(self) -> None:
        """Serve until cancelled (``mdq.bus.runtime.run_service`` cancels on SIGTERM/SIGINT),
        then stop: the requests in hand are answered and the connections drained, also when
        the stop comes while it is still starting."""
        try:
            await self.start()
            await asyncio.Future()  # until cancelled
        finally:
            await self.stop()


def build_intake(
    *, common: CommonSettings | None = None, settings: IntakeSettings | None = None
) -> Intake:
    """The intake service from the given settings (or the environment's)."""
    return Intake(common=common or CommonSettings(), settings=settings or IntakeSettings())
