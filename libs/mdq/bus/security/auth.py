"""NATS identities: the trust chain, the credentials of each identity, the server's half.

``Trust`` holds the operator and account keys; ``issue`` writes one identity's ``.creds`` with
the permissions of ``mdq.bus.security.permissions``; ``server_block`` is the configuration the
server needs (public material only); ``rotate`` replaces one identity's credentials; and
``generate`` is the one generator of a deployment's NATS material, for ``mdq up``, compose and
Kubernetes alike.

How it works: docs/security.md, "NATS: every connection proves who it is", "Deployments:
compose and Kubernetes" and "Adding an identity, rotating credentials".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nacl.signing
import nkeys

from mdq.bus.security.claims import decode_claims
from mdq.bus.security.permissions import (
    IDENTITIES,
    Bridge,
    Names,
    Permissions,
    account_bridge,
    runner_permissions,
    service_permissions,
)
from mdq.bus.subjects import Subjects
from mdq.core.tenants import check_job_id
from mdq.errors import InvalidInput

SECRETS_DIR = "secrets"
NATS_SECRETS = "nats"
TRUST_FILE = "trust.json"
SERVER_BLOCK_FILE = "nats-auth.conf"
"""The server's half (``Trust.server_block``), included by deploy/base/nats.conf."""
RUNNER_ISSUER_FILE = "runner-issuer.json"
"""Placement's runner-credential issuer (``MDQ_NATS_RUNNER_ISSUER``): it alone mints runner
credentials, the local node agents' included (``mdq.bus.security.runner_creds``)."""
REVOCATIONS_FILE = "revocations.json"
"""Revoked user public keys -> the time of revocation (``rotate``), in the account's JWT."""
TENANTS_DIR = "tenants"
"""Where, in a secrets folder, the tenants' credentials are (``mdq tenant add``)."""
RUNNER_ISSUER_ENV = "MDQ_NATS_RUNNER_ISSUER"
"""Where placement is told the runner issuer file is (set by the stack, compose, deploy)."""
CREDS_SUFFIX = ".creds"

_UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _new_key(prefix: int) -> nkeys.KeyPair:
    seed = nkeys.encode_seed(bytes(nacl.signing.SigningKey.generate()), prefix)
    return nkeys.from_seed(bytearray(seed))


def _from_seed(seed: str) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(seed.encode()))


def _public(key: nkeys.KeyPair) -> str:
    return str(key.public_key.decode())


def _seed(key: nkeys.KeyPair) -> str:
    return str(key.seed.decode())


def encode_jwt(claims: dict[str, Any], signer: nkeys.KeyPair) -> str:
    """A NATS JWT: ``claims`` (with ``iat`` and ``jti`` filled in) signed by ``signer``."""
    claims = {**claims, "iat": int(time.time()), "jti": ""}
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = signer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


def write_secret(path: Path, text: str, *, group_readable: bool = False) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (0600), replacing it atomically;
    the folders it has to make are 0700. ``group_readable``: 0640 (folders made 0750), for a
    container that runs as another user with the owner's group added (docker-compose.yml,
    ``group_add``). A folder that exists keeps its mode: whoever made it chose it (an
    embedded PostgreSQL may share it); make a private one first where it matters
    (``generate``, the stack's ``secrets/``)."""
    folder_mode, file_mode = (0o750, 0o640) if group_readable else (0o700, 0o600)
    missing = [each for each in path.parents if not each.exists()]
    path.parent.mkdir(mode=folder_mode, parents=True, exist_ok=True)
    for folder in missing:
        os.chmod(folder, folder_mode)  # mkdir's mode is masked by the umask
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode)
    os.fchmod(descriptor, file_mode)  # whatever the umask
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    return path


