"""An avatar lost where the session has no room audio: a text simulation (livekit's default
simulation mode: livekit gives the session no audio I/O there) or an agent that turned it off
(``RoomOptions(audio_output=False)``). The runtime puts no room audio output back when the
avatar never comes. The plain livekit job (the plugin, then the session, no runtime) is the
control: it publishes no audio track either."""

from __future__ import annotations

import pytest
from google.protobuf import json_format
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.testing import fake_job_context
from livekit.agents.types import ATTRIBUTE_SIMULATOR, ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice.room_io import RoomOptions
from livekit.protocol.agent_simulation import SimulationDispatch

from agent_runtime import AgentJob, on_session_end
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

pytestmark = [pytest.mark.virtual_time]


def published_audio(room: InMemoryRoom) -> list[str]:
    """The audio tracks the agent published into the room."""
    pubs = room.local_participant.track_publications.values()
    return [p.sid for p in pubs if isinstance(p.track, rtc.LocalAudioTrack)]


def avatar_agent(avatar: ScriptedAvatar, options: RoomOptions | None = None) -> AgentServer:
    """An agent whose job has ``avatar`` and starts with ``options`` (``job.start()``: the
    avatar first, then the session)."""
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), avatar=avatar)
        await job.start(Agent(instructions="test"), room_options=options or RoomOptions())

    return server


def lost_line(caplog: pytest.LogCaptureFixture) -> str:
    (lost,) = [r.getMessage() for r in caplog.records if "the avatar is gone" in r.getMessage()]
    return lost


async def test_an_avatar_that_never_joins_a_text_simulation_puts_no_room_audio_back(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    virtual_clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It attached a room audio output (an audio track published into a text-only room)
    when the avatar started first, and none when the session did; the warning says where
    the audio is."""
    server = avatar_agent(ScriptedAvatar(avatar_identity="avatar"))
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    await virtual_clock.advance(31)  # join_timeout
    assert job.states["avatar"] == "restored"
    assert published_audio(agent_room) == []
    assert job.audio_route() == "none"
    assert run_entrypoint.in_job(lk.session_text_only, job.session)
    assert lost_line(caplog).endswith(
        "the session has no audio output (none before the avatar's either)"
    )


async def test_an_avatar_failing_its_start_in_a_text_simulation_says_there_is_no_audio(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    virtual_clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its start fails before the session starts (``job.start()``'s order): the warning
    said the agent is on room audio, where livekit gives the session none."""
    server = avatar_agent(ScriptedAvatar(start_error="HTTP 401"))
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    await virtual_clock.advance(1)
    assert (job.audio_route(), published_audio(agent_room)) == ("none", [])
    assert lost_line(caplog).endswith(
        "the session has no audio output (none before the avatar's either)"
    )


async def test_without_the_runtime_a_text_simulation_publishes_no_audio_either(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock
) -> None:
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    with fake_job_context(room=agent_room) as ctx:
        dispatch = SimulationDispatch(simulation_run_id="run-1", job_id=ctx.job.id)
        ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(dispatch)
        session: AgentSession[None] = AgentSession()
        avatar = ScriptedAvatar(avatar_identity="avatar")
        await avatar.start(session, agent_room)
        await session.start(Agent(instructions="test"), room=agent_room)
        assert lk.session_text_only(session)  # the control runs as a text simulation
        await virtual_clock.advance(31)
        await settle()
        assert published_audio(agent_room) == []
        await session.aclose()


async def test_an_agent_with_room_audio_off_gets_no_room_audio_when_its_avatar_never_joins(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, virtual_clock: VirtualClock
) -> None:
    """``RoomOptions(audio_output=False)`` with the avatar started first (``job.start()``):
    livekit turns RoomIO's audio off under the avatar's route either way, and the lost
    avatar's route came back as a room audio output the agent had turned off."""
    server = avatar_agent(ScriptedAvatar(), RoomOptions(audio_output=False))
    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    await virtual_clock.advance(31)  # join_timeout
    assert job.states["avatar"] == "restored"
    assert (job.audio_route(), published_audio(agent_room)) == ("none", [])


async def test_without_the_runtime_room_audio_off_publishes_no_audio(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock
) -> None:
    agent_room.add_participant("user")
    with fake_job_context(room=agent_room):
        session: AgentSession[None] = AgentSession()
        await ScriptedAvatar().start(session, agent_room)
        options = RoomOptions(audio_output=False)
        await session.start(Agent(instructions="test"), room=agent_room, room_options=options)
        await virtual_clock.advance(31)
        await settle()
        assert published_audio(agent_room) == []
        await session.aclose()


async def test_an_agent_with_room_audio_on_gets_it_back_when_its_avatar_never_joins(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner, virtual_clock: VirtualClock
) -> None:
    server = avatar_agent(ScriptedAvatar())
    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    await virtual_clock.advance(31)
    assert job.audio_route() == "room"
    assert len(published_audio(agent_room)) == 1
