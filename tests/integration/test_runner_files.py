"""Which files a job may read: force fields only from trusted folders, structures only from
``<data>/inputs`` and its dependencies' folders, checkpoints only from its own folder.

Real files, real symlinks and real OpenMM: each case is a path trick a spec (or a forged
event) could try. A force-field XML may hold a <Script> that OpenMM executes, so the
working-directory case also proves the script never runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mdq.contracts import pb
from mdq.core.runner_task import inputs_home
from mdq.forcefields import ForceFieldFolders, ForceFieldRefused, openmm_data_dirs
from services.runner.checkpoints import CheckpointStore
from services.runner.errors import InvalidInputError
from services.runner.paths import dependency_file
from services.runner.recipes import force_field, input_roots, resolve_input

TIP3P = "amber14/tip3p.xml"
RID = "0123456789ab"


def evil_force_field(folder: Path, marker: Path) -> Path:
    """``folder/evil.xml``: a force field whose <Script> would create ``marker``."""
    path = folder / "evil.xml"
    path.write_text(
        f"<ForceField><Script>\nopen({str(marker)!r}, 'w').write('pwned')\n</Script></ForceField>\n"
    )
    return path


@pytest.fixture
def operator_dir(tmp_path: Path) -> Path:
    """An operator's force-field folder with a copy of TIP3P and a symlink leading out."""
    folder = tmp_path / "operator-ff"
    (folder / "lab").mkdir(parents=True)
    shutil.copy(openmm_data_dirs()[0] / TIP3P, folder / "lab" / "water.xml")
    outside = tmp_path / "outside.xml"
    shutil.copy(openmm_data_dirs()[0] / TIP3P, outside)
    (folder / "escape.xml").symlink_to(outside)
    return folder


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        pytest.param("amber14-all.xml", True, id="openmm-bundled"),
        pytest.param(TIP3P, True, id="openmm-bundled-subfolder"),
        pytest.param("lab/water.xml", True, id="operator-folder"),
        pytest.param("evil.xml", False, id="only-in-the-working-directory"),
        pytest.param("/etc/evil.xml", False, id="absolute"),
        pytest.param("../operator-ff/lab/water.xml", False, id="dot-dot"),
        pytest.param("amber14/../evil.xml", False, id="dot-dot-inside"),
        pytest.param("./evil.xml", False, id="dot-folder"),
        pytest.param("escape.xml", False, id="symlink-out-of-the-operator-folder"),
        pytest.param("amber14\\tip3p.xml", False, id="backslash"),
        pytest.param("~/evil.xml", False, id="home"),
    ],
)
def test_force_fields_come_only_from_trusted_folders(
    name: str,
    allowed: bool,
    operator_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    evil_force_field(workdir, tmp_path / "marker")
    monkeypatch.chdir(workdir)
    folders = ForceFieldFolders.from_env({"MDQ_FORCEFIELD_DIR": str(operator_dir)})
    if allowed:
        resolved = folders.resolve(name)
        assert resolved.is_absolute() and any(
            resolved.is_relative_to(folder.resolve()) for folder in folders.folders
        )
    else:
        with pytest.raises(ForceFieldRefused):
            folders.resolve(name)
    assert folders.exists(name) is allowed


def test_without_an_operator_folder_only_openmm_data_counts(operator_dir: Path) -> None:
    assert ForceFieldFolders.from_env({}).allowed is None
    assert not ForceFieldFolders.from_env({}).exists("lab/water.xml")
    assert ForceFieldFolders.from_env({"MDQ_FORCEFIELD_DIR": str(operator_dir)}).exists(
        "lab/water.xml"
    )


def test_openmm_never_loads_a_force_field_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain OpenMM would load ./evil.xml and run its script; the runner refuses the name."""
    marker = tmp_path / "marker"
    evil_force_field(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match="force field refused"):
        force_field("evil.xml", folders=ForceFieldFolders.from_env({}))
    assert not marker.exists()


def test_a_force_field_of_the_operator_folder_loads(operator_dir: Path) -> None:
    folders = ForceFieldFolders.from_env({"MDQ_FORCEFIELD_DIR": str(operator_dir)})
    assert force_field("amber14-all.xml", "lab/water.xml", folders=folders) is not None


@pytest.fixture
def data_dir_with_jobs(tmp_path: Path) -> Path:
    """A data folder with shared inputs, this job's dependency, and another job's folder."""
    data = tmp_path / "data"
    for folder in ("inputs", "jobs/dep", "jobs/other"):
        (data / folder).mkdir(parents=True)
    (data / "inputs" / "protein.pdb").write_text("ATOM\n")
    (data / "jobs" / "dep" / "minimized.pdb").write_text("ATOM\n")
    (data / "jobs" / "other" / "secret.pdb").write_text("ATOM\n")
    (data / "stack.pdb").write_text("ATOM\n")  # under the data folder, but not an input
    (data / "inputs" / "to-other.pdb").symlink_to(data / "jobs" / "other" / "secret.pdb")
    (data / "inputs" / "other-folder").symlink_to(data / "jobs" / "other")
    (data / "jobs" / "dep" / "to-other.pdb").symlink_to(data / "jobs" / "other" / "secret.pdb")
    return data


@pytest.mark.parametrize(
    ("relative", "found"),
    [
        pytest.param("inputs/protein.pdb", "inputs/protein.pdb", id="shared-input"),
        pytest.param("minimized.pdb", "jobs/dep/minimized.pdb", id="dependency-output"),
        pytest.param("jobs/other/secret.pdb", None, id="another-jobs-folder"),
        pytest.param("jobs/dep/minimized.pdb", None, id="dependency-by-data-path"),
        pytest.param("stack.pdb", None, id="data-folder-outside-inputs"),
        pytest.param("inputs/../jobs/other/secret.pdb", None, id="dot-dot"),
        pytest.param("/etc/passwd", None, id="absolute"),
        pytest.param("inputs/to-other.pdb", None, id="symlink-to-another-job"),
        pytest.param("inputs/other-folder/secret.pdb", None, id="symlinked-folder"),
        pytest.param("to-other.pdb", None, id="symlink-in-a-dependency"),
    ],
)
def test_structure_paths_resolve_only_inside_the_jobs_own_inputs(
    relative: str, found: str | None, data_dir_with_jobs: Path
) -> None:
    data = data_dir_with_jobs
    roots = input_roots(data, [data / "jobs" / "dep"])
    if found is None:
        with pytest.raises(InvalidInputError):
            resolve_input(relative, roots=roots)
    else:
        assert resolve_input(relative, roots=roots) == (data / found).resolve()


@pytest.mark.parametrize(
    ("job", "relative", "found"),
    [
        pytest.param(
            "alice.0123456789ab-md",
            "inputs/own.pdb",
            "tenants/alice/inputs/own.pdb",
            id="tenant-own-input",
        ),
        pytest.param(
            "alice.0123456789ab-md", "inputs/protein.pdb", None, id="tenant-not-the-operators"
        ),
        pytest.param("alice.0123456789ab-md", "inputs/bobs.pdb", None, id="tenant-not-another"),
        pytest.param(
            "alice.0123456789ab-md", "tenants/bob/inputs/bobs.pdb", None, id="tenant-by-data-path"
        ),
        pytest.param(
            "0123456789ab-md",
            "inputs/protein.pdb",
            "inputs/protein.pdb",
            id="operator-shared-input",
        ),
        pytest.param("0123456789ab-md", "inputs/own.pdb", None, id="operator-not-a-tenants"),
    ],
)
def test_a_tenants_inputs_are_its_own(
    job: str, relative: str, found: str | None, data_dir_with_jobs: Path
) -> None:
    data = data_dir_with_jobs
    for tenant, name in (("alice", "own.pdb"), ("bob", "bobs.pdb")):
        folder = data / "tenants" / tenant / "inputs"
        folder.mkdir(parents=True)
        shutil.copy(data / "inputs" / "protein.pdb", folder / name)
    roots = input_roots(inputs_home(data, job), [])
    if found is None:
        with pytest.raises(InvalidInputError):
            resolve_input(relative, roots=roots)
    else:
        assert resolve_input(relative, roots=roots) == (data / found).resolve()


def test_a_dependency_file_that_is_a_symlink_out_is_refused(data_dir_with_jobs: Path) -> None:
    dep = data_dir_with_jobs / "jobs" / "dep"
    assert dependency_file(dep, "minimized.pdb") == (dep / "minimized.pdb").resolve()
    with pytest.raises(InvalidInputError, match="outside the dependency's folder"):
        dependency_file(dep, "to-other.pdb")


def test_a_checkpoint_announced_in_another_jobs_folder_is_not_read(
    data_dir_with_jobs: Path,
) -> None:
    """resume_from comes from the bus: a path into another job's folder reads this job's
    file of that name (here: none), never the other one."""
    other = data_dir_with_jobs / "jobs" / "other" / "checkpoints"
    other.mkdir()
    (other / "ckpt-000000000100.xml").write_text("<State/>")
    store = CheckpointStore(directory=data_dir_with_jobs / "jobs" / "mine" / "checkpoints")
    announced = pb.Checkpoint(step=100, path=str(other / "ckpt-000000000100.xml"))
    assert store._confined(Path(announced.path)).parent == store._directory
    assert store.load(announced) is None


def test_intake_refuses_a_force_field_found_only_in_its_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Intake checks names against the same trusted folders: a file in its working
    directory does not make a name acceptable, and the error names the field."""
    from mdq.core.spec import SpecError
    from services.intake.handlers import acceptance

    evil_force_field(tmp_path, tmp_path / "marker")
    monkeypatch.chdir(tmp_path)
    structure = pb.Structure(pdb_content="ATOM      1  N   ALA A   1       0.0   0.0   0.0\n")
    request = pb.SubmitRequest(
        idempotency_key="k",
        jobs=[pb.JobSpec(name="a", system=pb.System(structure=structure))],
    )
    request.jobs[0].system.structure.force_fields.extend(["amber14-all.xml", "evil.xml"])
    with pytest.raises(SpecError) as caught:
        acceptance(request, request_id=RID, resolved={}, key_required=True)
    assert caught.value.field == "jobs[0].system.structure.force_fields[1]"
    request.jobs[0].system.structure.force_fields[1] = TIP3P
    accepted, _, _ = acceptance(request, request_id=RID, resolved={}, key_required=True)
    assert list(accepted[0].spec.system.structure.force_fields) == ["amber14-all.xml", TIP3P]