def ensure_token_file(path: Path, *, group_readable: bool = False) -> Path:
    """A random access token (256 bits, URL-safe) in ``path``, written as ``write_secret``
    writes (0600; 0640 ``group_readable``), or the one already there: a link that holds it
    keeps working."""
    if not (path.is_file() and path.read_text(encoding="utf-8").strip()):
        write_secret(path, secrets.token_urlsafe(32) + "\n", group_readable=group_readable)
    return path


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def bearer_guard(app: WsgiApp, token_file: Path) -> WsgiApp:
    """``app`` answering only requests that bring the token in ``token_file`` (read at each
    request, so a new token applies at once): ``Authorization: Bearer <token>``; 401 without
    it. What keeps ``/metrics`` (job ids, so tenants' names) from other accounts on a
    machine whose loopback they share."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        token = token_file.read_text(encoding="utf-8").strip()
        given = str(environ.get("HTTP_AUTHORIZATION", ""))
        if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")],
            )
            return [b"this endpoint needs its token: Authorization: Bearer <token>\n"]
        return app(environ, start_response)

    return guarded


def creds_text(user_jwt: str, seed: str) -> str:
    """The ``.creds`` file format that nats-py (``user_credentials``) and the nats CLI
    (``--creds``) read."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n"
    )


@dataclass(frozen=True, slots=True)
class Trust:
    """The operator, the system account, mdq's two accounts and the runner signing key: their
    seeds and signed JWTs, for one namespace.

    mdq's streams and buckets live in one account (``account_seed``, the *streams* account) to
    which no user may log in; every identity logs in to the other (``users_seed``, the *users*
    account), which reaches the streams through the imports of
    ``mdq.bus.security.permissions.account_bridge``. A JetStream answer then always comes back in
    the users account, where no stream stores it (the reply-subject trick)."""

    operator_seed: str
    system_seed: str
    account_seed: str
    """The streams account: JetStream, the exports, no users (its connection limit is 0)."""
    runner_signing_seed: str
    """A signing key of the users account scoped to the runner template: what it signs can
    publish one job's progress, checkpoints and outputs, whatever the JWT says (but the job is
    the JWT's name, filled in as it is: ``RunnerIssuer.creds`` mints for job ids only).
    Placement alone holds it (``runner_issuer``), never an account key."""
    namespace: str = "mdq"
    users_seed: str = ""
    """The users account: every identity's credentials are signed by it. A trust chain made
    before it existed gets one on load (``load_or_create``)."""

    @classmethod
    def generate(cls, namespace: str = "mdq") -> Trust:
        return cls(
            operator_seed=_seed(_new_key(nkeys.PREFIX_BYTE_OPERATOR)),
            system_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            account_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            runner_signing_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            namespace=namespace,
            users_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
        )

    @classmethod
    def load_or_create(cls, folder: Path, namespace: str = "mdq") -> Trust:
        """The trust chain kept in ``folder`` (created, 0600, on first use; a chain of one
        account, from before the users account, gets its users account added and kept)."""
        path = folder / TRUST_FILE
        if path.exists():
            trust = cls(**json.loads(path.read_text(encoding="utf-8")))
            if trust.users_seed:
                return trust
            trust = replace(trust, users_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)))
        else:
            trust = cls.generate(namespace)
            os.makedirs(folder, mode=0o700, exist_ok=True)
        document = {
            "operator_seed": trust.operator_seed,
            "system_seed": trust.system_seed,
            "account_seed": trust.account_seed,
            "runner_signing_seed": trust.runner_signing_seed,
            "namespace": trust.namespace,
            "users_seed": trust.users_seed,
        }
        write_secret(path, json.dumps(document, indent=2) + "\n")
        return trust

    @property
    def operator_public(self) -> str:
        return _public(_from_seed(self.operator_seed))

    @property
    def system_public(self) -> str:
        return _public(_from_seed(self.system_seed))

    @property
    def account_public(self) -> str:
        """The streams account (the one the monitoring endpoint's ``/jsz?acc=`` reports)."""
        return _public(_from_seed(self.account_seed))

    @property
    def users_public(self) -> str:
        """The account every identity logs in to."""
        return _public(_from_seed(self.users_seed))

    def operator_jwt(self) -> str:
        operator = _from_seed(self.operator_seed)
        claims = {
            "iss": _public(operator),
            "sub": _public(operator),
            "name": "mdq",
            "nats": {"type": "operator", "version": 2, "system_account": self.system_public},
        }
        return encode_jwt(claims, operator)

    def account_jwts(
        self, revocations: dict[str, int] | None = None, *, extra: Bridge | None = None
    ) -> dict[str, str]:
        """Account public key -> its JWT: the system account, the streams account (JetStream,
        its exports, no connections) and the users account (its imports, the runner signing
        key; user keys in ``revocations`` are refused for JWTs issued before their time).
        ``extra`` bridges more subjects (a benchmark's raw baseline beside mdq's)."""
        operator = _from_seed(self.operator_seed)
        system = {
            "iss": _public(operator),
            "sub": self.system_public,
            "name": "SYS",
            "nats": {"type": "account", "version": 2, "limits": _UNLIMITED},
        }
        runner = runner_permissions(Subjects(self.namespace))
        runner_scope = {
            "kind": "user_scope",
            "key": _public(_from_seed(self.runner_signing_seed)),
            "role": "runner",
            "template": {
                "pub": {"allow": list(runner.publish)},
                "sub": {"allow": list(runner.subscribe)},
                "subs": -1,
                "data": -1,
                "payload": -1,
            },
        }
        bridge = account_bridge(Subjects(self.namespace))
        if extra is not None:
            bridge = replace(
                bridge,
                services=(*bridge.services, *extra.services),
                streams=(*bridge.streams, *extra.streams),
            )

        def service(subject: str) -> dict[str, Any]:
            shared: dict[str, Any] = {"name": subject, "subject": subject, "type": "service"}
            if subject in bridge.multi_response:
                shared["response_type"] = "Stream"
            return shared

        shared = [service(subject) for subject in bridge.services]
        shared += [service(stored) for _, stored in bridge.mapped]
        shared += [
            {"name": subject, "subject": subject, "type": "stream"} for subject in bridge.streams
        ]
        streams: dict[str, Any] = {
            "iss": _public(operator),
            "sub": self.account_public,
            # Its public key, not a label: the monitoring endpoint (/jsz?acc=<key>) selects an
            # account by key and reports its name, and KEDA's nats-jetstream scaler asks for
            # one and compares the other (deploy/components/keda-watcher).
            "name": self.account_public,
            "nats": {
                "type": "account",
                "version": 2,
                # no connection of any user, nor of a leaf node: only the imports reach it
                "limits": {**_UNLIMITED, **_JETSTREAM, "conn": 0, "leaf": 0},
                "exports": shared,
            },
        }
        users: dict[str, Any] = {
            "iss": _public(operator),
            "sub": self.users_public,
            "name": self.users_public,
            "nats": {
                "type": "account",
                "version": 2,
                "limits": _UNLIMITED,  # no JetStream of its own: "$JS.API.>" is imported
                "signing_keys": [runner_scope],
                "imports": [{**each, "account": self.account_public} for each in shared],
            },
        }
        for each in users["nats"]["imports"]:
            each.pop("response_type", None)
            for local, stored in bridge.mapped:  # published as ``local``, stored as ``stored``
                if each["subject"] == stored:
                    each["local_subject"] = local
        if revocations:
            users["nats"]["revocations"] = dict(sorted(revocations.items()))
        return {
            self.system_public: encode_jwt(system, operator),
            self.account_public: encode_jwt(streams, operator),
            self.users_public: encode_jwt(users, operator),
        }

    def user_creds(self, permissions: Permissions, *, expires_s: float | None = None) -> str:
        """The ``.creds`` text of a new user with ``permissions`` (a fresh key each time)."""
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        nats: dict[str, Any] = {
            "type": "user",
            "version": 2,
            "pub": {
                "allow": list(permissions.publish),
                **({"deny": list(permissions.publish_deny)} if permissions.publish_deny else {}),
            },
            "sub": {"allow": list(permissions.subscribe)},
            "subs": permissions.max_subscriptions,
            "data": -1,
            "payload": permissions.max_payload,
        }
        if permissions.respond:
            nats["resp"] = {"max": 1, "ttl": 0}
        claims: dict[str, Any] = {
            "iss": self.users_public,
            "sub": _public(user),
            "name": permissions.identity,
            "nats": nats,
        }
        if expires_s is not None:
            claims["exp"] = int(time.time() + expires_s)
        return creds_text(encode_jwt(claims, _from_seed(self.users_seed)), _seed(user))

    def reissue(self, creds: str) -> str:
        """New credentials (a fresh user key) with the name and permissions of ``creds``."""
        (_, (claims,)) = _meaning(creds.split("------END NATS USER JWT------", 1)[0])
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        fresh = {**claims, "iss": self.users_public, "sub": _public(user)}
        return creds_text(encode_jwt(fresh, _from_seed(self.users_seed)), _seed(user))

    def server_block(
        self, revocations: dict[str, int] | None = None, *, extra: Bridge | None = None
    ) -> str:
        """The nats-server configuration that trusts this chain (public material only)."""
        jwts = self.account_jwts(revocations, extra=extra)
        preload = "\n".join(f'  {key}: "{jwt}"' for key, jwt in jwts.items())
        return (
            f'operator: "{self.operator_jwt()}"\n'
            f'system_account: "{self.system_public}"\n'
            "resolver: MEMORY\n"
            f"resolver_preload: {{\n{preload}\n}}\n"
        )


