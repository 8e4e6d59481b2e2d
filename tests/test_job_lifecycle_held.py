"""``AgentJob``'s lifecycle while the job machine holds for the verdict before the agent's
session runs: ``held`` (the room followed, nothing of the agent started) and
``starting_held`` (a start under way).

In a simulation the job holds once its end is asked (the agent's ``job.shutdown()``, from
its ``on_enter`` or a watchdog during a slow avatar start). A session still starting
cannot close: the lifecycle keeps the hold and hangs up once the session runs. Meanwhile
every call of the user's has the answer it has while starting: a second start refused,
a close and an abort taking effect, the start cut when the job closes on its own, a
failed start ending the hold.

Real: ``AgentSession``, every machine's runtime. Faked, because they need a server: the
room (``InMemoryRoom``), the session transport's byte stream (paired in memory) and the
model provider behind ``AgentSession.start()`` (a subclass whose start waits until the
test lets it go on, or fail).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from livekit.agents import Agent, AgentSession
from livekit.agents.simulation import SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, StateChanged
from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport

ROOM = "lh-room"  # the room the fixtures build (tests/conftest.py)
SIM = {ATTRIBUTE_SIMULATOR: "1"}
DISPATCH = SimulationDispatch(simulation_run_id="run-lh", job_id="simjob-lh")


class GatedSession(AgentSession):  # type: ignore[type-arg]
    """A session whose start waits on its model provider until the test says: it starts
    (``True``) or the provider refuses it (``False``)."""

    def __init__(self) -> None:
        super().__init__()
        self.answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        if not await self.answer:
            raise ConnectionError("the model provider refused the session")
        return await super().start(*args, **kwargs)


def agent() -> Agent:
    return Agent(instructions="agent")


def moves(sink: MemorySink, *machines: str) -> list[str]:
    """Where the machines went, in order, as the job's trace says (``machine.state``; the
    lifecycle's states alone when it is the one machine asked for)."""
    went = [
        (r.machine, r.dest)
        for r in sink.records
        if r.kind == "transition" and r.machine in machines and r.dest != r.source
    ]
    return [d if machines == ("agent_job",) else f"{m}.{d}" for m, d in went]


def ignored(sink: MemorySink, event: str) -> list[str]:
    """The lifecycle's states that ignored ``event``, as the trace says."""
    return [
        r.source
        for r in sink.records
        if (r.machine, r.event, r.kind) == ("agent_job", event, "ignore")
    ]


async def holding(
    room: InMemoryRoom, clock: VirtualClock, *, starting: bool
) -> tuple[AgentJob, GatedSession, asyncio.Task[None] | None, MemorySink]:
    """A simulation's job whose end was asked, holding for the verdict: its start waiting
    on the provider (``starting``), or the room followed and nothing of the agent started.
    The job, its session, the start under way and the job's trace."""
    room.add_participant("user")
    room.add_participant("simulator", attributes=SIM)
    _sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    session = GatedSession()
    job = AgentJob(
        room=room,
        session=session,
        clock=clock,
        transport=agent_end,
        simulation=DISPATCH,
        otel=False,
        tracer=Tracer(sink := MemorySink()),
    )
    await job.start_runtime()
    start = asyncio.create_task(job.start(agent())) if starting else None
    await settle()
    job.shutdown("nothing to do")  # the agent's end-call tool, a watchdog
    await settle()
    assert job.states["job"] == "awaiting_finalize"
    assert job.lifecycle == ("starting_held" if starting else "held")
    return job, session, start, sink


