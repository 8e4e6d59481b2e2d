"""A session whose ``start()`` did not finish is released with the job.

livekit's ``AgentSession.start()`` starts RoomIO (its room listeners, its transcript and
audio tasks, the inputs and outputs it gives the session) before it starts the agent's
activity. When the start is cut there (the job closes, the room goes away) or fails there
(a model provider refuses), livekit only cancels the tasks it was awaiting, and its
``aclose()`` does nothing for a session that is not started. What a user notices after
``aclose()`` is what these tests pin: the room has the listeners it had before the job, no
task of the session runs on, ``audio_route()`` says ``none``, and the agent can be started
again in a new job.

Real: ``AgentSession`` and its RoomIO, every machine's runtime. Faked, because they need a
server: the room (``InMemoryRoom``), and the model provider behind the agent's activity (a
toolset whose setup never answers, an LLM that refuses as it is warmed up).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, JobContext, llm, telemetry
from livekit.agents.testing import fake_job_context
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agent_runtime import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from tests.support.playout_rig import AskedLLM

ROOM = "hs-room"  # the room the fixtures build (tests/conftest.py)


class SilentProvider(llm.Toolset):
    """A toolset whose setup waits on a provider that never answers (an MCP server that
    accepts the connection and says nothing), until it is cancelled."""

    async def setup(self) -> SilentProvider:
        await asyncio.get_running_loop().create_future()
        return self


class RefusingLLM(AskedLLM):
    """A model provider that refuses the session once, as the agent's activity starts (a
    flaky network), and takes it the next time."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False

    def prewarm(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not self.refused:
            self.refused = True
            raise ConnectionError("the model provider refused the session")


def other_tasks() -> list[str]:
    me = asyncio.current_task()
    return sorted(
        getattr(t.get_coro(), "__qualname__", t.get_name())
        for t in asyncio.all_tasks()
        if t is not me and not t.done()
    )


async def assert_released(job: AgentJob, room: InMemoryRoom, listeners: int) -> None:
    await settle()
    assert job.lifecycle == "closed" and not job.session._started
    assert room.listener_count() == listeners
    assert other_tasks() == []  # no RoomIO._forward_user_transcript, no audio forwarding
    assert job.audio_route() == "none"


async def run_until(clock: VirtualClock, done: Any, limit: float = 20.0) -> None:
    while not done():
        assert clock.now() < limit, "still waiting"
        await settle()
        await clock.advance(1.0)


@pytest.mark.parametrize("how", ["close", "abort", "room-gone"])
async def test_a_session_start_cut_after_roomio_started_leaves_nothing_behind(
    room: InMemoryRoom, clock: VirtualClock, how: str
) -> None:
    room.add_participant("user")
    listeners = room.listener_count()
    agent = Agent(instructions="agent", tools=[SilentProvider(id="mcp")])
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    starting = asyncio.create_task(job.start(agent))
    await settle()
    await clock.advance(1.0)
    # RoomIO runs (the agent's activity waits on its provider): the room is followed
    assert job.lifecycle == "starting" and room.listener_count() > listeners
    assert "RoomIO._forward_user_transcript" in other_tasks()
    if how == "room-gone":
        room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    else:
        closing = asyncio.create_task(job.aclose(graceful=how == "close"))
    await run_until(clock, lambda: starting.done() and job.lifecycle == "closed")
    with pytest.raises(RuntimeError, match="closed before it finished starting"):
        await starting
    if how != "room-gone":
        await closing
    await asyncio.wait_for(job.wait_closed(), 5)
    await assert_released(job, room, listeners)


async def test_a_session_start_that_fails_after_roomio_started_leaves_nothing_behind(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.add_participant("user")
    listeners = room.listener_count()
    agent = Agent(instructions="agent", llm=RefusingLLM())
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    with pytest.raises(ConnectionError, match="refused the session"):
        await job.start(agent)
    await asyncio.wait_for(job.aclose(), 5)
    await assert_released(job, room, listeners)
    # the agent's half-started activity went with it: the user can try again with it
    again = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await again.start(agent)
    assert again.lifecycle == "running" and again.audio_route() == "room"
    await asyncio.wait_for(again.aclose(), 5)
    await assert_released(again, room, listeners)


async def test_half_started_sessions_do_not_pile_up_across_jobs(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.add_participant("user")
    listeners = room.listener_count()
    for _ in range(3):  # one worker process serves job after job
        agent = Agent(instructions="agent", tools=[SilentProvider(id="mcp")])
        job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
        starting = asyncio.create_task(job.start(agent))
        await settle()
        closing = asyncio.create_task(job.aclose())
        both = asyncio.gather(starting, closing, return_exceptions=True)
        await run_until(clock, both.done, clock.now() + 20)
        await both
        await assert_released(job, room, listeners)


@pytest.mark.parametrize("how", ["cut", "failed"])
async def test_a_half_started_sessions_span_ends_with_the_job(
    room: InMemoryRoom, clock: VirtualClock, spans: InMemorySpanExporter, how: str
) -> None:
    """The ``agent_session`` span livekit opens as the start begins is ended by the job's
    close, as livekit's own close ends a started session's: an exporter gets it (an open
    span is never exported, and the session's time never shows in the trace backend)."""
    room.add_participant("user")
    if how == "cut":
        agent = Agent(instructions="agent", tools=[SilentProvider(id="mcp")])
    else:
        agent = Agent(instructions="agent", llm=RefusingLLM())
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    starting = asyncio.create_task(job.start(agent))
    await settle()
    await clock.advance(1.0)
    if how == "cut":  # the start still runs: its span is open
        assert not [s for s in spans.get_finished_spans() if s.name == "agent_session"]
    closing = asyncio.create_task(job.aclose())
    both = asyncio.gather(starting, closing, return_exceptions=True)
    await run_until(clock, both.done)
    await both
    await assert_released(job, room, room.listener_count())
    ended = [s for s in spans.get_finished_spans() if s.name == "agent_session"]
    assert len(ended) == 1 and ended[0].end_time is not None


async def test_a_job_context_whose_job_closed_on_its_room_is_refused_saying_so(
    ctx: JobContext, room: InMemoryRoom
) -> None:
    """A start that fails closes the job (raised at once; ``wait_closed()`` waits for the
    close), and the close disconnects the room the job followed, as livekit's shutdown
    does: a second ``AgentJob`` for that job context, or a second ``start()``, is refused
    saying the job has ended, not started on a room that is gone."""
    room.add_participant("user")
    agent = Agent(instructions="agent", llm=RefusingLLM())
    job = AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
    with pytest.raises(ConnectionError, match="refused the session"):
        await job.start(agent)
    with pytest.raises(RuntimeError, match=r"already has an AgentJob \(closing\)"):
        AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
    await asyncio.wait_for(job.wait_closed(), 5)
    assert not room.isconnected() and AgentJob.for_job(ctx) is None
    with pytest.raises(RuntimeError, match="AgentJob is closed, and its room goes with it"):
        AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
    with pytest.raises(RuntimeError, match="a new session comes as a new job"):
        await job.start(agent)


@pytest.mark.parametrize("how", ["connect-failed", "closed-before-start", "agent-connected-first"])
async def test_a_job_context_whose_job_never_followed_its_room_takes_a_new_job(
    room: InMemoryRoom, how: str
) -> None:
    """A job closed before it followed the room (its ``ctx.connect()`` failed once, or it
    was closed before it started) disconnected nothing and ended no livekit job: a new
    ``AgentJob`` for the same context starts. The room the agent connected itself before
    building the job was disconnected by that close: the new job ran on a dead room."""
    if how != "agent-connected-first":
        room.disconnect_locally()  # as a real job's room before ctx.connect()
    room.add_participant("user")
    connects = 0

    async def flaky_connect(*_: Any, **__: Any) -> None:
        nonlocal connects
        connects += 1
        if connects == 1 and how == "connect-failed":
            raise ConnectionError("signal timeout")
        if not room.isconnected():
            room.connect_locally()

    with fake_job_context(room=room) as ctx:
        ctx.connect = flaky_connect  # type: ignore[method-assign]
        job = AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
        if how == "connect-failed":
            with pytest.raises(ConnectionError, match="signal timeout"):
                await job.start(Agent(instructions="agent"))
        await asyncio.wait_for(job.aclose(), 5)
        assert room.isconnected() == (how == "agent-connected-first")  # left as it was
        with pytest.raises(RuntimeError, match="this job is closed; build a new AgentJob"):
            await job.start(Agent(instructions="agent"))
        again = AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
        await again.start(Agent(instructions="agent"))
        assert again.lifecycle == "running" and again.audio_route() == "room"
        await asyncio.wait_for(again.aclose(), 5)


async def test_after_a_half_start_the_jobs_records_go_to_the_job_span(
    room: InMemoryRoom, spans: InMemorySpanExporter
) -> None:
    """Once the half-started session's span is ended, the job's later transitions (its
    close) are events of the span around the job (livekit's ``job_entrypoint``), as after
    a started session's close: not of the ended session span, where nobody sees them."""
    room.add_participant("user")
    root = telemetry.tracer.start_span("job_entrypoint")
    with trace.use_span(root, end_on_exit=False):
        job = AgentJob(room=room, session=AgentSession())
        with pytest.raises(ConnectionError, match="refused the session"):
            await job.start(Agent(instructions="agent", llm=RefusingLLM()))
    await asyncio.wait_for(job.wait_closed(), 5)
    root.end()
    closed = [
        s.name
        for s in spans.get_finished_spans()
        for e in s.events
        if e.name == "fsm.transition"
        and (e.attributes or {}).get("fsm.machine") == "agent_job"
        and (e.attributes or {}).get("fsm.dest") == "closed"
    ]
    assert closed == ["job_entrypoint"]
