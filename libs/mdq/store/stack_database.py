"""The database side of ``mdq up``: generated passwords, the roles, and one URL per process.

``load_or_create_passwords`` makes (once) and reads the superuser's and each role's password
under ``<state>/secrets/postgres/``; ``prepare`` makes the roles with the administrator's URL and
returns where each role connects; tenants' passwords are kept beside them
(``load_or_create_tenant_password``).

Where each password is and who gets which URL: docs/security.md, "Where the passwords are" and
"Tenants in PostgreSQL".
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from mdq.store.roles import (
    DEFAULT_PREFIX,
    ENV_PREFIX,
    PASSWORD_BYTES,
    RoleNames,
    RolePasswords,
    RoleUrls,
    role_urls,
    setup_database,
    without_password,
)

SECRETS_DIR = "secrets"
POSTGRES_SECRETS = "postgres"
ADMIN_FILE = "admin.password"
ROLE_FILES = ("owner.password", "writer.password", "reader.password")
TENANTS_DIR = "tenants"
"""Where, in ``<state>/secrets/postgres/``, ``mdq tenant add`` keeps each tenant's password
(``<name>.password``), for the operator to hand over."""
EMBEDDED_SUPERUSER = "postgres"
"""The superuser of the embedded server (pgserver's), whose password is ``ADMIN_FILE``."""
SECRET_DIR_MODE = 0o700
SECRET_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (created, or tightened, to 0700)."""
    path.mkdir(mode=SECRET_DIR_MODE, parents=True, exist_ok=True)
    path.chmod(SECRET_DIR_MODE)
    return path


def read_or_create_secret(path: Path, make: str) -> str:
    """The secret in ``path``; when there is none yet, ``make`` written there first (0600,
    created exclusively, so two starts at once agree on one value)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
    except FileExistsError:
        path.chmod(SECRET_FILE_MODE)
        value = path.read_text(encoding="utf-8").strip()
        if not value:
            raise RuntimeError(f"{path} is empty: remove it to have a new secret made") from None
        return value
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(make + "\n")
    return make


@dataclass(frozen=True, slots=True)
class StackSecrets:
    """The passwords of one stack's PostgreSQL, and where they are."""

    folder: Path
    admin: str
    """The embedded server's superuser (unused when the user gives DATABASE_URL)."""
    roles: RolePasswords

    @property
    def reader_file(self) -> Path:
        return self.folder / ROLE_FILES[2]


def load_or_create_passwords(state_dir: Path) -> StackSecrets:
    """Read the stack's database passwords, making the missing ones (see the module doc)."""
    folder = postgres_secrets_dir(state_dir)
    generated = RolePasswords.generate()
    fresh = (generated.owner, generated.writer, generated.reader)
    admin = read_or_create_secret(folder / ADMIN_FILE, RolePasswords.generate().owner)
    roles = [
        read_or_create_secret(folder / name, new)
        for name, new in zip(ROLE_FILES, fresh, strict=True)
    ]
    return StackSecrets(folder=folder, admin=admin, roles=RolePasswords(*roles))


def postgres_secrets_dir(state_dir: Path) -> Path:
    """``<state>/secrets/postgres/`` (made, or tightened, to 0700 with its parent)."""
    private_dir(state_dir / SECRETS_DIR)
    return private_dir(state_dir / SECRETS_DIR / POSTGRES_SECRETS)


def tenant_password_file(state_dir: Path, tenant: str) -> Path:
    """Where the PostgreSQL password of ``tenant`` is kept."""
    return state_dir / SECRETS_DIR / POSTGRES_SECRETS / TENANTS_DIR / f"{tenant}.password"


def load_or_create_tenant_password(state_dir: Path, tenant: str) -> tuple[Path, str]:
    """The file and the password of ``tenant``'s login; made (0600, folders 0700) the first
    time, the same afterwards."""
    private_dir(postgres_secrets_dir(state_dir) / TENANTS_DIR)
    path = tenant_password_file(state_dir, tenant)
    return path, read_or_create_secret(path, secrets.token_urlsafe(PASSWORD_BYTES))


@dataclass(frozen=True, slots=True)
class StackDatabase:
    """Where each role of the stack's database connects."""

    urls: RoleUrls
    reader_password_file: Path

    @property
    def reader_url(self) -> str:
        """The reader's URL without its password (stack.json)."""
        return without_password(self.urls.reader)


def role_names_from_env() -> RoleNames:
    """``MDQ_DB_ROLE_PREFIX`` (default ``mdq``) as role names."""
    return RoleNames.with_prefix(os.environ.get(ENV_PREFIX) or DEFAULT_PREFIX)


def prepare(admin_url: str, stack_secrets: StackSecrets, names: RoleNames) -> StackDatabase:
    """Provision the roles with the stack's passwords, migrate as the owner, grant; return
    each role's URL on ``admin_url``'s server and database. Blocking (run it in a thread)."""
    urls = role_urls(admin_url, names, stack_secrets.roles)
    setup_database(
        admin_url=admin_url, owner_url=urls.owner, names=names, passwords=stack_secrets.roles
    )
    return StackDatabase(urls=urls, reader_password_file=stack_secrets.reader_file)
