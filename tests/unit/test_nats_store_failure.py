"""Which lines of nats-server's log say a write of its store found the disk full
(``mdq.embedded.nats_store_failure``): the stack restarts such a server once the disk has room
again, since JetStream refuses every later write of that stream until it restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdq.embedded import nats_store_failure
from mdq.stack import NATS_SERVER
from mdq.stack.supervisor import SERVER_LOG_READ_BYTES, ServerWatch, Stack

FULL = (
    "[25940] 2026/12/05 22:17:59.588414 [ERR] JetStream failed to store a msg on stream "
    "'$G > S': write /n/jetstream/$G/streams/S/msgs/1.blk: no space left on device"
)
CASES: dict[str, tuple[str, str | None]] = {
    "a message the disk refused": (FULL, FULL),
    "the first of several, among other lines": (
        f"[1] 2026/12/05 [INF] Server is ready\n{FULL}\n{FULL.replace('S', 'T')}\n",
        FULL,
    ),
    "a consumer's state the disk refused": (
        "[1] 2026/12/05 [ERR] Error writing consumer state: No space left on device",
        "[1] 2026/12/05 [ERR] Error writing consumer state: No space left on device",
    ),
    "another error": ("[1] 2026/12/05 [ERR] JetStream failed to store a msg: timeout", None),
    "a warning quoting the words": ("[1] [WRN] client said: no space left on device", None),
    "an empty log": ("", None),
    "a very long line is cut": (FULL + "x" * 1000, (FULL + "x" * 1000)[:300]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_store_failure_lines(case: str) -> None:
    text, expected = CASES[case]
    assert nats_store_failure(text) == expected


def test_the_server_log_is_read_by_whole_new_lines(tmp_path: Path) -> None:
    """The stack reads what the server's log gained since its last look: whole lines only (the
    rest waits for its end), from the start of a file that became shorter (a new one), and
    no more than its last ``SERVER_LOG_READ_BYTES``."""
    log = tmp_path / "nats-server.log"
    log.write_text("old line\n")
    watch = ServerWatch(NATS_SERVER, log, None, store=tmp_path, log_offset=log.stat().st_size)
    assert Stack._read_server_log(watch) == ""
    with log.open("a") as out:
        out.write(f"{FULL}\nhalf a li")
    assert Stack._read_server_log(watch) == f"{FULL}\n"
    with log.open("a") as out:
        out.write("ne\n")
    assert Stack._read_server_log(watch) == "half a line\n"
    log.write_text("new\n")  # shorter than what was read: a new file
    assert Stack._read_server_log(watch) == "new\n"
    with log.open("a") as out:
        out.write("x" * SERVER_LOG_READ_BYTES + "\nlast\n")
    assert Stack._read_server_log(watch).endswith("\nlast\n")
    assert watch.log_offset == log.stat().st_size
