"""Tables of named cases for what a LAMMPS script may do (``mdq.core.lammps_script``), beyond
those of ``test_engines_core``: the styles that reach the network, connect the runner to other
programs or read a configuration that names its own files; refused words written in quotes
(LAMMPS takes ``"ipi"`` as it takes ``ipi``); and how a resume keeps the files the script
writes (``appending``, ``kept_aside``)."""

from __future__ import annotations

import pytest

from mdq.core.lammps_script import (
    ScriptError,
    appending,
    check_command,
    check_script,
    kept_aside,
    parse_script,
)
from tests.tables import named_cases

REFUSED = [
    ("fix ipi over TCP", "fix ipi all ipi 127.0.0.1 47111", "'ipi' is refused: fix ipi connects"),
    ("fix ipi over a unix socket", "fix ipi all ipi driver 0 unix", "a unix socket in /tmp"),
    ("fix imd", "fix imd all imd 47112", "'imd' is refused: fix imd listens on a network port"),
    ("fix imd with options", "fix 2 all imd 5678 unwrap on trate 10", "network port"),
    ("fix colvars", "fix cv all colvars cv.conf output cvout", "'colvars' is refused"),
    ("fix colvars, its files", "fix 1 all colvars in.colvars", "names its own files"),
    ("fix plumed", "fix p all plumed plumedfile plumed.dat outfile p.log", "PLUMED"),
    ("fitpod", "fitpod Ta_param.pod Ta_data.pod", "'fitpod' is refused"),
    ("a quoted style", 'fix 1 all "ipi" 127.0.0.1 47111', "'ipi' is refused"),
    ("a quoted colvars", "fix 1 all 'colvars' cv.conf", "'colvars' is refused"),
    ("a quoted getenv", 'variable h "getenv" HOME', "'getenv' is refused"),
    ("a quoted python style", "fix 1 all 'python/invoke' 10 end_of_step f", "runs Python"),
    ("a quoted movie", 'dump m all "movie" 100 m.mpg type type', "ffmpeg"),
    ("a styled case", "fix 1 all IPI 127.0.0.1 47111", "'IPI' is refused"),
]


@named_cases(("line", "why"), REFUSED)
def test_refused_styles_are_named_with_their_line(line: str, why: str) -> None:
    with pytest.raises(ScriptError) as caught:
        check_script(f"units metal\n\n{line}\n")
    assert caught.value.line == 3
    assert str(caught.value).startswith(f"line 3: {line[:20]}")
    assert why in str(caught.value)


@named_cases(("line", "why"), REFUSED)
def test_the_runner_refuses_them_after_substitution_too(line: str, why: str) -> None:
    (command,) = parse_script(line)
    with pytest.raises(ScriptError, match="is refused"):
        check_command(command, expanded=True)


ALLOWED = [
    ("free text that names a style", 'print "ipi and imd are refused"'),
    ("free text in a fix print", 'fix p all print 100 "colvars: none" file p.txt'),
    ("a word that only starts like one", "fix 1 all ave/time 10 10 100 c_ipis file imd.txt"),
    ("the fixes a melt uses", "fix 1 all nvt temp 300 300 0.1"),
]


@named_cases(("line",), ALLOWED)
def test_allowed_commands(line: str) -> None:
    check_script(line)


APPENDING = [
    (
        "fix ave/time",
        "fix av all ave/time 100 1 100 c_thermo_temp file temp.txt",
        "fix av all ave/time 100 1 100 c_thermo_temp append temp.txt",
    ),
    (
        "fix ave/time, a title that reads file",
        'fix av all ave/time 1 1 1 c_t title1 "file" file t.txt',
        'fix av all ave/time 1 1 1 c_t title1 "file" append t.txt',
    ),
    (
        "fix ave/chunk",
        "fix a all ave/chunk 10 10 100 cc density/mass file rho.txt ave running",
        "fix a all ave/chunk 10 10 100 cc density/mass append rho.txt ave running",
    ),
    (
        "fix ave/histo",
        "fix h all ave/histo 10 10 100 0 5 50 c_ke file h.txt mode vector",
        "fix h all ave/histo 10 10 100 0 5 50 c_ke append h.txt mode vector",
    ),
    (
        "fix ave/histo/weight",
        "fix h all ave/histo/weight 1 1 1 0 1 10 c_a c_b file hw.txt",
        "fix h all ave/histo/weight 1 1 1 0 1 10 c_a c_b append hw.txt",
    ),
    (
        "fix print, its text kept quoted",
        'fix p all print 100 "T = $(temp) file" file "t log.txt" screen no',
        'fix p all print 100 "T = $(temp) file" append "t log.txt" screen no',
    ),
    (
        "the print command",
        "print 'step file' file setup.txt",
        "print 'step file' append setup.txt",
    ),
    ("already appending", "fix av all ave/time 1 1 1 c_t append t.txt", None),
    ("no file", "fix av all ave/time 1 1 1 c_t", None),
    ("a fix that writes no file", "fix 1 all nve", None),
    ("a dump (dump_modify append yes)", "dump d all atom 100 file", None),
]


@named_cases(("line", "resumed"), APPENDING)
def test_a_resume_appends_to_the_files_it_can(line: str, resumed: str | None) -> None:
    (command,) = parse_script(line)
    changed = appending(command)
    if resumed is None:
        assert changed is None
        return
    assert changed is not None and changed.text == resumed
    (again,) = parse_script(resumed)
    assert changed.words == again.words and changed.line == command.line


KEPT_ASIDE = [
    ("ave/correlate", "fix c all ave/correlate 1 10 100 c_p[1] file cor.txt", ["cor.txt"]),
    ("ave/correlate/long", "fix c all ave/correlate/long 1 1000 v_p file l.txt", ["l.txt"]),
    ("reaxff/bonds", "fix b all reaxff/bonds 100 bonds.reaxff", ["bonds.reaxff"]),
    (
        "reaxff/species, all three",
        "fix s all reaxff/species 1 1 10 sp.out position 100 sp.pos delete sp.del masslimit 0 5",
        ["sp.out", "sp.pos", "sp.del"],
    ),
    ("balance", "fix b all balance 1000 1.1 shift xy 10 1.1 out bal.txt", ["bal.txt"]),
    ("tmd", "fix t all tmd 0.0 target.xyz 10000 tmd.out", ["tmd.out"]),
    ("ttm", "fix t all ttm 12 1 1 1 1 1 1 2 2 2 outfile 100 T.out", ["T.out"]),
    ("phonon", "fix p all phonon 10 50000 0 map.in ph", ["ph.log"]),
    ("appending styles are not moved", "fix av all ave/time 1 1 1 c_t file t.txt", []),
    ("not a fix", "print hi file x.txt", []),
]


@named_cases(("line", "names"), KEPT_ASIDE)
def test_the_files_a_resume_keeps_aside(line: str, names: list[str]) -> None:
    (command,) = parse_script(line)
    assert kept_aside(command) == names
