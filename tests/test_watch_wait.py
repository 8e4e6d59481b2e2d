"""``agent-runtime watch`` started before the job has written its trace: it waits for the
file (as ``tail -F`` does), says so once, and stops on Ctrl-C as a follower does; a path
that can never be a trace file is refused at once.

Run in the process, with the command's pauses replaced: each pause is a step of the test
(the job writes its trace, the user presses Ctrl-C), never a real wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_runtime.testing.runner import run_scenario
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.tools.cli import main
from agent_runtime.tools.commands import watch as watch_command

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "user_leaves.yaml"


@pytest.fixture(scope="module")
def trace_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("wait") / "full.jsonl"
    asyncio.run(run_scenario(load_scenario(SCENARIO), trace_path=path))
    return path.read_text(encoding="utf-8")


def pauses(monkeypatch: pytest.MonkeyPatch, *steps: Callable[[], None]) -> list[float]:
    """The command's pauses run ``steps`` in turn, then Ctrl-C; returns their lengths."""
    taken: list[float] = []

    def pause(seconds: float) -> None:
        taken.append(seconds)
        if len(taken) > len(steps):
            raise KeyboardInterrupt
        steps[len(taken) - 1]()

    monkeypatch.setattr(watch_command, "pause", pause)
    return taken


def nothing() -> None:
    pass


@pytest.mark.parametrize("where", ["job.jsonl", "traces/job-1/job.jsonl"], ids=["file", "dirs"])
def test_a_trace_not_written_yet_is_waited_for_then_followed(
    tmp_path: Path,
    trace_text: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    # watch started before the agent: it was "no such file", exit 2, and the developer had
    # to start it again once the job had begun (the runtime makes a trace_path's missing
    # directories, so a missing directory is waited for too)
    trace = tmp_path / where

    def job_writes() -> None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_text(trace_text, encoding="utf-8")

    taken = pauses(monkeypatch, nothing, nothing, job_writes, nothing)
    code = main(["watch", str(trace), "--interval", "0.5"])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.err == f"agent-runtime watch: waiting for {trace} to be written\n"
    assert "participant" in captured.out and "closing -> closed  on close_done" in captured.out
    assert taken == [0.5] * 5  # three while waiting, one after the first read, then Ctrl-C


def test_ctrl_c_while_waiting_ends_it_as_it_ends_a_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "job.jsonl"
    pauses(monkeypatch, nothing)
    code = main(["watch", str(trace)])
    captured = capsys.readouterr()
    assert (code, captured.out) == (0, "")
    assert captured.err == f"agent-runtime watch: waiting for {trace} to be written\n"


def test_a_trace_that_appears_as_no_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "job.jsonl"
    pauses(monkeypatch, trace.mkdir)
    code = main(["watch", str(trace)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err == [
        f"agent-runtime watch: waiting for {trace} to be written",
        f"agent-runtime watch: {trace}: a directory, not a trace file",
    ]


@pytest.mark.parametrize("case", ["directory", "under-a-file", "once"])
def test_a_path_that_cannot_become_a_trace_is_refused_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    (tmp_path / "notes.txt").write_text("not a directory\n", encoding="utf-8")
    path, message, extra = {
        "directory": (tmp_path, "a directory, not a trace file", []),
        "under-a-file": (
            tmp_path / "notes.txt" / "job.jsonl",
            f"{tmp_path / 'notes.txt'} is not a directory: no trace can be written there",
            [],
        ),
        # --once shows what is there now: nothing to wait for
        "once": (tmp_path / "job.jsonl", "no such file", ["--once"]),
    }[case]
    taken = pauses(monkeypatch)
    code = main(["watch", str(path), *extra])
    captured = capsys.readouterr()
    assert (code, captured.out, taken) == (2, "", [])
    assert captured.err == f"agent-runtime watch: {path}: {message}\n"
