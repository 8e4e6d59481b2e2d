"""``agent-runtime diff REV`` on a temporary git repository holding a copy of the specs:
the cells a committed or uncommitted spec change adds, removes or changes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_runtime.tools.cli import main
from agent_runtime.tools.commands.diff import diff_tables

# diffs of the specs as written
pytestmark = pytest.mark.snapshot

ROOT = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


# The temporary repository registers one machine this file owns, so the edits below do not
# depend on how the project's own specs are written today.
LAMP_SPEC = """
from .spec import Effect, MachineSpec, State, cells, row

LAMP = MachineSpec(
    name="lamp",
    initial="off",
    states=(State(name="off"), State(name="on"), State(name="broken", final=True)),
    events=("press", "surge", "tick"),
    guards=("armed",),
    effects=(Effect(name="glow"),),
    rows=(
        *row("off", "press", "on", guards=["armed"], effects=["glow"]),
        *row("off", "press", "off"),
        *row("on", "press", "off"),
        *row(["off", "on"], "surge", "broken"),
    ),
    ignore=(*cells(["off", "on"], "tick"), *cells("broken", ["press", "surge", "tick"])),
)
"""
MACHINES_PY = """
from .lamp import LAMP
from .spec import MachineSpec

MACHINES: dict[str, MachineSpec] = {"lamp": LAMP}
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "notes.md").write_text("before the machines\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "no machines yet")
    shutil.copytree(
        ROOT / "statemachines", repo / "statemachines", ignore=shutil.ignore_patterns("__pycache__")
    )
    (repo / "statemachines" / "lamp.py").write_text(LAMP_SPEC)
    (repo / "statemachines" / "machines.py").write_text(MACHINES_PY)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "machines")
    monkeypatch.chdir(repo)
    return repo


def test_no_change(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "HEAD"]) == 0
    assert "lamp: no change" in capsys.readouterr().out


def test_uncommitted_and_committed_changes(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lamp = repo / "statemachines" / "lamp.py"
    edit(lamp, '*row("on", "press", "off"),', '*row("on", "press", "off", effects=["glow"]),')
    edit(lamp, '*row(["off", "on"], "surge", "broken"),', '*row("off", "surge", "broken"),')
    edit(
        lamp, 'cells(["off", "on"], "tick")', 'cells(["off", "on"], "tick"), *cells("on", "surge")'
    )
    assert main(["diff", "HEAD"]) == 1  # changed: as diff(1), so CI can gate on it
    out = capsys.readouterr().out
    head = git(repo, "rev-parse", "--short", "HEAD").strip()
    assert "lamp: 2 changed\n" in out
    assert "  ~ (on, surge)\n      was: -> broken\n      now: ignore\n" in out
    assert "  ~ (on, press)\n      was: -> off\n      now: -> off / glow\n" in out
    # each changed cell names the region of the diagram it is drawn in, as a link
    assert (
        "      now: -> off / glow\n      drawn: edge on -> off  (diagrams/lamp.svg#edge--on--off)\n"
    ) in out
    # a transition that became ignore: where it was drawn, in the picture of the revision
    # (it was a bare link into today's picture, which has no such region)
    assert (
        "      now: ignore\n      drawn before: edge on -> broken  "
        f"(diagrams/lamp.svg#edge--on--broken as of {head})\n"
    ) in out

    git(repo, "commit", "-qam", "lamp: surges no longer break a lit lamp")
    assert main(["diff", "HEAD"]) == 0
    assert "lamp: no change" in capsys.readouterr().out
    assert main(["diff", "HEAD~1"]) == 1
    assert "~ (on, surge)" in capsys.readouterr().out


def test_a_cell_that_moved_links_both_places_each_in_its_own_picture(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(
        repo / "statemachines" / "lamp.py",
        '*row("on", "press", "off"),',
        '*row("on", "press", "broken"),',
    )
    assert main(["diff", "HEAD"]) == 1
    head = git(repo, "rev-parse", "--short", "HEAD").strip()
    assert (
        "  ~ (on, press)\n"
        "      was: -> off\n"
        "      now: -> broken\n"
        "      drawn: edge on -> broken  (diagrams/lamp.svg#edge--on--broken)\n"
        f"      drawn before: edge on -> off  (diagrams/lamp.svg#edge--on--off as of {head})\n"
    ) in capsys.readouterr().out


def test_added_and_removed_cells(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lamp = repo / "statemachines" / "lamp.py"
    edit(lamp, '("press", "surge", "tick")', '("press", "surge", "tick", "dim")')
    edit(lamp, 'cells(["off", "on"], "tick")', 'cells(["off", "on"], "tick"), *cells("on", "dim")')
    edit(
        lamp,
        '*cells("broken", ["press", "surge", "tick"])',
        '*cells("broken", ["press", "surge", "tick", "dim"])',
    )
    lamp.write_text(
        lamp.read_text().replace(
            "    ignore=(", '    reject=(*cells("off", "dim"),),\n    ignore=('
        )
    )
    assert main(["diff", "HEAD"]) == 1
    out = capsys.readouterr().out
    assert "lamp: 3 added\n" in out
    assert "  + (off, dim): reject\n" in out
    assert (
        "  + (off, dim): reject\n"
        "      drawn: nowhere, dim is not a transition in off (the table: diagrams/lamp.md)\n"
    ) in out
    assert "  + (broken, dim): ignore\n" in out


def test_a_revision_before_the_machines_shows_them_all_new(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", "HEAD~1"]) == 1
    out = capsys.readouterr().out
    assert "lamp: new machine, 9 cells" in out
    assert "  + (off, press): [armed] -> on / glow; else -> off" in out


def test_bad_revision_is_a_clear_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "no-such-rev"]) == 2
    assert "agent-runtime diff: unknown git revision 'no-such-rev'" in capsys.readouterr().err


def test_specs_that_do_not_load_are_a_clear_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(repo / "statemachines" / "lamp.py", '"tick")', '"tock")')
    assert main(["diff", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert "cannot load the machines of the working tree: " in err
    assert "tick" in err  # the spec validation message


def test_outside_a_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert main(["diff", "HEAD"]) == 2
    assert "is not inside a git repository" in capsys.readouterr().err


def test_removed_machines_and_initial_state() -> None:
    cell = {"kind": "ignore"}
    old = {
        "a": {"initial": "x", "cells": {"x": {"e": cell}}},
        "gone": {"initial": "x", "cells": {"x": {"e": cell}}},
    }
    new = {"a": {"initial": "y", "cells": {"x": {"e": cell}}}}
    assert diff_tables(old, new) == [
        "a: initial state changed",
        "  initial state: x -> y",
        "gone: machine removed (1 cells)",
    ]
