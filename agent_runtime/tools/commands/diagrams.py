"""``agent-runtime diagrams [--out DIR] [--check]``: write or check the generated diagrams.

Writes, for every machine, ``NAME.mmd`` (Mermaid), ``NAME.dot`` (Graphviz), ``NAME.md`` (the
whole table) and ``NAME.svg`` when the ``dot`` program is on PATH; the same for the whole job
(``whole-job.*``: the machines and the channels between them); and ``README.md`` embedding
every Mermaid diagram. Each SVG outlines the region a link's ``#id`` names (the ids
``agent-runtime diff`` prints). ``--check`` compares the text files with the disk (SVG
bytes vary with the Graphviz version, so they are never compared).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from agent_runtime.tools.render import DIAGRAM_SUFFIXES, diagram_files
from agent_runtime.tools.system_diagram import NAME as WHOLE_JOB
from statemachines.machines import MACHINES
from statemachines.spec import MachineSpec

_GENERATED_SUFFIXES = (*DIAGRAM_SUFFIXES, ".svg")
PROG = "agent-runtime diagrams"


def _strays(out: Path, expected: set[str]) -> list[Path]:
    """Generated-looking files no current machine accounts for (e.g. a removed machine's)."""
    if not out.is_dir():
        return []
    return sorted(
        p
        for p in out.iterdir()
        if p.is_file() and p.suffix in _GENERATED_SUFFIXES and p.name not in expected
    )


def _svgs(machines: Mapping[str, MachineSpec]) -> set[str]:
    """Every machine's SVG and the whole job's."""
    return {f"{name}.svg" for name in (*machines, WHOLE_JOB)}


def check(out: Path, machines: Mapping[str, MachineSpec]) -> list[str]:
    """One line per stale, missing or stray file; empty when the directory is current."""
    files = diagram_files(machines)
    problems: list[str] = []
    for name, text in files.items():
        path = out / name
        if not path.is_file():
            problems.append(f"missing: {path}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"stale: {path}")
    svgs = _svgs(machines)
    for p in _strays(out, set(files) | svgs):
        problems.append(f"stray: {p} (no machine named {p.stem!r})")
    return problems


def write(out: Path, machines: Mapping[str, MachineSpec]) -> int:
    files = diagram_files(machines)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    svgs = _svgs(machines)
    for p in _strays(out, set(files) | svgs):
        p.unlink()
        print(f"removed {p} (no machine named {p.stem!r})")
    dot = shutil.which("dot")
    if dot is None:
        print("the Graphviz `dot` program is not on PATH: SVGs not rendered", file=sys.stderr)
        return 0
    code = 0
    for name in (*machines, WHOLE_JOB):
        src, svg = out / f"{name}.dot", out / f"{name}.svg"
        done = subprocess.run(
            [dot, "-Tsvg", str(src)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=False,
        )
        if done.returncode != 0:
            print(f"dot failed on {src}: {done.stderr.strip()}", file=sys.stderr)
            code = 1
            continue
        # rendered in memory and written only when it differs, so an SVG is listed like
        # every other file written, and a run that changes nothing lists nothing
        text = _outline_targets(done.stdout)
        if not svg.is_file() or svg.read_text(encoding="utf-8") != text:
            svg.write_text(text, encoding="utf-8")
            print(f"wrote {svg}")
    return code


# a link to diagrams/NAME.svg#REGION (as `agent-runtime diff` prints) outlines that region
_TARGET_STYLE = (
    "<style>:target path, :target polygon, :target ellipse "
    "{ stroke: #d1242f; stroke-width: 3; } :target text { fill: #d1242f; }</style>"
)


def _outline_targets(text: str) -> str:
    """The SVG with the style that outlines a linked region, once."""
    start = text.find("<svg")
    end = text.find(">", start) + 1
    if start < 0 or end <= 0 or _TARGET_STYLE in text:
        return text
    return text[:end] + "\n" + _TARGET_STYLE + text[end:]


def _not_a_directory(out: Path) -> Path | None:
    """The existing file that stands where ``out`` or one of its parents would be a
    directory, if any."""
    for p in (out, *out.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    blocker = _not_a_directory(out)
    if blocker is not None:
        # refused before anything is written: a file there is the user's, never replaced
        where = "" if blocker == out else f" ({blocker} is a file)"
        print(f"{PROG}: {out}: not a directory{where}", file=sys.stderr)
        return 2
    if args.check:
        problems = check(out, MACHINES)
        if problems:
            for line in problems:
                print(line, file=sys.stderr)
            print(
                f"{len(problems)} diagram file(s) out of date; run `agent-runtime diagrams"
                + (f" --out {args.out}" if args.out != "diagrams" else "")
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
