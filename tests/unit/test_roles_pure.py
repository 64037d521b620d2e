"""The pure parts of ``mdq.store.roles`` and ``mdq.store.stack_database``: URLs per role, role
names, the grant table, the deployments' environment, and the secret files' modes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mdq.store.roles import (
    RELATIONS,
    TENANT_ROWS,
    Access,
    RoleError,
    RoleNames,
    RolePasswords,
    grant_statements,
    provision_statements,
    role_url,
    settings_from_env,
    tenant_statements,
    without_password,
)
from mdq.store.stack_database import load_or_create_passwords

ROLE_URLS = {
    "tcp, user and password replaced": (
        "postgresql://mdq:old@db:5432/mdq",
        ("mdq_reader", "s3cr-t_"),
        "postgresql://mdq_reader:s3cr-t_@db:5432/mdq",
    ),
    "unix socket query kept": (
        "postgresql://postgres:pw@/mdq?host=/tmp/pg%20dir",
        ("mdq_writer", "x"),
        "postgresql://mdq_writer:x@/mdq?host=/tmp/pg%20dir",
    ),
    "no user before": (
        "postgresql://db/mdq",
        ("mdq_owner", "p"),
        "postgresql://mdq_owner:p@db/mdq",
    ),
    "no password": (
        "postgresql://a:b@db/mdq",
        ("mdq_reader", None),
        "postgresql://mdq_reader@db/mdq",
    ),
    "odd characters quoted": (
        "postgresql://db/mdq",
        ("u", "a@b:c/d"),
        "postgresql://u:a%40b%3Ac%2Fd@db/mdq",
    ),
}


@pytest.mark.parametrize("url,role,expected", ROLE_URLS.values(), ids=ROLE_URLS.keys())
def test_role_url(url: str, role: tuple[str, str | None], expected: str) -> None:
    assert role_url(url, user=role[0], password=role[1]) == expected


def test_without_password_keeps_everything_else() -> None:
    url = "postgresql://mdq_reader:pw@/mdq?host=/s"
    assert without_password(url) == "postgresql://mdq_reader@/mdq?host=/s"
    assert without_password("postgresql://u@h/d") == "postgresql://u@h/d"


@pytest.mark.parametrize("prefix", ["", "Mdq", "1mdq", "mdq-x", 'mdq"; DROP', "m" * 42])
def test_a_bad_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(RoleError):
        RoleNames.with_prefix(prefix)


def test_the_writer_is_never_granted_delete_truncate_or_ddl() -> None:
    """Nor DELETE, but on the queue of its own pending work (``progress_unfolded``)."""
    statements = grant_statements(RoleNames.with_prefix("mdq"), RELATIONS)
    granted = [s for s in statements if s.startswith("GRANT")]
    privileges = [s.split(" ON ")[0] for s in granted if "progress_unfolded" not in s]
    assert not [
        p for p in privileges if any(w in p for w in ("DELETE", "TRUNCATE", "CREATE", "ALL"))
    ]
    assert 'GRANT SELECT, INSERT, DELETE ON public."progress_unfolded" TO "mdq_writer"' in granted
    assert not [s for s in granted if "alembic_version" in s]
    to_reader = [s for s in granted if s.endswith('"mdq_reader"') and " ON public." in s]
    assert all(s.startswith("GRANT SELECT ON") for s in to_reader)
    readable = [n for n, a in RELATIONS.items() if a is not Access.OWNER_ONLY]
    assert len(to_reader) == len(readable)


def test_grants_name_only_relations_that_exist() -> None:
    statements = grant_statements(RoleNames.with_prefix("mdq"), {"jobs"})
    assert [s for s in statements if " ON public." in s] == [
        'GRANT SELECT ON public."jobs" TO "mdq_reader"',
        'GRANT SELECT, INSERT, UPDATE ON public."jobs" TO "mdq_writer"',
    ]


def test_provisioning_quotes_passwords_and_makes_no_superuser() -> None:
    statements = provision_statements(RoleNames.with_prefix("mdq"), RolePasswords("a'b", "w", "r"))
    assert any("PASSWORD 'a''b'" in s for s in statements)
    assert all("NOSUPERUSER NOCREATEDB NOCREATEROLE" in s for s in statements if "LOGIN" in s)
    with pytest.raises(RoleError):
        provision_statements(RoleNames.with_prefix("mdq"), RolePasswords("", "w", "r"))


PASSWORDS = {
    "MDQ_PG_OWNER_PASSWORD": "o",
    "MDQ_PG_WRITER_PASSWORD": "w",
    "MDQ_PG_READER_PASSWORD": "r",
}


def test_the_migration_job_provisions_with_the_administrator() -> None:
    env = {"MDQ_PG_ADMIN_URL": "postgresql://mdq@postgres:5432/mdq", "MDQ_PG_ADMIN_PASSWORD": "a"}
    admin, owner, names, passwords = settings_from_env({**env, **PASSWORDS})
    assert admin == "postgresql://mdq:a@postgres:5432/mdq"
    assert owner == "postgresql://mdq_owner:o@postgres:5432/mdq"
    assert passwords == RolePasswords("o", "w", "r") and names.writer == "mdq_writer"
    with pytest.raises(RoleError, match="MDQ_PG_READER_PASSWORD"):
        settings_from_env({**env, **PASSWORDS, "MDQ_PG_READER_PASSWORD": ""})


def test_without_an_administrator_database_url_is_the_owners() -> None:
    env = {"DATABASE_URL": "postgresql://mdq_owner@db/mdq", "MDQ_PG_OWNER_PASSWORD": "o"}
    assert settings_from_env(env)[:2] == (None, "postgresql://mdq_owner:o@db/mdq")
    with pytest.raises(RoleError):
        settings_from_env({})


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_stack_passwords_are_private_files_made_once(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir(mode=0o755)  # made loose by someone else: tightened
    first = load_or_create_passwords(tmp_path)
    folder = tmp_path / "secrets" / "postgres"
    assert _mode(tmp_path / "secrets") == 0o700 and _mode(folder) == 0o700
    assert {p.name: _mode(p) for p in folder.iterdir()} == {
        name: 0o600
        for name in ("admin.password", "owner.password", "writer.password", "reader.password")
    }
    (folder / "reader.password").chmod(0o644)
    again = load_or_create_passwords(tmp_path)
    assert again == first and _mode(folder / "reader.password") == 0o600
    assert len({first.admin, first.roles.owner, first.roles.writer, first.roles.reader}) == 4


# -- tenants -------------------------------------------------------------------------------------
def test_only_the_writer_bypasses_row_security_and_the_group_cannot_log_in() -> None:
    names = RoleNames.with_prefix("mdq")
    statements = provision_statements(names, RolePasswords("o", "w", "r"))
    altered = {s.split()[2]: s for s in statements if s.startswith("ALTER ROLE")}
    assert " BYPASSRLS " in altered['"mdq_writer"']
    assert all(" NOBYPASSRLS " in altered[f'"{n}"'] for n in ("mdq_owner", "mdq_reader"))
    assert " NOLOGIN " in altered['"mdq_tenants"'] and " NOBYPASSRLS " in altered['"mdq_tenants"']


TENANT_ROLE_NAMES = {
    "plain": ("mdq", "alice", "mdq_tenant_alice"),
    "dash kept": ("mdq", "lab-7", "mdq_tenant_lab-7"),
    "other prefix": ("t0a1b2c3d4e", "x", "t0a1b2c3d4e_tenant_x"),
}


@pytest.mark.parametrize(
    "prefix,tenant,role", TENANT_ROLE_NAMES.values(), ids=TENANT_ROLE_NAMES.keys()
)
def test_tenant_role_names(prefix: str, tenant: str, role: str) -> None:
    names = RoleNames.with_prefix(prefix)
    assert names.tenant(tenant) == role and names.prefix == prefix


def test_a_tenant_role_name_postgresql_would_cut_is_refused() -> None:
    assert len(RoleNames.with_prefix("m" * 24).tenant("a" * 31)) == 63
    with pytest.raises(RoleError):
        RoleNames.with_prefix("m" * 25).tenant("a" * 31)


def test_tenant_logins_are_quoted_and_bad_names_refused() -> None:
    statements = tenant_statements(RoleNames.with_prefix("mdq"), "lab-7", "p'w")
    assert statements[-1] == 'GRANT "mdq_tenants" TO "mdq_tenant_lab-7"'
    assert "PASSWORD 'p''w'" in statements[1] and " NOBYPASSRLS " in statements[1]
    assert "NOSUPERUSER NOCREATEDB NOCREATEROLE" in statements[1]
    for bad in ("Alice", "a_b", 'x"; DROP', "intake"):
        with pytest.raises(ValueError):
            tenant_statements(RoleNames.with_prefix("mdq"), bad, "pw")


def _tenant_grants(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("GRANT") and s.endswith('"mdq_tenants"')]


def test_tenants_get_only_secured_relations_of_their_rows_and_the_views() -> None:
    names = RoleNames.with_prefix("mdq")
    everything = set(RELATIONS)
    statements = grant_statements(names, everything, secured=everything, tenants=True)
    granted = {s.split('"')[1] for s in _tenant_grants(statements) if " ON public." in s}
    views = {n for n, a in RELATIONS.items() if a is Access.READ}
    assert granted == set(TENANT_ROWS) | views  # not consumer_offsets, alembic_version
    assert all(s.startswith("GRANT SELECT ON") for s in _tenant_grants(statements)[1:])
    policies = [s for s in statements if s.startswith("CREATE POLICY")]
    assert len(policies) == 2 * len(TENANT_ROWS)
    readers = [s for s in policies if s.startswith("CREATE POLICY reader_rows")]
    assert len(readers) == len(TENANT_ROWS)
    assert all(s.endswith('TO "mdq_reader" USING (true)') for s in readers)


def test_tenants_get_nothing_that_is_not_secured_or_without_their_group() -> None:
    names = RoleNames.with_prefix("mdq")
    unsecured = grant_statements(names, set(RELATIONS), secured={"events"}, tenants=True)
    assert [s for s in _tenant_grants(unsecured) if " ON public." in s] == [
        'GRANT SELECT ON public."events" TO "mdq_tenants"'
    ]
    assert not [s for s in unsecured if "POLICY" in s]
    no_group = grant_statements(names, set(RELATIONS), secured=set(RELATIONS))
    assert not [s for s in no_group if "mdq_tenants" in s]
