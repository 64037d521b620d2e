"""``mdq.backoff`` and the log-line helpers of the connection code: tables of named cases."""

from __future__ import annotations

import asyncio
import itertools
import logging

import asyncpg
import pytest

from mdq.backoff import Backoff, describe_error, keep_trying, redact_url
from mdq.store.engine import connection_lost, database_location


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        pytest.param(Backoff(), [0.5, 1.0, 2.0, 4.0, 5.0, 5.0], id="default doubles up to 5 s"),
        pytest.param(Backoff(initial_s=1, factor=3, max_s=10), [1, 3, 9, 10, 10, 10], id="x3"),
        pytest.param(Backoff(initial_s=2, max_s=2), [2, 2, 2, 2, 2, 2], id="constant"),
    ],
)
def test_delays(backoff: Backoff, expected: list[float]) -> None:
    assert list(itertools.islice(backoff.delays(), len(expected))) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("nats://127.0.0.1:4222", "nats://127.0.0.1:4222", id="no credentials"),
        pytest.param("nats://mdq:s3cret@nats:4222", "nats://mdq:***@nats:4222", id="password"),
        pytest.param("nats://token@nats:4222", "nats://token@nats:4222", id="user only"),
        pytest.param(
            "nats://a:p@n1:4222, nats://n2:4222",
            "nats://a:***@n1:4222,nats://n2:4222",
            id="server list",
        ),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param(
            "postgresql://postgres@/mdq?host=/tmp/pg", "/tmp/pg (database mdq)", id="unix socket"
        ),
        pytest.param(
            "postgresql://mdq:s3cret@db:5433/mdq", "db:5433 (database mdq)", id="no password"
        ),
        pytest.param("postgresql+asyncpg://u@db/x", "db (database x)", id="sqlalchemy form"),
        pytest.param("postgresql://db", "db", id="no database"),
    ],
)
def test_database_location(url: str, expected: str) -> None:
    assert database_location(url) == expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        pytest.param(
            ConnectionRefusedError(111, "refused"),
            "ConnectionRefusedError: [Errno 111] refused",
            id="os",
        ),
        pytest.param(TimeoutError(), "TimeoutError", id="no message"),
        pytest.param(RuntimeError("two\n  lines"), "RuntimeError: two lines", id="one line"),
    ],
)
def test_describe_error(error: BaseException, expected: str) -> None:
    assert describe_error(error) == expected


async def test_keep_trying_retries_only_what_it_is_told(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mdq.backoff")
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError(111, "refused")
        return "up"

    fast = Backoff(initial_s=0.01, max_s=0.02)
    result = await keep_trying(flaky, what="X", where="x:1", retry_on=(OSError,), backoff=fast)
    assert (result, calls) == ("up", 3)
    assert [m.split(" (")[0] for m in caplog.messages] == [
        "X at x:1 not reachable",
        "X at x:1 not reachable",
        "X at x:1 reached after 2 failed tries",
    ]

    async def broken() -> str:
        raise ValueError("bad password")

    with pytest.raises(ValueError, match="bad password"):
        await asyncio.wait_for(
            keep_trying(broken, what="X", where="x:1", retry_on=(OSError,), backoff=fast), 5
        )


def _raised_while_handling(first: BaseException, then: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise then  # noqa: B904 - the implicit context is the point
    except BaseException as error:
        return error


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        pytest.param(ConnectionRefusedError(111, "refused"), True, id="refused"),
        pytest.param(FileNotFoundError(2, "no socket"), True, id="no socket file"),
        pytest.param(asyncpg.ConnectionDoesNotExistError("closed mid-operation"), True, id="08003"),
        pytest.param(asyncpg.CannotConnectNowError("starting up"), True, id="57P03"),
        pytest.param(asyncpg.AdminShutdownError("terminating"), True, id="57P01"),
        pytest.param(asyncpg.DiskFullError("no space"), True, id="53100"),
        pytest.param(
            _raised_while_handling(
                asyncpg.ConnectionDoesNotExistError("closed"),
                asyncpg.InterfaceError("the underlying connection is closed"),
            ),
            True,
            id="transaction exit after the connection died",
        ),
        pytest.param(asyncpg.InterfaceError("another operation"), False, id="interface alone"),
        pytest.param(asyncpg.InvalidCatalogNameError("no db"), False, id="no such database"),
        pytest.param(asyncpg.DataError("NUL"), False, id="data"),
        pytest.param(RuntimeError("log went backwards"), False, id="anything else"),
    ],
)
def test_connection_lost(error: BaseException, lost: bool) -> None:
    assert connection_lost(error) is lost
