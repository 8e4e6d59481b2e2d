"""Every line the runtime logs while serving a job names that job: a livekit worker runs
many jobs in one process, and "linked participant alice" or "job closed (done)" without
the job's labels could be any of them. The labels are the log policy's (``job_id``,
``room``, as a machine's warnings carry them).

Real: livekit's fake ``JobContext``, ``AgentSession`` with its RoomIO, every machine's
runtime, the scripted avatar plugin, livekit's ``RemoteSession`` as the simulator. Faked,
because they need a server: the room (``InMemoryRoom``) and the transport's byte stream.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from google.protobuf import json_format
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.job import JobContext
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR, ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob, injected, session_end_hook
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

ROOM = "labels-room"  # the room the fixtures build (tests/conftest.py)
DISPATCH = SimulationDispatch(simulation_run_id="run-labels", job_id="simjob-labels")


async def test_every_runtime_line_of_a_job_s_life_carries_the_job_s_labels(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "1"})
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))

    async def verdict(sim: SimulationContext) -> None:
        sim.fail("the agent vetoes this run")

    async def users_session_end(_: JobContext) -> None:
        return None

    async def remove(identity: str) -> None:
        room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(DISPATCH)
    lk.set_job_simulation_end_fn(ctx, verdict)
    plugin = ScriptedAvatar(avatar_identity="avatar-1")
    with caplog.at_level(logging.INFO, logger="agent_runtime"):
        with injected(clock=clock, transport=agent_end, remove_avatar_participant=remove):
            job = AgentJob.from_job_context(
                ctx, session=AgentSession(), avatar=plugin, participant_identity="user"
            )
        await job.start(Agent(instructions="agent"))
        room.add_participant("avatar-1", kind="agent")
        room.publish_track("avatar-1", "video")
        room.add_participant("user")
        await settle()
        assert job.states["avatar"] == "joined" and job.states["participant"] == "linked"
        with pytest.raises(rtc.RpcError):  # a stranger's report of the avatar's playout
            await room.invoke_rpc("lk.playback_finished", "user", "{}")
        room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        await settle()  # the session closes; livekit then runs on_session_end: the hold
        hook = asyncio.ensure_future(session_end_hook(users_session_end)(ctx))
        await clock.advance(5)
        remote = RemoteSession(sim_end)
        await remote.start()
        fin = await remote.finalize_simulation(provisional_success=True)
        await asyncio.wait_for(hook, 5)
        await remote.aclose()
        await job.aclose()
    assert fin.user_verdict.reason == "the agent vetoes this run"
    assert job.states["job"] == "closed"
    lines = [r for r in caplog.records if r.name.startswith("agent_runtime")]
    said = {r.getMessage() for r in lines}
    assert any(m.startswith("linked participant user") for m in said), said
    assert any(m.startswith("job closed") for m in said), said
    unlabelled = [
        f"{r.name} {r.levelname}: {r.getMessage()}"
        for r in lines
        if (getattr(r, "job_id", None), getattr(r, "room", None)) != (ctx.job.id, ROOM)
    ]
    assert unlabelled == []
