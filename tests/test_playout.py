"""The playout machine through the real runtime: the composed ``AgentJob`` on a real
``AgentSession`` speaking through the SDK's own ``session.say`` to a plugin-style avatar.

Stood in for (they need a network): the SFU and the avatar's side (``InMemoryRoom``: its
``lk.playback_finished`` is an incoming RPC the test sends, ``lk.clear_buffer`` an outgoing
one it records), and the LLM a default re-prompt asks (``AskedLLM`` records the request).
The user's voice activity is the session's user state, set with the method the SDK's VAD
path calls. Virtual time throughout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.events import CloseEvent

from agent_runtime import AgentJob, Event, Tracer
from agent_runtime.runtimes.avatar import SegmentFlushed
from agent_runtime.runtimes.playout import PlayoutTracker
from agent_runtime.runtimes.routing import hear_reports
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.room_audio import room_output_source
from agent_runtime.settings import SettingError, SettingTypeError
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.room_audio import pace_as_published, room_outputs
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from statemachines.playout import PLAYOUT
from statemachines.system import REPORTS, Report
from tests.support.playout_rig import AVATAR, RATE, USER, AskedLLM, PlayoutRig, frames

# livekit's own timers (the avatar sink's 2 s clear bound) move with the test's clock
pytestmark = pytest.mark.virtual_time


async def fails_after(seconds: float) -> AsyncIterator[rtc.AudioFrame]:
    """A reply's audio that breaks after ``seconds`` (its TTS stream failed)."""
    per = RATE // 100
    for _ in range(round(seconds * 100)):
        yield rtc.AudioFrame(b"\0\0" * per, RATE, 1, per)
    raise RuntimeError(TTS_BROKE)


TTS_BROKE = "the TTS stream broke"


def say_failing(rig: PlayoutRig, seconds: float) -> tuple[Any, list[asyncio.Task[Any]]]:
    """``session.say()`` with audio that breaks after ``seconds``: the handle, and the
    reply's task livekit made for it (``AgentActivity.tts_say``, made within ``say()``).

    That task is livekit's, not the runtime's: it ends with the stream's error, livekit
    logs it ("Error in _tts_task") yet never reads it, and the handle does not carry it
    (``handle.exception()`` is None). livekit alone, with no runtime, leaves the same
    failure unread, so asyncio reports it ("Task exception was never retrieved")
    whenever the task is collected, in whichever later test that is. The test provoked
    that failure, so it takes it with :func:`the_failure`."""
    before = asyncio.all_tasks()
    handle = rig.session.say("...", audio=fails_after(seconds))
    made = [t for t in asyncio.all_tasks() - before if t.get_name() == "AgentActivity.tts_say"]
    assert len(made) == 1, made
    return handle, made


def the_failure(tasks: list[asyncio.Task[Any]]) -> str:
    """What the reply's task ended with, read (so asyncio has nothing left to report)."""
    (task,) = tasks
    assert task.done()
    return str(task.exception())


# -- the wait for the avatar -----------------------------------------------------------------


async def test_a_silent_avatar_gets_the_audio_plus_the_margin_then_the_agent_listens_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    handle = rig.say(3.0)
    await rig.settle()
    assert rig.playout.state == "remote_playout"
    assert rig.playout.actor.timer_deadline == pytest.approx(5.0)  # 3 s of audio + 2 s
    await rig.advance(4.9)
    assert (rig.playout.state, rig.session.agent_state) == ("remote_playout", "speaking")
    with caplog.at_level(logging.WARNING, logger="agent_runtime.playout"):
        await rig.advance(0.1)
    assert rig.playout.state == "idle"
    assert [(d.t, d.cause) for d in rig.playout.done] == [(5.0, "playout_timeout")]
    # the SDK's own wait ended with it: the speech is done and the agent listens
    assert handle.done() and rig.session.agent_state == "listening"
    assert rig.job.avatar is not None and rig.job.avatar.state == "joined"
    assert rig.rpcs() == []  # nothing was sent to the avatar
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.playout"]
    # named as the job's other warnings are: the room (and job), then the machine
    assert msg.startswith(
        "room room, playout[room]: avatar avatar sent no lk.playback_finished within 5s "
        "(3s of audio pushed and a 2s margin); "
    )
    await rig.aclose()


async def test_a_late_report_for_audio_finished_here_does_not_end_the_next_reply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The avatar reports reply A only after playout's bound finished it here, while it
    plays reply B: the report is A's, so B goes on (speaking, interruptible, no re-prompt
    over it) until its own report. Taken for B's, it left the agent listening 0.5 s into 8
    s of audio the avatar still played, as the plugin alone never does."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    first = rig.say(1.0)
    await rig.settle()
    await rig.advance(3.0)  # 1 s of audio + the 2 s margin: finished here
    assert first.done() and rig.playout.done[-1].cause == "playout_timeout"
    second = rig.say(8.0)
    await rig.settle()
    await rig.advance(0.5)
    with caplog.at_level(logging.INFO, logger="agent_runtime.avatar"):
        assert await rig.report(1.0) == "ok"  # A's, late
        await rig.settle()
    assert any("late lk.playback_finished" in r.getMessage() for r in caplog.records)
    assert not second.done() and rig.session.agent_state == "speaking"
    assert rig.playout.state == "remote_playout"
    await rig.advance(7.5)
    assert await rig.report(8.0) == "ok"  # B's own
    await rig.settle()
    assert second.done() and rig.session.agent_state == "listening"
    assert rig.playout.done[-1].cause == "playback_finished"
    await rig.aclose()


@pytest.mark.parametrize(
    ("position", "interrupted"),
    [(0.4, True), (3.0, False)],
    ids=["interrupted-with-no-clear", "played-in-full"],
)
async def test_a_late_report_for_a_reply_finished_here_does_not_end_the_reply_after_it(
    caplog: pytest.LogCaptureFixture, position: float, interrupted: bool
) -> None:
    """Reply A (3 s) is finished here by the bound; 0.5 s into reply B (6 s) A's report
    comes after all. Saying ``interrupted`` it cannot be B's: nothing was cleared since B
    began, and an avatar says so only of a clear. Taken for B's, the agent listened (the
    user speaking was no interruption, a re-prompt could run) while B still played; a
    full play of 3 s is not B's either. B goes on until its own report."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    first = rig.say(3.0)
    await rig.settle()
    await rig.advance(5.0)  # 3 s of audio + the 2 s margin: finished here
    assert first.done() and rig.playout.done[-1].cause == "playout_timeout"
    await rig.advance(0.5)
    second = rig.say(6.0)
    await rig.settle()
    await rig.advance(0.5)
    with caplog.at_level(logging.INFO, logger="agent_runtime.avatar"):
        assert await rig.report(position, interrupted=interrupted) == "ok"  # A's, late
        await rig.settle()
    assert any("late lk.playback_finished" in r.getMessage() for r in caplog.records)
    assert not second.done()
    assert (rig.playout.state, rig.session.agent_state) == ("remote_playout", "speaking")
    await rig.advance(5.5)
    assert await rig.report(6.0) == "ok"  # B's own
    await rig.settle()
    assert second.done() and rig.session.agent_state == "listening"
    assert rig.playout.done[-1].cause == "playback_finished"
    await rig.aclose()


async def _reply_after_one_finished_here(rig: PlayoutRig, seconds: float) -> Any:
    """Reply A (3 s, no report) finished here by the bound, then reply B of ``seconds``
    handed to the avatar 0.5 s ago: B's handle."""
    await rig.start()
    rig.say(3.0)
    await rig.settle()
    await rig.advance(5.5)
    second = rig.say(seconds)
    await rig.settle()
    await rig.advance(0.5)
    return second