async def test_a_start_under_the_hold_refuses_a_second_one_and_hangs_up_once_it_runs(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job, session, start, sink = await holding(room, clock, starting=True)
    changes: list[StateChanged] = []
    job.on("state_changed", changes.append)
    with pytest.raises(RuntimeError, match="this job is already starting"):
        await job.start(agent())
    # another part is let through by the lifecycle; the session's own claim refuses it
    with pytest.raises(RuntimeError, match="session is already started"):
        await job.start_session(agent())
    await job.start_runtime()  # following the room already: nothing to do
    assert job.lifecycle == "starting_held" and changes == []  # the calls changed nothing
    assert ignored(sink, "follow_room") == ["new", "starting_held"]

    session.answer.set_result(True)
    assert start is not None
    await settle()
    assert start.done()  # no clock moves: the start ends as its session runs
    await start
    assert moves(sink, "agent_job") == ["starting", "starting_held", "running"]
    assert job.states["session"] == "ended" and job.close_reason == "job_shutdown"
    assert job.states["job"] == "awaiting_finalize"  # the verdict can still be asked
    await job.aclose(graceful=False)


@pytest.mark.parametrize("part", [False, True], ids=["start", "start_session"])
async def test_an_agent_started_once_the_job_holds_hangs_up_once_it_runs(
    room: InMemoryRoom, clock: VirtualClock, part: bool
) -> None:
    job, session, _, sink = await holding(room, clock, starting=False)
    await job.start_runtime()  # following the room already: nothing to do
    assert job.lifecycle == "held" and ignored(sink, "follow_room") == ["new", "held"]
    session.answer.set_result(True)
    await (job.start_session(agent()) if part else job.start(agent()))
    await settle()
    assert moves(sink, "agent_job") == ["held", "starting_held", "running"]
    assert job.states["session"] == "ended" and job.close_reason == "job_shutdown"
    assert job.states["job"] == "awaiting_finalize"
    await job.aclose(graceful=False)


@pytest.mark.parametrize("starting", [False, True], ids=["held", "starting_held"])
async def test_an_abort_under_the_hold_closes_the_job_at_once(
    room: InMemoryRoom, clock: VirtualClock, starting: bool
) -> None:
    job, _, start, sink = await holding(room, clock, starting=starting)
    closing = asyncio.create_task(job.aclose(graceful=False))
    await settle()  # no clock moves: the hold's bound is not what ends it
    assert closing.done() and job.lifecycle == "closed" and job.states["job"] == "closed"
    # the lifecycle's teardown (the start cut first) is what closes the job machine
    went = moves(sink, "agent_job", "job")
    held = "agent_job.starting_held" if starting else "agent_job.held"
    assert went[went.index(held) + 1 :][:2] == ["agent_job.closing", "job.closing"]
    assert went[-1] == "agent_job.closed"
    if start is not None:
        with pytest.raises(RuntimeError, match="closed before it finished starting"):
            await start


@pytest.mark.parametrize("starting", [False, True], ids=["held", "starting_held"])
async def test_a_close_under_the_hold_cuts_the_start_and_waits_for_the_hold(
    room: InMemoryRoom, clock: VirtualClock, starting: bool
) -> None:
    job, _, start, sink = await holding(room, clock, starting=starting)
    closing = asyncio.create_task(job.aclose())
    await settle()
    assert job.lifecycle == "closing" and not closing.done()
    if start is not None:
        assert start.done()  # cut at once, not when closed
        with pytest.raises(RuntimeError, match="closed before it finished starting"):
            await start
    assert job.states["job"] == "awaiting_finalize"  # the simulator may still ask
    room.remove_participant("simulator")
    await settle()
    assert closing.done()  # no clock moves: the hold ends as the simulator leaves
    await closing
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert moves(sink, "agent_job")[-2:] == ["closing", "closed"]


@pytest.mark.parametrize("starting", [False, True], ids=["held", "starting_held"])
async def test_the_hold_ending_on_its_own_closes_the_job_and_cuts_the_start(
    room: InMemoryRoom, clock: VirtualClock, starting: bool
) -> None:
    job, _, start, sink = await holding(room, clock, starting=starting)
    room.remove_participant("simulator")  # nobody left to ask for the verdict
    await settle()  # no clock moves, and nobody has to call aclose()
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    held = "starting_held" if starting else "held"
    path = [*(["starting"] if starting else []), held, "closing", "closed"]
    assert moves(sink, "agent_job") == path
    if start is not None:
        with pytest.raises(RuntimeError, match="closed before it finished starting"):
            await start


async def test_a_start_that_fails_under_the_hold_ends_the_hold(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job, session, start, sink = await holding(room, clock, starting=True)
    session.answer.set_result(False)
    assert start is not None
    with pytest.raises(ConnectionError, match="refused the session"):
        await start
    await settle()  # no clock moves: what did start is released, the hold too
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert moves(sink, "agent_job") == ["starting", "starting_held", "closing", "closed"]
    # the lifecycle's teardown (what did start released) is what closes the job machine
    went = moves(sink, "agent_job", "job")
    assert went.index("agent_job.closing") < went.index("job.closing")


async def test_a_shutdown_before_the_room_is_followed_closes_rather_than_holds(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    # the premise of held: the job knows its simulator from the room it follows, so it
    # holds only once start_runtime() ran (which then returns at once: nothing fails)
    room.add_participant("simulator", attributes=SIM)
    _sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    job = AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        transport=agent_end,
        simulation=DISPATCH,
        otel=False,
        tracer=Tracer(sink := MemorySink()),
    )
    job.shutdown("nothing to do")
    await asyncio.wait_for(job.wait_closed(), 5)
    assert moves(sink, "agent_job") == ["closing", "closed"] and job.states["job"] == "closed"
