"""Short-lived runner credentials, renewed while their attempt lives.

Placement, the one holder of the runner issuer, answers on ``<ns>.api.runner_creds.<job id>``
(``RenewalDesk``) from the jobs log (``log_verdict``): a node agent asks there for a runner's
first credentials (``request_runner_creds``), the runner for fresh ones at half-life
(``keep_renewed``, ``RenewableCreds``), and a runner refused renewal is asked to stop
(``on_lost``).

How and why: docs/security.md, "NATS: every connection proves who it is" (its runner
credentials' items).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import nkeys
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mdq.bus.outage import warn_try_failed
from mdq.bus.security.claims import decode_claims
from mdq.bus.security.permissions import inbox_prefix
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.state import attempt_lives
from mdq.core.tenants import JobIdError, check_job_id
from mdq.errors import PermissionDenied

log = logging.getLogger(__name__)

RENEW_TIMEOUT_S = 5.0
"""How long one renewal request waits for its answer."""
RETRY_S = 5.0
"""How long a runner waits before asking again after an unanswered renewal (at most)."""

Verdict = Callable[[str, int], Awaitable[bool | None]]
"""``(job id, attempt) ->`` True: that attempt runs, mint; False: it does not, refuse; None:
not this desk's to say, stay silent. An error is no answer either (the asker asks again)."""


class CredsRefused(PermissionDenied):
    """The desk refused credentials: the attempt does not live, or the job id is not one."""


_JWT_BEGIN, _JWT_END = "-----BEGIN NATS USER JWT-----", "------END NATS USER JWT------"
_SEED_BEGIN, _SEED_END = "-----BEGIN USER NKEY SEED-----", "------END USER NKEY SEED------"


def _between(text: str, begin: str, end: str) -> str:
    try:
        return text.split(begin, 1)[1].split(end, 1)[0].strip()
    except IndexError:
        raise ValueError(f"not a NATS credentials text: no {begin!r} block") from None


@dataclass(frozen=True, slots=True)
class Credentials:
    """One ``.creds`` text, read: the user JWT, its seed, and what its claims say."""

    jwt: str
    seed: str
    name: str
    issued_at: float
    expires_at: float | None
    """None: the JWT never expires (a service's; nothing to renew)."""

    @classmethod
    def parse(cls, text: str) -> Credentials:
        token = _between(text, _JWT_BEGIN, _JWT_END)
        claims = decode_claims(token)
        expires = claims.get("exp")
        return cls(
            jwt=token,
            seed=_between(text, _SEED_BEGIN, _SEED_END),
            name=str(claims["name"]),
            issued_at=float(claims.get("iat", 0)),
            expires_at=float(expires) if expires else None,
        )

    def renew_at(self) -> float | None:
        """When to ask for fresh credentials: half-way through their life."""
        if self.expires_at is None:
            return None
        return self.issued_at + (self.expires_at - self.issued_at) / 2