async def test_an_interruption_of_the_reply_after_one_finished_here_ends_it_on_its_report() -> None:
    """Reply A is finished here by the bound; the user interrupts reply B: the clear goes
    to the avatar, and its ``interrupted`` report ends B at once (B's, not A's late one),
    not after the plugin's own 2 s wait for it."""
    rig = PlayoutRig(reprompt=False)
    second = await _reply_after_one_finished_here(rig, 6.0)
    rig.session.interrupt()
    await rig.settle()
    assert rig.rpcs() == ["lk.clear_buffer"]
    assert await rig.report(0.4, interrupted=True) == "ok"
    await rig.settle()
    assert second.done() and second.interrupted and rig.session.agent_state == "listening"
    assert rig.playout.done[-1].cause == "playback_finished"
    await rig.aclose()


async def test_a_reply_after_a_late_interrupted_report_is_still_owed_its_own_late_report() -> None:
    """A's report comes late, as ``interrupted`` with nothing cleared, during reply B: it
    cannot be B's own (sent early), so B still owes its report. B's is lost too and the
    bound finishes B; B's report, late in turn, does not end reply C 0.5 s in."""
    rig = PlayoutRig(reprompt=False)
    await _reply_after_one_finished_here(rig, 2.0)
    assert await rig.report(0.4, interrupted=True) == "ok"  # A's, late
    await rig.settle()
    await rig.advance(3.6)  # 2 s of audio + the 2 s margin from B's hand-off
    assert rig.playout.done[-1].cause == "playout_timeout"
    third = rig.say(6.0)
    await rig.settle()
    await rig.advance(0.5)
    assert await rig.report(2.0) == "ok"  # B's, late
    await rig.settle()
    assert not third.done() and rig.session.agent_state == "speaking"
    await rig.aclose()


async def test_an_avatar_that_dropped_a_report_still_ends_the_next_reply_with_its_own() -> None:
    """A's report never comes (finished here by the bound); B's own report, when B could
    have played, ends B at once: it is not taken for A's."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.advance(3.0)
    second = rig.say(2.0)
    await rig.settle()
    await rig.advance(2.1)
    assert await rig.report(2.0) == "ok"
    await rig.settle()
    assert second.done() and rig.session.agent_state == "listening"
    assert [d.cause for d in rig.playout.done][-1] == "playback_finished"
    third = rig.say(1.0)  # and the next report after it is its own again
    await rig.settle()
    await rig.advance(1.0)
    await rig.report(1.0)
    await rig.settle()
    assert third.done() and rig.playout.done[-1].cause == "playback_finished"
    await rig.aclose()


async def test_an_avatar_that_reports_early_after_one_lost_report_costs_one_bound_only() -> None:
    """A's report lost (finished here by the bound); the avatar then reports each reply as
    soon as it has its audio, before it could have played it. The first such report is
    taken for A's, late: that reply waits for the bound, once. The bound does not count
    its report as still owed, so every later reply ends on its own report at once (each
    one waited for the bound before)."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.advance(3.0)
    ended_at_once = []
    for _ in range(3):
        reply = rig.say(2.0)
        await rig.settle()
        await rig.advance(0.1)
        await rig.report(2.0)  # early: it cannot have played 2 s in 0.1 s
        await rig.settle()
        ended_at_once.append(reply.done())
        await rig.advance(5.0)
    assert ended_at_once == [False, True, True]
    causes = [d.cause for d in rig.playout.done]
    assert causes[-3:] == ["playout_timeout", "playback_finished", "playback_finished"]
    await rig.aclose()


async def test_a_reply_cut_before_its_end_reached_the_sink_is_not_counted_as_owed() -> None:
    """The avatar's clear confirmed for a reply still being produced: its segment ends
    before the sink's flush, and the flush adds nothing the avatar owes. A later reply's
    own full report is then read against that reply, not the one before it."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    gate = asyncio.Event()
    rig.session.say("...", audio=frames(3.0, gate=gate))
    await rig.settle()
    await rig.advance(0.5)
    assert rig.job.avatar is not None
    rig.job.avatar.interrupt()
    await rig.settle()
    await rig.report(0.5, interrupted=True)  # the avatar confirms the clear
    await rig.settle()
    gate.set()  # the reply's last frame, then its flush
    await rig.settle()
    await rig.advance(5.0)
    rig.say(4.0)  # its report is lost: finished here by the bound
    await rig.settle()
    await rig.advance(6.1)
    shorter = rig.say(1.0)
    await rig.settle()
    await rig.advance(1.0)
    await rig.report(1.0)  # its own, in full, on time
    await rig.settle()
    assert shorter.done() and rig.session.agent_state == "listening"
    await rig.aclose()


async def test_a_long_session_keeps_only_the_last_turns() -> None:
    """A session of many turns: what the tracker keeps of them stays bounded."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    turns = rig.playout.HISTORY + 5
    for _ in range(turns):
        rig.say(1.0)
        await rig.settle()
        await rig.advance(3.0)  # 1 s of audio + the 2 s margin: each turn times out
    assert rig.playout.state == "idle"
    done = list(rig.playout.done)
    assert len(done) == rig.playout.HISTORY
    # the oldest were dropped: the first kept is turn 6's, the last is the last turn's
    assert done[0].t == pytest.approx(6 * 3.0) and done[-1].t == pytest.approx(turns * 3.0)
    await rig.aclose()


async def test_the_avatars_report_ends_the_wait() -> None:
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    handle = rig.say(3.0)
    await rig.settle()
    await rig.advance(3.2)
    assert await rig.report(3.0) == "ok"
    await rig.settle()
    assert [(d.t, d.cause) for d in rig.playout.done] == [(3.2, "playback_finished")]
    assert rig.playout.state == "idle" and not rig.playout.actor.timer_armed
    assert handle.done() and rig.session.agent_state == "listening"
    await rig.aclose()


async def test_an_avatar_that_leaves_ends_the_wait_at_once_and_nothing_is_sent_to_it() -> None:
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    handle = rig.say(5.0)
    await rig.settle()
    await rig.advance(1.0)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.SIGNAL_CLOSE)
    await rig.settle()
    assert [(d.t, d.cause) for d in rig.playout.done] == [(1.0, "avatar_left")]
    assert handle.done() and rig.session.agent_state == "listening"
    assert rig.job.audio_route() == "room"
    rig.session.interrupt()  # nothing playing: and nothing goes to the departed avatar
    await rig.settle()
    assert rig.rpcs() == []
    await rig.aclose()


