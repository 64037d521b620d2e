"""Tenants' names and ids (``mdq.core.tenants``, ``mdq.core.ids``), by tables of named cases."""

from __future__ import annotations

import hashlib

import pytest

from mdq.bus.security.permissions import IDENTITIES, inbox_prefix, tenant_identity
from mdq.core import ids
from mdq.core.tenants import RESERVED, TenantNameError, validate_tenant_name

OPERATOR_REQUEST = ids.request_id_for_key("run-1")
ALICE_REQUEST = ids.request_id_for_key("run-1", "alice")


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        pytest.param("alice", True, id="plain"),
        pytest.param("lab-7", True, id="digits-and-dash"),
        pytest.param("a" * 31, True, id="longest"),
        pytest.param("a" * 32, False, id="too-long"),
        pytest.param("Alice", False, id="upper-case"),
        pytest.param("7lab", False, id="starts-with-a-digit"),
        pytest.param("al.ice", False, id="a-dot-would-split-the-subject-token"),
        pytest.param("al*", False, id="a-wildcard"),
        pytest.param("", False, id="empty"),
        pytest.param("intake", False, id="a-service-identity"),
        pytest.param("tenant", False, id="the-tenants-identity-prefix"),
        pytest.param("abcdef012345-x", False, id="looks-like-a-job-id"),
    ],
)
def test_tenant_names(name: str, valid: bool) -> None:
    if valid:
        assert validate_tenant_name(name) == name
    else:
        with pytest.raises(TenantNameError):
            validate_tenant_name(name)


@pytest.mark.parametrize(
    ("given", "tenant", "name", "request_id"),
    [
        pytest.param(f"{OPERATOR_REQUEST}-md", "", "md", OPERATOR_REQUEST, id="operator-job"),
        pytest.param(f"{ALICE_REQUEST}-md", "alice", "md", ALICE_REQUEST, id="tenant-job"),
        pytest.param(
            f"{ALICE_REQUEST}-a-b-c", "alice", "a-b-c", ALICE_REQUEST, id="dashes-in-the-name"
        ),
        pytest.param(ALICE_REQUEST, "alice", "", ALICE_REQUEST, id="a-request-id"),
    ],
)
def test_what_a_job_id_says(given: str, tenant: str, name: str, request_id: str) -> None:
    assert ids.tenant_of(given) == tenant
    assert ids.request_id_of(given) == request_id
    if name:
        assert ids.job_name_of(given) == name


def test_the_operators_ids_are_those_of_a_year_of_history() -> None:
    """Tenants change nothing for the operator's submits: the same key, the same ids."""
    assert ids.request_id_for_key("run-1") == hashlib.sha256(b"key:run-1").hexdigest()[:12]
    assert ids.request_id_for_sequence(7) == hashlib.sha256(b"seq:7").hexdigest()[:12]


@pytest.mark.parametrize(
    ("request_id", "prefix"),
    [
        pytest.param(ids.request_id_for_key("run-1", "alice"), "alice.", id="tenant-key"),
        pytest.param(ids.request_id_for_sequence(7, "bob"), "bob.", id="tenant-sequence"),
    ],
)
def test_a_tenants_request_id_starts_with_it(request_id: str, prefix: str) -> None:
    assert request_id.startswith(prefix) and len(request_id) == len(prefix) + 12


def test_keys_are_per_tenant() -> None:
    assert len({ids.request_id_for_key("k", tenant) for tenant in ("", "alice", "bob")}) == 3
    hex_parts = {ids.request_id_for_key("k", t).split(".")[-1] for t in ("", "alice", "bob")}
    assert len(hex_parts) == 3  # not merely a prefix on the same digest


def test_a_tenants_pod_name_is_a_dns_label() -> None:
    name = ids.pod_name(f"{ALICE_REQUEST}-md", 2)
    assert name == f"mdq-alice-{ALICE_REQUEST.split('.')[1]}-md-2"
    assert "." not in name


def test_no_tenant_is_named_after_an_identity() -> None:
    assert set(IDENTITIES) <= RESERVED


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_identitys_inbox_holds_a_tenants_runner_inbox(identity: str) -> None:
    """A tenant's runner (identity = its job id) listens on ``_INBOX_<tenant>.<job>``; an
    identity's ``_INBOX_<identity>.>`` must never cover it, for any tenant allowed."""
    runner = inbox_prefix(f"{ids.request_id_for_key('k', 'somebody')}-md")
    tenant = inbox_prefix(tenant_identity("somebody"))
    own = inbox_prefix(identity) + "."
    assert not runner.startswith(own) and not tenant.startswith(own)
    for reserved in RESERVED:
        with pytest.raises(TenantNameError):
            validate_tenant_name(reserved)
