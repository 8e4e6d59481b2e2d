"""``job.shutdown`` in scenarios and in the fuzzer is the agent's ``AgentJob.shutdown()``.

The scenario runner's ``job.shutdown`` step closed the session itself before telling the
job, as ``ctx.shutdown()`` does, and the fuzzer drew only ``ctx.shutdown()``: an
``AgentJob.shutdown()`` that left the agent on the call through the hold (fixed in
``JobSystem._hang_up``) passed every scenario and every fuzz. With that fix undone here
(``hang_up`` doing nothing), a scenario and a fuzz now show it; ``ctx.shutdown`` is the
step for livekit's own end.

Real: the runtime, the scenario runner, livekit's fake ``JobContext``, ``AgentSession``,
``AgentServer``, hypothesis. Faked, because they need a server: the room and the session
transport.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end
from agent_runtime.system.job_system import JobSystem
from agent_runtime.testing.fuzz import FuzzOptions, fuzz, replay
from agent_runtime.testing.runner import run_scenario
from agent_runtime.testing.scenario import load_scenario, parse_scenario

SEED = 4  # finds the fault in 10 runs and shrinks it in seconds (seed 1: 101 runs, 30 s)


def _hang_up_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(JobSystem, "_hang_up", lambda self: None)


def _held(event: str) -> dict[str, Any]:
    """A simulation whose agent ends the call at 1 s; looked at 10 s into the hold."""
    return {
        "name": f"{event} in a simulation",
        "config": {"simulation": True},
        "participants": [
            {"identity": "user"},
            {"identity": "simulator", "attributes": {"lk.simulator": "true"}},
        ],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": event, "reason": "the user said bye"},
            {"at": 10, "event": "end"},
        ],
    }


async def _states_in_the_hold(event: str) -> dict[str, str]:
    result = await run_scenario(parse_scenario(_held(event)))
    return dict(result["final_states"])


@pytest.mark.virtual_time
async def test_a_scenarios_job_shutdown_is_the_agents_own_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    off_the_call = {"job": "awaiting_finalize", "session": "ended", "participant": "closed"}
    on_the_call = {"job": "awaiting_finalize", "session": "started", "participant": "linked"}
    states = await _states_in_the_hold("job.shutdown")
    assert off_the_call.items() <= states.items()

    _hang_up_undone(monkeypatch)  # AgentJob.shutdown() leaves the session running again
    states = await _states_in_the_hold("job.shutdown")
    assert on_the_call.items() <= states.items()
    # livekit's own end closes the session itself, whatever the job's shutdown does
    states = await _states_in_the_hold("ctx.shutdown")
    assert off_the_call.items() <= states.items()


def _server() -> AgentServer:
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def test_the_fuzzer_finds_an_agent_left_on_the_call_by_job_shutdown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _hang_up_undone(monkeypatch)
    report = fuzz(_server(), FuzzOptions(seed=SEED, examples=200, avatar=False), out=tmp_path)
    assert not report.ok
    assert report.problems[0].startswith("off the call: t="), report.problems
    assert report.written is not None
    steps = load_scenario(Path(report.written)).steps
    assert "job.shutdown" in [s.event for s in steps]
    again = replay(_server(), Path(report.written))
    assert not again.ok and again.problems == report.problems

    monkeypatch.undo()  # the fix back: the counterexample passes
    assert replay(_server(), Path(report.written)).ok
