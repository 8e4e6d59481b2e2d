"""``agent-runtime diff REV`` on a temporary git repository holding a copy of the specs:
the cells a committed or uncommitted spec change adds, removes or changes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent_runtime.cli import main
from agent_runtime.commands.diff import diff_tables

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
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "machines")
    monkeypatch.chdir(repo)
    return repo


def test_no_change(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "HEAD"]) == 0
    out = capsys.readouterr().out
    for name in ("avatar", "job", "session_host", "participant"):
        assert f"{name}: no change" in out


def test_uncommitted_and_committed_changes(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = repo / "statemachines" / "job.py"
    edit(
        job,
        '*row("awaiting_finalize", "hold_timeout", "closing"),',
        '*row("awaiting_finalize", "hold_timeout", "closing", effects=["run_close"]),',
    )
    edit(job, '*row("serving", "simulator_left", "closing"),', "")
    edit(
        job,
        '*cells("serving", ["hold_timeout", "close_done", "close_timeout"]),',
        '*cells("serving", ["hold_timeout", "close_done", "close_timeout", "simulator_left"]),',
    )
    assert main(["diff", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "job: 2 changed\n" in out
    assert ("  ~ (serving, simulator_left)\n      was: -> closing\n      now: ignore\n") in out
    assert (
        "  ~ (awaiting_finalize, hold_timeout)\n      was: -> closing\n"
        "      now: -> closing / run_close\n"
    ) in out
    assert "participant: no change" in out

    git(repo, "commit", "-qam", "job: hold timeout closes at once")
    assert main(["diff", "HEAD"]) == 0
    assert "job: no change" in capsys.readouterr().out
    assert main(["diff", "HEAD~1"]) == 0
    assert "~ (serving, simulator_left)" in capsys.readouterr().out


def test_added_and_removed_cells(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = repo / "statemachines" / "session_host.py"
    edit(host, '"request", "finalize", "close")', '"request", "finalize", "close", "ping")')
    edit(
        host,
        'reject=(*cells("closed", "attach", "the host is closed"),),',
        'reject=(*cells("closed", "attach", "the host is closed"), *cells(OPEN, "ping")),',
    )
    edit(
        host,
        '*cells("closed", ["detach", "request", "finalize", "close"], "the transport is gone"),',
        '*cells("closed", ["detach", "request", "finalize", "close", "ping"]),',
    )
    assert main(["diff", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "session_host: 3 added\n" in out
    assert "  + (detached, ping): reject\n" in out
    assert "  + (closed, ping): ignore\n" in out


def test_a_revision_before_the_machines_shows_them_all_new(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", "HEAD~1"]) == 0
    out = capsys.readouterr().out
    assert "job: new machine, 32 cells" in out
    assert "  + (serving, shutdown): [hold_needed] -> awaiting_finalize; else -> closing" in out


def test_bad_revision_is_a_clear_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "no-such-rev"]) == 2
    assert "agent-runtime diff: unknown git revision 'no-such-rev'" in capsys.readouterr().err


def test_specs_that_do_not_load_are_a_clear_error(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(repo / "statemachines" / "job.py", '"hold_timeout",\n', "")
    assert main(["diff", "HEAD"]) == 2
    err = capsys.readouterr().err
    assert "cannot load the machines of the working tree: " in err
    assert "hold_timeout" in err  # the spec validation message


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
