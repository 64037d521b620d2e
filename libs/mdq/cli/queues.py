"""``mdq queues``: each tenant's share of the cluster, as placement last counted it.

Placement (the leader) writes each tenant's ``TenantUsage`` into its waiting bucket under
``tenant.<name>`` at most every second when it changed: jobs queued and running, the requests
running, the tenant's fair-share weight, its dominant share of the schedulable capacity now and
the fair share it is due while every tenant's queued work competes (docs/placement.md, "Fair
share"). This command reads those keys (the operator's identity may read the bucket; a tenant's
may not) and prints one row per tenant; a tenant above its fair share is marked, since its
jobs go after those of tenants below theirs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rich.table import Table

from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import read_tenant_usages
from mdq.cli.tables import columns_table
from mdq.core.tenants import TenantUsage

ABOVE_FAIR_MARGIN = 0.02
"""How far above its fair share a tenant's share must be to be marked (rounding, one job)."""


async def tenant_usages(
    nats_url: str, namespace: str, *, creds: str = ""
) -> dict[str, TenantUsage]:
    """Each tenant's latest usage from placement's waiting bucket, by tenant."""
    nc = await connect(nats_url, name="mdq-queues", creds=creds or None)
    try:
        return await read_tenant_usages(nc.jetstream(), Subjects(namespace=namespace))
    finally:
        await nc.drain()


def queues_table(usages: dict[str, TenantUsage], now: datetime | None = None) -> Table:
    """One row per tenant: weight, jobs and requests running, jobs queued, share and fair
    share (a share above the fair one in yellow), and how old the count is."""
    now = now or datetime.now(UTC)
    table = columns_table(
        "tenants (placement's last count)",
        (
            ("tenant", "left"),
            ("weight", "right"),
            ("running", "right"),
            ("cpu", "right"),
            ("memory", "right"),
            ("queued", "right"),
            ("share", "right"),
            ("fair share", "right"),
            ("counted", "right"),
        ),
    )
    for tenant, usage in sorted(usages.items()):
        above = usage.share > usage.fair_share + ABOVE_FAIR_MARGIN
        share = f"{usage.share:.1%}"
        age = max(0.0, (now - usage.as_of).total_seconds())
        table.add_row(
            tenant,
            f"{usage.weight:g}",
            str(usage.running_jobs),
            f"{usage.running_cpu:g} cores",
            f"{usage.running_memory_mb / 1024:.1f} GiB",
            str(usage.queued_jobs),
            f"[yellow]{share} (above)[/]" if above else share,
            f"{usage.fair_share:.1%}",
            f"{age:.0f} s ago",
        )
    return table
