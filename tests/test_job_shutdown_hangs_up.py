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

import pytest
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom

pytestmark = pytest.mark.virtual_time


def _server() -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


async def test_the_agent_that_ends_its_call_in_a_simulation_is_off_the_call_during_the_hold(
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    simulator: RemoteSession,
    run_entrypoint: EntrypointRunner,
) -> None:
    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(_server(), simulation=True)
    await virtual_clock.advance(3)

    run_entrypoint.in_job(job.shutdown, "the user said bye")  # the agent's end-call tool
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"  # still holding for the verdict
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered


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

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(_EndsAtOnce(job))

    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"

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
    job = await run_entrypoint(_server(), simulation=True)
    await virtual_clock.advance(3)

    run_entrypoint.in_job(job.job.shutdown, "the user said bye")
    await run_entrypoint.wait_for("session", "ended")
    await virtual_clock.advance(5)
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["participant"] == "closed" and job.close_reason == "job_shutdown"

    await simulator.finalize_simulation(provisional_success=True)
    await run_entrypoint.wait_ended()
    assert job.states["job"] == "closed" and job.finalize_answered
