"""my_agent's lifecycles, through its own entrypoint, on virtual time and an in-memory room.

No LiveKit server: the room is the kit's ``InMemoryRoom`` (a real ``rtc.Room`` the test
drives), the simulator is livekit's ``RemoteSession`` on an in-memory transport, the avatar
provider is the test (``scripted_avatar``). The entrypoint runs unchanged.
"""

import pytest
from livekit import rtc
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from my_agent import GRACE_PERIOD, JOIN_TIMEOUT, server

# asyncio: for strict mode (auto mode needs no mark); virtual_time: livekit's own timers
# move with the test's clock too
pytestmark = [pytest.mark.asyncio, pytest.mark.virtual_time]


async def test_a_user_who_leaves_ends_the_job(agent_room, run_entrypoint):
    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    assert job.states["job"] == "serving" and job.states["participant"] == "linked"

    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")
    assert job.close_reason == "participant_disconnected"
    assert not agent_room.isconnected()


async def test_a_user_who_drops_may_come_back_within_the_grace_period(
    agent_room, virtual_clock, run_entrypoint
):
    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    agent_room.remove_participant("user", rtc.DisconnectReason.SIGNAL_CLOSE)
    await virtual_clock.advance(GRACE_PERIOD - 1)
    assert job.states["participant"] == "grace"

    agent_room.add_participant("user")
    await virtual_clock.advance(60)
    assert job.states["participant"] == "linked" and job.states["job"] == "serving"


async def test_an_avatar_that_never_joins_leaves_the_agent_audible(
    monkeypatch, agent_room, virtual_clock, scripted_avatar, run_entrypoint
):
    monkeypatch.setenv("BEY_API_KEY", "unused: the scripted avatar stands in for bey")
    agent_room.add_participant("user")
    job = await run_entrypoint(server, avatar=scripted_avatar)
    assert job.states["avatar"] == "routing" and job.audio_route() == "avatar"

    await virtual_clock.advance(JOIN_TIMEOUT)
    assert job.states["avatar"] == "restored" and job.audio_route() == "room"


async def test_an_avatar_that_joins_with_video_gets_the_audio(
    monkeypatch, agent_room, virtual_clock, scripted_avatar, run_entrypoint
):
    monkeypatch.setenv("BEY_API_KEY", "unused: the scripted avatar stands in for bey")
    agent_room.add_participant("user")
    job = await run_entrypoint(server, avatar=scripted_avatar)
    await virtual_clock.advance(2)
    agent_room.add_participant(scripted_avatar.avatar_identity, kind="agent")
    await virtual_clock.advance(1)
    agent_room.publish_track(scripted_avatar.avatar_identity, "video")
    await virtual_clock.advance(JOIN_TIMEOUT)
    assert job.states["avatar"] == "joined" and job.audio_route() == "avatar"


async def test_the_simulator_gets_the_verdict_after_the_agent_hangs_up(
    agent_room, virtual_clock, simulator, run_entrypoint
):
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "true"})
    job = await run_entrypoint(server, simulation=True)
    job.session.shutdown()  # the agent hangs up, as an end-call tool does
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()  # livekit calls on_session_end: the job holds

    await virtual_clock.advance(20)
    assert not held.done() and agent_room.isconnected()
    reply = await simulator.finalize_simulation(provisional_success=True)
    await held
    assert not reply.HasField("user_verdict")  # the agent does not veto this run
    assert job.states["job"] == "closed" and job.closed_at == 20.0
