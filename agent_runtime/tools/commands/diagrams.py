"""``agent-runtime diagrams [--out DIR] [--check]``: write or check the generated diagrams.

Without ``--out``: the project's ``diagrams/`` (here, else in the clone the package runs
from), from whatever directory it is run.

Writes, for every machine, ``NAME.mmd`` (Mermaid), ``NAME.dot`` (Graphviz), ``NAME.md`` (the
whole table) and ``NAME.svg`` (``machine_svg.py``'s drawing, the one the timeline page shows;
a link's ``#id``, as ``agent-runtime diff`` prints, outlines that region); for the whole job
(``whole-job.*``: the machines and the channels between them) the Mermaid and DOT files, and
``whole-job.svg`` when Graphviz's ``dot`` program is on PATH; and ``README.md`` embedding
every Mermaid diagram. ``--check`` compares every file but ``whole-job.svg`` with the disk
(its bytes vary with the Graphviz version).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from agent_runtime.tools.output import check_directory, project_dir, write_all, write_file
from agent_runtime.tools.render import DIAGRAM_SUFFIXES, diagram_files
from agent_runtime.tools.system_diagram import NAME as WHOLE_JOB
from statemachines.machines import MACHINES
from statemachines.spec import MachineSpec

PROG = "agent-runtime diagrams"


def _strays(out: Path, expected: set[str]) -> list[Path]:
    """Generated-looking files no current machine accounts for (e.g. a removed machine's)."""
    if not out.is_dir():
        return []
    return sorted(
        p
        for p in out.iterdir()
        if p.is_file() and p.suffix in DIAGRAM_SUFFIXES and p.name not in expected
    )


_WHOLE_JOB_SVG = f"{WHOLE_JOB}.svg"  # Graphviz's, when installed: expected, never compared
_OURS = "by `agent-runtime diagrams`"  # in the README.md this command writes


def _not_ours(out: Path) -> str | None:
    """Why ``out`` is not this command's to write: it holds files and no README.md of its
    own (a write replaces the README and removes every other diagram-like file there)."""
    if not out.is_dir() or all(p.name.startswith(".") for p in out.iterdir()):
        return None  # new, empty, or only a .gitkeep
    try:
        if _OURS in (out / "README.md").read_text(encoding="utf-8"):
            return None
    except (OSError, UnicodeDecodeError):
        pass
    return (
        "holds files agent-runtime diagrams did not write (no README.md of its own): give "
        "--out a new or empty directory (or put back the README.md it wrote there)"
    )


def check(out: Path, machines: Mapping[str, MachineSpec]) -> list[str]:
    """One line per stale, missing or stray file; empty when the directory is current."""
    files = diagram_files(machines)
    problems: list[str] = []
    for name, text in files.items():
        path = out / name
        if (why := _not_a_file(path)) is not None:
            problems.append(why)
            continue
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError) as e:  # stale all the same, but say why
            why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            problems.append(f"unreadable: {path} ({why})")
            continue
        if not same:
            problems.append(f"stale: {path}")
    for p in _strays(out, {*files, _WHOLE_JOB_SVG}):
        problems.append(f"stray: {p} (no machine named {p.stem!r})")
    return problems


def _not_a_file(path: Path) -> str | None:
    """The problem line for ``path`` when it is no regular file: missing, or what it is."""
    try:
        os.stat(path)
    except OSError as e:  # a link to nothing is missing too
        return (
            f"missing: {path}" if e.errno == errno.ENOENT else f"unreadable: {path} ({e.strerror})"
        )
    if path.is_dir():
        return f"not a file: {path} (a directory)"
    return None if path.is_file() else f"not a file: {path} (not a regular file)"


def write(out: Path, machines: Mapping[str, MachineSpec]) -> int:
    files = diagram_files(machines)
    changed = {
        name: text
        for name, text in files.items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    }
    # all written or none (each to a temporary file first): a directory stopped half-way
    # would be neither the old diagrams nor the new
    for path in write_all(out, changed):
        print(f"wrote {path}")
    for p in _strays(out, {*files, _WHOLE_JOB_SVG}):
        p.unlink()
        print(f"removed {p} (no machine named {p.stem!r})")
    dot = shutil.which("dot")
    if dot is None:
        print(
            f"the Graphviz `dot` program is not on PATH: {_WHOLE_JOB_SVG} not rendered",
            file=sys.stderr,
        )
        return 0
    src, svg = out / f"{WHOLE_JOB}.dot", out / _WHOLE_JOB_SVG
    done = subprocess.run(
        [dot, "-Tsvg", str(src)], capture_output=True, text=True, encoding="utf-8", check=False
    )
    if done.returncode != 0:
        print(f"dot failed on {src}: {done.stderr.strip()}", file=sys.stderr)
        return 1
    # rendered in memory and written only when it differs, so it is listed like every other
    # file written, and a run that changes nothing lists nothing
    if not svg.is_file() or svg.read_text(encoding="utf-8") != done.stdout:
        write_file(svg, done.stdout)
        print(f"wrote {svg}")
    return 0


DEFAULT_DIR = Path("diagrams")


def _out(args: argparse.Namespace) -> Path | None:
    """``--out``, else the project's ``diagrams/``: the one here, else the clone's this
    package runs from (as ``simulate`` finds ``examples/scenarios``); with neither, a write
    makes ``./diagrams`` and a check has nothing to check (``None``)."""
    if args.out is not None:
        return Path(args.out)
    found = project_dir(DEFAULT_DIR, __file__)
    return found if found is not None or args.check else DEFAULT_DIR


def run(args: argparse.Namespace) -> int:
    out = _out(args)
    if out is None:
        print(
            f"{PROG}: no {DEFAULT_DIR}/ directory here (nor in a clone of the project this "
            "package runs from) to check: give --out DIR",
            file=sys.stderr,
        )
        return 2
    # refused before anything is written: a file there is the user's, never replaced
    names = None if args.check else [*diagram_files(MACHINES), _WHOLE_JOB_SVG]
    why = check_directory(out, names) or (None if args.check else _not_ours(out))
    if why is None and args.check and not out.is_dir():
        why = "no such directory"
    if why is not None:
        print(f"{PROG}: {out}: {why}", file=sys.stderr)
        return 2
    if args.check:
        problems = check(out, MACHINES)
        if problems:
            for line in problems:
                print(line, file=sys.stderr)
            print(
                f"{len(problems)} diagram file(s) out of date; run `agent-runtime diagrams"
                + (f" --out {args.out}" if args.out is not None else "")
                + "` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"{out}: diagrams of {len(MACHINES)} machines and the whole job are up to date")
        return 0
    try:
        return write(out, MACHINES)
    except OSError as e:  # no permission, a full disk
        failed = e.filename if e.filename is not None else out
        print(f"{PROG}: {failed}: cannot write the diagrams ({e.strerror or e})", file=sys.stderr)
        return 2
