"""A small agent that embeds the runtime: its lifecycles run as explicit state machines.

The user may drop for up to 30 s before the session ends; an avatar (bey, when
``BEY_API_KEY`` is set) has 10 s to join; in a simulation the agent vetoes a run whose
session ended in an error.
"""

from __future__ import annotations

import os

from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.simulation import SimulationContext
from livekit.agents.voice.avatar import AvatarSession

from agent_runtime import AgentJob, on_session_end

GRACE_PERIOD = 30.0
JOIN_TIMEOUT = 10.0

# livekit bounds on_session_end by this: room for the job's simulation hold (300 s) and its
# close (10 s); livekit's default, 300 s, would cut the hold's end
server = AgentServer(session_end_timeout=315)


async def check_run(sim: SimulationContext) -> None:
    """The agent's own verdict on a simulated run."""
    job = AgentJob.for_job(sim.job_context)
    if job is not None and job.close_reason == "error":
        sim.fail("the session ended in an error")


def avatar_plugin() -> AvatarSession | None:  # type: ignore[type-arg]
    if not os.environ.get("BEY_API_KEY"):
        return None
    from livekit.plugins import bey

    return bey.AvatarSession()


@server.rtc_session(on_session_end=on_session_end, on_simulation_end=check_run)
async def entrypoint(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(
        ctx,
        session=AgentSession(),  # stt=..., llm=..., tts=...
        avatar=avatar_plugin(),
        grace_period=GRACE_PERIOD,
        join_timeout=JOIN_TIMEOUT,
    )
    await job.start(Agent(instructions="You are a helpful voice assistant."))