class RenewableCreds:
    """A runner's credentials, in memory, replaced by each renewal."""

    def __init__(self, text: str) -> None:
        self.current = Credentials.parse(text)
        self.renewals = 0

    @classmethod
    def load(cls, path: Path) -> RenewableCreds:
        return cls(path.read_text(encoding="utf-8"))

    def connect_options(self) -> dict[str, Any]:
        """nats-py's connect options: the JWT and the nonce's signature from the current
        credentials at every (re)connect, and this identity's own reply-inbox prefix."""

        def user_jwt() -> bytes:
            return self.current.jwt.encode()

        def sign(nonce: str) -> bytes:
            key = nkeys.from_seed(bytearray(self.current.seed.encode()))
            try:
                return base64.b64encode(key.sign(nonce.encode()))
            finally:
                key.wipe()

        return {
            "user_jwt_cb": user_jwt,
            "signature_cb": sign,
            "inbox_prefix": inbox_prefix(self.current.name),
        }

    def _left(self, clock: Callable[[], float]) -> float:
        return (self.current.expires_at or clock()) - clock()

    async def keep_renewed(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        job_id: str,
        attempt: int,
        on_lost: Callable[[str], None],
        before_reconnect: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Renew at half-life, for as long as the attempt lives (run it as a task, cancel it
        when the attempt ends). ``on_lost`` is told why, once, when the attempt is refused
        fresh credentials or its current ones expire unrenewed; then this returns.
        ``before_reconnect`` is awaited before each reconnect: the runner lets the events in
        flight be acknowledged first (an acknowledgement sent on the old connection is lost)."""
        request = json.dumps({"attempt": attempt}).encode()
        while True:
            renew_at = self.current.renew_at()
            if renew_at is None:
                return  # credentials that never expire
            await asyncio.sleep(max(0.0, renew_at - clock()))
            while True:
                expires_at = self.current.expires_at or 0.0
                if clock() >= expires_at:
                    on_lost("its NATS credentials expired and could not be renewed")
                    return
                try:
                    answer = await nc.request(
                        subjects.runner_creds(job_id), request, timeout=RENEW_TIMEOUT_S
                    )
                except (nats.errors.Error, OSError) as error:  # no answer yet: ask again
                    left = expires_at - clock()
                    log.warning(
                        "renewing the NATS credentials failed (%r); %.0f s left", error, left
                    )
                    await asyncio.sleep(min(RETRY_S, max(0.1, left / 4)))
                    continue
                reply = json.loads(answer.data)
                if "creds" not in reply:
                    on_lost(f"its NATS credentials were not renewed: {reply.get('error')}")
                    return
                self.current = Credentials.parse(reply["creds"])
                self.renewals += 1
                if before_reconnect is not None:
                    await before_reconnect()
                await nc.force_reconnect()  # from now on on the fresh credentials
                log.info("NATS credentials renewed, valid for %.0f s", self._left(clock))
                break


class RenewalDesk:
    """Answers the renewal requests of runners, for the holder of the runner issuer."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        mint: Callable[[str], str],
        verdict: Verdict,
    ) -> None:
        """``mint(job_id)``: fresh credentials for that job's runner
        (``RunnerIssuer.creds`` with the TTL); ``verdict``: whether the attempt lives
        (``log_verdict``)."""
        self._nc = nc
        self._subjects = subjects
        self._mint = mint
        self._verdict = verdict
        self._prefix = subjects.runner_creds("")
        self._subscription: Subscription | None = None
        self.renewed = 0
        self.refused = 0

    async def start(self) -> RenewalDesk:
        self._subscription = await self._nc.subscribe(
            self._subjects.runner_creds(">"), cb=self._answer
        )
        return self

    async def _answer(self, message: Msg) -> None:
        if not message.reply:
            return
        job_id = message.subject[len(self._prefix) :]
        try:
            check_job_id(job_id)
        except JobIdError as error:
            self.refused += 1
            log.warning("refused runner credentials: %s", error)
            await message.respond(json.dumps({"error": str(error)}).encode())
            return
        try:
            attempt = int(json.loads(message.data)["attempt"])
        except (ValueError, TypeError, KeyError):
            attempt = 0  # no attempt runs as number 0: refused below
        try:
            live = await self._verdict(job_id, attempt) if attempt > 0 else False
        except Exception as error:  # the log cannot be read now: no answer, the asker asks again
            warn_try_failed(log, f"could not tell whether {job_id} attempt {attempt} runs", error)
            return
        if live is None:
            return
        if live:
            reply: dict[str, str] = {"creds": self._mint(job_id)}
            self.renewed += 1
        else:
            reply = {"error": f"attempt {attempt} of job {job_id} is not running"}
            self.refused += 1
            log.info("refused runner credentials for %s attempt %d", job_id, attempt)
        await message.respond(json.dumps(reply).encode())

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None


def log_verdict(js: JetStreamContext, subjects: Subjects) -> Verdict:
    """Whether an attempt lives, read from the jobs log at the moment of asking: the job's
    last ``bound`` event is of that attempt, and no ``attempt_failed``, ``succeeded`` or
    ``failed`` of it or a later one came after (a job extended after it succeeded lives on in
    a later attempt). Four reads of a subject's
    last message, no state: every placement replica answers alike, and a pod whose ``bound``
    event was acknowledged a moment ago is already live."""
    stream = subjects.jobs_stream

    async def last(job_id: str, kind: str) -> pb.Event | None:
        try:
            message = await js.get_last_msg(stream, subjects.job(job_id, kind))
        except NotFoundError:
            return None
        return pb.Event.FromString(message.data or b"")

    async def verdict(job_id: str, attempt: int) -> bool:
        bound = await last(job_id, "bound")
        if bound is None or bound.attempt != attempt:
            return False  # no need to read more
        failed = await last(job_id, "attempt_failed")
        ends = [await last(job_id, kind) for kind in ("succeeded", "failed")]
        return attempt_lives(
            attempt,
            last_bound=bound.attempt,
            last_failed=None if failed is None else failed.attempt,
            last_ended=max((end.attempt for end in ends if end is not None), default=None),
        )

    return verdict


async def request_runner_creds(
    nc: Client,
    subjects: Subjects,
    *,
    job_id: str,
    attempt: int,
    wait_s: float,
    timeout_s: float = RENEW_TIMEOUT_S,
) -> str:
    """The first credentials of ``attempt`` of ``job_id``, from the desk (what the local node
    agent asks before it starts a pod). Asks again while no desk answers, for ``wait_s`` at
    most (then ``TimeoutError``); ``CredsRefused`` when the desk says no."""
    request = json.dumps({"attempt": attempt}).encode()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            answer = await nc.request(subjects.runner_creds(job_id), request, timeout=timeout_s)
        except (nats.errors.Error, OSError) as error:  # no desk yet, or no answer in time
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(
                    f"no runner credentials for {job_id} attempt {attempt} within "
                    f"{wait_s:g} s ({error!r}): is placement running with the runner issuer?"
                ) from error
            await asyncio.sleep(min(RETRY_S / 5, left))
            continue
        reply = json.loads(answer.data)
        if "creds" in reply:
            return str(reply["creds"])
        raise CredsRefused(str(reply.get("error")))
