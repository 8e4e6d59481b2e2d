"""``job.shutdown()`` in a simulation hangs up before the job holds for the verdict.

An end-call tool of the agent's (``job.request_room_deletion()`` then ``job.shutdown()``,
as the embedding guide shows) ended a plain job at once, but in a simulation the job held
for the verdict with the session still running: the agent stayed on the call, linked to
the user and answering, until the simulator asked (or the 300 s hold ran out).
``ctx.shutdown()``, ``job.aclose()`` and ``session.shutdown()`` close the session first, as
livekit's own end does; ``job.shutdown()`` now does too.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, ``RemoteSession``,
the runtime. Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob, on_session_end
from agent_runtime.actor import StateChanged
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from statemachines import step
from statemachines.agent_job import AGENT_JOB
from tests.support import planted

pytestmark = pytest.mark.virtual_time


async def test_the_agent_that_ends_its_call_in_a_simulation_is_off_the_call_during_the_hold(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    simulator: RemoteSession,
    run_entrypoint: EntrypointRunner,
) -> None:
    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(planted.session_end_server(on_session_end), simulation=True)
    await virtual_clock.advance(3)
    heard: list[tuple[str, str]] = []  # a dashboard's listener on the job's own lifecycle
    job.on(
        "state_changed",
        lambda sc: heard.append((sc.source, sc.dest)) if sc.machine == "agent_job" else None,
    )

    run_entrypoint.in_job(job.shutdown, "the user said bye")  # the agent's end-call tool
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"  # still holding for the verdict
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"
    # the hang-up is no change of the lifecycle's: it runs until the job closes
    assert job.lifecycle == "running" and heard == []

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered


def _lifecycle_into(states: list[str]) -> Callable[[StateChanged], None]:
    """A ``state_changed`` listener keeping where the job's own lifecycle went."""

    def heard(sc: StateChanged) -> None:
        if sc.machine == "agent_job" and sc.dest != sc.source:
            states.append(sc.dest)

    return heard


class _EndsAtOnce(Agent):
    """An agent with nothing to do: it ends the call from ``on_enter``, while the session
    is still starting."""

    def __init__(self, job: AgentJob) -> None:
        super().__init__(instructions="test")
        self._job = job

    async def on_enter(self) -> None:
        self._job.shutdown("nothing to do")


async def test_an_agent_that_ends_its_call_while_starting_is_off_the_call_during_the_hold(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    simulator: RemoteSession,
    run_entrypoint: EntrypointRunner,
) -> None:
    server = AgentServer(session_end_timeout=315)

    lifecycle: list[str] = []

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.on("state_changed", _lifecycle_into(lifecycle))
        await job.start(_EndsAtOnce(job))

    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"
    # the lifecycle's table kept the hang-up until the session ran
    assert lifecycle == ["starting", "starting_held", "running"]

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered


async def test_the_job_machine_asked_to_end_holds_off_the_call_too(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    simulator: RemoteSession,
    run_entrypoint: EntrypointRunner,
) -> None:
    # the hang-up is the lifecycle's, on the job machine's hold (a declared watch), not a
    # step of AgentJob.shutdown(): the job machine's own shutdown (`job.job`, public) holds
    # off the call as well
    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(planted.session_end_server(on_session_end), simulation=True)
    await virtual_clock.advance(3)

    run_entrypoint.in_job(job.job.shutdown, "the user said bye")
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered


async def test_an_agent_started_once_the_job_holds_hangs_up_once_its_session_runs(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    simulator: RemoteSession,
    run_entrypoint: EntrypointRunner,
) -> None:
    # the room followed first (start_runtime()), the end asked before the agent started:
    # the job holds with no session to close; the start goes on and hangs up once it runs
    server = AgentServer(session_end_timeout=315)
    seen: dict[str, str] = {}
    lifecycle: list[str] = []

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        job.on("state_changed", _lifecycle_into(lifecycle))
        await job.start_runtime()
        job.shutdown("nothing to do")
        await virtual_clock.advance(1)
        seen.update(job=job.states["job"], lifecycle=job.lifecycle)
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert seen == {"job": "awaiting_finalize", "lifecycle": "held"}
    assert lifecycle == ["held", "starting_held", "running"]
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered


@pytest.mark.parametrize(
    ("events", "path"),
    [
        (("job_holding", "start", "started"), ["held", "starting_held", "running"]),
        (("start", "job_holding", "started"), ["starting", "starting_held", "running"]),
        (("start_part", "job_holding", "started"), ["starting", "starting_held", "running"]),
    ],
)
def test_the_lifecycle_keeps_a_hold_heard_before_its_session_runs_and_hangs_up_then(
    events: tuple[str, ...], path: list[str]
) -> None:
    # the table alone: a hold heard before the start or while it runs is kept, and the
    # hang-up comes with the session's start, once (nothing runs to close before it)
    state = AGENT_JOB.initial
    states: list[str] = []
    effects: list[tuple[str, ...]] = []
    for event in events:
        s = step(AGENT_JOB, state, event)
        assert s.outcome == "transition", (state, event)
        state = s.dest
        states.append(state)
        effects.append(s.effects)
    assert states == path
    assert effects == [(), (), ("hang_up",)]