@dataclass(frozen=True, slots=True)
class RunnerIssuer:
    """Mints each runner's credentials with the account's runner-scoped signing key."""

    signing_seed: str
    account_public: str
    """The users account, whose scoped signing key ``signing_seed`` is."""
    expires_s: float | None = None
    """How long the credentials it mints live (None: for ever; ``MDQ_NATS_RUNNER_CREDS_TTL_S``
    where a desk renews them, ``mdq.bus.security.runner_creds``)."""

    @classmethod
    def load(cls, path: Path, *, expires_s: float | None = None) -> RunnerIssuer:
        document = json.loads(path.read_text(encoding="utf-8"))
        return cls(document["signing_seed"], document["account_public"], expires_s)

    def text(self) -> str:
        """The file ``load`` reads."""
        document = {"signing_seed": self.signing_seed, "account_public": self.account_public}
        return json.dumps(document, indent=2) + "\n"

    def save(self, path: Path) -> Path:
        return write_secret(path, self.text())

    def creds(self, job_id: str) -> str:
        """Credentials for the runners of ``job_id``: the server gives them the runner
        template with this job id filled in, and nothing else; they expire ``expires_s`` from
        now (``mdq.bus.security.runner_creds`` renews them while the attempt lives).

        ``job_id`` must be a job id (``mdq.core.tenants.check_job_id``, ``JobIdError``
        otherwise): the server fills it into the template as it is, so ``*``, ``>``,
        ``alice.*`` or ``intake`` would grant every job's (or an identity's) subjects."""
        check_job_id(job_id)
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {
            "iss": _public(_from_seed(self.signing_seed)),
            "sub": _public(user),
            "name": job_id,
            "nats": {"type": "user", "version": 2, "issuer_account": self.account_public},
        }
        if self.expires_s is not None:
            claims["exp"] = int(time.time() + self.expires_s)
        return creds_text(encode_jwt(claims, _from_seed(self.signing_seed)), _seed(user))