async def test_an_interruption_bounds_the_wait_by_the_margin_from_the_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    handle = rig.say(5.0)
    await rig.settle()
    await rig.advance(1.0)
    rig.session.interrupt()
    await rig.settle()
    assert rig.rpcs() == ["lk.clear_buffer"]  # the plugin's own clear: the avatar is joined
    assert rig.playout.state == "remote_playout"
    assert rig.playout.actor.timer_deadline == pytest.approx(3.0)  # the cut + 2 s, not 7 s
    with caplog.at_level(logging.WARNING, logger="agent_runtime.playout"):
        await rig.advance(2.0)
    assert [(d.t, d.cause) for d in rig.playout.done] == [(3.0, "playout_timeout")]
    # the wait it names is the one it waited (it read "within 2s (5s of audio pushed, ...)")
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.playout"]
    assert "within 2s of the interruption's clear;" in msg
    assert handle.done() and handle.interrupted and rig.session.agent_state == "listening"
    await rig.aclose()


async def test_an_earlier_interruption_does_not_make_a_later_unreported_segment_interrupted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cut was kept for the job's life: a later utterance the avatar never reported was
    finished as interrupted (its chat message marked so) and named as a clear's wait."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(5.0)
    await rig.settle()
    await rig.advance(1.0)
    rig.session.interrupt()
    await rig.settle()
    await rig.report(1.0, interrupted=True)
    await rig.advance(5.0)
    assert rig.playout.state == "idle"
    sink = rig.session.output.audio
    assert sink is not None
    finished: list[bool] = []
    sink.on("playback_finished", lambda ev: finished.append(ev.interrupted))
    handle = rig.say(3.0)
    await rig.settle()
    assert rig.playout.actor.timer_deadline == pytest.approx(11.0)  # 3 s of audio + 2 s
    with caplog.at_level(logging.WARNING, logger="agent_runtime.playout"):
        await rig.advance(5.0)
    assert [d.cause for d in rig.playout.done][-1] == "playout_timeout"
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.playout"]
    assert "within 5s (3s of audio pushed and a 2s margin);" in msg
    assert handle.done() and not handle.interrupted
    assert finished == [False]  # the SDK hears it played out, not cut
    await rig.aclose()


async def test_more_audio_at_the_avatar_sets_the_bound_again_from_it() -> None:
    """A plugin's sink that gets a second segment while the first is still awaited: the
    wait is bounded from the new audio, so the avatar still playing it is not cut. The
    avatar's one report ends one segment; the SDK's speech, which awaited its own, is done
    with it, and its playout report ends the turn."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    assert rig.playout.actor.timer_deadline == pytest.approx(3.0)  # 1 s + the 2 s margin
    await rig.advance(1.5)
    sink = rig.session.output.audio
    assert sink is not None
    per = RATE // 100
    for _ in range(400):  # 4 s more, as the session pushes it
        await sink.capture_frame(rtc.AudioFrame(b"\0\0" * per, RATE, 1, per))
    sink.flush()
    await rig.settle()
    assert rig.playout.actor.timer_deadline == pytest.approx(7.5)  # 1.5 + 4 + 2
    await rig.advance(4.0)  # past the first bound: still waiting for the avatar
    assert rig.playout.state == "remote_playout" and not rig.playout.done
    await rig.report(4.0)
    await rig.settle()
    assert [(d.t, d.cause) for d in rig.playout.done] == [(5.5, "agent_listening")]
    await rig.aclose()


async def test_a_reply_whose_audio_failed_partway_is_reported_apart_from_the_next() -> None:
    """A ``say()`` whose audio fails partway: the SDK flushed what it pushed and no speech
    waits for it; the next reply stacks on it at the avatar's sink. The avatar's first
    report ends one segment, so the turn still waits for the next one's (the watchdog is
    not armed over the agent speaking); the second report ends it with the SDK's own."""

    rig = PlayoutRig(reprompt=True)
    await rig.start()
    rig.user("listening")
    first, failed = say_failing(rig, 0.3)
    await rig.settle()
    assert first.done()  # the SDK ended it without waiting for its playout
    assert the_failure(failed) == TTS_BROKE
    ended = len(rig.playout.done)  # that turn ended with the agent listening again
    second = rig.say(1.0)
    await rig.settle()
    assert rig.playout.state == "remote_playout"
    await rig.report(0.3)  # the failed reply's audio, played
    await rig.settle()
    assert not second.done() and rig.session.agent_state == "speaking"
    assert rig.playout.state == "remote_playout" and len(rig.playout.done) == ended
    await rig.report(1.0)
    await rig.settle()
    assert second.done() and rig.session.agent_state == "listening"
    assert [d.cause for d in list(rig.playout.done)[ended:]] == ["playback_finished"]
    assert rig.playout.state == "settling"
    await rig.aclose()


async def test_the_bound_finishes_every_segment_a_silent_avatar_still_owes() -> None:
    """The same two segments, and an avatar that reports neither: when playout's bound
    runs out it finishes both, so the SDK's reply is done and the agent listens again
    (one finished would leave it "speaking" for good)."""

    rig = PlayoutRig(reprompt=False)
    await rig.start()
    _, failed = say_failing(rig, 0.3)
    await rig.settle()
    assert the_failure(failed) == TTS_BROKE
    second = rig.say(1.0)
    await rig.settle()
    sink = rig.session.output.audio
    assert rig.playout.state == "remote_playout" and rig.playout.audio_at_avatar
    # 0.3 s and 1 s of audio, played in turn, + the 2 s margin, and nothing reported
    assert rig.playout.actor.timer_deadline == pytest.approx(3.3)
    await rig.advance(3.3)
    assert rig.playout.done[-1].cause == "playout_timeout"
    assert second.done() and rig.session.agent_state == "listening"
    assert sink is not None and not rig.playout.audio_at_avatar
    await rig.aclose()


async def test_a_segment_stacked_behind_another_is_bounded_from_the_others_end() -> None:
    """A reply whose 3 s of audio failed at its end, then a 1 s reply: an avatar that
    plays them in turn reports the second at 4 s. The bound counts the second from the
    first one's end (4 s + the 2 s margin), so neither the SDK's reply nor the avatar is
    cut while it plays."""

    rig = PlayoutRig(reprompt=False)
    await rig.start()
    _, failed = say_failing(rig, 3.0)
    await rig.settle()
    assert the_failure(failed) == TTS_BROKE
    ended = len(rig.playout.done)
    second = rig.say(1.0)
    await rig.settle()
    assert rig.playout.actor.timer_deadline == pytest.approx(6.0)
    await rig.advance(3.0)
    await rig.report(3.0)  # the first, played; the avatar plays the second now
    await rig.settle()
    await rig.advance(0.9)
    assert not second.done() and rig.session.agent_state == "speaking"
    await rig.advance(0.1)
    await rig.report(1.0)
    await rig.settle()
    assert second.done() and rig.session.agent_state == "listening"
    assert [(d.t, d.cause) for d in list(rig.playout.done)[ended:]] == [
        (pytest.approx(4.0), "playback_finished")
    ]
    await rig.aclose()


async def test_a_report_ends_the_wait_when_playout_steps_before_the_avatar_counts_it() -> None:
    """The user's speech comes in the same turn of the loop as the avatar's report, so the
    playout machine has mail before the avatar's step counts the report: the report says
    what it leaves owed, and the wait ends on it."""
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.advance(0.9)
    rig.user("speaking")  # playout's mail, ahead of the report's
    await rig.report(1.0)
    await rig.settle()
    assert [d.cause for d in rig.playout.done] == ["playback_finished"]
    assert rig.playout.state == "idle"
    await rig.aclose()


