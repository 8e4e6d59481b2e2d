"""``agent-runtime diff REV``: the cells of every machine added, removed or changed since a git
revision, compared with the working tree.

Both sides are loaded the same way: the ``statemachines`` package (from ``git archive REV``
for the old side, from the working tree for the new one) is imported in a fresh interpreter
that prints the JSON cell table, so an old spec never mixes with the code running here.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from agent_runtime.tools import drawing
from agent_runtime.tools.drawing import describe_cell

# Run in a fresh interpreter with argv = [root, path of drawing.py]. drawing.py is loaded by
# path (it imports nothing from agent_runtime), next to the statemachines found at root.
_LOADER = """
import importlib.util, json, os, sys
root, drawing_path = sys.argv[1], sys.argv[2]
if not os.path.isfile(os.path.join(root, "statemachines", "machines.py")):
    print("{}")
    raise SystemExit(0)
sys.path.insert(0, root)
import statemachines
if not os.path.abspath(statemachines.__file__).startswith(os.path.abspath(root)):
    raise SystemExit(f"statemachines was imported from {statemachines.__file__}, not {root}")
from statemachines.machines import MACHINES
spec = importlib.util.spec_from_file_location("_agent_runtime_drawing", drawing_path)
mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = mod
spec.loader.exec_module(mod)
tables = {}
for name, m in MACHINES.items():
    tables[name] = mod.cell_table(m)
    tables[name]["regions"] = mod.cell_regions(m)
print(json.dumps(tables))
"""


class DiffError(Exception):
    """A revision or a spec that cannot be loaded; the message says which and why."""


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    if done.returncode != 0:
        raise DiffError(done.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
    return done.stdout.decode()


def load_tables(root: Path, *, what: str) -> dict[str, Any]:
    """The cell tables of the ``statemachines`` package under ``root``, by machine name."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", _LOADER, str(root), drawing.__file__],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DiffError(f"cannot load the machines of {what}: {last}")
    tables: dict[str, Any] = json.loads(done.stdout)
    return tables


def tables_at(rev: str, *, cwd: Path) -> tuple[str, dict[str, Any]]:
    """(short commit id, cell tables) of the machines at a git revision."""
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=cwd).strip()
    except DiffError:
        raise DiffError(f"unknown git revision {rev!r}") from None
    short = _git("rev-parse", "--short", commit, cwd=cwd).strip()
    with tempfile.TemporaryDirectory(prefix="agent-runtime-diff-") as tmp:
        if _git("ls-tree", "--name-only", commit, "statemachines", cwd=cwd).strip():
            done = subprocess.run(
                ["git", "archive", "--format=tar", commit, "statemachines"],
                cwd=cwd,
                capture_output=True,
                check=False,
            )
            if done.returncode != 0:
                raise DiffError(f"git archive {short} failed: {done.stderr.decode().strip()}")
            with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                    tar.extractall(tmp, filter="data")
                else:  # pragma: no cover - git's own archive of one directory
                    tar.extractall(tmp)
        return short, load_tables(Path(tmp), what=f"{rev} ({short})")


def _cells(table: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(s, e): cell for s, evs in table["cells"].items() for e, cell in evs.items()}


def _text(cell: Any) -> str:
    return "; ".join(describe_cell(cell))


def _drawn(
    name: str,
    key: tuple[str, str],
    now: dict[str, Any] | None,
    before: dict[str, Any] | None = None,
    rev: str = "",
) -> list[str]:
    """Where the cell is drawn in ``diagrams/NAME.svg``, as links a reviewer opens to see
    that region outlined: the working tree's picture (``drawn``), and a place only the
    picture at ``rev`` has (``drawn before``, a region of that revision's file)."""

    def regions(table: dict[str, Any] | None) -> list[tuple[str, str]]:
        found = (table or {}).get("regions", {}).get(key[0], {}).get(key[1], [])
        return [(ident, words) for ident, words in found]

    here = regions(now)
    lines = [f"      drawn: {words}  (diagrams/{name}.svg#{ident})" for ident, words in here]
    lines += [
        f"      drawn before: {words}  (diagrams/{name}.svg#{ident} as of {rev})"
        for ident, words in regions(before)
        if ident not in {i for i, _ in here}
    ]
    if not lines and any(t is not None and "regions" in t for t in (now, before)):
        lines.append(
            f"      drawn: nowhere, {key[1]} is not a transition in {key[0]} "
            f"(the table: diagrams/{name}.md)"
        )
    return lines


def diff_tables(old: dict[str, Any], new: dict[str, Any], rev: str = "REV") -> list[str]:
    """Readable lines: per machine, cells added (+), removed (-) and changed (~), each
    followed by where it is drawn (``rev``: the old side, named in its links)."""
    out: list[str] = []
    names = [*new, *(n for n in old if n not in new)]
    for name in names:
        if name not in old:
            cells = _cells(new[name])
            out.append(f"{name}: new machine, {len(cells)} cells")
            for (s, e), c in cells.items():
                out.append(f"  + ({s}, {e}): {_text(c)}")
                out += _drawn(name, (s, e), new[name])
            continue
        if name not in new:
            out.append(f"{name}: machine removed ({len(_cells(old[name]))} cells)")
            continue
        before, after = _cells(old[name]), _cells(new[name])
        lines: list[str] = []
        if old[name]["initial"] != new[name]["initial"]:
            lines.append(f"  initial state: {old[name]['initial']} -> {new[name]['initial']}")
        for key, cell in after.items():
            if key not in before:
                lines.append(f"  + ({key[0]}, {key[1]}): {_text(cell)}")
                lines += _drawn(name, key, new[name])
            elif before[key] != cell:
                lines.append(f"  ~ ({key[0]}, {key[1]})")
                lines.append(f"      was: {_text(before[key])}")
                lines.append(f"      now: {_text(cell)}")
                lines += _drawn(name, key, new[name], old[name], rev)
        for key, cell in before.items():
            if key not in after:
                lines.append(f"  - ({key[0]}, {key[1]}): {_text(cell)}")
                lines += _drawn(name, key, None, old[name], rev)
        if not lines:
            out.append(f"{name}: no change")
            continue
        counts = [
            f"{n} {label}"
            for label, n in (
                ("added", sum(1 for k in after if k not in before)),
                ("removed", sum(1 for k in before if k not in after)),
                ("changed", sum(1 for k in after if k in before and before[k] != after[k])),
            )
            if n
        ]
        out.append(f"{name}: {', '.join(counts) or 'initial state changed'}")
        out += lines
    return out


def run(args: argparse.Namespace) -> int:
    cwd = Path.cwd()
    try:
        try:
            root = Path(_git("rev-parse", "--show-toplevel", cwd=cwd).strip())
        except DiffError:
            raise DiffError(f"{cwd} is not inside a git repository") from None
        if not (root / "statemachines" / "machines.py").is_file():
            raise DiffError(f"no statemachines/machines.py in the working tree at {root}")
        short, old = tables_at(args.rev, cwd=root)
        new = load_tables(root, what="the working tree")
    except DiffError as e:
        print(f"agent-runtime diff: {e}", file=sys.stderr)
        return 2
    print(f"machine cells since {args.rev} ({short}), compared with the working tree")
    print("  + added   - removed   ~ changed   (rows of a cell are tried in order)")
    lines = diff_tables(old, new, short)
    for line in lines:
        print(line)
    # as diff(1) and git diff --exit-code: 1 when a cell changed, so CI can gate on it
    return 0 if all(line.endswith(": no change") for line in lines) else 1
