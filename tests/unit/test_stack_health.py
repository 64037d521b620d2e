"""The stack-health check reads a stack's notes and logs as they are written: a table of named
cases of what a test's stack went through and what the check says about it."""

from __future__ import annotations

import pytest

from tests.stack_health import ANY, problems, read_stack_health, stack_state_dirs

STARTED = "2026-12-03 22:53:22 stack started: NATS nats://127.0.0.1:4222, namespace t1"
STOPPED = "2026-12-03 22:53:35 stack stopped"
CRASH = "2026-12-03 22:53:30 recovery: exited with -9; restarting in 0.5 s (log: x)"
SERVER_CRASH = "2026-12-03 22:53:31 nats-server: exited (signal 9); restarting in 0.5 s (log: y)"
BAD_STOP = "2026-12-03 22:53:35 intake: exited with 1 on stop"
HANG = "2026-12-03 22:53:35 watcher: no exit 5 s after SIGTERM; SIGKILL"
TRACEBACK = "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: boom"

CASES = {
    "a quiet stack": ([STARTED, STOPPED], {}, {}, (), []),
    "an unexpected crash": ([STARTED, CRASH, STOPPED], {}, {}, (), ["recovery exited 1"]),
    "a crash the test caused": ([STARTED, CRASH, STOPPED], {}, {"recovery": 1}, (), []),
    "more crashes than caused": (
        [STARTED, CRASH, CRASH, STOPPED],
        {},
        {"recovery": 1},
        (),
        ["recovery exited 2 time(s) while its stack ran, expected 1"],
    ),
    "a claimed fault that never happened": (
        [STARTED, STOPPED],
        {},
        {"recovery": 1},
        (),
        ["recovery exited 0 time(s)"],
    ),
    "any number of crashes": ([STARTED, CRASH, CRASH, STOPPED], {}, {"recovery": ANY}, (), []),
    "ANY needs at least one": (
        [STARTED, STOPPED],
        {},
        {"recovery": ANY},
        (),
        ["recovery was expected to exit, and never did"],
    ),
    "a server's crash": ([STARTED, SERVER_CRASH, STOPPED], {}, {}, (), ["nats-server exited 1"]),
    "a non-zero exit on stop": ([STARTED, BAD_STOP, STOPPED], {}, {}, (), ["on stop"]),
    "a hang on stop": ([STARTED, HANG, STOPPED], {}, {}, (), ["after SIGTERM; SIGKILL"]),
    "a traceback in a log": (
        [STARTED, STOPPED],
        {"watcher": TRACEBACK},
        {},
        (),
        ["watcher.log has a traceback"],
    ),
    "a traceback the test allows": (
        [STARTED, STOPPED],
        {"watcher": TRACEBACK},
        {},
        ("watcher",),
        [],
    ),
}


@pytest.mark.parametrize(
    ("notes", "logs", "expected", "tracebacks", "said"), CASES.values(), ids=CASES.keys()
)
def test_stack_health(
    tmp_path_factory: pytest.TempPathFactory,
    notes: list[str],
    logs: dict[str, str],
    expected: dict[str, int | str],
    tracebacks: tuple[str, ...],
    said: list[str],
) -> None:
    # not under the test's own tmp_path, which the real check reads after every test
    root = tmp_path_factory.mktemp("fake-stack")
    state = root / "deep" / "state"
    (state / "logs").mkdir(parents=True)
    (state / "logs" / "stack.log").write_text("\n".join(notes) + "\n")
    for name, text in logs.items():
        (state / "logs" / f"{name}.log").write_text(f"some line\n{text}\n")
    assert stack_state_dirs(root) == [state]
    found = problems([read_stack_health(state)], expected=expected, tracebacks_allowed=tracebacks)
    assert len(found) == len(said), found
    for line, words in zip(found, said, strict=True):
        assert words in line, (line, words)