async def test_without_an_avatar_the_sdks_own_playout_report_ends_the_turn() -> None:
    rig = PlayoutRig(avatar=False, reprompt=False)
    await rig.start()
    # the states the SDK's pipeline goes through for a reply played on the room's track
    rig.session._update_agent_state("thinking")
    rig.session._update_agent_state("speaking")
    await rig.advance(2.0)
    assert rig.playout.state == "agent_turn" and not rig.playout.actor.timer_armed
    rig.session._update_agent_state("listening")
    await rig.settle()
    assert [(d.t, d.cause) for d in rig.playout.done] == [(2.0, "agent_listening")]
    await rig.aclose()


async def test_audio_to_an_avatar_that_has_not_joined_waits_for_the_sdk_not_for_a_report() -> None:
    rig = PlayoutRig(reprompt=False, max_reprompts=0)
    pace_as_published(rig.room, lambda: [rig.session])  # the room's audio on virtual time
    await rig.start(join=False)
    handle = rig.say(1.0)
    await rig.settle()
    # the plugin's sink holds the audio until the avatar is there: nothing is handed off
    assert rig.playout.state == "agent_turn"
    await rig.advance(30.0)  # the avatar's join_timeout: its route goes back to the room
    assert rig.job.avatar is not None and rig.job.avatar.state == "restored"
    # the reply goes on in the room, the frame that waited at the sink first
    assert rig.playout.state == "agent_turn" and not handle.done()
    await rig.advance(1.0)
    assert rig.playout.state == "idle" and handle.done() and not handle.interrupted
    played = [room_output_source(out).captured for out in room_outputs(rig.session)]
    assert played == [pytest.approx(1.0)]
    # the avatar never took a frame: the agent's turn ends as it listens again
    assert [d.cause for d in rig.playout.done] == ["agent_listening"]
    assert rig.rpcs() == []
    await rig.aclose()


# -- the watchdog ----------------------------------------------------------------------------


async def test_the_watchdog_is_timed_from_the_remote_playout_not_the_hand_off() -> None:
    rig = PlayoutRig()
    await rig.start()
    rig.say(3.0)  # handed off at once
    await rig.settle()
    await rig.advance(3.2)
    await rig.report(3.0)
    await rig.settle()
    assert rig.playout.state == "settling"
    await rig.advance(1.0)
    assert rig.playout.state == "watching"
    await rig.advance(4.9)
    assert rig.reprompts == []
    await rig.advance(0.1)
    assert rig.reprompts == [(pytest.approx(9.2), 1)]  # 3.2 + 1 + 5
    await rig.aclose()


async def test_the_user_speaking_disarms_it_and_only_the_agent_can_arm_it_again() -> None:
    rig = PlayoutRig(max_reprompts=2)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.settle()
    await rig.advance(3.0)
    assert rig.playout.state == "watching"
    rig.user("speaking")
    await rig.advance(1.0)
    rig.user("listening")
    await rig.advance(30.0)
    assert rig.playout.state == "idle" and rig.reprompts == []  # the user spoke last
    await rig.aclose()


async def test_a_user_who_is_speaking_when_playout_ends_is_not_re_prompted() -> None:
    rig = PlayoutRig()
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    rig.user("speaking")
    await rig.report()
    await rig.advance(30.0)
    assert rig.playout.state == "idle" and rig.reprompts == []
    await rig.aclose()


async def test_it_never_re_prompts_over_the_agents_own_audio() -> None:
    rig = PlayoutRig()
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(5.9)  # watching, 0.1 s before the re-prompt
    assert rig.playout.state == "watching"
    rig.say(10.0)  # the app speaks by itself
    await rig.advance(5.0)
    assert rig.playout.state == "remote_playout" and rig.reprompts == []
    await rig.aclose()


async def test_re_prompts_are_counted_then_the_session_is_closed_as_asked() -> None:
    rig = PlayoutRig(max_reprompts=2, when_exhausted="close", close_reason="task_completed")
    closed: list[Any] = []
    rig.session.on("close", closed.append)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(6.0)  # 1 + 5
    await rig.advance(6.0)  # the re-prompt said nothing: armed again
    assert [a for _, a in rig.reprompts] == [1, 2]
    await rig.advance(6.0)
    assert [a for _, a in rig.reprompts] == [1, 2]  # never a third
    await rig.settle()
    assert [ev.reason.value for ev in closed] == ["task_completed"]
    assert rig.playout.state == "closed"
    await rig.job.wait_closed()
    await rig.aclose()


@pytest.mark.parametrize("user", ["speaks", "leaves"])
async def test_exhausted_waits_for_the_user_whose_speech_starts_the_count_again(
    user: str,
) -> None:
    """Re-prompts used up, waiting for the user as configured: the user speaking (or
    leaving) ends the wait, and the count starts again."""
    rig = PlayoutRig(max_reprompts=1)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(12.0)
    assert rig.playout.state == "exhausted" and rig.playout.reprompts == 1
    assert rig.session._closing_task is None  # waiting, as configured
    if user == "speaks":
        rig.user("speaking")
    else:
        rig.room.remove_participant(USER, rtc.DisconnectReason.SIGNAL_CLOSE)  # grace
    await rig.settle()
    assert rig.playout.state == "idle" and rig.playout.reprompts == 0
    await rig.aclose()


@pytest.mark.parametrize("answer", ["over_it", "as_it_ends", "leaves_as_it_ends"])
async def test_a_user_who_answers_a_re_prompt_gets_the_count_again(answer: str) -> None:
    """One re-prompt allowed, then close: the user answers the re-prompt by speaking over
    it, or starts answering (or drops out, to come back) in the very instant the avatar
    reports it played; there the end of the turn is taken first (no silent user by then:
    no watchdog), then the user. Either way the next silence gets a re-prompt again, not
    the session closed on them."""
    rig = PlayoutRig(max_reprompts=1, when_exhausted="close")
    closed: list[Any] = []
    rig.session.on("close", closed.append)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(6.0)
    assert [a for _, a in rig.reprompts] == [1]
    rig.say(2.0)  # the re-prompt is spoken
    await rig.settle()
    if answer == "over_it":
        rig.user("speaking")
        await rig.advance(1.0)
        rig.user("listening")
        await rig.report(2.0)
    else:
        await rig.advance(2.0)
        # the avatar's report and the user in one instant, the report taken in first
        report = asyncio.ensure_future(rig.report(2.0))
        if answer == "as_it_ends":
            await asyncio.sleep(0)  # the report is posted; then the user's state changes
            rig.user("speaking")
        else:
            # the link decides the departure before the tracker handles the report
            rig.room.remove_participant(USER, rtc.DisconnectReason.SIGNAL_CLOSE)
        assert await report == "ok"
        await rig.settle()
        event = "user_speaking" if answer == "as_it_ends" else "user_left"
        assert rig.decided(event)[-1] == "idle"  # the cell
        await rig.advance(1.0)
        if answer == "as_it_ends":
            rig.user("listening")
        else:
            rig.room.add_participant(USER)  # back within the grace period
    rig.say(1.0)  # the agent's reply
    await rig.settle()
    await rig.report()
    await rig.advance(6.0)  # the user is silent again
    assert [a for _, a in rig.reprompts] == [1, 1]
    assert closed == [] and rig.playout.state == "settling"
    await rig.aclose()


