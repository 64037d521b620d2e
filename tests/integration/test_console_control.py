"""The console's job-control buttons over HTTP (docs/control.md, docs/console.md): a job's page
sends one request to placement (a real Placement on real NATS), a campaign's page asks to
confirm how many jobs it would change before it sends anything; a form without the console's
token or from another origin is refused (CSRF), and a form posted twice is one request."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.store.engine import create_engine
from mdq.store.projection import Projector
from mdq.store.roles import RoleUrls
from services.console.app import Console
from tests.helpers import OwnersPublisher, RecordingBackend, events_of, node_load
from tests.integration.test_console import serve_console
from tests.integration.test_control import job, placement_running

FIRST, SECOND = "aaaaaaaaaaaa-first", "aaaaaaaaaaaa-second"


@pytest.fixture
async def site(
    nc: Client, subjects: Subjects, database_roles: RoleUrls, pool: asyncpg.Pool, data_dir: Path
) -> AsyncIterator[str]:
    js = nc.jetstream()
    bus = OwnersPublisher(js=js, subjects=subjects)
    await bus.publish(node_load("n1", cpu_capacity=1))
    events = [job(name, cpu=8, labels={"campaign": "x"}) for name in (FIRST, SECOND)]
    for each in events:
        await bus.publish(each)  # fit nowhere: they stay PENDING
    projector = Projector(js=js, subjects=subjects, pool=pool)
    projecting = asyncio.create_task(projector.run())
    engine = create_engine(database_roles.reader)
    server = serving = None
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while await pool.fetchval("SELECT count(*) FROM jobs") < len(events):
            assert asyncio.get_running_loop().time() < deadline, "the jobs were projected"
            await asyncio.sleep(0.05)
        console = Console(engine=engine, nc=nc, subjects=subjects, data_dir=data_dir)
        server, serving, url = await serve_console(console)
        async with placement_running(nc, subjects, RecordingBackend()):
            yield url
    finally:
        if server is not None and serving is not None:
            server.should_exit = True
            await asyncio.wait_for(serving, timeout=10)
        projector.stop()
        await asyncio.wait_for(projecting, timeout=10)
        await engine.dispose()


def hidden(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found is not None, name
    return found.group(1)


async def control_form(
    session: aiohttp.ClientSession, page_url: str, **fields: str
) -> dict[str, str]:
    """A control form of the page at ``page_url``: the console's token and the control key the
    page carries (a page with control forms is never cached), and ``fields``."""
    async with session.get(page_url) as response:
        page = await response.text()
        assert response.headers["Cache-Control"] == "no-store"
    return {"token": hidden(page, "token"), "control_key": hidden(page, "control_key"), **fields}


async def test_a_jobs_page_controls_it_and_refuses_forged_forms(
    site: str, nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    async with aiohttp.ClientSession() as session:
        form = await control_form(
            session, f"{site}/jobs/{FIRST}", verb="cancel", reason="wrong box"
        )
        for forged, headers, field in (
            ({**form, "token": "guess"}, {}, "token"),
            (form, {"Origin": "http://evil.example"}, "origin"),
            ({**form, "verb": "destroy"}, {}, "verb"),
        ):
            async with session.post(
                f"{site}/jobs/{FIRST}/control", data=forged, headers=headers
            ) as response:
                assert response.status == 400
                assert f'id="error-field">{field}<' in await response.text()
        assert await events_of(js, subjects, "cancelled") == []  # none was sent
        for _ in range(2):  # posted twice: one request, one answer
            async with session.post(f"{site}/jobs/{FIRST}/control", data=form) as response:
                html = await response.text()
                assert response.status == 200, html
                assert re.search(r'class="outcome">done<', html), html
                assert "CANCELLED" in html
    [cancelled] = await events_of(js, subjects, "cancelled")
    assert cancelled.job_id == FIRST
    assert cancelled.cancelled.message == "cancelled by the console: wrong box"


async def test_a_campaign_is_controlled_after_a_confirmation(
    site: str, nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    async with aiohttp.ClientSession() as session:
        form = await control_form(
            session,
            f"{site}/campaigns?label=campaign%3Dx",
            label="campaign=x",
            verb="hold",
            priority_class="normal",
            reason="",
        )
        async with session.post(f"{site}/campaigns/control", data=form) as response:
            confirm = await response.text()
            assert response.status == 200
        assert re.search(r'id="confirm-count">2<', confirm), confirm
        assert FIRST in confirm and SECOND in confirm
        assert await events_of(js, subjects, "held") == []  # nothing sent before the yes
        confirmed = {name: hidden(confirm, name) for name in form} | {"confirmed": "yes"}
        async with session.post(f"{site}/campaigns/control", data=confirmed) as response:
            html = await response.text()
            assert response.status == 200, html
        assert len(re.findall(r'class="outcome">done<', html)) == 2, html
        async with session.post(
            f"{site}/campaigns/control", data={**form, "verb": "extend", "confirmed": "yes"}
        ) as response:
            assert response.status == 400  # extend takes job ids, not a campaign
    held = await events_of(js, subjects, "held")
    assert sorted(e.job_id for e in held) == [FIRST, SECOND]
    assert {e.held.origin.requested_by for e in held} == {"the console"}


async def test_a_refusal_shows_the_field(site: str) -> None:
    async with aiohttp.ClientSession() as session:
        form = await control_form(session, f"{site}/jobs/{SECOND}", verb="extend", extend_steps="0")
        async with session.post(f"{site}/jobs/{SECOND}/control", data=form) as response:
            html = await response.text()
            assert response.status == 400
        assert re.search(r'id="refusal-field">extend_steps<', html), html
