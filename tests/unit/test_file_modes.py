"""What mdq writes gets the mode it should, and nothing else changes: secrets 0600 in the
folders they need (made 0700), a folder that exists left as its owner made it; logs and job
data 0640 in 0750 folders (``mdq.files``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mdq.bus.security.auth import ensure_token_file, write_secret
from mdq.files import open_log, private_folder, touch_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("group_readable", [False, True], ids=["private", "group-readable"])
def test_a_secret_leaves_the_mode_of_a_folder_that_exists(
    tmp_path: Path, group_readable: bool
) -> None:
    """A folder shared with another program (an embedded PostgreSQL's, say) keeps 0755: red
    while write_secret tightened the folder it wrote into."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    written = write_secret(shared / "a.secret", "x", group_readable=group_readable)
    assert mode(shared) == 0o755
    assert mode(written) == (0o640 if group_readable else 0o600)
    assert written.read_text() == "x"


def test_the_folders_a_secret_needs_are_made_private(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    written = write_secret(tmp_path / "new" / "deeper" / "a.secret", "x")
    assert mode(tmp_path / "new") == 0o700 and mode(tmp_path / "new" / "deeper") == 0o700
    assert mode(tmp_path) == 0o755 and mode(written) == 0o600
    token = ensure_token_file(tmp_path / "other" / "token")
    assert mode(token.parent) == 0o700 and mode(token) == 0o600


def test_logs_and_job_folders_are_for_their_owner_and_group(tmp_path: Path) -> None:
    old = os.umask(0o022)  # what a shell gives: 0755 folders, 0644 files
    try:
        folder = private_folder(tmp_path / "data" / "jobs" / "0123456789ab-j")
        existing = tmp_path / "logs"
        existing.mkdir(mode=0o755)
        private_folder(existing)
        with open_log(existing / "intake.log") as log:
            log.write(b"line\n")
        made = touch_private(existing / "nats-server.log")
        loose = existing / "old.log"
        loose.write_text("made loose by hand\n")
        os.chmod(loose, 0o644)
        with open_log(loose) as log:
            log.write(b"more\n")
    finally:
        os.umask(old)
    for each in (folder, folder.parent, tmp_path / "data", existing):
        assert mode(each) == 0o750, each
    for each in (existing / "intake.log", made, loose):
        assert mode(each) == 0o640, each
    assert loose.read_text() == "made loose by hand\nmore\n"