async def test_the_user_leaving_disarms_it() -> None:
    rig = PlayoutRig()
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(2.0)
    rig.room.remove_participant(USER, rtc.DisconnectReason.SIGNAL_CLOSE)  # grace, no close
    await rig.advance(10.0)
    assert rig.playout.state == "idle" and rig.reprompts == []
    await rig.aclose()


async def test_each_re_prompt_waits_the_safety_window_and_the_silence_again() -> None:
    """The user hears the re-prompts spaced as configured (window + silence), not faster."""
    rig = PlayoutRig(max_reprompts=2)
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()  # at 0: the window (1 s), then 5 s of silence
    for _ in range(14):
        await rig.advance(1.0)
    assert rig.reprompts == [(pytest.approx(6.0), 1), (pytest.approx(12.0), 2)]
    await rig.aclose()


@pytest.mark.parametrize("end", ["avatar_left", "playout_timeout"])
async def test_a_turn_the_avatar_never_reported_still_arms_the_watchdog_from_its_end(
    end: str,
) -> None:
    """The avatar leaves mid-utterance, or never reports within the bound: the silent user
    is re-prompted after the window and the silence, counted from that end."""
    rig = PlayoutRig()
    await rig.start()
    rig.say(3.0)
    await rig.settle()
    if end == "avatar_left":
        await rig.advance(1.0)
        rig.room.remove_participant(AVATAR, rtc.DisconnectReason.SIGNAL_CLOSE)
        await rig.settle()
    else:
        await rig.advance(5.0)  # 3 s of audio + the 2 s margin
    (done,) = rig.playout.done
    assert done.cause == end
    await rig.advance(5.9)
    assert rig.reprompts == []
    await rig.advance(0.2)
    assert rig.reprompts == [(pytest.approx(done.t + 6.0), 1)]
    await rig.aclose()


async def test_with_room_audio_the_watchdog_arms_once_the_sdk_reports_the_playout() -> None:
    """No avatar: the agent's reply plays on the room's track, and the user who stays
    silent after it is re-prompted."""
    rig = PlayoutRig(avatar=False)
    await rig.start()
    for state in ("thinking", "speaking", "listening"):  # the SDK's pipeline, as it goes
        rig.session._update_agent_state(state)  # type: ignore[arg-type]
    await rig.settle()
    await rig.advance(5.9)
    assert rig.reprompts == []
    await rig.advance(0.2)  # the window (1 s) and 5 s of silence after the report
    assert [a for _, a in rig.reprompts] == [1]
    await rig.aclose()


async def test_with_room_audio_a_user_speaking_at_the_end_is_not_re_prompted() -> None:
    """No avatar, and the user is already speaking when the SDK reports the reply played:
    the watchdog stays off (no re-prompt, however long the silence after) until the agent
    replies again; then it arms as usual."""
    rig = PlayoutRig(avatar=False)
    await rig.start()
    for state in ("thinking", "speaking"):
        rig.session._update_agent_state(state)  # type: ignore[arg-type]
    rig.user("speaking")
    rig.session._update_agent_state("listening")
    await rig.settle()
    assert rig.playout.state == "idle"
    rig.user("listening")
    await rig.advance(30.0)
    assert rig.reprompts == []
    for state in ("thinking", "speaking", "listening"):
        rig.session._update_agent_state(state)  # type: ignore[arg-type]
    await rig.settle()
    await rig.advance(6.1)
    assert [a for _, a in rig.reprompts] == [1]
    assert [d.cause for d in rig.playout.done] == ["agent_listening", "agent_listening"]
    await rig.aclose()


async def test_a_reply_queued_while_the_watchdog_arms_holds_the_re_prompt_off() -> None:
    """The app queues a reply right after the last one was heard; its audio is slow to
    come (not one frame out yet). The user is not re-prompted while it is pending."""
    rig = PlayoutRig()
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(0.5)
    assert rig.playout.state == "settling"
    gate = asyncio.Event()
    handle = rig.say(0.01, gate=gate)  # its only frame waits for the gate
    await rig.settle()
    await rig.advance(30.0)
    assert rig.reprompts == [] and rig.playout.state == "agent_turn"
    gate.set()
    await rig.settle()
    await rig.report()
    await rig.settle()
    assert handle.done()
    await rig.aclose()


async def test_the_default_re_prompt_asks_the_llm_with_the_configured_instructions() -> None:
    model = AskedLLM()
    rig = PlayoutRig(
        default_reprompt=True,
        session=AgentSession(llm=model),
        reprompt_instructions="Ask whether they can still hear you.",
    )
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(6.0)
    for _ in range(5):
        await rig.settle()
    assert len(model.asked) == 1
    said = [str(item.content) for item in model.asked[0].items if hasattr(item, "content")]
    assert any("Ask whether they can still hear you." in s for s in said)
    await rig.aclose()


async def test_a_re_prompt_that_raises_is_logged_and_the_watchdog_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = PlayoutRig(max_reprompts=2)
    calls: list[int] = []

    def broken(session: AgentSession[Any], attempt: int) -> None:
        calls.append(attempt)
        raise RuntimeError("the app's re-prompt failed")

    rig.playout._on_reprompt = broken
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    await rig.advance(20.0)
    assert calls == [1, 2] and rig.playout.state == "exhausted"
    failed = [r for r in rig.sink.records if r.kind == "effect" and r.outcome == "error"]
    assert [(r.effect, r.detail) for r in failed] == [
        ("reprompt", "RuntimeError: the app's re-prompt failed")
    ] * 2
    await rig.aclose()


async def test_a_re_prompt_that_raises_is_the_agents_bug_logged_once_at_error_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It was one WARNING, "effect 'reprompt' failed", with the traceback at DEBUG: an
    operator never saw where the agent's code failed, and the testing kit (which hears a
    failure of the agent's code by its traceback) passed the agent."""
    rig = PlayoutRig(max_reprompts=1)

    async def broken(session: AgentSession[Any], attempt: int) -> None:
        raise RuntimeError("the app's re-prompt failed")

    rig.playout._on_reprompt = broken
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    await rig.report()
    with caplog.at_level(logging.DEBUG, logger="agent_runtime"):
        await rig.advance(20.0)
    seen = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("agent_runtime")
    ]
    assert [(r.levelname, r.getMessage().split(": ", 1)[1]) for r in seen] == [
        ("ERROR", "on_reprompt failed: RuntimeError: the app's re-prompt failed")
    ]
    error = seen[0].exc_info[1] if seen[0].exc_info else None
    assert isinstance(error, RuntimeError) and error.__traceback__ is not None
    failed = [r for r in rig.sink.records if r.kind == "effect" and r.outcome == "error"]
    assert [(r.effect, r.detail) for r in failed] == [
        ("reprompt", "RuntimeError: the app's re-prompt failed")
    ]
    await rig.aclose()


# -- composition, options, listeners -------------------------------------------------------------


