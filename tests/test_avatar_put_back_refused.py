"""The previous route's put-back refused part-way by the session's output chain (a plugin
sink whose detach raises): the avatar's sink stays in the chain. A later interruption of
what it holds is the session's own, and must end the speech, not be taken for the
put-back's detaching clear."""

from __future__ import annotations

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
