"""AvatarLifecycle cells whose changes only a user would notice: the orders in which they decide.

Each test drives a real ``AgentSession`` (started on the in-memory room, RoomIO and all),
the real ``DataStreamAudioOutput`` a plugin-style ``start()`` installs and the real actor
into one cell of the ``avatar`` table, and asserts what a user of the runtime sees there:
whether the agent is left speaking, where its audio goes, what ``start()`` and a
``state_changed`` listener report, what the plugin was asked. Faked, because they need a
network: the byte stream that carries audio to the avatar, the SFU (the in-memory room and
its RPC delivery), the provider's API call (a scripted delay or gate), the server API's
removal of the avatar participant. Virtual time throughout; nothing sleeps for real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes.avatar import AvatarLifecycle, route_of
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.room_audio import room_output_source
from agent_runtime.testing.clock import settle
from agent_runtime.testing.room_audio import pace_as_published, room_outputs
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from tests.support.avatar_rig import AVATAR, Rig, frames, playback_finished, route_names

SYNCED_TO_ROOM = ["_SyncedAudioOutput", "_AudioSinkProxy", "_ParticipantAudioOutput"]

# livekit's own timers (a speech's 5 s interruption bound) run on the virtual clock too
pytestmark = pytest.mark.virtual_time


def _agent_state(rig: Rig) -> str:
    """What the session tells its app the agent is doing (``speaking``, ``listening``...)."""
    return rig.session.agent_state


async def _start_session_without_transcripts(rig: Rig) -> None:
    """An agent that sends no transcriptions (``text_output=False``): no synchronizer wraps
    its audio output, so an avatar's sink becomes the whole chain, and a speech waits on
    that sink itself."""
    await rig.session.start(
        Agent(instructions="test"), room=rig.room, room_options=RoomOptions(text_output=False)
    )
    await settle()


async def _speaking_when_the_avatar_leaves(rig: Rig) -> Any:
    """Joined, the agent speaking through the avatar (a reply the avatar has not reported
    played yet): returns its handle. When the avatar then drops, the reply still waits on
    the avatar's sink: with rejoin the sink is not retired as the route goes back, so what
    it counts stays counted until something finishes it."""
    await _start_session_without_transcripts(rig)
    await rig.start_avatar()
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    assert route_names(rig.session) == ["DataStreamAudioOutput"]  # nothing wraps the sink
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert sink is not None and lk.pending_playbacks(sink) == 1
    return handle


# -- a reply waiting on the avatar's own sink when the avatar drops -------------------------


@pytest.mark.parametrize("retries", [1, 0], ids=["backoff", "restored"])
async def test_a_reply_playing_when_a_rejoinable_avatar_drops_ends_at_once(
    retries: int,
) -> None:
    """The avatar drops while the agent speaks through it, with rejoin (the avatar's sink
    is kept for its return, not retired) and an audio chain that is the sink alone: the
    reply ends there and then (its playout reported cut) and the agent listens again on room audio,
    whether the lifecycle waits to retry or has given up. Nothing else would end it: no
    proxy above the sink clears it as the chain is swapped, and a ``restored`` lifecycle
    is left alone (this reply used to keep the agent "speaking" for good). A user's
    interruption after that finds nothing to clear and sends nothing to the avatar."""
    retry: dict[str, Any] = {"attempts": retries, "rejoin": True, "backoff": {"initial": 30.0}}
    rig = Rig(retry=retry)
    handle = await _speaking_when_the_avatar_leaves(rig)
    changes = rig.watch()
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    waits = "backoff" if retries else "restored"
    assert changes == [("joined", "failed", "avatar_left"), ("failed", waits, "route_restored")]
    assert rig.lifecycle.audio_route() == "room" and route_of(rig.session) == "room"
    assert handle.done()
    assert _agent_state(rig) == "listening"
    assert rig.clock.now() == 0.0  # at once, not at livekit's 5 s fallback
    rig.session.interrupt()
    await settle()
    assert rig.rpcs() == [] and rig.lifecycle.state == waits
    await rig.aclose()


@pytest.mark.parametrize("text", [False, True], ids=["sink-alone", "wrapped"])
async def test_a_reply_waiting_for_an_avatar_that_never_joins_ends_with_rejoin(
    text: bool,
) -> None:
    """With rejoin, the agent speaks before the avatar joined (its reply waits in the
    avatar's sink for the avatar to arrive), and the avatar never does: at the join bound
    the agent is back on room audio and that reply has ended; it does not wait for good on
    a sink kept only for the avatar's return: below a wrapper (the transcript's), the
    reply goes on in the room, the frame that waited first; a sink alone in the chain is
    replaced whole, and the reply ends. When the avatar does come back later, the route
    goes back in and its sink takes the next reply."""
    rig = Rig(retry={"attempts": 0, "rejoin": True}, join_timeout=5.0)
    pace_as_published(rig.room, lambda: [rig.session])  # the room's audio on virtual time
    await rig.session.start(
        Agent(instructions="test"), room=rig.room, room_options=RoomOptions(text_output=text)
    )
    await settle()
    await rig.start_avatar()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    assert not handle.done() and rig.lifecycle.state == "routing"
    await rig.clock.advance(5.0)  # the join bound
    await settle()
    assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    played = [room_output_source(out).captured for out in room_outputs(rig.session)]
    if text:
        assert not handle.done()  # playing in the room
        await rig.clock.advance(0.5)
        await settle()
        played = [room_output_source(out).captured for out in room_outputs(rig.session)]
    assert played == [pytest.approx(0.5 if text else 0.0)]
    assert handle.done()
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined" and rig.lifecycle.audio_route() == "avatar"
    rig.session.say("again", audio=frames(5), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert sink is not None and lk.pending_playbacks(sink) == 1
    await rig.aclose()


# -- (starting, avatar_left) ----------------------------------------------------------------


async def test_the_avatar_dropping_while_the_plugin_starts_does_not_restart_it() -> None:
    """The provider sends its avatar before its API call returns, and the avatar drops
    again before it does. The plugin's start goes on undisturbed (the plugin is started
    once), ``start()`` returns only once that start has, a ``state_changed`` listener sees
    no change meanwhile, and the lifecycle then waits for the avatar to come back, its
    route in place; the avatar's return is the join."""
    rig = Rig()
    rig.avatar = ScriptedAvatar(avatar_identity=AVATAR, start_delay=20.0, clock=rig.clock)
    rig.lifecycle = AvatarLifecycle(rig.avatar, clock=rig.clock, tracer=Tracer(rig.trace))
    await rig.start_session()
    changes = rig.watch()
    start = asyncio.ensure_future(rig.lifecycle.start(rig.session, rig.room))
    await rig.clock.advance(1.0)
    rig.join()
    await rig.clock.advance(1.0)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert rig.decided("avatar_left") == ["starting"]  # the cell this test is about
    assert not start.done() and rig.lifecycle.state == "starting"
    assert rig.avatar.start_calls == 1
    assert changes == [("idle", "starting", "start")]
    await rig.clock.advance(18.0)  # the provider answers, 20 s after the start
    assert start.done() and start.exception() is None
    assert rig.avatar.start_calls == 1
    assert rig.lifecycle.state == "routing" and rig.lifecycle.audio_route() == "avatar"
    assert changes == [("idle", "starting", "start"), ("starting", "routing", "plugin_started")]
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    await rig.aclose()


