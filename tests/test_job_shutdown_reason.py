"""The reason the agent gives ``job.shutdown(reason)`` reaches livekit's end of the job, as
the one given ``ctx.shutdown(reason)`` does without the runtime.

A trial's agent ended its call from a tool with ``job.shutdown("the user said bye")``: the
job's own shutdown callbacks heard that reason, but livekit's (``ctx.add_shutdown_callback``,
the job process's exit, its ``job_shutdown`` span) heard "room disconnected", as for a room
the server dropped: the job's close disconnects the room, and livekit's end began on that.
With ``ctx.shutdown(reason)``, livekit alone gives every callback the reason. The job tells
livekit's process the reason before its close disconnects the room.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime. Faked,
because they need a server: the room (``InMemoryRoom``) and the session transport.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.simulation import SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, on_session_end, session_end_hook
from agent_runtime.testing.clock import settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport

pytestmark = pytest.mark.virtual_time


def _server(seen: list[str]) -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        async def livekits(reason: str) -> None:
            seen.append(f"ctx callback: {reason}")

        async def jobs(reason: str) -> None:
            seen.append(f"job callback: {reason}")

        ctx.add_shutdown_callback(livekits)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.add_shutdown_callback(jobs)
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.parametrize("ended_by", ["job.shutdown", "ctx.shutdown"])
async def test_the_reason_the_agent_gives_reaches_every_shutdown_callback(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, ended_by: str
) -> None:
    seen: list[str] = []
    agent_room.add_participant("user")
    job = await run_entrypoint(_server(seen))
    end = job.shutdown if ended_by == "job.shutdown" else run_entrypoint.ctx.shutdown
    run_entrypoint.in_job(end, "the user said bye")  # as an end-call tool of the agent's
    await run_entrypoint.wait_ended()

    assert sorted(seen) == [
        "ctx callback: the user said bye",
        "job callback: the user said bye",
    ]
    assert run_entrypoint.process.reason == "the user said bye"
    assert job.states["job"] == "closed" and not agent_room.isconnected()


@pytest.mark.parametrize("graceful", [True, False], ids=["aclose", "abort"])
async def test_the_agents_own_close_is_what_livekits_end_hears(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, graceful: bool
) -> None:
    # the agent's await job.aclose() is its ctx.shutdown(): livekit's callbacks heard "room
    # disconnected" while the job's heard "job closed" ("aborted")
    reason = "job closed" if graceful else "aborted"
    seen: list[str] = []
    agent_room.add_participant("user")
    job = await run_entrypoint(_server(seen))
    await run_entrypoint.in_job(job.aclose, graceful=graceful)
    await run_entrypoint.wait_ended()
    assert sorted(seen) == [f"ctx callback: {reason}", f"job callback: {reason}"]
    assert run_entrypoint.process.reason == reason


async def test_a_job_that_ends_on_its_own_still_ends_livekits_on_the_rooms_disconnect(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # no reason from the agent: livekit's end comes from the disconnect, as before
    seen: list[str] = []
    agent_room.add_participant("user")
    job = await run_entrypoint(_server(seen))
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    assert "ctx callback: room disconnected" in seen
    assert run_entrypoint.process.reason == "room disconnected"
    assert job.states["job"] == "closed"


class _FailingStart(AgentSession):  # type: ignore[type-arg]
    async def start(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError("the STT plugin's key is wrong")


async def test_a_start_that_fails_ends_livekits_job_with_the_jobs_own_reason(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # the agent catches the failed start and waits for the job's close: the job aborts what
    # did start, and its callbacks hear "aborted"; livekit's heard "room disconnected", as
    # for a room the server dropped
    seen: list[str] = []
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        async def livekits(reason: str) -> None:
            seen.append(f"ctx callback: {reason}")

        async def jobs(reason: str) -> None:
            seen.append(f"job callback: {reason}")

        ctx.add_shutdown_callback(livekits)
        job = AgentJob.from_job_context(ctx, session=_FailingStart())
        job.add_shutdown_callback(jobs)
        try:
            await job.start(Agent(instructions="test"))
        except RuntimeError:
            await job.wait_closed()

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    await run_entrypoint.wait_ended()
    assert sorted(seen) == ["ctx callback: aborted", "job callback: aborted"]
    assert run_entrypoint.process.reason == "aborted"
    assert job.lifecycle == "closed" and not agent_room.isconnected()


@pytest.mark.parametrize("ended_by", ["job.shutdown", "aclose"])
async def test_the_agents_session_end_callback_runs_once_the_jobs_close_ended_the_room(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, ended_by: str
) -> None:
    # the job's close asks livekit's end with the agent's reason, then disconnects the room;
    # livekit runs on_session_end meanwhile. A real room's disconnect is a round trip to its
    # native side: the agent's session_end_hook(then) saw the room connected or gone,
    # whichever came first (and lost it under its feet). It runs once the room is gone, as
    # after a user who left; ctx.shutdown() is how to keep the room for it
    seen: list[str] = []
    disconnect = agent_room.disconnect

    async def native_disconnect(**kwargs: Any) -> None:
        await asyncio.sleep(0.05)  # the loop's virtual time
        await disconnect(**kwargs)

    agent_room.disconnect = native_disconnect  # type: ignore[method-assign]
    server = AgentServer(session_end_timeout=315)

    async def then(ctx: JobContext) -> None:
        seen.append(f"then connected={ctx.room.isconnected()}")

    @server.rtc_session(on_session_end=session_end_hook(then))
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    if ended_by == "job.shutdown":
        run_entrypoint.in_job(job.shutdown, "the user said bye")
    else:
        await run_entrypoint.in_job(job.aclose)
    await run_entrypoint.wait_ended()
    assert seen == ["then connected=False"]
    assert run_entrypoint.process.reason == (
        "the user said bye" if ended_by == "job.shutdown" else "job closed"
    )


async def test_a_long_reason_is_cut_in_the_close_s_log_line_and_kept_whole_elsewhere(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that passed a whole transcript as the reason made the INFO ``job closed``
    line as long, over several lines; every shutdown callback, livekit's included, still
    gets all of it."""
    seen: list[str] = []
    agent_room.add_participant("user")
    job = await run_entrypoint(_server(seen))
    reason = "the user said:\n" + "goodbye and thank you " * 200
    with caplog.at_level(logging.INFO, logger="agent_runtime"):
        run_entrypoint.in_job(job.shutdown, reason)
        await run_entrypoint.wait_ended()

    closed = [r.getMessage() for r in caplog.records if "job closed (" in r.getMessage()]
    assert len(closed) == 1
    said = closed[0].split("job closed (", 1)[1].removesuffix(")")
    assert said.startswith("the user said: goodbye and thank you goodbye")
    assert said.endswith("...") and len(said) == 200 and "\n" not in closed[0]
    assert sorted(seen) == [f"ctx callback: {reason}", f"job callback: {reason}"]
    assert run_entrypoint.process.reason == reason


