"""A loop that tries again logs a NATS outage in one line and anything else with its traceback:
a table of named errors and whether the log line carries a traceback."""

from __future__ import annotations

import logging

import nats.errors
import nats.js.errors
import pytest

from mdq.bus.outage import BUS_AWAY, warn_try_failed

CASES: dict[str, tuple[Exception, bool]] = {
    "a request timing out while the server restarts": (nats.errors.TimeoutError(), False),
    "a refused connection": (ConnectionRefusedError(111, "Connect call failed"), False),
    "the connection closed": (nats.errors.ConnectionClosedError(), False),
    "no servers": (nats.errors.NoServersError(), False),
    "no responders while JetStream starts": (nats.errors.NoRespondersError(), False),
    "JetStream answering 503": (nats.js.errors.ServiceUnavailableError(), False),
    "a bug in the loop": (ValueError("boom"), True),
    "a permission the server refused": (nats.js.errors.APIError(code=403), True),
    "a key error": (KeyError("job"), True),
}


@pytest.mark.parametrize("error, traceback", CASES.values(), ids=CASES.keys())
def test_a_failed_try_logs_a_traceback_only_for_what_is_not_an_outage(
    caplog: pytest.LogCaptureFixture, error: Exception, traceback: bool
) -> None:
    logger = logging.getLogger("test.outage")
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        try:
            raise error
        except Exception as raised:
            warn_try_failed(logger, "heartbeat failed", raised)
    [record] = caplog.records
    assert record.getMessage().startswith("heartbeat failed")
    assert (record.exc_info is not None) is traceback
    assert isinstance(error, BUS_AWAY) is not traceback
    if not traceback:
        assert type(error).__name__ in record.getMessage()
        assert "NATS away" in record.getMessage()
