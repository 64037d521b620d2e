"""The console's link: its address with the access token, as ``mdq up``, ``mdq demo`` and
``mdq console`` print it (read from the token file, never from stack.json)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from mdq.bus.security.auth import ensure_token_file
from mdq.cli.main import app, campaign_url
from mdq.contracts import pb
from mdq.stack import STACK_FILE, StackInfo

EXIT_UNAVAILABLE = 3


def info(tmp_path: Path, *, console: bool = True) -> StackInfo:
    token_file = ensure_token_file(tmp_path / "secrets" / "console.token")
    return StackInfo(
        nats_url="nats://127.0.0.1:4222",
        database_url="",
        namespace="mdq",
        metrics_url="http://127.0.0.1:9464/metrics",
        state_dir=str(tmp_path),
        logs_dir=str(tmp_path / "logs"),
        data_dir=str(tmp_path / "data"),
        backend="local",
        pid=os.getpid(),
        embedded_nats=True,
        embedded_postgres=True,
        console_url="http://127.0.0.1:8089/" if console else "",
        console_token_file=str(token_file) if console else "",
    )


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


@pytest.mark.parametrize(
    ("name", "path", "expected_path", "expected_query"),
    [
        ("the home page", "", "/", {}),
        ("a page", "jobs", "/jobs", {}),
        (
            "a page with its own query",
            "campaigns?label=campaign%3Ddemo",
            "/campaigns",
            {"label": ["campaign=demo"]},
        ),
    ],
)
def test_the_link_carries_the_token_of_the_file(
    tmp_path: Path, name: str, path: str, expected_path: str, expected_query: dict[str, list[str]]
) -> None:
    stack = info(tmp_path)
    link = stack.console_link(path)
    token = Path(stack.console_token_file).read_text().strip()
    parts = urlsplit(link)
    assert (parts.netloc, parts.path) == ("127.0.0.1:8089", expected_path), name
    query = parse_qs(parts.query)
    assert query.pop("token") == [token], name
    assert query == expected_query, name
    assert token not in stack.to_json(), "stack.json names the file, never the token"


def test_no_console_no_link(tmp_path: Path) -> None:
    assert info(tmp_path, console=False).console_link("jobs") == ""


def test_the_demo_prints_its_campaign_page_with_the_token(tmp_path: Path) -> None:
    stack = info(tmp_path)
    request = pb.SubmitRequest(jobs=[pb.JobSpec(name="a", labels={"campaign": "demo"})])
    link = campaign_url(stack, request)
    assert urlsplit(link).path == "/campaigns"
    assert token_of(link) == Path(stack.console_token_file).read_text().strip()


def test_mdq_console_prints_the_link_of_the_running_stack(tmp_path: Path) -> None:
    stack = info(tmp_path)
    (tmp_path / STACK_FILE).write_text(stack.to_json())
    result = CliRunner().invoke(app, ["--state-dir", str(tmp_path), "console"])
    assert result.exit_code == 0, result.output
    assert token_of(result.output.strip()) == Path(stack.console_token_file).read_text().strip()
    empty = tmp_path / "none"
    empty.mkdir()
    result = CliRunner().invoke(app, ["--state-dir", str(empty), "console"])
    assert result.exit_code == EXIT_UNAVAILABLE


def test_mdq_console_token_makes_a_token_once(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "console.token"
    first = CliRunner().invoke(app, ["console-token", "--out", str(path), "--group-readable"])
    assert first.exit_code == 0, first.output
    token = path.read_text()
    again = CliRunner().invoke(app, ["console-token", "--out", str(path)])
    assert again.exit_code == 0 and path.read_text() == token