@pytest.mark.parametrize("where", ["livekit job", "plain room"])
async def test_a_job_ended_by_the_simulator_leaving_says_the_simulation_completed(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """livekit's ``JobContext`` ends the job with "simulation completed" as the simulator
    leaves. Used with a plain ``rtc.Room``, the job said "room disconnected" instead (its
    own close disconnects the room), to its shutdown callbacks and in its log. Whoever hears
    the job closing reads why already (a note of the reason as an effect of the
    ``simulator_left`` rows ran after the listeners: they read ``""``)."""
    seen: list[str] = []
    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "1"})
    with caplog.at_level(logging.INFO, logger="agent_runtime"):
        if where == "livekit job":
            job = await run_entrypoint(_server(seen), simulation=True)
        else:
            job = AgentJob(
                room=agent_room,
                session=AgentSession(),
                clock=run_entrypoint.clock,
                otel=False,
                transport=InMemorySessionTransport.pair(identities=("agent", "simulator"))[0],
                simulation=SimulationDispatch(simulation_run_id="RUN_1", job_id="job"),
            )
            job.add_shutdown_callback(lambda reason: seen.append(f"job callback: {reason}"))
            await job.start(Agent(instructions="test"))
        heard: list[str] = []  # why, as the job is heard closing (its reason is known by then)
        job.on(
            "state_changed",
            lambda sc: (
                heard.append(job.snapshot()["job_reason"])
                if (sc.machine, sc.dest) == ("job", "closing")
                else None
            ),
        )
        await settle()
        agent_room.remove_participant("simulator", rtc.DisconnectReason.CLIENT_INITIATED)
        await settle()
        await run_entrypoint.clock.advance(job.settings.close_timeout)
        await settle()
        if where == "plain room":
            await job.aclose()

    assert job.states["job"] == "closed"
    assert heard == ["simulation completed"]
    assert "job callback: simulation completed" in seen
    closed = [r.getMessage() for r in caplog.records if "job closed (" in r.getMessage()]
    assert closed == ["job closed (simulation completed)"]
