"""The tenants KV bucket: each tenant's ``TenantPolicy``, read live by the services.

The bucket is ``<namespace>_tenants``, one key per tenant holding its policy's JSON. Only the
admin writes and creates it (``put_policy``, ``remove_policy``, ``ensure_tenants_bucket``);
services read it through ``TenantDirectory``, a watch answering ``policy(tenant)`` from memory,
``DEFAULT_POLICY`` when there is none. Design: docs/placement.md, "Tenant quotas".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from mdq.bus.kv import watch_through
from mdq.bus.outage import warn_try_failed
from mdq.bus.streams import open_bucket
from mdq.bus.subjects import Subjects
from mdq.core.tenants import (
    DEFAULT_POLICY,
    USAGE_KEY_PREFIX,
    TenantPolicy,
    TenantUsage,
    validate_tenant_name,
)

log = logging.getLogger("mdq.bus.tenants")

TENANTS_HISTORY = 5
"""Policies kept per tenant (the latest and the ones before, for ``nats kv history``)."""


async def ensure_tenants_bucket(
    js: JetStreamContext, subjects: Subjects, *, replicas: int = 1
) -> KeyValue:
    """Create (idempotently) and open the tenants bucket; the admin's setup does this."""
    return await open_bucket(
        js,
        KeyValueConfig(
            bucket=subjects.tenants_bucket,
            history=TENANTS_HISTORY,
            storage=StorageType.FILE,
            replicas=replicas,
        ),
    )


async def put_policy(
    js: JetStreamContext, subjects: Subjects, tenant: str, policy: TenantPolicy
) -> int:
    """Store ``tenant``'s policy (the admin); returns the entry's revision. The bucket must
    exist (``ensure_tenants_bucket``)."""
    validate_tenant_name(tenant)
    kv = await js.key_value(subjects.tenants_bucket)
    return await kv.put(tenant, policy.to_json())


async def remove_policy(js: JetStreamContext, subjects: Subjects, tenant: str) -> None:
    """Drop ``tenant``'s policy (the admin): it gets ``DEFAULT_POLICY`` again."""
    validate_tenant_name(tenant)
    kv = await js.key_value(subjects.tenants_bucket)
    await kv.delete(tenant)


class TenantDirectory:
    """Every tenant's policy, kept up to date by a watch of the tenants bucket."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        retry_s: float = 5.0,
        resync_s: float = 300.0,
    ) -> None:
        self._js = js
        self._bucket = subjects.tenants_bucket
        self._retry_s = retry_s
        self._resync_s = resync_s
        self._policies: dict[str, TenantPolicy] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._missing_logged = False
        """Whether the bucket's absence (or the failure to open it) was logged as a warning
        since it was last opened (once per episode, not every retry)."""
        self._version = 0
        """Bumped at each change of the policies read (``wait_changed``)."""
        self._changed = asyncio.Event()

    def policy(self, tenant: str) -> TenantPolicy:
        """``tenant``'s policy as last read (``DEFAULT_POLICY`` without one)."""
        return self._policies.get(tenant, DEFAULT_POLICY)

    @property
    def policies(self) -> dict[str, TenantPolicy]:
        """A copy of the policies read (tenants without a record are absent)."""
        return dict(self._policies)

    @property
    def synced(self) -> bool:
        """Whether the bucket was read through once (or found missing)."""
        return self._synced.is_set()

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the policies to change after this call (a tenant added,
        changed or removed); whether they did."""
        seen = self._version
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._version == seen:
                    self._changed.clear()
                    await self._changed.wait()
        return self._version != seen

    def _note_change(self) -> None:
        self._version += 1
        self._changed.set()

    def start(self) -> None:
        """Start following the bucket (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow(), name="tenant-policies")

    async def wait_synced(self, timeout_s: float) -> bool:
        """Start, then wait up to ``timeout_s`` until the bucket was read through once;
        returns whether it was."""
        self.start()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._synced.wait()
        return self.synced

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _follow(self) -> None:
        while True:
            try:
                kv = await self._js.key_value(self._bucket)
            except BucketNotFoundError:
                if not self._missing_logged:
                    log.warning(
                        "no bucket %s (the admin's setup makes it): every tenant has the "
                        "default policy until it exists",
                        self._bucket,
                    )
                    self._missing_logged = True
                self._policies = {}
                self._synced.set()
                await asyncio.sleep(self._retry_s)
                continue
            except Exception:
                # no right to read it, or no server: waiting for it would not help the caller
                log.log(
                    logging.DEBUG if self._missing_logged else logging.WARNING,
                    "could not open bucket %s; retrying (policies as last read, the default "
                    "policy for the others)",
                    self._bucket,
                    exc_info=True,
                )
                self._missing_logged = True
                self._synced.set()
                await asyncio.sleep(self._retry_s)
                continue
            self._missing_logged = False
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._resync_s):
                        await self._watch(kv)
            except Exception as error:
                warn_try_failed(log, f"watch of {self._bucket} failed; starting it again", error)
                await asyncio.sleep(self._retry_s)

    async def _watch(self, kv: KeyValue) -> None:
        """Read the bucket through into a fresh table (the old one answers meanwhile), then
        apply each change as it comes."""
        watcher = await kv.watchall()
        reading: dict[str, TenantPolicy] | None = {}
        try:
            async for entry in watch_through(watcher):
                if entry is None:
                    if reading is not None:
                        self._policies, reading = reading, None
                        self._synced.set()
                        self._note_change()
                    continue
                table = reading if reading is not None else self._policies
                if reading is None:
                    self._note_change()
                if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                    table.pop(entry.key, None)
                    continue
                try:
                    table[entry.key] = TenantPolicy.from_json(entry.value)
                except ValueError as error:
                    table.pop(entry.key, None)
                    log.error(
                        "tenant %s: ignoring its policy (%s); it has the default policy",
                        entry.key,
                        error,
                    )
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]


async def read_tenant_usages(js: JetStreamContext, subjects: Subjects) -> dict[str, TenantUsage]:
    """Each tenant's latest ``TenantUsage`` as placement wrote it into its waiting bucket
    (keys ``tenant.<name>``), by tenant; {} while the bucket does not exist. One watch filtered
    by the server to those keys, values included (the bucket's many job explanations are never
    sent); entries that do not parse are left out."""
    try:
        kv = await js.key_value(subjects.waiting_bucket)
    except BucketNotFoundError:
        return {}  # placement has written nothing yet
    watcher = await kv.watch(f"{USAGE_KEY_PREFIX}>")
    usages: dict[str, TenantUsage] = {}
    try:
        # nats-py's own marker may come before the values on a loaded machine (an empty
        # reading, which took every tenant's series away for a moment): watch_through's
        async for entry in watch_through(watcher):
            if entry is None:
                break  # the marker after the current values
            tenant = entry.key[len(USAGE_KEY_PREFIX) :]
            if entry.operation in (KV_DEL, KV_PURGE):
                usages.pop(tenant, None)
                continue
            try:
                usages[tenant] = TenantUsage.from_json(entry.value or b"")
            except ValueError:
                continue
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return usages