def runner_issuer(trust: Trust) -> RunnerIssuer:
    """The runner-credential issuer of ``trust`` (placement's)."""
    return RunnerIssuer(trust.runner_signing_seed, trust.users_public)


def issue(
    trust: Trust, permissions: Permissions, path: Path, *, group_readable: bool = False
) -> Path:
    """Write the credentials of ``permissions.identity`` to ``path`` (0600)."""
    return write_secret(path, trust.user_creds(permissions), group_readable=group_readable)


def nats_secrets_dir(state_dir: Path) -> Path:
    """Where ``mdq up`` keeps the NATS trust chain and every identity's credentials."""
    return state_dir / SECRETS_DIR / NATS_SECRETS


def creds_path(state_dir: Path, identity: str) -> Path:
    """The credentials file of ``identity`` under ``state_dir``."""
    return nats_secrets_dir(state_dir) / f"{identity}.creds"


class TrustMismatch(InvalidInput):
    """The folder holds the trust chain of another namespace."""


_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_UNSIGNED = ("iat", "jti")


def _meaning(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``text`` with its JWTs taken out, and their claims less the time of signing: what a
    server block or a ``.creds`` file says, which signing it again does not change."""
    claims = [
        {k: v for k, v in decode_claims(token).items() if k not in _UNSIGNED}
        for token in _JWT.findall(text)
    ]
    return _JWT.sub("JWT", text), claims


_OPERATOR_LINE = re.compile(r'^operator: "([^"]+)"$', re.MULTILINE)


def _keep_operator_jwt(old_block: str, fresh_block: str) -> str:
    """``fresh_block`` with the operator JWT of ``old_block`` when the two say the same (they
    differ only in the time of signing). A server refuses to reload a configuration whose
    operator JWT changed ("config reload not supported for TrustedOperators"), so a block
    rewritten for a revocation must keep the operator line the server started with, or the
    rotation never takes effect until a restart."""
    old, fresh = _OPERATOR_LINE.search(old_block), _OPERATOR_LINE.search(fresh_block)
    if old is None or fresh is None or _meaning(old.group(1)) != _meaning(fresh.group(1)):
        return fresh_block
    return fresh_block[: fresh.start(1)] + old.group(1) + fresh_block[fresh.end(1) :]


def _permissions_of(creds: str) -> dict[str, Any]:
    """What the user JWT of a ``.creds`` text allows (and whose it is), not who signed when."""
    (_, claims) = _meaning(creds.split("------END NATS USER JWT------", 1)[0])
    (user,) = claims
    return {"iss": user["iss"], "name": user["name"], "nats": user["nats"]}


@dataclass(frozen=True, slots=True)
class Generated:
    """What ``generate`` wrote (or kept) in one folder."""

    trust: Trust
    folder: Path
    server_block: Path
    creds: dict[str, Path]
    runner_issuer: Path
    written: tuple[str, ...]
    """The files (re)written this time; the rest were kept."""


def generate(
    folder: Path,
    namespace: str = "mdq",
    *,
    group_readable: bool = False,
    local_clusters: tuple[str, ...] = (),
) -> Generated:
    """Make or complete one deployment's NATS material in ``folder`` (0700): the trust chain,
    ``nats-auth.conf`` (the server's block: public keys and signed JWTs), one ``.creds`` per
    identity of ``IDENTITIES`` and ``runner-issuer.json`` (both 0600). ``local_clusters``: the
    named local clusters whose buckets the services and agents may use (``mdq up --clusters``).

    Idempotent: an existing trust chain is kept (raises ``TrustMismatch`` if it is another
    namespace's); a file is rewritten only when missing or when what it says changed (the
    permissions of an identity after an upgrade), never merely re-signed, so the Secrets made
    from the folder stay the same. ``group_readable``: 0640 files in a 0750 folder (compose).
    """
    trust = Trust.load_or_create(folder, namespace)
    if trust.namespace != namespace:
        raise TrustMismatch(
            f"{folder} holds the NATS identities of namespace {trust.namespace!r}, not "
            f"{namespace!r}: use another folder (or remove that one)"
        )
    written: list[str] = []

    def keep_or_write(path: Path, fresh: str, same: bool) -> None:
        if not same:
            write_secret(path, fresh, group_readable=group_readable)
            written.append(path.name)
        elif group_readable:
            os.chmod(path, 0o640)

    block = folder / SERVER_BLOCK_FILE
    fresh_block = trust.server_block(load_revocations(folder))
    old_block = block.read_text(encoding="utf-8") if block.exists() else ""
    fresh_block = _keep_operator_jwt(old_block, fresh_block)
    keep_or_write(
        block, fresh_block, bool(old_block) and _meaning(old_block) == _meaning(fresh_block)
    )
    subjects = Subjects(namespace)
    creds: dict[str, Path] = {}
    for identity in IDENTITIES:
        path = folder / f"{identity}{CREDS_SUFFIX}"
        fresh = trust.user_creds(
            service_permissions(identity, subjects, Names(local_clusters=local_clusters))
        )
        same = path.exists() and _permissions_of(
            path.read_text(encoding="utf-8")
        ) == _permissions_of(fresh)
        keep_or_write(path, fresh, same)
        creds[identity] = path
    for tenant_creds in sorted((folder / TENANTS_DIR).glob(f"*{CREDS_SUFFIX}")):
        _move_to_users_account(trust, folder, tenant_creds)
    issuer = folder / RUNNER_ISSUER_FILE
    wanted = runner_issuer(trust)
    keep_or_write(issuer, wanted.text(), issuer.exists() and RunnerIssuer.load(issuer) == wanted)
    os.chmod(folder, 0o750 if group_readable else 0o700)
    return Generated(trust, folder, block, creds, issuer, tuple(written))


def _move_to_users_account(trust: Trust, folder: Path, path: Path) -> None:
    """Reissue a tenant's credentials signed before the users account existed (by the streams
    account, which no one may log in to any more) with the same name and permissions, and
    record the new key: an upgrade keeps every tenant, whose new file must reach it."""
    old = path.read_text(encoding="utf-8")
    if _permissions_of(old)["iss"] == trust.users_public:
        return
    fresh = trust.reissue(old)
    _record_issued(folder, _permissions_of(old)["name"], creds_key(fresh))
    write_secret(path, fresh)


def load_revocations(folder: Path) -> dict[str, int]:
    """The revoked user keys of the deployment in ``folder`` (empty when none)."""
    path = folder / REVOCATIONS_FILE
    if not path.exists():
        return {}
    found = json.loads(path.read_text(encoding="utf-8"))
    return {str(key): int(at) for key, at in found.items()}


def identity_creds_path(folder: Path, identity: str) -> Path:
    """Where ``generate`` or ``mdq tenant add`` keeps ``identity``'s credentials in ``folder``
    (a tenant's identity is ``tenant.<name>``)."""
    if identity.startswith("tenant."):
        return folder / TENANTS_DIR / f"{identity.removeprefix('tenant.')}{CREDS_SUFFIX}"
    return folder / f"{identity}{CREDS_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Rotated:
    """What ``rotate`` did."""

    identity: str
    creds: Path
    revoked_key: str
    server_block: Path


ISSUED_KEYS_SUFFIX = ".keys"
"""Beside a tenant's ``.creds``: the public key of every credentials file ever issued to it
(one per line, nothing secret), so that removing the tenant revokes them all."""


def creds_key(creds: str) -> str:
    """The user public key of a ``.creds`` text (its JWT's subject)."""
    (token,) = _JWT.findall(creds.split("------END NATS USER JWT------", 1)[0])
    return str(decode_claims(token)["sub"])


def issued_keys_path(folder: Path, identity: str) -> Path:
    """Where the keys issued to ``identity`` are listed (``ISSUED_KEYS_SUFFIX``)."""
    return identity_creds_path(folder, identity).with_suffix(ISSUED_KEYS_SUFFIX)


def issued_keys(folder: Path, identity: str) -> list[str]:
    """The keys recorded as issued to ``identity`` (empty: no record)."""
    record = issued_keys_path(folder, identity)
    return record.read_text(encoding="utf-8").split() if record.exists() else []


def _record_issued(folder: Path, identity: str, key: str) -> None:
    write_secret(
        issued_keys_path(folder, identity),
        "".join(f"{each}\n" for each in [*issued_keys(folder, identity), key]),
    )


def issue_recorded(trust: Trust, permissions: Permissions, folder: Path) -> Path:
    """Issue ``permissions.identity``'s credentials into its file in ``folder`` (0600) and add
    their key to its issued keys: what ``mdq tenant add`` does, each time with a fresh key
    (the earlier files stay valid until the identity is removed)."""
    path = identity_creds_path(folder, permissions.identity)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    text = trust.user_creds(permissions)
    _record_issued(folder, permissions.identity, creds_key(text))
    return write_secret(path, text)


def _revoke(folder: Path, keys: list[str], *, group_readable: bool) -> None:
    """Put ``keys`` on the deployment's revocation list from now on (JWTs of a key issued
    before this time are refused; a key is never issued again, so nothing later is caught)."""
    revocations = load_revocations(folder)
    now = int(time.time()) + 1
    for key in keys:
        revocations[key] = max(now, revocations.get(key, 0))
    write_secret(
        folder / REVOCATIONS_FILE,
        json.dumps(revocations, indent=2, sort_keys=True) + "\n",
        group_readable=group_readable,
    )


@dataclass(frozen=True, slots=True)
class Revoked:
    """What ``revoke_identity`` did."""

    identity: str
    revoked_keys: tuple[str, ...]
    server_block: Path


def revoke_identity(
    folder: Path, identity: str, namespace: str = "mdq", *, group_readable: bool = False
) -> Revoked:
    """Revoke every key ever issued to ``identity`` in ``folder`` (its current file's and the
    recorded ones), delete its credentials and the record, and rewrite the server's block with
    the revocations. The server applies it when it reloads its configuration. Nothing to
    revoke (no file, no record): an empty result, the block left as it is."""
    path = identity_creds_path(folder, identity)
    keys = issued_keys(folder, identity)
    if path.exists():
        keys.append(creds_key(path.read_text(encoding="utf-8")))
    keys = sorted(set(keys))
    if keys:
        _revoke(folder, keys, group_readable=group_readable)
        generate(folder, namespace, group_readable=group_readable)  # the block
    path.unlink(missing_ok=True)
    issued_keys_path(folder, identity).unlink(missing_ok=True)
    return Revoked(identity, tuple(keys), folder / SERVER_BLOCK_FILE)


def rotate(
    folder: Path, identity: str, namespace: str = "mdq", *, group_readable: bool = False
) -> Rotated:
    """Replace ``identity``'s credentials in ``folder``: revoke the user key of the current
    file (from now on), issue a new key with the same permissions into the same file, and
    rewrite the server's block with the revocation. The server applies it when it reloads its
    configuration; until then both files work."""
    path = identity_creds_path(folder, identity)
    if not path.exists():
        raise FileNotFoundError(f"no credentials of {identity!r} at {path}")
    trust = Trust.load_or_create(folder, namespace)
    old = path.read_text(encoding="utf-8")
    key = creds_key(old)
    _revoke(folder, [key], group_readable=group_readable)
    fresh = trust.reissue(old)
    if issued_keys_path(folder, identity).exists():  # a tenant's: the record stays complete
        _record_issued(folder, identity, creds_key(fresh))
    write_secret(path, fresh, group_readable=group_readable)
    generate(folder, namespace, group_readable=group_readable)  # the block, with the revocation
    return Rotated(identity, path, key, folder / SERVER_BLOCK_FILE)