async def test_the_job_shows_the_machine_in_its_states_snapshot_and_trace() -> None:
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    rig.say(2.0)
    await rig.settle()
    assert rig.job.states["playout"] == "remote_playout"
    snap = rig.job.snapshot()["machines"]["playout"]
    assert snap["timer"] == {"event": "playout_timeout", "deadline": 4.0, "remaining": 4.0}
    assert ("speech_created", "idle", "agent_turn") in [(e, s, d) for _, e, s, d in rig.path()]
    await rig.aclose()


async def test_bad_options_are_refused_naming_them_before_anything_is_built() -> None:
    room = InMemoryRoom()
    with pytest.raises(SettingError, match=r"playout.margin: input should be greater"):
        AgentJob(room=room, session=AgentSession(), playout={"margin": -1})
    with pytest.raises(SettingError, match=r"playout.when_exhausted"):
        AgentJob(room=room, session=AgentSession(), playout={"when_exhausted": "hang up"})
    with pytest.raises(ValueError, match=r"on_reprompt given, but the watchdog is off"):
        AgentJob(room=room, session=AgentSession(), on_reprompt=lambda s, n: None)
    with pytest.raises(TypeError, match="on_reprompt must be callable"):
        AgentJob(room=room, session=AgentSession(), playout=True, on_reprompt="hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session must be an AgentSession"):
        PlayoutTracker(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options=False"):
        PlayoutTracker(AgentSession(), options=False)
    job = AgentJob(room=room, session=AgentSession(), playout=True)
    assert job.playout is not None and job.playout.options.margin == 2.0
    assert not job.playout.options.reprompt  # the watchdog is opt-in
    assert AgentJob(room=room, session=AgentSession()).playout is None  # off by default


# -- the avatar's reports: declared, delivered from the table ---------------------------------


def without(report: str) -> tuple[Report, ...]:
    """``REPORTS`` with ``report`` left out."""
    return tuple(r for r in REPORTS if r.report != report)


@pytest.mark.parametrize(
    ("left_out", "avatar_reports", "done", "agent"),
    [
        ("", False, [(5.0, "playout_timeout")], "listening"),
        ("segment_flushed", False, [], "speaking"),
        ("", True, [(3.0, "playback_finished")], "listening"),
        ("playback_finished", True, [(3.0, "agent_listening")], "listening"),
    ],
    ids=["silent-avatar", "silent-avatar-no-handoff", "reported", "reported-not-declared"],
)
async def test_the_job_connects_playout_to_the_avatars_sink_as_reports_declares(
    monkeypatch: pytest.MonkeyPatch,
    left_out: str,
    avatar_reports: bool,
    done: list[tuple[float, str]],
    agent: str,
) -> None:
    """Who hears the avatar's sink is ``statemachines.system.REPORTS``, and the job connects
    exactly that. Declared, a silent avatar's 3 s reply is bounded from the hand-off the sink
    reports (3 s + the 2 s margin) and the avatar's own report ends the turn. With the
    hand-off left out of the table playout never learns the audio went to the avatar: the
    agent stays speaking as with livekit alone. With the avatar's report left out, playout
    never hears it: the turn ends only on the SDK's own playout report."""
    if left_out:
        monkeypatch.setitem(hear_reports.__kwdefaults__, "reports", without(left_out))
    rig = PlayoutRig(reprompt=False)
    await rig.start()
    handle = rig.say(3.0)
    await rig.settle()
    if avatar_reports:
        await rig.advance(3.0)
        assert await rig.report(3.0) == "ok"
        await rig.settle()
    await rig.advance(60.0)
    assert [(d.t, d.cause) for d in rig.playout.done] == done
    assert rig.session.agent_state == agent and handle.done() == (agent == "listening")
    await rig.aclose()


@pytest.mark.parametrize("left_out", ["", "playback_finished"])
async def test_a_tracker_built_by_hand_hears_its_avatars_reports_from_the_same_table(
    monkeypatch: pytest.MonkeyPatch, left_out: str
) -> None:
    """Alone (no job), the tracker connects its avatar's reports itself, from
    ``REPORTS``: the hand-off starts the wait for the avatar, the avatar's report ends it;
    its close takes the connections back."""
    from tests.support.avatar_rig import AVATAR as RIG_AVATAR
    from tests.support.avatar_rig import Rig, playback_finished

    if left_out:
        monkeypatch.setitem(hear_reports.__kwdefaults__, "reports", without(left_out))
    rig = Rig()
    tracker = PlayoutTracker(rig.session, avatar=rig.lifecycle, clock=rig.clock)
    tracker.start()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await rig.clock.advance(0)
    rig.session.say("...", audio=frames(3.0))
    for _ in range(3):
        await rig.clock.advance(0)
    assert tracker.state == "remote_playout"  # the sink's hand-off, heard
    await rig.clock.advance(3.0)
    payload = playback_finished(3.0)
    assert await rig.room.invoke_rpc("lk.playback_finished", RIG_AVATAR, payload) == "ok"
    for _ in range(3):
        await rig.clock.advance(0)
    cause = "agent_listening" if left_out else "playback_finished"
    assert [d.cause for d in tracker.done] == [cause]
    await tracker.aclose()
    for name in ("segment_flushed", "playback_finished"):
        assert not rig.lifecycle._events.get(name)
    await rig.aclose()


async def test_a_tracker_built_by_hand_hears_its_sessions_close_by_the_path_a_job_takes() -> None:
    """Alone, the tracker listened to its session's ``close`` itself; now, as in a job, a
    session machine hears it (the tracker's own) and its declared link closes the
    playout machine. Its avatar, which it does not own, stays as it was (in a job the
    same link closes it), and ``aclose()`` leaves no listener of the tracker's on the
    session."""
    from tests.support.avatar_rig import Rig

    rig = Rig()
    tracker = PlayoutTracker(
        rig.session, avatar=rig.lifecycle, clock=rig.clock, tracer=Tracer(rig.trace)
    )
    tracker.start()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await rig.clock.advance(0)
    assert (tracker.state, rig.lifecycle.state) == ("idle", "joined")
    assert ours(rig.session) == 1  # its own session machine's
    await rig.session.aclose()
    for _ in range(3):
        await rig.clock.advance(0)
    closes = [
        (r.machine, r.event, r.dest)
        for r in rig.trace.records
        if r.kind == "transition"
        and r.machine in ("session", "playout", "avatar")
        and r.event in ("session_closed", "close")
    ]
    assert closes == [("session", "session_closed", "new"), ("playout", "close", "closed")]
    assert rig.lifecycle.state == "joined"
    await tracker.aclose()
    assert ours(rig.session) == 0
    await rig.aclose()


def ours(session: AgentSession[Any]) -> int:
    """The runtime's listeners on the session's ``close`` (livekit has its own)."""
    return sum(
        type(fn).__module__.startswith("agent_runtime.")
        for fn in lk.listeners(session).get("close", ())
    )


async def test_closing_releases_every_listener_and_task() -> None:
    rig = PlayoutRig()
    before = sum(len(v) for v in rig.session._events.values())
    await rig.start()
    rig.say(1.0)
    await rig.settle()
    tracker = rig.playout
    await tracker.aclose()
    assert tracker.state == "closed" and tracker.actor.closed
    assert not tracker._speeches and tracker.actor.live_tasks == 0
    avatar = rig.job.avatar
    assert avatar is not None
    assert sum(len(v) for v in rig.session._events.values()) >= before  # the job's own
    for name in ("speech_created", "agent_state_changed", "user_state_changed"):
        assert not any(
            getattr(fn, "__self__", None) is tracker for fn in rig.session._events.get(name, ())
        )
    # the avatar's reports are the job's channels (statemachines.system.REPORTS): a closed
    # tracker hears none, and the job's close takes them back
    heard = len([r for r in rig.sink.records if r.machine == "playout"])
    avatar.emit("segment_flushed", SegmentFlushed(rig.clock.now(), 1.0))
    await rig.settle()
    assert len([r for r in rig.sink.records if r.machine == "playout"]) == heard
    await rig.aclose()
    for name in ("segment_flushed", "playback_finished"):
        assert not avatar._events.get(name)


async def test_the_avatars_sink_reports_each_segment_it_was_given() -> None:
    rig = PlayoutRig(reprompt=False)
    segments: list[SegmentFlushed] = []
    assert rig.job.avatar is not None
    rig.job.avatar.on("segment_flushed", segments.append)
    rig.job.avatar.on("segment_flushed", lambda seg: 1 / 0)  # a listener that fails
    await rig.start()
    await rig.advance(1.0)
    rig.say(2.5)
    await rig.settle()
    assert segments == [SegmentFlushed(started_at=1.0, pushed=pytest.approx(2.5))]
    assert rig.playout.state == "remote_playout"  # the failing listener changed nothing
    await rig.aclose()


@pytest.mark.parametrize("reports", [True, False], ids=["reported", "never-reported"])
async def test_audio_the_avatar_took_before_it_joined_is_awaited_from_its_join(
    reports: bool,
) -> None:
    """An avatar whose sink streams before its video is up (its plugin does not wait for
    it): the agent's reply is handed to it while it is still routing. Once it joins, what
    it plays is awaited: its report ends the turn, and without one the bound does (the
    sink's segment finished locally). The agent is never left speaking."""
    plugin = ScriptedAvatar(avatar_identity=AVATAR, wait_remote_track=None)
    rig = PlayoutRig(plugin=plugin, reprompt=False)
    await rig.start(join=False)
    rig.room.add_participant(AVATAR, kind="agent")  # there, its video not up yet
    await rig.settle()
    assert rig.job.avatar is not None and rig.job.avatar.state == "routing"
    rig.say(1.0)
    await rig.settle()
    assert rig.playout.state == "agent_turn" and rig.session.agent_state == "speaking"
    await rig.advance(5.0)  # the avatar's video comes long after the reply was pushed
    rig.room.publish_track(AVATAR, "video")
    await rig.settle()
    assert rig.job.avatar.state == "joined"
    assert rig.playout.state == "remote_playout"
    # it plays from its join: the second of audio pushed, plus the margin, from now
    deadline = rig.playout.actor.timer_deadline
    assert deadline is not None and deadline - rig.clock.now() == pytest.approx(3.0)
    if reports:
        assert await rig.report() == "ok"
        await rig.settle()
        assert [d.cause for d in rig.playout.done] == ["playback_finished"]
    else:
        await rig.advance(10.0)
        assert [d.cause for d in rig.playout.done] == ["playout_timeout"]
    assert rig.session.agent_state == "listening"
    await rig.aclose()


async def test_a_reply_the_sink_took_while_the_plugin_started_is_handed_off_once() -> None:
    """The plugin's start() installs its sink and goes on (its provider still answering)
    while the avatar is already in the room with its video: the sink streams the agent's
    reply before the runtime has adopted it. Once start() returns, the segment it took is
    handed off once, and as the avatar joins it is awaited for what was pushed plus the
    margin (not the margin alone)."""
    plugin = ScriptedAvatar(avatar_identity=AVATAR, held=True)
    rig = PlayoutRig(plugin=plugin, reprompt=False)
    await rig.job.start_runtime()
    starting = asyncio.ensure_future(rig.job.start_avatar())  # returns with the plugin's
    await rig.settle()
    rig.join()
    await rig.job.start_session(Agent(instructions="test"))
    await rig.settle()
    assert plugin.waits == "start"
    plugin.tell("routed")  # the route is in, start() has not returned
    await rig.settle()
    rig.say(1.0)
    await rig.settle()
    assert rig.job.avatar is not None and rig.job.avatar.state == "starting"
    assert rig.playout.state == "agent_turn" and rig.decided("handed_off") == []
    plugin.tell("ok")
    await rig.settle()
    await starting
    assert rig.job.avatar.state == "joined"
    assert rig.decided("handed_off") == ["agent_turn"]  # said once, as it was adopted
    assert rig.playout.state == "remote_playout"
    deadline = rig.playout.actor.timer_deadline
    assert deadline is not None and deadline - rig.clock.now() == pytest.approx(3.0)
    await rig.advance(3.0)
    assert [d.cause for d in rig.playout.done] == ["playout_timeout"]
    assert rig.session.agent_state == "listening"
    await rig.aclose()


# -- every cell, through the runtime --------------------------------------------------------------

REST = ("idle", "settling", "watching", "exhausted")
NEW_TURN = ("speech_created", "agent_thinking", "agent_speaking")
CELLS: dict[tuple[str, str], tuple[str, str]] = {
    **{(s, e): ("ignore", s) for s in PLAYOUT.state_names for e in PLAYOUT.events},
    **{(s, e): ("transition", "agent_turn") for s in REST for e in NEW_TURN},
    **{(s, "handed_off"): ("transition", "remote_playout") for s in ("agent_turn", *REST)},
    **{(s, "close"): ("transition", "closed") for s in PLAYOUT.state_names if s != "closed"},
    **{(s, e): ("transition", "idle") for s in REST[1:] for e in ("user_speaking", "user_left")},
    # the count starts again, nothing else changes (internal)
    **{
        (s, e): ("transition", s)
        for s in ("idle", "agent_turn", "remote_playout")
        for e in ("user_speaking", "user_left")
    },
    ("agent_turn", "agent_listening"): ("transition", "settling"),
    ("agent_turn", "speech_done"): ("transition", "settling"),
    ("agent_turn", "interrupted"): ("transition", "remote_playout"),
    ("remote_playout", "agent_listening"): ("transition", "settling"),
    ("remote_playout", "handed_off"): ("transition", "remote_playout"),
    ("remote_playout", "playback_finished"): ("transition", "settling"),
    ("remote_playout", "interrupted"): ("transition", "remote_playout"),
    ("remote_playout", "avatar_left"): ("transition", "settling"),
    ("agent_turn", "avatar_joined"): ("transition", "agent_turn"),
    ("remote_playout", "playout_timeout"): ("transition", "settling"),
    ("settling", "window_elapsed"): ("transition", "watching"),
    ("watching", "reprompt_timeout"): ("transition", "settling"),
}


@pytest.mark.snapshot  # pins each cell as written
def test_every_cell_of_the_spec_is_in_the_cell_table() -> None:
    assert set(CELLS) == {(s, e) for s in PLAYOUT.state_names for e in PLAYOUT.events}
    for (s, e), (outcome, _) in CELLS.items():
        assert PLAYOUT.cell_kind(s, e) == outcome, (s, e)


async def _reach(rig: PlayoutRig, state: str) -> asyncio.Event:
    """Drive the job into ``state`` as the world would; returns the gate of a speech still
    being produced (``agent_turn``)."""
    gate = asyncio.Event()
    await rig.start()
    if state == "agent_turn":
        rig.say(1.0, gate=gate)
    elif state != "idle" and state != "closed":
        rig.say(1.0)
        await rig.settle()
        if state != "remote_playout":
            await rig.report()
            await rig.settle()
            await rig.advance({"settling": 0.0, "watching": 1.0, "exhausted": 12.0}[state])
    elif state == "closed":
        rig.playout.actor.post(
            Event("close", {"reason": "setup"})
        )  # what the session's close posts
    await rig.settle()
    return gate


def _agent_state(rig: PlayoutRig, state: str) -> bool:
    if rig.session.agent_state == state:
        return False  # the SDK says a state once: it was said already
    rig.session._update_agent_state(state)  # type: ignore[arg-type]
    return True


async def _cause(rig: PlayoutRig, gate: asyncio.Event, state: str, event: str) -> None:
    """Make ``event`` happen as the world would; where nothing in the world produces it in
    this state, post it as a late one."""
    in_turn = state in ("agent_turn", "remote_playout")
    live = state != "closed"
    timeout = PLAYOUT.state(state).timeout
    caused = False
    if not live:
        pass
    elif event == "speech_created":
        rig.say(1.0)
        caused = True
    elif event in ("agent_thinking", "agent_speaking", "agent_listening"):
        caused = _agent_state(rig, event.removeprefix("agent_"))
    elif event == "handed_off" and state == "agent_turn":
        gate.set()
        caused = True
    elif event == "playback_finished":
        caused = await rig.report() == "ok"
    elif event == "interrupted" and in_turn:
        rig.session.interrupt()
        caused = True
    elif event == "avatar_left":
        rig.room.remove_participant(AVATAR, rtc.DisconnectReason.SIGNAL_CLOSE)
        caused = True
    elif event == "user_speaking":
        rig.user("speaking")
        caused = True
    elif event == "user_left":
        rig.room.remove_participant(USER, rtc.DisconnectReason.SIGNAL_CLOSE)
        caused = True
    elif timeout is not None and event == timeout.event:
        deadline = rig.playout.actor.timer_deadline
        assert deadline is not None
        await rig.clock.run_until(deadline)
        caused = True
    elif event == "close":
        # the session's close event, as its close emits it (the close itself would end the
        # speech first; the whole close is in test_re_prompts_are_counted_...)
        rig.session.emit("close", CloseEvent(reason=CloseReason.USER_INITIATED))
        caused = True
    if not caused:
        rig.playout.actor.post(Event(event, {"late": True}))
    await rig.settle()


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize(("state", "event"), list(CELLS), ids=[f"{s}-{e}" for s, e in CELLS])
async def test_cell(state: str, event: str) -> None:
    outcome, dest = CELLS[(state, event)]
    rig = PlayoutRig(max_reprompts=1)
    gate = await _reach(rig, state)
    assert rig.playout.state == state
    mark = len(rig.sink.records)

    await _cause(rig, gate, state, event)

    recs = [
        r
        for r in rig.sink.records[mark:]
        if r.machine == "playout" and r.event == event and r.kind in ("transition", "ignore")
    ]
    assert recs, f"the playout machine never saw {event}"
    assert (recs[0].kind, recs[0].source, recs[0].dest) == (outcome, state, dest)
    # in every cell: nothing went to the avatar but the plugin's own clear, and only with
    # the avatar joined and audio playing
    assert set(rig.rpcs()) <= {"lk.clear_buffer"}
    if "lk.clear_buffer" in rig.rpcs():
        await rig.report(interrupted=True)  # the avatar confirms the cut (the sink waits)
    gate.set()
    await rig.aclose()
    assert rig.playout.actor.closed and rig.playout.actor.live_tasks == 0


def test_the_glue_names_only_events_the_machine_declares() -> None:
    from typing import get_args

    from livekit.agents.voice.events import AgentState

    from statemachines.glue import agent_state_event, avatar_change_event, link_change_event
    from statemachines.machines import MACHINES

    mapped = {s: agent_state_event(s) for s in get_args(AgentState)}
    assert mapped == {
        "initializing": None,
        "idle": "agent_listening",
        "listening": "agent_listening",
        "thinking": "agent_thinking",
        "speaking": "agent_speaking",
    }
    # the session's start ends no turn (a greeting in on_enter is queued before it)
    assert agent_state_event("listening", "initializing") is None
    assert agent_state_event("speaking", "initializing") == "agent_speaking"
    assert agent_state_event("listening", "speaking") == "agent_listening"
    avatar = MACHINES["avatar"].state_names
    joined = ("joined", "clearing")
    left = {(a, b) for a in avatar for b in avatar if avatar_change_event(a, b) == "avatar_left"}
    assert left == {(a, b) for a in joined for b in avatar if b not in joined}
    came = {(a, b) for a in avatar for b in avatar if avatar_change_event(a, b) == "avatar_joined"}
    assert came == {(a, b) for a in avatar for b in joined if a not in joined}
    link = MACHINES["participant"].state_names
    assert {(a, b) for a in link for b in link if link_change_event(a, b)} == {
        ("linked", b) for b in link if b != "linked"
    }
    named = {
        e for e in (*mapped.values(), "avatar_left", "avatar_joined", "user_left") if e is not None
    }
    assert named <= set(PLAYOUT.events)


async def test_an_avatar_leaving_before_the_session_starts_leaves_playout_following_it() -> None:
    """The avatar joins and drops while the job's parts start one by one, before the
    session's: its watch reaches playout first, and the session's turns are still tracked."""
    rig = PlayoutRig(reprompt=False)
    await rig.job.start_runtime()
    await rig.job.start_avatar()
    rig.join()
    await rig.settle()
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await rig.settle()
    await rig.job.start_session(Agent(instructions="test"))
    await rig.settle()
    assert rig.job.avatar is not None and rig.job.avatar.state != "joined"
    for state in ("thinking", "speaking", "listening"):  # the SDK's pipeline, on room audio
        rig.session._update_agent_state(state)  # type: ignore[arg-type]
    await rig.settle()
    assert [d.cause for d in rig.playout.done] == ["agent_listening"]
    await rig.aclose()


async def test_a_tracker_refused_at_construction_leaves_its_avatars_reports_unheard() -> None:
    """Bad input changes nothing: a tracker built alone and refused (a tracer of the wrong
    kind) has not connected itself to its avatar, whose reports would otherwise reach a
    tracker that was never built."""
    from tests.support.avatar_rig import Rig

    rig = Rig()
    with pytest.raises(SettingTypeError, match="tracer must be an agent_runtime Tracer"):
        PlayoutTracker(rig.session, avatar=rig.lifecycle, clock=rig.clock, tracer="x")  # type: ignore[arg-type]
    for name in ("segment_flushed", "playback_finished"):
        assert not rig.lifecycle._events.get(name)
    await rig.aclose()
