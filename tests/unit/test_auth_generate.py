"""The one generator of a deployment's NATS material (``mdq.bus.security.auth.generate``): what it
writes, with which modes, and that running it again keeps what is there (idempotent), rewriting only
what is missing or says something else."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mdq.bus.connect import identity_of_creds
from mdq.bus.security.auth import (
    RUNNER_ISSUER_FILE,
    SERVER_BLOCK_FILE,
    TRUST_FILE,
    RunnerIssuer,
    Trust,
    TrustMismatch,
    creds_key,
    ensure_token_file,
    generate,
    identity_creds_path,
    issue,
    issue_recorded,
    issued_keys,
    write_secret,
)
from mdq.bus.security.claims import decode_claims
from mdq.bus.security.permissions import IDENTITIES, service_permissions, tenant_permissions
from mdq.bus.subjects import Subjects
from mdq.cli.main import app


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_it_writes_the_server_block_every_identity_and_the_runner_issuer(tmp_path: Path) -> None:
    folder = tmp_path / "nats"
    generated = generate(folder, "mdq")
    names = {p.name for p in folder.iterdir()}
    assert names == {
        TRUST_FILE,
        SERVER_BLOCK_FILE,
        RUNNER_ISSUER_FILE,
        *(f"{identity}.creds" for identity in IDENTITIES),
    }
    assert mode(folder) == 0o700
    assert {mode(folder / name) for name in names} == {0o600}
    for identity, path in generated.creds.items():
        assert identity_of_creds(path) == identity
    trust = Trust.load_or_create(folder)
    assert generated.trust == trust
    block = (folder / SERVER_BLOCK_FILE).read_text()
    assert trust.operator_public in block or trust.system_public in block
    seeds = (trust.operator_seed, trust.account_seed, trust.users_seed, trust.runner_signing_seed)
    assert not [seed for seed in seeds if seed in block]  # public only
    assert RunnerIssuer.load(folder / RUNNER_ISSUER_FILE).account_public == trust.users_public


def test_running_it_again_keeps_everything_and_fills_in_what_is_missing(tmp_path: Path) -> None:
    folder = tmp_path / "nats"
    generate(folder, "mdq")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    again = generate(folder, "mdq")
    assert again.written == ()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    (folder / "intake.creds").unlink()
    (folder / SERVER_BLOCK_FILE).unlink()
    third = generate(folder, "mdq")
    assert set(third.written) == {"intake.creds", SERVER_BLOCK_FILE}
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert {name for name in after if after[name] != before[name]} <= set(third.written)
    assert after["intake.creds"] != before["intake.creds"]  # a new key


def test_credentials_whose_permissions_changed_are_issued_again(tmp_path: Path) -> None:
    folder = tmp_path / "nats"
    generated = generate(folder, "mdq")
    # A file that no longer says what intake may do (here: metrics' permissions), same trust.
    stale = generated.trust.user_creds(service_permissions("metrics", Subjects("mdq")))
    (folder / "intake.creds").write_text(stale)
    assert generate(folder, "mdq").written == ("intake.creds",)
    assert identity_of_creds(folder / "intake.creds") == "intake"


def test_another_namespaces_folder_is_refused(tmp_path: Path) -> None:
    generate(tmp_path / "nats", "mdq")
    with pytest.raises(TrustMismatch, match="'mdq', not 'other'"):
        generate(tmp_path / "nats", "other")


def test_group_readable_for_compose(tmp_path: Path) -> None:
    folder = tmp_path / "nats"
    generate(folder, "mdq", group_readable=True)
    assert mode(folder) == 0o750
    assert mode(folder / "intake.creds") == 0o640
    assert mode(folder / TRUST_FILE) == 0o600  # the operator's seeds: never the group's


def test_mdq_credentials_is_the_generator(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    first = CliRunner().invoke(app, ["credentials", "--out", str(folder)])
    assert first.exit_code == 0, first.output
    assert "wrote nats-auth.conf" in first.output
    second = CliRunner().invoke(app, ["credentials", "--out", str(folder)])
    assert "nothing (all kept)" in second.output
    refused = CliRunner().invoke(app, ["credentials", "--out", str(folder), "--namespace", "x"])
    assert refused.exit_code == 2


def test_a_rotation_keeps_the_operator_jwt_the_server_started_with(tmp_path: Path) -> None:
    """nats-server refuses to reload a configuration whose operator JWT changed ("config
    reload not supported for TrustedOperators"), so the block a rotation rewrites must keep
    it, though it is signed again a second or more later (seen: the revocation never took
    effect)."""
    import re
    import time

    from mdq.bus.security.auth import SERVER_BLOCK_FILE, generate, rotate

    folder = tmp_path / "secrets"
    generate(folder)
    before = (folder / SERVER_BLOCK_FILE).read_text()
    time.sleep(1.1)  # the next signing is in another second: another iat, another JWT
    rotate(folder, "intake")
    after = (folder / SERVER_BLOCK_FILE).read_text()
    operator = re.compile(r'^operator: "([^"]+)"$', re.MULTILINE)
    assert operator.findall(after) == operator.findall(before) != []
    assert after != before, "the account JWT carries the revocation"


def test_removing_a_tenant_revokes_every_key_it_was_given_rotations_included(
    tmp_path: Path,
) -> None:
    from mdq.bus.security.auth import (
        Trust,
        creds_key,
        identity_creds_path,
        issue_recorded,
        load_revocations,
        revoke_identity,
        rotate,
    )
    from mdq.bus.security.permissions import tenant_permissions
    from mdq.bus.subjects import Subjects

    folder = tmp_path / "secrets"
    generate(folder)
    trust = Trust.load_or_create(folder)
    path = identity_creds_path(folder, "tenant.alice")
    given = []
    # `mdq tenant add`, a rotation, `mdq tenant add` again: the rotated file is no longer the
    # current one, and still valid, so only the record names it
    issue_recorded(trust, tenant_permissions(Subjects(), "alice"), folder)
    given.append(creds_key(path.read_text()))
    rotate(folder, "tenant.alice")
    given.append(creds_key(path.read_text()))
    issue_recorded(trust, tenant_permissions(Subjects(), "alice"), folder)
    given.append(creds_key(path.read_text()))

    removed = revoke_identity(folder, "tenant.alice")

    assert sorted(removed.revoked_keys) == sorted(given) and len(set(given)) == 3
    assert set(given) <= set(load_revocations(folder))
    assert not path.exists() and revoke_identity(folder, "tenant.alice").revoked_keys == ()


def test_a_trust_chain_from_before_the_users_account_is_upgraded_in_place(tmp_path: Path) -> None:
    """A deployment made when every identity logged in to the streams account: its chain keeps
    its keys and gains a users account; the services' and the tenants' credentials are
    reissued from it (same names and permissions), each new tenant key recorded for removal."""
    folder = tmp_path / "nats"
    first = generate(folder)
    document = json.loads((folder / TRUST_FILE).read_text())
    del document["users_seed"]
    write_secret(folder / TRUST_FILE, json.dumps(document))
    old_trust = first.trust
    streams_signed = replace(old_trust, users_seed=old_trust.account_seed)  # the old signer
    tenant = tenant_permissions(Subjects(), "alice")
    issue_recorded(streams_signed, tenant, folder)
    for identity in IDENTITIES:
        issue(
            streams_signed, service_permissions(identity, Subjects()), folder / f"{identity}.creds"
        )

    again = generate(folder)

    trust = again.trust
    assert trust.users_seed and trust.users_seed != old_trust.account_seed
    assert (trust.operator_seed, trust.account_seed) == (
        old_trust.operator_seed,
        old_trust.account_seed,
    )
    assert json.loads((folder / TRUST_FILE).read_text())["users_seed"] == trust.users_seed
    alice = identity_creds_path(folder, tenant.identity)
    for path in [alice, *again.creds.values()]:
        claims = decode_claims(path.read_text().split("\n")[1])
        assert claims["iss"] == trust.users_public, path.name
    assert decode_claims(alice.read_text().split("\n")[1])["name"] == "tenant.alice"
    assert creds_key(alice.read_text()) in issued_keys(folder, tenant.identity)


@pytest.mark.parametrize(("group_readable", "file_mode"), [(False, 0o600), (True, 0o640)])
def test_a_token_file_is_made_once_private_and_kept(
    tmp_path: Path, group_readable: bool, file_mode: int
) -> None:
    path = tmp_path / "secrets" / "console.token"
    ensure_token_file(path, group_readable=group_readable)
    token = path.read_text().strip()
    assert len(token) >= 43  # 256 bits, URL-safe
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    ensure_token_file(path, group_readable=group_readable)
    assert path.read_text().strip() == token, "a link that holds it keeps working"
    other = tmp_path / "other.token"
    assert ensure_token_file(other).read_text().strip() != token
