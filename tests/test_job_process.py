"""The kit ends a job as livekit's job process does (1.8.9 ``_shutdown_job``): the
entrypoint, the primary session, ``on_session_end``, the report, the room's disconnect, then
the shutdown callbacks at once with the reason; what fails in the agent's code fails the test.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime. Faked,
because they need a server: the room (``InMemoryRoom``) and the session transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, on_session_end, session_end_hook
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.user_code import UserCodeError


def _server(
    seen: list[str],
    *,
    failing_callback: bool = False,
    hanging_callback: bool = False,
    end_timeout: float = 315.0,
) -> AgentServer:
    server = AgentServer(session_end_timeout=end_timeout)

    async def session_end(ctx: JobContext) -> None:
        seen.append(f"on_session_end connected={ctx.room.isconnected()}")
        await on_session_end(ctx)

    @server.rtc_session(on_session_end=session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), grace_period=5)

        async def upload(reason: str) -> None:
            seen.append(f"callback {reason} connected={ctx.room.isconnected()}")
            if failing_callback:
                raise ValueError("the upload's bucket is gone")
            if hanging_callback:
                try:
                    await asyncio.Event().wait()  # an upload that never returns
                except asyncio.CancelledError:
                    await asyncio.Event().wait()  # and takes no for an answer only twice

        ctx.add_shutdown_callback(upload)
        await job.start(Agent(instructions="test"))

    return server


def _with_callback(callback: Callable[..., Any], *, on_job: bool = False) -> AgentServer:
    """A server whose entrypoint adds ``callback`` as a shutdown callback: the job
    context's (livekit's), or the job's own (``on_job``)."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        (job if on_job else ctx).add_shutdown_callback(callback)
        await job.start(Agent(instructions="test"))

    return server


async def _shut_down(
    room: InMemoryRoom, session_end: Callable[[JobContext], Any], **server: Any
) -> tuple[EntrypointRunner, Any]:
    """A job whose server runs ``session_end`` through ``session_end_hook``, started with a
    user in the room and shut down: its runner (for the test to close) and its process."""
    served = AgentServer(session_end_timeout=315, **server)

    @served.rtc_session(on_session_end=session_end_hook(session_end))
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    runner = EntrypointRunner(room=room)
    room.add_participant("user")
    await runner(served)
    runner.ctx.shutdown("bye")
    return runner, runner.process


