"""The input files a job file names, as ``mdq submit`` reads them before anything is sent: a
name intake would refuse (300 characters, a NUL) is refused by intake's own rule, naming the
field, before a path is made of it (not ``OSError: File name too long`` or ``ValueError:
embedded null byte``), and a file that is there but cannot be read is named with the reason.
Offline: ``resolve_inputs`` directly, and the command through Typer's runner (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mdq.cli.main import app
from mdq.sdk.inputs import resolve_inputs
from mdq.sdk.jobfile import JobFileError, load_job_file
from tests.tables import named_cases

RULE = "must be a relative path of 1 to 255 letters"

BAD_NAMES = [
    ("300 characters", "x" * 300),
    ("a NUL", "a\x00b"),
    ("a parent folder", "../secret"),
]


def job_file(folder: Path, *, inputs: list[str], lammps_script: str = "") -> Path:
    """A one-job file in ``folder`` naming ``inputs`` (and a LAMMPS script, if given)."""
    system = (
        {"lammps": {"script": lammps_script}} if lammps_script else {"water_box": {"box_nm": 1.5}}
    )
    job = {"name": "j", "system": system, "inputs": [{"name": n} for n in inputs], "steps": 100}
    path = folder / "job.json"
    path.write_text(json.dumps({"jobs": [job]}))
    return path


@named_cases(["name"], BAD_NAMES)
def test_a_name_intake_would_refuse_is_refused_naming_the_field(tmp_path: Path, name: str) -> None:
    path = job_file(tmp_path, inputs=["ok.dat", name])
    (tmp_path / "ok.dat").write_text("1\n")
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(load_job_file(path), tmp_path, source=str(path))
    assert caught.value.field == "jobs[0].inputs[1].name"
    assert RULE in caught.value.message


def test_a_lammps_script_of_a_name_too_long_is_refused_naming_the_field(tmp_path: Path) -> None:
    """The attacker's file: the script's name is also its input's name, 300 characters."""
    name = "x" * 300
    path = job_file(tmp_path, inputs=[name], lammps_script=name)
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(load_job_file(path), tmp_path, source=str(path))
    assert caught.value.field == "jobs[0].inputs[0].name"
    assert RULE in caught.value.message


def test_a_file_that_cannot_be_read_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a file without read permission is read by anyone but root (the tests may be root)."""

    def refused(path: Path) -> tuple[str, int]:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("mdq.sdk.inputs.sha256_file", refused)
    path = job_file(tmp_path, inputs=["locked.dat"])
    (tmp_path / "locked.dat").write_text("1\n")
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(load_job_file(path), tmp_path, source=str(path))
    assert caught.value.field == "jobs[0].inputs[0].name"
    message = caught.value.message
    assert "'locked.dat': cannot read" in message and "Permission denied" in message


def test_a_symlink_loop_is_named_with_the_reason(tmp_path: Path) -> None:
    path = job_file(tmp_path, inputs=["loop.dat"])
    (tmp_path / "loop.dat").symlink_to(tmp_path / "loop.dat")
    with pytest.raises(JobFileError) as caught:
        resolve_inputs(load_job_file(path), tmp_path, source=str(path))
    assert caught.value.field == "jobs[0].inputs[0].name"
    assert "'loop.dat'" in caught.value.message


def test_a_good_name_still_resolves(tmp_path: Path) -> None:
    path = job_file(tmp_path, inputs=["sub/ok.dat"])
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ok.dat").write_text("1\n")
    request = load_job_file(path)
    (local,) = resolve_inputs(request, tmp_path, source=str(path))
    assert local.size_bytes == 2
    (entry,) = request.jobs[0].inputs
    assert (entry.sha256, entry.size_bytes) == (local.sha256, 2)


@named_cases(["name"], BAD_NAMES)
def test_mdq_submit_refuses_it_with_exit_2_and_no_traceback(tmp_path: Path, name: str) -> None:
    """Refused before any server is looked for: none is given."""
    path = job_file(tmp_path, inputs=[name])
    result = CliRunner().invoke(
        app,
        ["--state-dir", str(tmp_path / "no-stack"), "submit", str(path)],
        env={"NATS_URL": "", "DATABASE_URL": "", "COLUMNS": "400"},
    )
    assert result.exit_code == 2, result.output
    assert "jobs[0].inputs[0].name" in result.output and RULE in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
