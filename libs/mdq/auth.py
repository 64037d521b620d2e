"""NATS identities: the trust chain, the credentials of each identity, the server's half.

NATS's decentralized authentication (JWTs signed with nkeys, Ed25519): an *operator* signs the
*accounts*, an account signs its *users*; the server trusts the operator and preloads the
account JWTs, so a user proves who it is with a JWT plus a signature made with its own seed,
and the server enforces the permissions written into that JWT. Nothing secret lives in the
server's configuration (public keys and signed JWTs only), and a user can be issued at any
time without touching the server: how each runner gets credentials for its own attempt.

``Trust`` holds the operator and account keys (``<state>/secrets/nats/trust.json``, 0600);
``issue`` writes one identity's ``.creds`` file (0600) with the permissions of
``mdq.bus.permissions``; ``server_block`` is the configuration the server needs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.signing
import nkeys

from mdq.bus.permissions import Permissions, runner_permissions
from mdq.bus.subjects import Subjects

SECRETS_DIR = "secrets"
NATS_SECRETS = "nats"
TRUST_FILE = "trust.json"

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


def decode_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: for reading what a credential allows)."""
    body = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return claims


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by its owner only (0600, in a 0700 folder),
    replacing it atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    partial = path.with_name(path.name + ".partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    return path


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
    """The operator, the system account, mdq's account and its runner signing key: their seeds
    and signed JWTs, for one namespace."""

    operator_seed: str
    system_seed: str
    account_seed: str
    runner_signing_seed: str
    """A signing key of the account scoped to the runner template: what it signs can publish
    one job's progress, checkpoints and outputs, whatever the JWT says. The node agent holds
    it (``runner_issuer``), never the account key."""
    namespace: str = "mdq"

    @classmethod
    def generate(cls, namespace: str = "mdq") -> Trust:
        return cls(
            operator_seed=_seed(_new_key(nkeys.PREFIX_BYTE_OPERATOR)),
            system_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            account_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            runner_signing_seed=_seed(_new_key(nkeys.PREFIX_BYTE_ACCOUNT)),
            namespace=namespace,
        )

    @classmethod
    def load_or_create(cls, folder: Path, namespace: str = "mdq") -> Trust:
        """The trust chain kept in ``folder`` (created, 0600, on first use)."""
        path = folder / TRUST_FILE
        if path.exists():
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        trust = cls.generate(namespace)
        document = {
            "operator_seed": trust.operator_seed,
            "system_seed": trust.system_seed,
            "account_seed": trust.account_seed,
            "runner_signing_seed": trust.runner_signing_seed,
            "namespace": trust.namespace,
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
        return _public(_from_seed(self.account_seed))

    def operator_jwt(self) -> str:
        operator = _from_seed(self.operator_seed)
        claims = {
            "iss": _public(operator),
            "sub": _public(operator),
            "name": "mdq",
            "nats": {"type": "operator", "version": 2, "system_account": self.system_public},
        }
        return encode_jwt(claims, operator)

    def account_jwts(self) -> dict[str, str]:
        """Account public key -> its JWT (the system account and mdq's, JetStream on)."""
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
        account = {
            "iss": _public(operator),
            "sub": self.account_public,
            "name": "MDQ",
            "nats": {
                "type": "account",
                "version": 2,
                "limits": {**_UNLIMITED, **_JETSTREAM},
                "signing_keys": [runner_scope],
            },
        }
        return {
            self.system_public: encode_jwt(system, operator),
            self.account_public: encode_jwt(account, operator),
        }

    def user_creds(self, permissions: Permissions, *, expires_s: float | None = None) -> str:
        """The ``.creds`` text of a new user with ``permissions`` (a fresh key each time)."""
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        nats: dict[str, Any] = {
            "type": "user",
            "version": 2,
            "pub": {"allow": list(permissions.publish)},
            "sub": {"allow": list(permissions.subscribe)},
            "subs": -1,
            "data": -1,
            "payload": -1,
        }
        if permissions.respond:
            nats["resp"] = {"max": 1, "ttl": 0}
        claims: dict[str, Any] = {
            "iss": self.account_public,
            "sub": _public(user),
            "name": permissions.identity,
            "nats": nats,
        }
        if expires_s is not None:
            claims["exp"] = int(time.time() + expires_s)
        return creds_text(encode_jwt(claims, _from_seed(self.account_seed)), _seed(user))

    def server_block(self) -> str:
        """The nats-server configuration that trusts this chain (public material only)."""
        preload = "\n".join(f'  {key}: "{jwt}"' for key, jwt in self.account_jwts().items())
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

    @classmethod
    def load(cls, path: Path) -> RunnerIssuer:
        document = json.loads(path.read_text(encoding="utf-8"))
        return cls(document["signing_seed"], document["account_public"])

    def save(self, path: Path) -> Path:
        document = {"signing_seed": self.signing_seed, "account_public": self.account_public}
        return write_secret(path, json.dumps(document, indent=2) + "\n")

    def creds(self, job_id: str) -> str:
        """Credentials for the runners of ``job_id``: the server gives them the runner
        template with this job id filled in, and nothing else."""
        user = _new_key(nkeys.PREFIX_BYTE_USER)
        claims = {
            "iss": _public(_from_seed(self.signing_seed)),
            "sub": _public(user),
            "name": job_id,
            "nats": {"type": "user", "version": 2, "issuer_account": self.account_public},
        }
        return creds_text(encode_jwt(claims, _from_seed(self.signing_seed)), _seed(user))


def runner_issuer(trust: Trust) -> RunnerIssuer:
    """The runner-credential issuer of ``trust`` (for the node agent)."""
    return RunnerIssuer(trust.runner_signing_seed, trust.account_public)


def issue(trust: Trust, permissions: Permissions, path: Path) -> Path:
    """Write the credentials of ``permissions.identity`` to ``path`` (0600)."""
    return write_secret(path, trust.user_creds(permissions))


def nats_secrets_dir(state_dir: Path) -> Path:
    """Where ``mdq up`` keeps the NATS trust chain and every identity's credentials."""
    return state_dir / SECRETS_DIR / NATS_SECRETS


def creds_path(state_dir: Path, identity: str) -> Path:
    """The credentials file of ``identity`` under ``state_dir``."""
    return nats_secrets_dir(state_dir) / f"{identity}.creds"
