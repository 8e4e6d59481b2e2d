"""The ``session`` machine in a real ``AgentJob``: each session's close heard once, from
livekit's own ``close`` event, and told to whoever follows it.

Real: ``AgentSession`` (started on the room with its RoomIO), every machine's runtime, the
scripted avatar plugin. Faked, because they need a server: the room (``InMemoryRoom``, a real
``rtc.Room`` with no connection) and the avatar participant's removal.
"""

from __future__ import annotations

import asyncio

import pytest
from livekit.agents import Agent, AgentSession, CloseEvent, CloseReason

from agent_runtime import AgentJob, MemorySink, Tracer
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom

ROOM = "sessions-room"  # the room the fixtures build (tests/conftest.py)


def agent() -> Agent:
    return Agent(instructions="agent")


async def test_the_jobs_own_session_closing_ends_the_job_once(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    sink = MemorySink()
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, tracer=Tracer(sink), otel=False)
    await job.start(agent())
    await settle()
    assert job.states["session"] == "started"
    await job.session.aclose()
    await settle()
    await job.wait_closed()
    assert job.close_reason == "user_initiated"
    closes = [
        r
        for r in sink.records
        if (r.kind, r.machine, r.event) == ("transition", "session", "session_closed")
    ]
    assert [(r.source, r.dest) for r in closes] == [("started", "ended")]  # heard once
    # the participant link and the host heard it through the machine's links
    heard = {(r.machine, r.event) for r in sink.records if r.kind == "transition"}
    assert {("participant", "session_closed"), ("session_host", "session_closed")} <= heard
    assert job.states["session"] == "closed"  # let go with the job
    await job.aclose()


async def test_another_session_attached_in_its_place_is_still_heard_after_the_own_one_ends(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """``attach(other)``: the job's own session is detached; its close is the participant
    link's and the avatar's, not the job's end. The attached one's close ends the job."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    other: AgentSession = AgentSession()  # type: ignore[type-arg]
    job.attach(other)
    await settle()
    await job.session.aclose()
    await settle()
    assert job.states["session"] == "ended"
    assert job.states["participant"] == "closed"  # it followed the job's own session
    assert job.states["job"] == "serving"  # the attached session still runs
    other.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    await job.wait_closed()
    assert job.states["job"] == "closed"
    await job.aclose()


async def test_a_second_start_of_the_session_is_refused_and_the_job_goes_on(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The lifecycle lets a part start while running (the avatar may come later); the
    session's start is taken once, by the session machine's ``start``."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start_session(agent())
    other: AgentSession = AgentSession()  # type: ignore[type-arg]
    job.attach(other)
    job.attach(job.session)
    other.emit("close", _closed(CloseReason.USER_INITIATED))  # another session's close
    await settle()
    with pytest.raises(RuntimeError, match="already started"):
        await job.start_session(agent())
    await settle()
    assert (job.lifecycle, job.states["session"], job.states["job"]) == (
        "running",
        "started",
        "serving",
    )
    await job.aclose()
    assert job.states["session"] == "closed"


async def test_the_own_session_closed_before_any_start_may_still_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """livekit lets a session that closed before it started start again; so does the job
    (the claim is only refused once a start took the session)."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.attach(job.session)
    job.attach(AgentSession())  # attached in its place: the own one's close is not the end
    await settle()
    job.session.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    assert (job.states["session"], job.close_reason) == ("new", "user_initiated")
    await job.start(agent())
    await settle()
    assert (job.lifecycle, job.states["session"], job.states["job"]) == (
        "running",
        "started",
        "serving",
    )
    await job.aclose()


async def test_the_close_reason_is_known_inside_a_users_own_close_handler(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    seen: list[str | None] = []
    job.session.on("close", lambda _ev: seen.append(job.close_reason))
    await job.session.aclose()
    assert seen == ["user_initiated"]
    await job.aclose()


async def test_the_own_session_attached_again_and_closing_again_ends_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """Its second close is the host's to judge: attached again, it ends the job."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    job.attach(AgentSession())
    await settle()
    await job.session.aclose()
    await settle()
    assert (job.states["session"], job.states["job"]) == ("ended", "serving")
    job.attach(job.session)
    await settle()
    job.session.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    await job.wait_closed()
    assert job.states["job"] == "closed"
    await job.aclose()


async def test_two_starts_of_the_session_at_once_let_one_through(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """livekit's own lock lets a second concurrent ``start()`` return quietly; the job
    refuses it plainly, and the session starts once."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start_runtime()
    results = await asyncio.gather(
        job.start_session(agent()), job.start_session(agent()), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, RuntimeError)]
    assert len(refused) == 1 and "already started" in str(refused[0]), results
    assert results.count(None) == 1
    await settle()
    assert (job.lifecycle, job.states["session"]) == ("running", "started")
    await job.aclose()


async def test_a_session_that_closed_is_not_started_again_by_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """After ``aclose()`` livekit would start the same session again; the job's session
    was taken by its first start, and a later one is refused."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start_session(agent())
    job.attach(AgentSession())  # in its place: the own session's close is not the end
    await settle()
    await job.session.aclose()
    await settle()
    assert (job.states["session"], job.lifecycle) == ("ended", "running")
    with pytest.raises(RuntimeError, match="already started"):
        await job.start_session(agent())
    assert not job.session._started  # the SDK's own flag: it was not started again
    await job.aclose()


async def test_other_sessions_closing_are_heard_whatever_became_of_the_own_one(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """Before the job's start, while its session runs and after it ended, another
    session's close leaves the job's session where it was, and is still told to the
    host: the attached one's close ends the job."""
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    first, second, third = AgentSession(), AgentSession(), AgentSession()
    job.attach(first)
    job.attach(job.session)  # first detached: its close is no one's end
    first.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    assert job.states["session"] == "new"
    await job.start(agent())
    job.attach(second)
    job.attach(job.session)
    second.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    assert job.states["session"] == "started"
    job.attach(third)
    await job.session.aclose()
    await settle()
    assert job.states["session"] == "ended"
    job.attach(first)  # third detached, first attached again
    third.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    assert (job.states["session"], job.states["job"]) == ("ended", "serving")
    first.emit("close", _closed(CloseReason.USER_INITIATED))
    await settle()
    await job.wait_closed()
    assert job.states["job"] == "closed"
    await job.aclose()


def _closed(reason: CloseReason) -> CloseEvent:
    return CloseEvent(reason=reason)