async def test_a_user_who_leaves_ends_the_job_through_on_session_end_then_the_callbacks(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    seen: list[str] = []
    agent_room.add_participant("user")
    await run_entrypoint(_server(seen))
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    # the job's own close disconnected the room: livekit's end follows, as in production
    assert seen == [
        "on_session_end connected=False",
        "callback room disconnected connected=False",
    ]
    steps = [s for _, s in run_entrypoint.shutdown_steps]
    assert steps[-3:] == ["report", "disconnect", "callbacks"]


@pytest.mark.parametrize("how", ["ctx.shutdown", "kit session_end"])
async def test_an_agent_that_ends_the_call_has_the_room_in_its_on_session_end(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, how: str
) -> None:
    # livekit disconnects after on_session_end; the job's own close disconnected the room
    # first, under the agent's session-end callback (an end-call tool's path). The kit's
    # session_end() ended the job process behind the context, with the same result
    seen: list[str] = []
    agent_room.add_participant("user")
    await run_entrypoint(_server(seen))
    if how == "ctx.shutdown":
        run_entrypoint.ctx.shutdown("session ended")
    else:
        await asyncio.wait_for(run_entrypoint.session_end(), 5)
    await run_entrypoint.wait_ended()
    assert seen == [
        "on_session_end connected=True",
        "callback session ended connected=False",
    ]
    assert [s for _, s in run_entrypoint.shutdown_steps] == [
        "session",
        "on_session_end",
        "report",
        "disconnect",
        "callbacks",
    ]


async def test_a_shutdown_asks_on_session_end_while_the_hold_keeps_the_room(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    seen: list[str] = []
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    await run_entrypoint(_server(seen), simulation=True)
    run_entrypoint.ctx.shutdown("the agent hung up")
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    await virtual_clock.advance(300)  # the simulator never asks: the hold runs out
    await run_entrypoint.wait_ended()
    assert seen == [
        "on_session_end connected=True",
        "callback the agent hung up connected=False",
    ]
    assert [s for _, s in run_entrypoint.shutdown_steps] == [
        "session",
        "on_session_end",
        "report",
        "disconnect",
        "callbacks",
    ]
    assert run_entrypoint.shutdown_steps[-1][0] == 300.0


async def test_a_hold_cut_by_the_servers_shorter_bound_says_what_bound_it_needs(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # livekit says only "on_session_end timed out after 60s"; the verdict is lost with it
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    await run_entrypoint(_server([], end_timeout=60), simulation=True)
    run_entrypoint.ctx.shutdown("the agent hung up")
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        await virtual_clock.advance(60)
        with pytest.raises(UserCodeError, match="on_session_end timed out after 60s"):
            await run_entrypoint.wait_ended()
    (cut,) = [r.getMessage() for r in caplog.records if "was cut before" in r.getMessage()]
    assert "in job state awaiting_finalize" in cut
    assert "up to 310s (its session_end_timeout 300s + close_timeout 10s)" in cut


async def test_a_simulation_job_with_no_on_session_end_hook_warns_that_its_verdict_was_lost(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # rtc_session without on_session_end=on_session_end: livekit disconnects the room as
    # the session closes, which ends the hold before the simulator could ask; the verdict
    # was lost with nothing above INFO (a trial's report); the log says what to pass
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    await run_entrypoint(server, simulation=True)
    with caplog.at_level(logging.INFO, logger="agent_runtime"):
        run_entrypoint.ctx.shutdown("the agent hung up")
        await run_entrypoint.wait_ended()
    assert not agent_room.isconnected()
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(": ", 1)[1] for r in warned] == [
        "the hold ended as the room disconnected (a livekit job's room is disconnected as "
        "its session closes unless rtc_session was given on_session_end=on_session_end) "
        "without the simulator's verdict: the simulator had not asked for it "
        "(finalize_simulation); the job closes without it"
    ]


async def test_the_simulator_leaving_ends_the_job_as_livekit_does(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    seen: list[str] = []
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    await run_entrypoint(_server(seen), simulation=True)
    agent_room.remove_participant("simulator", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    assert seen[-1].startswith("callback simulation completed")


async def test_a_failing_shutdown_callback_fails_the_test_with_its_traceback(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    await run_entrypoint(_server([], failing_callback=True))
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError, match="shutdown callback raised ValueError") as info:
        await run_entrypoint.wait_ended()
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.__cause__.__traceback__ is not None


@pytest.mark.virtual_time
async def test_livekits_own_room_deletion_deletes_the_tests_room(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """``ctx.delete_room()``, as livekit's EndCallTool runs it in a shutdown callback: a
    fake job's only logged "not executed while in console mode", so a test could not tell
    an agent that deletes its room from one that never does."""

    async def delete_the_room() -> None:
        await ctx_of[0].delete_room()

    ctx_of: list[JobContext] = []
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        ctx_of.append(ctx)
        ctx.add_shutdown_callback(delete_the_room)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    run_entrypoint.ctx.shutdown("user ended the call")
    await run_entrypoint.wait_ended()
    assert agent_room.deleted_at is not None


@pytest.mark.virtual_time
async def test_livekits_room_deletion_disconnects_everyone_and_ends_the_job(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    """``ctx.delete_room()`` while the job serves (an end-call tool's, or the agent's own
    call): the server deletes the room and disconnects everyone, the agent's room with
    ``ROOM_DELETED``, and livekit's job process ends the job on that. The kit only noted
    ``deleted_at``: the room stayed connected, the user linked, the job serving."""
    reasons: list[int] = []
    agent_room.on("disconnected", reasons.append)
    agent_room.add_participant("user")
    job = await run_entrypoint(_server([]))
    await virtual_clock.advance(3)

    await run_entrypoint.ctx.delete_room()
    assert agent_room.deleted_at == 3.0
    assert reasons == [rtc.DisconnectReason.ROOM_DELETED] and not agent_room.isconnected()
    await run_entrypoint.wait_ended()
    assert run_entrypoint.process.reason == "room disconnected"
    assert job.states["job"] == "closed" and job.states["participant"] == "closed"


@pytest.mark.virtual_time
async def test_the_jobs_own_room_deletion_goes_through_the_same_server(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    """The job's own deletion (asked, run once its close allows it) runs after the job
    disconnected its room, as deployed: the room's one disconnect is the job's own. The
    room is deleted once: a later ``ctx.delete_room()`` finds none (the server's
    ``NOT_FOUND``, which livekit ignores) and changes nothing; the kit moved
    ``deleted_at`` to the later call."""
    reasons: list[int] = []
    agent_room.on("disconnected", reasons.append)
    agent_room.add_participant("user")
    job = await run_entrypoint(_server([]))
    job.request_room_deletion()
    await virtual_clock.advance(5)
    assert agent_room.deleted_at is None and agent_room.isconnected()

    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    assert agent_room.deleted_at == 5.0 and job.room_deleted_at == 5.0
    assert reasons == [rtc.DisconnectReason.CLIENT_INITIATED]
    await virtual_clock.advance(1)
    await run_entrypoint.ctx.delete_room()
    assert agent_room.deleted_at == 5.0


def _greets(seen: list[str], loaded: asyncio.Event | None = None) -> AgentServer:
    """A server whose entrypoint adds a participant entrypoint noting who it greets, (waits
    for ``loaded``, as an agent loading a model,) connects, then starts its job (which
    connects again: nothing more)."""
    server = AgentServer(session_end_timeout=315)

    async def greet(_: JobContext, p: rtc.RemoteParticipant) -> None:
        seen.append(p.identity)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        ctx.add_participant_entrypoint(greet)
        if loaded is not None:
            await loaded.wait()
        await ctx.connect()
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.virtual_time
async def test_a_participant_entrypoint_runs_for_those_already_in_the_room(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """livekit's ``ctx.connect()`` runs the participant entrypoints for the participants
    already there; a fake job context is connected from the start, so they ran only for
    those who joined later."""
    seen: list[str] = []
    agent_room.add_participant("user")
    await run_entrypoint(_greets(seen))
    agent_room.add_participant("late")
    await run_entrypoint.wait_for("job", "serving")
    assert seen == ["user", "late"]


@pytest.mark.virtual_time
async def test_a_participant_who_joins_before_the_first_connect_is_greeted_once(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """A real room brings no event before ``connect()``, which then runs the participant
    entrypoints once for each participant there: the fake context heard the join too."""
    seen: list[str] = []
    loaded = asyncio.Event()
    started = asyncio.ensure_future(run_entrypoint(_greets(seen, loaded)))
    await asyncio.sleep(0.01)
    agent_room.add_participant("user")  # joins while the entrypoint loads
    loaded.set()
    await started
    await asyncio.sleep(0.01)
    assert seen == ["user"]


@pytest.mark.virtual_time
async def test_two_failing_shutdown_callbacks_are_both_reported(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """The job's and livekit's callbacks both raise: the second was taken with the first
    and never raised, so it showed only once the first was fixed."""
    server = AgentServer(session_end_timeout=315)

    async def job_callback(_: str) -> None:
        raise RuntimeError("job callback boom")

    async def ctx_callback(_: str) -> None:
        raise KeyError("ctx callback boom")

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        ctx.add_shutdown_callback(ctx_callback)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.add_shutdown_callback(job_callback)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError, match=r"\(and 1 more: see below\)") as info:
        await run_entrypoint.wait_ended()
    told = [str(info.value), *info.value.__notes__]
    assert sum("job callback boom" in t for t in told) == 1
    assert sum("ctx callback boom" in t for t in told) == 1
    assert run_entrypoint.user_failures == []  # each reported once


@pytest.mark.virtual_time
async def test_a_shutdown_callback_without_the_reason_that_never_returns_is_named_too(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # livekit wraps one that takes no reason in a function of its own: it was taken for
    # livekit's and cancelled unnamed
    async def flush() -> None:
        await asyncio.Event().wait()

    agent_room.add_participant("user")
    await run_entrypoint(_with_callback(flush))
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError, match=r"shutdown callback .*<locals>.flush had not returned"):
        await run_entrypoint.aclose()


@pytest.mark.virtual_time
async def test_a_shutdown_callback_raising_a_base_exception_fails_the_test(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    class Abandoned(BaseException):
        pass

    async def abandon(_: str) -> None:
        raise Abandoned("gone")

    agent_room.add_participant("user")
    await run_entrypoint(_with_callback(abandon))
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError, match="shutdown callback raised Abandoned: gone"):
        await run_entrypoint.wait_ended()


@pytest.mark.virtual_time
async def test_a_shutdown_callback_that_never_returns_is_named_and_fails_the_test(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # it passed: livekit's worker would kill the process at shutdown_process_timeout
    agent_room.add_participant("user")
    await run_entrypoint(_server([], hanging_callback=True))
    run_entrypoint.ctx.shutdown("bye")
    process = run_entrypoint.process
    with pytest.raises(TimeoutError, match=r"shutdown callback .*upload has not returned"):
        await run_entrypoint.wait_ended(timeout=1)
    with pytest.raises(UserCodeError, match=r"shutdown callback .*upload had not returned") as info:
        await run_entrypoint.aclose()  # bounded, though the callback swallowed a cancel
    assert isinstance(info.value.__cause__, TimeoutError)
    # it swallowed the cancel: the test's end stops it, as the worker's kill does (left
    # running, the loop's own close would wait for it)
    assert not process.hung_callbacks


async def test_a_close_still_running_is_not_named_as_the_agents_callback(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    # the job's own safety net (waiting on the job's bounded close) was named "its shutdown
    # callback register.<locals>.on_livekit_shutdown has not returned"
    async def slow_upload() -> None:
        await asyncio.Event().wait()

    agent_room.add_participant("user")
    # no on_session_end: the job closes from its own shutdown callback on the job context
    await run_entrypoint(_with_callback(slow_upload, on_job=True))
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(TimeoutError) as info:
        await run_entrypoint.wait_ended(timeout=0.5)
    assert "on_livekit_shutdown" not in str(info.value)
    assert run_entrypoint.process.hung_callbacks == []
    await virtual_clock.advance(10)  # the job's close_timeout cuts the upload: the end ends
    await run_entrypoint.wait_ended()


@pytest.mark.virtual_time
async def test_a_session_end_of_the_agents_that_never_returns_fails_the_test(
    agent_room: InMemoryRoom,
) -> None:
    # it passed; the job's end was left running past the test, and the HTTP session the
    # callback used was closed under it
    from livekit.agents.utils import http_context

    used: list[Any] = []

    async def upload_transcript(ctx: JobContext) -> None:
        used.append(http_context.http_session())
        await asyncio.Event().wait()  # the transcript store never answers

    runner, process = await _shut_down(agent_room, upload_transcript)
    # livekit's process cuts it at the server's session_end_timeout and ends the job
    with pytest.raises(UserCodeError, match=r"on_session_end timed out after 315s"):
        await asyncio.wait_for(runner.aclose(), 1000)  # loop seconds: virtual
    assert process.ended.done() and used[0].closed
    assert [s for _, s in process.steps][-3:] == ["report", "disconnect", "callbacks"]


@pytest.mark.virtual_time
async def test_a_wait_for_the_end_names_the_agents_session_end_that_has_not_returned(
    agent_room: InMemoryRoom,
) -> None:
    # the stall said only "ending: room disconnected": the agent's on_session_end, where the
    # end waited, was named only later, as a teardown error
    async def upload_transcript(ctx: JobContext) -> None:
        await asyncio.Event().wait()  # the transcript store never answers

    runner, _ = await _shut_down(agent_room, upload_transcript)
    with pytest.raises(
        TimeoutError,
        match=r"its on_session_end .*upload_transcript\) has not returned \(livekit bounds it "
        r"by the server's session_end_timeout, 315s\)",
    ):
        await runner.wait_ended(timeout=30)
    with pytest.raises(UserCodeError, match=r"on_session_end timed out after 315s"):
        await asyncio.wait_for(runner.aclose(), 1000)


@pytest.mark.virtual_time
@pytest.mark.parametrize("kill_after", [60.0, 10.0])
async def test_a_slow_session_end_has_the_servers_session_end_timeout_whatever_the_kill_bound(
    agent_room: InMemoryRoom, kill_after: float
) -> None:
    # a worker counts shutdown_process_timeout once the process says it is shutting down,
    # after on_session_end: a 12 s upload failed a test whose server kills after 10 s
    async def upload_transcript(_ctx: JobContext) -> None:
        await asyncio.sleep(12)

    runner, process = await _shut_down(
        agent_room, upload_transcript, shutdown_process_timeout=kill_after
    )
    await runner.aclose()
    assert process.ended.done()
    assert [s for _, s in process.steps][-3:] == ["report", "disconnect", "callbacks"]


async def test_a_failing_event_handler_fails_the_test(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())

        def on_left(p: rtc.RemoteParticipant) -> None:
            raise KeyError(p.identity)  # the agent's own handler, which livekit only logs

        ctx.room.on("participant_disconnected", on_left)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(entrypoint)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    with pytest.raises(UserCodeError, match="raised KeyError"):
        await run_entrypoint.wait_ended()


async def test_logging_disabled_is_refused_rather_than_missing_the_agents_failures(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """A handler's failure reaches the kit only through livekit's log: with that log off the
    kit says so before the entrypoint runs, instead of passing a failing agent."""
    ran: list[str] = []

    async def entrypoint(ctx: JobContext) -> None:
        ran.append("entrypoint")

    logging.disable(logging.CRITICAL)
    try:
        with pytest.raises(RuntimeError, match=r"logging is disabled at ERROR"):
            await run_entrypoint(entrypoint)
    finally:
        logging.disable(logging.NOTSET)
    assert ran == []


async def test_on_session_end_is_bounded_by_the_servers_timeout_on_virtual_time() -> None:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    server = AgentServer(session_end_timeout=30)

    async def stuck(ctx: JobContext) -> None:
        await asyncio.Event().wait()

    @server.rtc_session(on_session_end=stuck)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    runner = EntrypointRunner(room=room, clock=clock)
    await runner(server)
    runner.ctx.shutdown("bye")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if any(s == "on_session_end" for _, s in runner.shutdown_steps):
            break
    await clock.advance(29)
    assert not runner.process.ended.done()
    await clock.advance(1)
    with pytest.raises(UserCodeError, match="on_session_end timed out after 30s"):
        await runner.wait_ended()
    assert runner.shutdown_steps[-1] == (30.0, "callbacks")
    await runner.aclose()


@pytest.mark.virtual_time
async def test_the_tests_end_is_over_when_speech_waits_for_an_avatar_that_never_joined(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, scripted_avatar: Any
) -> None:
    # the session's close drains a speech that waits for the avatar; the job's own bounds
    # (join_timeout, then its close's) are on the virtual clock, which the test's end used
    # to leave standing: the test never finished
    from tests.support.avatar_rig import frames

    class Greeter(Agent):
        async def on_enter(self) -> None:
            self.session.say("hello", audio=frames(100))

    server = AgentServer()

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), avatar=scripted_avatar, join_timeout=8.0
        )
        await job.start(Greeter(instructions="test"))

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    job.session.shutdown()
    await asyncio.wait_for(run_entrypoint.aclose(), 60)  # the loop's seconds: virtual too
    assert job.states["job"] == "closed"
    assert job.states["avatar"] in ("failed", "closed")


@pytest.mark.virtual_time
async def test_an_entrypoint_still_running_at_the_tests_end_is_cut_before_time_passes(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # the test's end runs the virtual clock for the job's end; the entrypoint's own 15 s
    # bound is not one of the job's: the promise is that it is cancelled at once
    cancelled_at: list[float] = []
    server = AgentServer(shutdown_process_timeout=20)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))
        try:
            await asyncio.Event().wait()  # the agent's own loop, after the start
        except asyncio.CancelledError:
            cancelled_at.append(run_entrypoint.clock.now())
            raise

    agent_room.add_participant("user")
    await run_entrypoint(server)
    process = run_entrypoint.process
    await run_entrypoint.aclose()
    assert cancelled_at == [0.0]
    assert {t for t, _ in process.steps} == {0.0}


async def test_the_scripted_avatars_close_asks_no_server_to_remove_its_participant(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    scripted_avatar: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # livekit's AvatarSession.aclose() removes the participant through the server API: in a
    # test that was a warning with a traceback ("url must be set") at every test's end
    server = AgentServer()

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), avatar=scripted_avatar)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    agent_room.add_participant(scripted_avatar.avatar_identity, kind="agent")
    agent_room.publish_track(scripted_avatar.avatar_identity, "video")
    with caplog.at_level(logging.DEBUG, logger="livekit.agents"):
        await run_entrypoint.aclose()
    removal = [r for r in caplog.records if "remove avatar participant" in r.getMessage()]
    assert removal == []
    assert scripted_avatar.avatar_identity not in agent_room.remote_participants


async def test_a_hold_whose_room_drops_does_not_blame_a_missing_on_session_end_hook(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the hook is given and holding; the server drops the room (a network loss): the
    # warning said the room went because rtc_session lacked on_session_end=on_session_end,
    # sending the operator to fix a configuration that was right
    seen: list[str] = []
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(_server(seen), simulation=True)
    job.session.shutdown()
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()
    await virtual_clock.advance(5)
    with caplog.at_level(logging.INFO, logger="agent_runtime"):
        agent_room.disconnect_locally(rtc.DisconnectReason.SIGNAL_CLOSE)
        await held
        await run_entrypoint.wait_ended()
    assert seen[0] == "on_session_end connected=True"
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "the hold ended as the room disconnected" in warned[0]
    assert "on_session_end=on_session_end" not in warned[0]


async def test_the_job_s_own_shutdown_callback_lines_name_the_job_and_the_callback(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the log policy: a line an operator reads names the job; these two named neither the
    # job nor its room, and the failed callback as a repr with a memory address
    async def never_returns() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ValueError("the upload's bucket is gone")

    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), close_timeout=4)
        job.add_shutdown_callback(never_returns)
        job.add_shutdown_callback(fails)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        await virtual_clock.advance(4)
        with pytest.raises(UserCodeError, match="bucket is gone"):
            await run_entrypoint.wait_ended()
    assert job.closed_at == 4.0
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "agent_runtime.job"]
    place = "job test-job (room test-room), job[test-room]: "
    assert lines == [
        (logging.ERROR, place + f"shutdown callback {fails.__qualname__} failed"),
        (
            logging.WARNING,
            place + "closing the job was cut off after 4s (close_timeout): shutdown callback "
            f"{never_returns.__qualname__} had not returned",
        ),
    ]


async def test_a_failing_on_simulation_end_s_line_names_the_job(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    simulator: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the verdict is lost to a bug in the agent's code: the ERROR line named neither the job
    # nor the room, which an operator needs to find the run
    async def broken_verdict(_sim: Any) -> None:
        raise KeyError("score")

    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    await run_entrypoint(_server([]), simulation=True, on_simulation_end=broken_verdict)
    with (
        caplog.at_level(logging.ERROR, logger="agent_runtime"),
        pytest.raises(RuntimeError, match="on_simulation_end failed: KeyError"),
    ):
        await simulator.finalize_simulation(provisional_success=True)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith("job test-job (room test-room), finalize")
    assert line.endswith("on_simulation_end failed: KeyError: 'score'")
    with pytest.raises(UserCodeError, match="score"):
        await run_entrypoint.aclose()


async def test_the_job_s_shutdown_callbacks_get_the_reason_given_to_ctx_shutdown(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # livekit's own callbacks got "the agent hung up"; the job's got the session's close
    # ("session closed: user_initiated"), the close livekit made after it was told why
    seen: list[str] = []
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.add_shutdown_callback(lambda reason: seen.append(f"job: {reason}"))

        async def livekits(reason: str) -> None:  # livekit awaits its callbacks
            seen.append(f"livekit: {reason}")

        ctx.add_shutdown_callback(livekits)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    run_entrypoint.ctx.shutdown("the agent hung up")
    await run_entrypoint.wait_ended()
    assert sorted(seen) == ["job: the agent hung up", "livekit: the agent hung up"]


async def test_a_finalize_from_a_stranger_is_refused_in_a_line_naming_the_job(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    agent_session_transports: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a simulator whose participant lacks lk.simulator loses its verdict this way: the
    # WARNING named the caller but not the job or the room it asked
    from livekit.protocol.agent_pb import agent_session as agent_pb

    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    agent_room.add_participant("user")
    await run_entrypoint(_server([]), simulation=True)
    request = agent_pb.SessionRequest(
        request_id="req-1",
        finalize_simulation=agent_pb.SessionRequest.FinalizeSimulation(provisional_success=True),
    )
    sim_end = agent_session_transports[1]
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        await sim_end.send_message(agent_pb.AgentSessionMessage(request=request), sender="user")
        reply = await asyncio.wait_for(sim_end.receive(), 5)
        while not reply.message.HasField("response"):  # the session's events come too
            reply = await asyncio.wait_for(sim_end.receive(), 5)
    assert "only from the simulator" in reply.message.response.error
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("job test-job (room test-room), session_host")
    assert line.endswith("refused finalize_simulation from 'user': not the simulator participant")


async def test_the_job_s_shutdown_callbacks_say_the_room_disconnected_when_it_did(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # the server dropped the room: livekit's job process closes the session (aclose(),
    # user_initiated) and the job's callbacks were told "session closed: user_initiated",
    # what a callback reads as the user hanging up
    seen: list[str] = []
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.add_shutdown_callback(lambda reason: seen.append(reason))
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    agent_room.disconnect_locally(rtc.DisconnectReason.SIGNAL_CLOSE)
    await run_entrypoint.wait_ended()
    assert seen == ["room disconnected"]


async def test_an_on_session_end_cut_by_livekit_warns_naming_the_job_and_the_bound_to_give(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # AgentServer's session_end_timeout shorter than the job's hold: livekit cuts the hook
    # mid-hold; the line says what to give, and (the log policy) which job it was
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(_server([], end_timeout=100), simulation=True)
    job.session.shutdown()
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        await virtual_clock.advance(100)
        await held
        with pytest.raises(UserCodeError, match="timed out after 100s"):
            await run_entrypoint.wait_ended()
    cut = [r.getMessage() for r in caplog.records if "was cut" in r.getMessage()]
    assert len(cut) == 1 and cut[0].startswith("job test-job (room test-room), job[test-room]: ")
    assert "in job state awaiting_finalize" in cut[0]
    assert "give AgentServer(session_end_timeout=...) at least that" in cut[0]


@pytest.mark.virtual_time
async def test_a_callback_still_running_when_another_raises_is_named_as_cut(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    """livekit gathers the shutdown callbacks without ``return_exceptions``: the first to
    raise ends the job's shutdown and its process exits, so a slower one (a transcript
    saved in 3 s) is cut deployed. Only the one that raised was reported: the lost save
    passed here."""
    saved: list[str] = []

    async def save_transcript(_: str) -> None:
        await asyncio.sleep(3)
        saved.append("transcript")

    async def notify_crm() -> None:
        raise ConnectionError("crm down")

    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        ctx.add_shutdown_callback(save_transcript)
        ctx.add_shutdown_callback(notify_crm)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError, match="shutdown callback raised ConnectionError") as info:
        await run_entrypoint.wait_ended()
    told = [str(info.value), *getattr(info.value, "__notes__", [])]
    cut = [t for t in told if "save_transcript was still running when" in t]
    assert len(cut) == 1 and "notify_crm raised" in cut[0], told
    assert saved == ["transcript"]  # the kit still lets it finish: its own failures show


@pytest.mark.parametrize("takes_reason", [True, False])
async def test_a_plain_function_as_shutdown_callback_or_session_end_fails_as_livekit_awaits_it(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, takes_reason: bool
) -> None:
    """livekit awaits what a shutdown callback and ``on_session_end`` return: a plain
    function's ``None`` is a ``TypeError`` in its job process (a callback's cuts the
    others). The kit took a plain callback taking the reason, and a plain
    ``on_session_end``, as if they were awaited, and the test passed."""
    seen: list[str] = []
    server = AgentServer(session_end_timeout=315)

    def save(reason: str) -> None:
        seen.append("saved")

    def session_over(ctx: JobContext) -> None:
        seen.append("over")

    @server.rtc_session(on_session_end=session_over)
    async def entrypoint(ctx: JobContext) -> None:
        ctx.add_shutdown_callback(save if takes_reason else (lambda: seen.append("saved")))
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    await run_entrypoint(server)
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError) as info:
        await run_entrypoint.wait_ended()
    told = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert (
        "the agent's on_session_end raised TypeError: "
        "test_a_plain_function_as_shutdown_callback_or_session_end_fails_as_livekit_awaits_it"
        ".<locals>.session_over returned None, not an awaitable" in told
    )
    assert "the agent's shutdown callback raised TypeError" in told
    assert seen == ["over", "saved"]  # each ran, as deployed, before the await failed


@pytest.mark.virtual_time
async def test_a_slow_shutdown_callback_is_named_as_cut_at_the_servers_bound_not_as_hung(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    """A 20 s upload under a server whose ``shutdown_process_timeout`` is 10 s: it was
    reported as one that "never returned", which it does, later than the worker waits."""
    uploaded: list[str] = []

    async def upload_recording(_: str) -> None:
        await asyncio.sleep(20)
        uploaded.append("recording")

    agent_room.add_participant("user")
    await run_entrypoint(_with_callback(upload_recording))
    run_entrypoint.ctx.shutdown("bye")
    with pytest.raises(UserCodeError) as info:
        await run_entrypoint.aclose()
    assert str(info.value) == (
        "the agent's shutdown callback "
        f"{upload_recording.__qualname__} had not returned when livekit's worker kills the "
        "job's process (the server's shutdown_process_timeout, 10s): one that never returns, "
        "or takes longer, is cut there"
    )
    assert uploaded == []


@pytest.mark.virtual_time
async def test_an_on_exit_that_never_returns_fails_the_test_naming_it(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    """livekit cuts the session's close at 60 s and logs only that ``aclose()`` timed out;
    the test passed, the agent's ``on_exit`` unnamed."""
    from tests.support.planted import hung_on_exit_server

    agent_room.add_participant("user")
    await run_entrypoint(hung_on_exit_server())
    run_entrypoint.ctx.shutdown("bye")
    await virtual_clock.advance(61)
    with pytest.raises(UserCodeError, match=r"session close waited on ForeverExit\.on_exit \("):
        await run_entrypoint.wait_ended()


@pytest.mark.virtual_time
async def test_a_task_the_agent_leaves_running_is_reported_too_when_its_on_exit_hangs(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    """A held close leaves livekit's own tasks of the half-closed session running (not
    reported); the agent's own task left running was not reported either, found only once
    the ``on_exit`` was fixed."""
    from tests.support.planted import hung_on_exit_server

    agent_room.add_participant("user")
    await run_entrypoint(hung_on_exit_server(leak=True))
    run_entrypoint.ctx.shutdown("bye")
    await virtual_clock.advance(61)
    with pytest.raises(UserCodeError) as raised:
        await run_entrypoint.aclose()
    text = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    # the close is held by the on_exit alone, not by the heartbeat (it was named too)
    assert "session close waited on ForeverExit.on_exit (planted.py:" in text
    assert "heartbeat (planted.py" not in text
    assert "left a task running after it ended: " in text
    assert "heartbeat (agent code)" in text
    assert "VADStream" not in text and "_metrics_monitor_task" not in text
