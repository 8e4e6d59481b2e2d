"""The simulator asks for the verdict again, through livekit's own ``RemoteSession``.

Its ``finalize_simulation(timeout=...)`` stops waiting and forgets the request when the
agent's ``on_simulation_end`` (a model call, often) takes longer than that; a simulator
that then asks again must get the verdict. livekit alone runs ``on_simulation_end`` again
for the new request; the runtime sends the one it computed.
"""

from __future__ import annotations

import asyncio

import pytest
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.simulation import SimulationContext
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, on_session_end

pytestmark = [pytest.mark.asyncio, pytest.mark.virtual_time]

JUDGING = 15.0  # how long the agent's own verdict takes
calls: list[float] = []

server = AgentServer(session_end_timeout=315)


async def slow_verdict(sim: SimulationContext) -> None:
    calls.append(asyncio.get_running_loop().time())
    await asyncio.sleep(JUDGING)
    sim.fail("the agent vetoes this run")


@server.rtc_session(on_session_end=on_session_end, on_simulation_end=slow_verdict)
async def entrypoint(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(ctx, session=AgentSession())
    await job.start(Agent(instructions="You are a test agent."))


@pytest.fixture(autouse=True)
def _calls() -> None:
    calls.clear()


async def test_asked_again_while_the_verdict_is_computed_the_simulator_gets_it(
    agent_room, virtual_clock, simulator, run_entrypoint
):
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    job.session.shutdown()  # the agent hangs up: the job holds for the verdict
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()

    first = asyncio.ensure_future(
        simulator.finalize_simulation(provisional_success=True, timeout=10)
    )
    await virtual_clock.advance(11)
    with pytest.raises(asyncio.TimeoutError):
        await first  # the simulator stopped waiting
    again = asyncio.ensure_future(
        simulator.finalize_simulation(provisional_success=True, timeout=30)
    )
    await virtual_clock.advance(10)
    reply = await again
    assert reply.user_verdict.reason == "the agent vetoes this run"
    await held
    assert len(calls) == 1 and job.states["job"] == "closed" and job.closed_at == JUDGING


async def test_asked_again_after_the_answer_the_simulator_gets_the_same_verdict(
    agent_room, virtual_clock, simulator, run_entrypoint
):
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    first = asyncio.ensure_future(
        simulator.finalize_simulation(provisional_success=True, timeout=10)
    )
    await virtual_clock.advance(20)  # answered at 15 s, after the simulator gave up
    with pytest.raises(asyncio.TimeoutError):
        await first
    again = asyncio.ensure_future(
        simulator.finalize_simulation(provisional_success=True, timeout=30)
    )
    await virtual_clock.advance(1)
    reply = await again
    assert reply.user_verdict.reason == "the agent vetoes this run"
    assert len(calls) == 1 and job.states["job"] == "serving"  # the session goes on


async def test_the_entrypoint_function_runs_with_the_hooks_its_server_gave_it(
    agent_room, virtual_clock, simulator, run_entrypoint
):
    """``run_entrypoint(entrypoint)`` (the function this module's ``server`` registered,
    not the server) ran it with no hooks: no ``on_session_end``, so the hang-up ended the
    hold before the simulator asked, and no ``on_simulation_end``, so the agent's veto was
    never heard. It runs as a worker runs it, as ``fuzz(entrypoint)`` does."""
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(entrypoint, simulation=True)
    job.session.shutdown()  # the agent hangs up: the server's on_session_end holds
    await virtual_clock.advance(1)
    held = run_entrypoint.session_end()
    asked = asyncio.ensure_future(simulator.finalize_simulation(provisional_success=True))
    await virtual_clock.advance(JUDGING)
    reply = await asked
    assert reply.user_verdict.reason == "the agent vetoes this run"
    await held
    assert len(calls) == 1 and job.states["job"] == "closed"


async def test_hooks_given_to_run_entrypoint_win_over_those_of_the_functions_server(
    agent_room, virtual_clock, simulator, run_entrypoint
):
    """``on_session_end=``/``on_simulation_end=`` given to ``run_entrypoint`` replace the
    server's, for the server and for the function its server registered alike."""
    ends: list[str] = []

    async def own_end(ctx: JobContext) -> None:
        ends.append(ctx.job.id)
        await on_session_end(ctx)

    def lenient(sim: SimulationContext) -> None:
        ends.append("lenient")

    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(
        entrypoint, simulation=True, on_session_end=own_end, on_simulation_end=lenient
    )
    job.session.shutdown()
    await virtual_clock.advance(1)
    held = run_entrypoint.session_end()
    asked = asyncio.ensure_future(simulator.finalize_simulation(provisional_success=True))
    await virtual_clock.advance(1)
    reply = await asked
    assert reply.user_verdict.reason != "the agent vetoes this run"
    await held
    assert sorted(ends) == ["lenient", "test-job"] and calls == []
    assert job.states["job"] == "closed"
