"""Short-lived runner credentials, renewed while their attempt lives.

A runner's credentials (``mdq.auth.RunnerIssuer.creds``) expire ``MDQ_NATS_RUNNER_CREDS_TTL_S``
after they are minted, and the server ends a connection whose credentials expired. While the
attempt runs, the runner asks for fresh ones at half-life (``keep_renewed``) on
``<ns>.api.runner_creds.<job id>``, a subject the server lets only that job's credentials
publish on (the runner template fills in the job id). Whoever holds the runner issuer answers
(``RenewalDesk``): placement on Kubernetes, from the jobs log (the job is BOUND or RUNNING in
that very attempt), the local node agent from the pods it runs. So a pod that ended, a runner of
an attempt that was superseded, or a copy of a runner's file stops working within one TTL, with
no revocation list and no change to the server's configuration.

The runner holds its credentials in memory (``RenewableCreds``: nats-py asks for the JWT and a
signature of the server's nonce at each connect); after a renewal it reconnects at once, so the
connection always runs on credentials with at least half their life left. A runner told its
attempt no longer lives, or left without valid credentials, is asked to stop (``on_lost``):
it checkpoints and exits, since nothing it reports would be accepted.
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

from mdq.auth import decode_claims
from mdq.bus.permissions import inbox_prefix
from mdq.bus.subjects import Subjects

log = logging.getLogger(__name__)

RENEW_TIMEOUT_S = 5.0
"""How long one renewal request waits for its answer."""
RETRY_S = 5.0
"""How long a runner waits before asking again after an unanswered renewal (at most)."""

Verdict = Callable[[str, int], bool | None]
"""``(job id, attempt) ->`` True: that attempt runs, renew; False: it does not, refuse; None:
not this desk's to say (another node agent's pod), stay silent."""

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
        (``RunnerIssuer.creds`` with the TTL); ``verdict``: whether the attempt lives."""
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
        job_id = message.subject[len(self._prefix) :]
        try:
            attempt = int(json.loads(message.data)["attempt"])
        except (ValueError, TypeError, KeyError):
            attempt = 0  # no attempt runs as number 0: refused below
        live = self._verdict(job_id, attempt) if attempt > 0 else False
        if live is None or not message.reply:
            return
        if live:
            reply: dict[str, str] = {"creds": self._mint(job_id)}
            self.renewed += 1
        else:
            reply = {"error": f"attempt {attempt} of job {job_id} is not running"}
            self.refused += 1
            log.info("refused to renew the credentials of %s attempt %d", job_id, attempt)
        await message.respond(json.dumps(reply).encode())

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
