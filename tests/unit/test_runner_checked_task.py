"""The runner's own check of its task (``services.runner.app.checked_task``): a LAMMPS task
is checked without loading OpenMM (a start-up cost a LAMMPS attempt never needs), and an
OpenMM task's force-field names are still checked against OpenMM's folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mdq.contracts import pb

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from pathlib import Path
from google.protobuf import json_format
from mdq.contracts import pb
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
