"""The fuzzer on an agent whose failure does not come back when its run is replayed (it keeps
state between jobs), and with a ``progress`` callback that raises: a report, never a
traceback.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room (``InMemoryRoom``) and the session
transport's byte stream.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, session_end_hook
from agent_runtime.testing.fuzz import FuzzOptions, fuzz
from agent_runtime.tools.cli import main

ONCE = "a cache that was stale once"


def once_failing_server(nth: int = 3) -> AgentServer:
    """on_session_end fails in the ``nth`` job of the process only: state kept between jobs
    (a module-level cache, a counter), so the same run passes when it is run again."""
    server = AgentServer(session_end_timeout=315)
    calls = [0]

    async def mine(ctx: JobContext) -> None:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError(ONCE)

    @server.rtc_session(on_session_end=session_end_hook(mine))
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


SERVER = once_failing_server()


def clean_server() -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=session_end_hook())
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def test_a_failure_that_does_not_come_back_is_reported_as_such(tmp_path: Path) -> None:
    """hypothesis runs a failing example again before it reports it; here it passed, and the
    fuzz ended in hypothesis' FlakyFailure traceback, the agent's failure inside it."""
    report = fuzz(once_failing_server(), FuzzOptions(seed=1, examples=20), out=tmp_path)
    assert not report.ok
    assert report.flaky
    assert any(ONCE in p for p in report.problems), report.problems
    summary = report.summary()
    assert "passed when it ran again" in summary
    # the run that failed is kept, to read (a replay may well pass)
    assert report.written is not None and Path(report.written).is_file()


def test_the_cli_says_so_in_its_report_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            "fuzz",
            f"{__file__}:SERVER",
            "--examples",
            "20",
            "--seed",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1, out + err
    # the agent's own traceback, as for any failure found; nothing of hypothesis' group
    assert "FlakyFailure" not in out + err and "hypothesis" not in out + err
    assert ONCE in out and "passed when it ran again" in out


def test_a_progress_callback_that_raises_is_dropped_and_the_fuzz_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Called from inside a run, its error was taken for the agent's failure: hypothesis
    shrank it, then ended in FlakyFailure (it raised only every progress_every seconds)."""
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if len(lines) == 2:  # the first line after the seed's: from inside a run
            raise BrokenPipeError(32, "Broken pipe")

    options = FuzzOptions(seed=1, examples=8, progress_every=1e-9)
    with caplog.at_level(logging.WARNING):
        report = fuzz(clean_server(), options, progress=progress)
    assert report.ok, report.summary()
    assert report.examples == 8
    assert len(lines) == 2  # dropped once it raised
    warned = [r for r in caplog.records if "progress" in r.getMessage()]
    assert len(warned) == 1 and "BrokenPipeError" in warned[0].getMessage()


def test_a_progress_callback_that_raises_at_once_is_dropped_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def progress(line: str) -> Any:
        raise ValueError("no terminal")

    with caplog.at_level(logging.WARNING):
        report = fuzz(clean_server(), FuzzOptions(seed=1, examples=3), progress=progress)
    assert report.ok and report.examples == 3
    assert sum("progress" in r.getMessage() for r in caplog.records) == 1
