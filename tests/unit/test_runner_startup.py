"""What the runner loads as it starts, each in a fresh process: its own check of its task
(``services.runner.app.checked_task``) loads OpenMM only for a spec naming a force field (a
LAMMPS attempt never needs it), and ``python -m services.runner`` leaves the NATS client's
WebSocket transport (``aiohttp``) out unless its NATS URL is a WebSocket one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from pathlib import Path
from google.protobuf import json_format
from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask, job_dir
from services.runner.app import InvalidTask, checked_task

data_dir = Path(sys.argv[1])
spec = json_format.Parse(sys.argv[2], pb.JobSpec())
folder = job_dir(data_dir, "job-1")
task = RunnerTask(job_id="job-1", attempt=1, spec=spec, job_dir=folder, threads=1)
try:
    checked_task(task, data_dir=data_dir, env={})
    outcome = "ok"
except InvalidTask as error:
    outcome = str(error)
print(json.dumps({"outcome": outcome, "openmm": "openmm" in sys.modules}))
"""


def check_in_a_fresh_process(tmp_path: Path, spec: pb.JobSpec) -> dict[str, object]:
    from google.protobuf import json_format

    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path), json_format.MessageToJson(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_lammps_task_is_checked_without_loading_openmm(tmp_path: Path) -> None:
    spec = pb.JobSpec(
        name="melt",
        system=pb.System(lammps=pb.LammpsInput(script="in.melt")),
        steps=1000,
        report_interval_steps=100,
        checkpoint_interval_steps=500,
    )
    spec.inputs.add(name="in.melt", sha256="a" * 64, size_bytes=10)
    assert check_in_a_fresh_process(tmp_path, spec) == {"outcome": "ok", "openmm": False}


def test_an_openmm_task_naming_an_unknown_force_field_is_still_refused(tmp_path: Path) -> None:
    spec = pb.JobSpec(
        name="protein",
        system=pb.System(
            structure=pb.Structure(pdb_path="inputs/p.pdb", force_fields=["nowhere/ff.xml"])
        ),
        steps=1000,
        report_interval_steps=100,
        checkpoint_interval_steps=500,
    )
    result = check_in_a_fresh_process(tmp_path, spec)
    assert "nowhere/ff.xml" in str(result["outcome"]), result
    assert result["openmm"] is True


ENTRY = """
import runpy, sys
try:
    runpy.run_module("services.runner", run_name="__main__")
except SystemExit as exit:
    print(exit.code, "aiohttp.client" in sys.modules)
"""


def start_a_runner_without_a_task(nats_url: str) -> str:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith(("MDQ_", "NATS"))
    }
    done = subprocess.run(
        [sys.executable, "-c", ENTRY],
        cwd=REPO,
        env={**environment, "NATS_URL": nats_url},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.splitlines()[-1]


def test_the_runner_starts_without_the_websocket_transport_on_a_nats_url() -> None:
    invalid_input = int(RunnerExit.INVALID_INPUT)
    assert start_a_runner_without_a_task("nats://127.0.0.1:4222") == f"{invalid_input} False"
    assert start_a_runner_without_a_task("nats://a:4222, wss://b:443") == f"{invalid_input} True"
