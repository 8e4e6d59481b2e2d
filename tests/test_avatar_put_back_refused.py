"""Putting the previous route back when it fails: refused part-way by the session's output
chain (a plugin sink whose detach raises: the avatar's sink stays in the chain), or the
room audio output it goes back to failing to be built. A later interruption of what the
sink holds is the session's own, and a later put-back still has the route to put back."""

from __future__ import annotations

import logging

import pytest
from livekit import rtc

from agent_runtime.runtimes.avatar import audio_tail
from agent_runtime.testing.clock import settle
from tests.support.avatar_rig import AVATAR, Rig, frames


async def test_an_interruption_after_a_refused_put_back_ends_the_speech(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(retry={"rejoin": True})  # the sink is kept (and followed) for a rejoin
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    sink = audio_tail(rig.session)
    assert sink is not None

    def refuse() -> None:
        raise RuntimeError("the sink refuses to be detached")

    # livekit's proxy clears the sink it swaps out, then detaches it: refused there, the
    # sink is cleared but still in the chain
    monkeypatch.setattr(sink, "on_detached", refuse)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert rig.lifecycle.state == "restored" and audio_tail(rig.session) is sink
    assert not handle.done()

    rig.session.interrupt()
    await settle()
    # it hung, interrupted but never done: the clear was taken for the put-back's own
    assert handle.done() and handle.interrupted
    steps = [r for r in rig.trace.records if r.kind == "transition" and r.event == "interrupt"]
    assert [(r.source, r.effects) for r in steps] == [("restored", ["clear_local_buffer"])]
    monkeypatch.undo()
    await rig.aclose()


async def test_a_put_back_to_room_audio_that_failed_is_made_when_the_avatar_leaves_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The avatar was started before the session (whose start turned RoomIO's audio off
    under its route): putting the route back builds a room audio output, and that failed
    the first time (here: the agent's ``room_audio`` answer). The route to put back is
    kept: an interruption meanwhile is the session's, and with rejoin, once the avatar came
    back and left again, that put-back is made: the agent is on room audio."""
    asked: list[bool] = []

    def room_audio() -> bool:
        asked.append(True)
        if len(asked) == 1:
            raise RuntimeError("the room options cannot be read")
        return True

    rig = Rig(retry={"rejoin": True}, room_audio=room_audio)
    await rig.start_avatar()
    await rig.start_session()
    sink = audio_tail(rig.session)
    rig.join()
    await settle()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
        await settle()
    assert "the room options cannot be read" in caplog.text
    assert rig.lifecycle.state == "restored" and audio_tail(rig.session) is sink
    # still on that sink: an interruption is the session's, not a put-back's own clear
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    rig.session.interrupt()
    await settle()
    assert handle.done() and rig.decided("interrupt") == ["restored"]
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    # not left on the sink of the avatar that left (the failed put-back had let go of the
    # route to put back, and the reinstall took the sink itself for it)
    assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    assert len(rig.room.local_participant.track_publications) == 1
    await rig.aclose()
