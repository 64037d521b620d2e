"""Rotating one identity's NATS credentials, against a real nats-server that reloads its
configuration: the old file is refused and its live connections closed, the new file works,
every other identity is untouched."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from pathlib import Path

import nats
import nats.errors
import pytest
from typer.testing import CliRunner

from mdq.bus.connect import auth_options, identity_of_creds
from mdq.bus.security.auth import REVOCATIONS_FILE, generate, issue, rotate
from mdq.bus.security.permissions import tenant_permissions
from mdq.bus.subjects import Subjects
from mdq.cli.main import app as cli
from mdq.embedded import EmbeddedNats, nats_config, start_nats
from tests.helpers import wait_for


def reload_with(server: EmbeddedNats, block: str) -> None:
    """Rewrite the server's configuration with ``block`` and have it reload (SIGHUP)."""
    config = server.store_dir / "nats.conf"
    config.write_text(nats_config(port=server.port, store_dir=server.store_dir, auth=block))
    server.process.send_signal(signal.SIGHUP)


async def connects(creds: Path, url: str) -> bool:
    try:
        client = await nats.connect(url, allow_reconnect=False, **auth_options(creds))
    except (nats.errors.Error, OSError):
        return False
    await client.close()
    return True


async def test_a_rotated_identity_reconnects_with_its_new_file_and_the_old_one_is_refused(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "secrets"
    generated = generate(folder)
    issue(generated.trust, tenant_permissions(Subjects(), "alice"), folder / "tenants/alice.creds")
    server = start_nats(tmp_path / "nats", auth=generated.server_block.read_text())
    intake = folder / "intake.creds"
    old = shutil.copy(intake, tmp_path / "old-intake.creds")
    old_alice = shutil.copy(folder / "tenants/alice.creds", tmp_path / "old-alice.creds")
    rotated_client = await nats.connect(server.url, **auth_options(intake))
    other_client = await nats.connect(server.url, **auth_options(folder / "placement.creds"))
    try:
        # The server is up when it accepts connections, but it enables JetStream for the
        # account a moment later; a reload in that moment is overtaken by the start-up's own
        # update of the account, with the old claims (seen under load: the revocation never
        # applied). A rotation on a running deployment comes long after; here the test waits
        # for the account's JetStream, as a deployment's services do before anything else.
        await other_client.jetstream().account_info()
        rotated = [rotate(folder, "intake"), rotate(folder, "tenant.alice")]
        assert intake.read_bytes() != await asyncio.to_thread(Path(old).read_bytes)
        assert identity_of_creds(intake) == "intake"  # same name, same permissions
        revoked = json.loads((folder / REVOCATIONS_FILE).read_text())
        assert set(revoked) == {each.revoked_key for each in rotated}
        assert await connects(Path(old), server.url)  # nothing changes before the reload

        reload_with(server, (folder / "nats-auth.conf").read_text())

        async def old_refused() -> bool:
            return not await connects(Path(old), server.url)

        await wait_for(old_refused, timeout=10, what="the old intake file refused")
        assert not await connects(Path(old_alice), server.url)
        assert await connects(intake, server.url)
        assert await connects(folder / "tenants/alice.creds", server.url)
        assert await connects(folder / "placement.creds", server.url)  # untouched
        # The server closed the rotated identity's live connection for good (nats-py does not
        # retry a revoked user): its process restarts, as a supervisor restarts it, with the
        # new file (above). Every other identity's connection stays.
        assert rotated_client.is_closed and "revoked" in str(rotated_client.last_error)
        await other_client.flush(timeout=5)
        assert other_client.is_connected
    finally:
        await rotated_client.close()
        await other_client.close()
        server.stop()


def test_mdq_credentials_rotate(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    runner = CliRunner()
    assert runner.invoke(cli, ["credentials", "--out", str(folder)]).exit_code == 0
    before = (folder / "watcher.creds").read_text()
    block = (folder / "nats-auth.conf").read_text()
    done = runner.invoke(cli, ["credentials", "--out", str(folder), "--rotate", "watcher"])
    assert done.exit_code == 0, done.output
    assert "rotated watcher" in done.output and "reload" in done.output
    assert (folder / "watcher.creds").read_text() != before
    assert (folder / "nats-auth.conf").read_text() != block  # it carries the revocation
    missing = runner.invoke(cli, ["credentials", "--out", str(folder), "--rotate", "nobody"])
    assert missing.exit_code == 2 and "no credentials" in missing.output


@pytest.mark.parametrize("identity", ["admin", "runners"])
def test_rotating_keeps_the_permissions(tmp_path: Path, identity: str) -> None:
    from mdq.bus.security.auth import _meaning

    folder = tmp_path / "secrets"
    generate(folder)
    path = folder / f"{identity}.creds"

    def permissions() -> dict[str, object]:
        (_, (claims,)) = _meaning(path.read_text().split("------END NATS USER JWT------")[0])
        return {key: value for key, value in claims.items() if key != "sub"}

    before = permissions()
    rotate(folder, identity)
    assert permissions() == before


async def test_a_removed_tenant_is_refused_with_every_file_it_was_given(tmp_path: Path) -> None:
    """``mdq tenant rm``: every credentials file ever issued to the tenant (``add`` twice makes
    two keys) is revoked once the server reloads; its stream and policy are gone; every other
    identity is untouched; it can be added again."""
    from nats.js.errors import KeyNotFoundError, NotFoundError

    from mdq.bus.setup import prepare_bus
    from mdq.tenancy import add_tenant, remove_tenant

    folder = tmp_path / "secrets"
    generated = generate(folder)
    server = start_nats(tmp_path / "nats", auth=generated.server_block.read_text())
    admin = folder / "admin.creds"
    subjects = Subjects("mdq")
    try:
        await prepare_bus(server.url, namespace="mdq", creds=admin)
        given = []
        for round_ in range(2):  # a second add mints a second key; the first stays valid
            added = await add_tenant(
                "alice", secrets=folder, nats_url=server.url, namespace="mdq", admin_creds=admin
            )
            given.append(Path(shutil.copy(added.creds, tmp_path / f"alice-{round_}.creds")))
        assert [await connects(path, server.url) for path in given] == [True, True]

        removed = await remove_tenant(
            "alice", secrets=folder, nats_url=server.url, namespace="mdq", admin_creds=admin
        )
        assert len(removed.revoked_keys) == 2
        assert removed.stream_deleted and removed.policy_deleted
        assert not (folder / "tenants" / "alice.creds").exists()
        reload_with(server, removed.server_block.read_text())

        async def all_refused() -> bool:
            return not any([await connects(path, server.url) for path in given])

        await wait_for(all_refused, timeout=10, what="every file alice was given refused")
        assert await connects(folder / "placement.creds", server.url)
        client = await nats.connect(server.url, **auth_options(admin))
        try:
            js = client.jetstream()
            with pytest.raises(NotFoundError):
                await js.stream_info(subjects.tenant_stream("alice"))
            with pytest.raises(KeyNotFoundError):
                await (await js.key_value(subjects.tenants_bucket)).get("alice")
        finally:
            await client.close()

        again = await remove_tenant(
            "alice", secrets=folder, nats_url=server.url, namespace="mdq", admin_creds=admin
        )
        assert again.revoked_keys == () and not again.stream_deleted and not again.policy_deleted
        back = await add_tenant(
            "alice", secrets=folder, nats_url=server.url, namespace="mdq", admin_creds=admin
        )
        assert await connects(back.creds, server.url)  # a new key: not on the list
    finally:
        server.stop()


async def test_mdq_tenant_rm_on_the_embedded_stack_takes_effect_at_once(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On `mdq up`'s own NATS, `mdq tenant rm` has the server reload (its configuration
    includes nats-auth.conf): the tenant's file is refused with no restart."""
    from mdq.bus.security.auth import nats_secrets_dir
    from mdq.errors import NotFound
    from mdq.stack import Stack

    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("MDQ_NATS_CREDS", raising=False)
    state = tmp_path / "state"
    stack = Stack(state_dir=state, database_url=database_url, services=(), metrics_port=0)
    info = await stack.start()
    try:
        runner = CliRunner()
        base = ["--state-dir", str(state)]
        env = {"COLUMNS": "300", "MDQ_PG_ADMIN_URL": None}
        added = await asyncio.to_thread(
            runner.invoke, cli, [*base, "tenant", "add", "lab"], env=env
        )
        assert added.exit_code == 0, added.output
        given = Path(
            shutil.copy(nats_secrets_dir(state) / "tenants/lab.creds", tmp_path / "lab.creds")
        )
        assert await connects(given, info.nats_url)
        removed = await asyncio.to_thread(
            runner.invoke, cli, [*base, "tenant", "rm", "lab"], env=env
        )
        assert removed.exit_code == 0, removed.output
        assert "1 key(s) revoked" in removed.output and "reloaded" in removed.output
        for gone in ("lab", "nosuch"):  # removed already, or never there: nothing to remove
            again = await asyncio.to_thread(
                runner.invoke, cli, [*base, "tenant", "rm", gone], env=env
            )
            assert again.exit_code == NotFound.exit_code, again.output
            assert f"no tenant {gone}: nothing to remove" in again.output
            assert "dropped" not in again.output

        async def refused() -> bool:
            return not await connects(given, info.nats_url)

        await wait_for(refused, timeout=10, what="the removed tenant's file refused")
        assert await connects(nats_secrets_dir(state) / "placement.creds", info.nats_url)
    finally:
        await stack.stop()
