"""Habits of ordinary agents the fuzzer must run as they run deployed, not report as bugs:
blocking work handed to a thread (``asyncio.to_thread``, a thread pool) at the job's end is
waited for, rather than the fuzzer's clock running past it to the bounds; a handler of the
session's events (the user's turn, the session's close) runs in the job's context, where
an end-call tool it calls finds the job; a second session handed the call starts its
room I/O beside the first's published audio, as on a real room.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime, the
threads. Faked: the room (``InMemoryRoom``) and the session transport.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from pathlib import Path

import pytest
import yaml
from livekit.agents import (
    Agent,
    AgentServer,
    AgentSession,
    JobContext,
    UserStateChangedEvent,
    get_job_context,
)

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.fuzz import FuzzOutcome, replay
from tests.support import planted

# the shortest run the fuzzer found for both agents: the agent hangs up at once
HANG_UP = {
    "name": "the agent hangs up",
    "config": {"simulation": True},
    "participants": [{"identity": "simulator", "attributes": {"lk.simulator": "true"}}],
    "steps": [
        {"at": 0, "event": "session.start"},
        {"at": 0, "event": "ctx.shutdown", "reason": "the agent hung up"},
        {"at": 0, "event": "end"},
    ],
}


def blocking_save() -> None:
    time.sleep(0.01)  # a blocking client's call: real time, on a thread


def saves_in_a_shutdown_callback() -> AgentServer:
    """A shutdown callback writes the transcript through a thread pool."""
    server = AgentServer(session_end_timeout=315)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        async def save(reason: str) -> None:
            await asyncio.get_running_loop().run_in_executor(pool, blocking_save)

        ctx.add_shutdown_callback(save)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def saves_in_on_session_end() -> AgentServer:
    """The agent's on_session_end saves the call's record on a thread, then holds."""

    async def session_end(ctx: JobContext) -> None:
        await asyncio.to_thread(blocking_save)
        await on_session_end(ctx)

    return planted.session_end_server(session_end)


@pytest.mark.parametrize("agent", [saves_in_a_shutdown_callback, saves_in_on_session_end])
def test_work_on_a_thread_at_the_jobs_end_is_waited_for(agent: object, tmp_path: Path) -> None:
    # were: "closes: ctx.shutdown() at t=0, and the job never ended", and "on_session_end
    # timed out after 315s", for 10 ms of real work
    path = tmp_path / "hang_up.yaml"
    path.write_text(yaml.safe_dump(HANG_UP))
    report = replay(agent(), path)  # type: ignore[operator]
    assert report.problems == []


def ends_the_call_after_the_users_turn() -> AgentServer:
    """The user's turn ends; the agent's end-call tool finds its job through livekit's job
    context, asks for the room's deletion and shuts the job down."""
    server = AgentServer(session_end_timeout=315)

    async def end_call() -> None:
        job = AgentJob.for_job(get_job_context())
        if job is not None:
            job.request_room_deletion()
            job.shutdown("the user said goodbye")

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        session: AgentSession = AgentSession()

        calls: set[asyncio.Task[None]] = set()

        def on_user(ev: UserStateChangedEvent) -> None:
            if ev.old_state == "speaking":  # the LLM's tool call, in the turn's context
                calls.add(asyncio.create_task(end_call()))

        session.on("user_state_changed", on_user)
        job = AgentJob.from_job_context(ctx, session=session)
        await job.start(Agent(instructions="test"))

    return server


def test_a_tool_called_in_the_users_turn_finds_the_job_context(tmp_path: Path) -> None:
    # was: "the agent's task raised RuntimeError: no job context found", the turn run
    # in the fuzzer's own context
    path = tmp_path / "goodbye.yaml"
    speech = {"at": 0, "event": "user.speech", "duration": 0.5}
    steps = [HANG_UP["steps"][0], speech, {"at": 0, "event": "end"}]
    path.write_text(yaml.safe_dump({**HANG_UP, "steps": steps}))

    def hung_up_by_the_tool(outcome: FuzzOutcome) -> bool:
        return outcome.shutdown_reason == "the user said goodbye"

    report = replay(ends_the_call_after_the_users_turn(), path, checks=[hung_up_by_the_tool])
    assert report.problems == []


def reports_the_call_as_the_session_closes(reported: list[str]) -> AgentServer:
    """The session's close handler reports the call, reading livekit's job context."""
    server = AgentServer(session_end_timeout=315)

    async def report_call() -> None:
        reported.append(get_job_context().room.name)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        session: AgentSession = AgentSession()
        session.on("close", lambda _: asyncio.create_task(report_call()))
        job = AgentJob.from_job_context(ctx, session=session)
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.parametrize("graceful", [True, False])
def test_a_close_the_agents_code_asks_runs_its_handlers_in_the_job(
    graceful: bool, tmp_path: Path
) -> None:
    # was: "the agent's task raised RuntimeError: no job context found"
    path = tmp_path / "aclose.yaml"
    aclose = {"at": 0, "event": "job.aclose", "graceful": graceful}
    steps = [HANG_UP["steps"][0], aclose, {"at": 0, "event": "end"}]
    path.write_text(yaml.safe_dump({**HANG_UP, "steps": steps}))
    reported: list[str] = []
    assert replay(reports_the_call_as_the_session_closes(reported), path).problems == []
    assert reported == ["fuzz-room"]


def hands_the_call_to_a_second_session() -> AgentServer:
    """A warm transfer: the user's first turn hands the call to a specialist's session,
    started on the room beside the first session's published audio, and attached."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        first: AgentSession = AgentSession()
        job = AgentJob.from_job_context(ctx, session=first)
        transfers: list[asyncio.Task[None]] = []

        async def transfer() -> None:
            second: AgentSession = AgentSession()
            await first.aclose()
            specialist = Agent(instructions="specialist")
            await second.start(agent=specialist, room=ctx.room, session_host=False)
            job.attach(second)

        def on_user(ev: UserStateChangedEvent) -> None:
            if ev.new_state == "speaking" and not transfers:
                transfers.append(asyncio.create_task(transfer()))

        first.on("user_state_changed", on_user)
        await job.start(Agent(instructions="front desk"))

    return server


def test_a_second_session_starts_its_room_io_beside_the_first_sessions_audio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # was: livekit's "Error in _init_task" (AttributeError: 'LocalAudioTrack' object has no
    # attribute 'track'): the in-memory room kept the agent's tracks, not their
    # publications, where the second session's transcription looks for the audio's
    path = tmp_path / "transfer.yaml"
    speech = {"at": 0, "event": "user.speech", "duration": 0.5}
    steps = [HANG_UP["steps"][0], speech, {"at": 5, "event": "end"}]
    path.write_text(yaml.safe_dump({**HANG_UP, "steps": steps}))
    with caplog.at_level(logging.ERROR):
        report = replay(hands_the_call_to_a_second_session(), path, logs=True)
    assert report.problems == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