# -- (starting, playback_finished) ------------------------------------------------------------


async def test_a_playback_report_the_instant_the_plugins_start_returns_ends_the_reply() -> None:
    """The plugin's start puts its route in, then waits for its provider; meanwhile the
    avatar is there and the agent's reply plays through it. The avatar reports the reply
    played in the very instant the plugin's start returns (the lifecycle has just taken
    the report over from the sink, and has not yet moved on from ``starting``): the
    report is answered and ends the reply; the agent is not left speaking."""
    rig = Rig(avatar=ScriptedAvatar(avatar_identity=AVATAR, held=True))
    await rig.start_session()
    start = await rig.start_avatar_aside()
    rig.avatar.tell("routed")  # the provider's first word: the route goes in
    await settle()
    rig.join()  # the provider's avatar, before its API call has returned
    await settle()
    assert rig.lifecycle.state == "starting" and rig.lifecycle.audio_route() == "avatar"
    handle = rig.session.say("hello", audio=frames(5), add_to_chat_ctx=False)
    await settle()
    assert not handle.done() and _agent_state(rig) == "speaking"
    changes = rig.watch()
    rig.avatar.tell("ok")  # the provider answers: the plugin's start() returns ...
    reply = asyncio.ensure_future(  # ... and the avatar's report arrives in that instant
        rig.room.invoke_rpc("lk.playback_finished", AVATAR, playback_finished())
    )
    await settle()
    assert await reply == "ok"
    assert rig.decided("playback_finished") == ["starting"]  # the cell this test is about
    assert handle.done() and not handle.interrupted
    assert _agent_state(rig) == "listening"
    assert start.done() and rig.lifecycle.state == "joined"
    # a state_changed listener hears the start's outcome, then the join it already saw
    assert [(src, dest) for src, dest, _on in changes] == [
        ("starting", "routing"),
        ("routing", "joined"),
    ]
    assert rig.lifecycle.audio_route() == "avatar" and rig.rpcs() == []
    await rig.aclose()


# -- (backoff, avatar_connected) [rejoin] ---------------------------------------------------


async def test_a_returning_avatar_that_drops_again_leaves_the_agent_on_room_audio() -> None:
    """With rejoin, the avatar drops, comes back while the lifecycle waits to retry, is
    routed to and joins again, then drops a second time: the agent is back on room audio
    (RoomIO's own output under the session's wrappers), not left streaming to an avatar
    that is gone. A ``state_changed`` listener sees the return as ``backoff -> routing``
    (awaited again, under a fresh join timeout), then the join, the drop and the wait."""
    rig = Rig(retry={"attempts": 2, "rejoin": True, "backoff": {"initial": 10.0}})
    await rig.join_and_leave()
    assert rig.lifecycle.state == "backoff" and rig.lifecycle.audio_route() == "room"
    changes = rig.watch()
    rig.join(video=False)
    await settle()
    assert "backoff" in rig.decided("avatar_connected")  # the cell this test is about
    assert rig.lifecycle.state == "routing" and rig.lifecycle.audio_route() == "avatar"
    rig.room.publish_track(AVATAR, "video")
    await settle()
    assert rig.lifecycle.state == "joined" and rig.lifecycle.audio_route() == "avatar"
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert rig.lifecycle.audio_route() == "room"
    assert route_names(rig.session) == SYNCED_TO_ROOM
    assert route_of(rig.session) == "room"
    assert changes == [
        ("backoff", "routing", "avatar_connected"),
        ("routing", "joined", "video_published"),
        ("joined", "failed", "avatar_left"),
        ("failed", "backoff", "route_restored"),
    ]
    assert rig.avatar.start_calls == 1  # routed to again, never restarted
    await rig.aclose()
