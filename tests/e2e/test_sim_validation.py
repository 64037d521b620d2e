"""The simulator against reality: a small campaign run for real (the whole stack, two local
nodes of one core, real OpenMM), then simulated from the history it left in PostgreSQL. The
makespan agrees within 10 % and the jobs start in the same order, but for at most a fifth of
the pairs that started a second or more apart (docs/simulate.md, "Validating it")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdq.stack import Stack
from tests.e2e.stacks import session_stack
from tools.sim_validation import run_and_simulate, stack_env

pytestmark = pytest.mark.e2e

MAKESPAN_TOLERANCE = 0.10
ORDER_TOLERANCE = 0.2


@pytest.fixture
async def stack(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    env = stack_env()
    async with session_stack(
        nats_url, database_url, namespace, tmp_path, extra_env=env
    ) as the_stack:
        yield the_stack


async def test_simulation_of_a_campaign_agrees_with_its_run(
    stack: Stack, database_url: str, namespace: str
) -> None:
    result = await run_and_simulate(
        nats_url=stack.info.nats_url,
        namespace=namespace,
        creds=stack.info.nats_creds,
        database_url=database_url,
    )
    print(result)  # the figures, for -s and the report
    assert result.jobs == 8
    assert result.makespan_error <= MAKESPAN_TOLERANCE, result
    assert result.order_discordance <= ORDER_TOLERANCE, result
