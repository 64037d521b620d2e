"""Tables of named cases for what an error LAMMPS raises while mdq runs the steps becomes
(``services.runner.engines.lammps_engine.run_failure``): a blow-up is UNSTABLE, a full or
failing disk the node's, memory LAMMPS could not get OUT_OF_MEMORY, an error LAMMPS reports
about the script (found only as the run sets up) the job's INVALID_INPUT, naming the line when
its message names one of the script's files, and anything else a crash."""

from __future__ import annotations

import errno
from pathlib import Path

from mdq.core.exit_codes import RunnerExit
from services.runner.app import exit_code_for
from services.runner.engines.lammps_engine import RanCommand, culprit, run_failure
from services.runner.errors import InvalidInputError
from tests.tables import named_cases

RAN = [
    RanCommand("in.melt", 3, "units metal"),
    RanCommand("in.melt", 20, "fix 1 all nvt temp 300 300 0.1"),
    RanCommand("in.melt", 21, "dump d all atom 100 nosuch/x.dump"),
    RanCommand("in.melt", 22, "fix p all print 100 hi file out/p.txt"),
    RanCommand("in.settings", 4, "fix av all ave/time 10 1 10 c_t file t.txt"),
]
LAST = "\nLast input line: run 100 post no"

CASES = [
    (
        "a dump file it cannot open",
        "ERROR on proc 0: Cannot open dump file nosuch/x.dump:No such file or directory "
        "(src/src/dump.cpp:606)" + LAST,
        RunnerExit.INVALID_INPUT,
        "in.melt line 21: dump d all atom 100 nosuch/x.dump: LAMMPS refused it in 'run 100': "
        "ERROR on proc 0: Cannot open dump file nosuch/x.dump",
    ),
    (
        "a fix's file, in an included file",
        "ERROR: Cannot open fix ave/time file t.txt: Permission denied" + LAST,
        RunnerExit.INVALID_INPUT,
        "in.settings line 4: fix av all ave/time",
    ),
    (
        "no file named: the script as a whole",
        "ERROR: Neighbor list overflow, boost neigh_modify one (src/src/npair.cpp:1)" + LAST,
        RunnerExit.INVALID_INPUT,
        "in.melt: LAMMPS refused the script in 'run 100': ERROR: Neighbor list overflow",
    ),
    (
        "a source file of LAMMPS is not the script's",
        "ERROR: Compute ID for fix ave/time does not exist (src/src/t.txt.cpp:10)" + LAST,
        RunnerExit.INVALID_INPUT,
        "in.melt: LAMMPS refused the script",
    ),
    ("lost atoms", "ERROR: Lost atoms: original 4000 current 3998" + LAST, RunnerExit.UNSTABLE, ""),
    (
        "a non-numeric pressure",
        "ERROR: Non-numeric pressure - simulation unstable (src/src/fix_nh.cpp:1)",
        RunnerExit.UNSTABLE,
        "",
    ),
    (
        "a bond stretched past half the box",
        "ERROR: Bond extent > half of periodic box length (src/src/domain.cpp:1)",
        RunnerExit.UNSTABLE,
        "",
    ),
    (
        "a full disk",
        "ERROR: Cannot open dump file x.dump: No space left on device",
        RunnerExit.NO_SPACE,
        "",
    ),
    (
        "a read-only disk",
        "ERROR: Cannot open dump file x.dump: Read-only file system",
        RunnerExit.DISK_FAILED,
        "",
    ),
    (
        "memory",
        "ERROR on proc 0: Failed to allocate 8000000000 bytes for array atom:x",
        RunnerExit.OUT_OF_MEMORY,
        "",
    ),
    ("not LAMMPS's error: a crash", "ctypes: access violation", RunnerExit.CRASHED, ""),
]


@named_cases(("message", "code", "named"), CASES)
def test_run_failures(message: str, code: RunnerExit, named: str, tmp_path: Path) -> None:
    error = run_failure(Exception(message), "'run 100'", tmp_path, script="in.melt", ran=RAN)
    assert exit_code_for(error) == code
    if named:
        assert isinstance(error, InvalidInputError)
        assert str(error).startswith(named)
        assert "Last input line" not in str(error)


def test_a_full_disk_keeps_its_errno(tmp_path: Path) -> None:
    error = run_failure(
        Exception("ERROR: Cannot open dump file x.dump: No space left on device"),
        "'run 100'",
        tmp_path,
        script="in.melt",
    )
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC


CULPRITS = [
    ("the last command naming the file", "Cannot open fix print file out/p.txt", 22),
    ("a file named with a colon after it", "Cannot open dump file nosuch/x.dump:No such", 21),
    ("a longer name is another file", "Cannot open dump file nosuch/x.dump2", None),
    ("a name inside a path is another file", "Cannot open file a/nosuch/x.dump", None),
    ("IDs and numbers are not files", "Fix 1 compute 300 does not exist", None),
]


@named_cases(("message", "line"), CULPRITS)
def test_the_culprit_is_the_command_naming_the_file(message: str, line: int | None) -> None:
    found = culprit(RAN, message)
    assert (found.line if found is not None else None) == line
