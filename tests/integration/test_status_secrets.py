"""``mdq status`` probes PostgreSQL with the reader's password and never prints it: the URL it
shows is the one without the password, with the file that holds it; a probe that fails says
why without it either."""

from __future__ import annotations

from urllib.parse import urlsplit

from rich.console import Console

from mdq.cli.status import Probe, probe_servers, render
from mdq.store.roles import RoleUrls


def _shown(probes: list[Probe]) -> str:
    console = Console(record=True, width=400)
    render(console, [], probes, now=0.0)
    return console.export_text()


async def test_status_shows_the_password_file_never_the_password(
    database_roles: RoleUrls, nats_url: str
) -> None:
    url = database_roles.reader
    password = urlsplit(url).password
    assert password
    bare = url.replace(f":{password}@", "@")
    probes = await probe_servers(
        nats_url, url, shown_database_url=bare, password_file="/state/secrets/reader.password"
    )
    text = _shown(probes)
    assert "answers" in text and "/state/secrets/reader.password" in text
    assert password not in text
    # nor when it does not answer (no such database): the error does not hold it either
    split = urlsplit(url)
    wrong = url.replace(split.path, "/no_such_database")
    failed = await probe_servers(nats_url, wrong, password_file="/state/secrets/reader.password")
    text = _shown(failed)
    assert "does not answer" in text and password not in text
