"""Putting the previous route back when something in the way fails: the avatar's sink
refusing to be let go part-way through livekit's swap (its detach raising), or the room
audio output the route goes back to failing to be built. The agent must not be left on the
sink of an avatar that is gone (silent, its speech never finished)."""

from __future__ import annotations

import logging

import pytest
from livekit import rtc
from livekit.agents import Agent
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime.runtimes.avatar import audio_tail
from agent_runtime.sdk.room_audio import room_output_source
from agent_runtime.testing.clock import settle
from agent_runtime.testing.room_audio import pace_as_published, room_outputs
from tests.support.avatar_rig import AVATAR, Rig, frames


def _refuse() -> None:
    raise RuntimeError("the sink refuses to be detached")


@pytest.mark.virtual_time  # the room's audio plays on the loop's clock
@pytest.mark.parametrize("text", [True, False], ids=["wrapped", "sink-alone"])
@pytest.mark.parametrize("rejoin", [True, False])
async def test_a_sink_refusing_its_detach_still_leaves_the_agent_audible_in_the_room(
    rejoin: bool, text: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Below the transcript's wrapper the sink is swapped out under livekit's proxy;
    without it (no text output) the chain is the sink alone, replaced whole."""
    rig = Rig(retry={"rejoin": rejoin})
    pace_as_published(rig.room, lambda: [rig.session])  # the room's audio on virtual time
    options = RoomOptions(text_output=text)
    await rig.session.start(Agent(instructions="test"), room=rig.room, room_options=options)
    await settle()
    room_output = audio_tail(rig.session)
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    sink = audio_tail(rig.session)
    assert sink is not None and sink is not room_output
    # livekit clears the sink it swaps out, then detaches it: refused there
    monkeypatch.setattr(sink, "on_detached", _refuse)
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
        await settle()
    assert rig.lifecycle.state == "restored"
    # not left on the avatar's sink (silent), the speech it was playing ended (not hung)
    assert audio_tail(rig.session) is room_output and rig.lifecycle.audio_route() == "room"
    assert handle.done()
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("agent_runtime") and r.levelno >= logging.WARNING
    ]
    assert [m for m in warned if "the sink refuses to be detached" in m] == warned[:1]
    assert "the agent is on room audio" in warned[1]  # the loss, said as always

    again = rig.session.say("again", audio=frames(20), add_to_chat_ctx=False)
    await rig.clock.advance(1.0)
    await settle()
    assert again.done() and not again.interrupted  # heard to its end in the room
    played = [room_output_source(out).captured for out in room_outputs(rig.session)]
    assert played == [pytest.approx(0.2)]
    if rejoin:
        rig.join()
        await settle()
        assert rig.lifecycle.state == "joined" and audio_tail(rig.session) is sink
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


def test_a_sink_that_cannot_be_stood_in_for_is_left_as_it_was() -> None:
    """The retried put-back stands in for the sink's flush, clear and detach; a sink where
    one of them cannot be replaced (a read-only attribute) is left with all of its own, not
    with a flush that silently does nothing."""
    from livekit.agents.voice.io import AudioOutput

    from agent_runtime.runtimes.avatar._route import _unasked

    class Stubborn(AudioOutput):
        flushed = 0

        def __init__(self) -> None:
            super().__init__(label="stubborn", capabilities=None, sample_rate=24000)

        async def capture_frame(self, frame: rtc.AudioFrame) -> None:
            return None

        def flush(self) -> None:
            self.flushed += 1

        @property
        def clear_buffer(self) -> object:  # type: ignore[override]
            return lambda: None

    sink = Stubborn()
    with pytest.raises(AttributeError), _unasked(sink):
        pass
    sink.flush()
    assert sink.flushed == 1
    assert "flush" not in vars(sink)
