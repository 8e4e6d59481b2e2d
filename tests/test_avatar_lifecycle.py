"""AvatarLifecycle with real SDK classes: the agent ends audible in every ordering.

Real ``AgentSession`` (started on the in-memory room, RoomIO and all), the real
``DataStreamAudioOutput`` installed by a plugin-style ``start()``, real ``rtc.RpcError``s,
virtual time. Only the network is faked (see ``test_avatar_rig``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from livekit import rtc
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.agents.voice.room_io._output import _ParticipantAudioOutput

from agent_runtime.actor import ActorClosed, Event
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes.avatar import AvatarLifecycle, audio_tail, route_of
from agent_runtime.runtimes.room_events import RoomEventAdapter
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import settle
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from tests.support.avatar_rig import (
    AVATAR,
    USER,
    OtherSink,
    Rig,
    StuckAvatar,
    frames,
    playback_finished,
    route_names,
    session_listeners,
)

SYNCED_TO_AVATAR = ["_SyncedAudioOutput", "_AudioSinkProxy", "DataStreamAudioOutput"]
SYNCED_TO_ROOM = ["_SyncedAudioOutput", "_AudioSinkProxy", "_ParticipantAudioOutput"]


# -- the avatar never joins ----------------------------------------------------------------


async def test_never_joins_avatar_started_before_session_ends_on_room_audio() -> None:
    rig = Rig()
    await rig.start_avatar()
    assert rig.lifecycle.state == "routing"
    assert route_names(rig.session) == ["DataStreamAudioOutput"]
    await rig.start_session()
    # session.start() saw the avatar route and turned RoomIO's own audio output off
    assert route_names(rig.session) == SYNCED_TO_AVATAR
    assert rig.lifecycle.audio_route() == "avatar"

    await rig.clock.advance(29.9)
    assert rig.lifecycle.state == "routing"
    await rig.clock.advance(0.1)
    assert rig.lifecycle.state == "restored"
    assert rig.lifecycle.audio_route() == "room"
    assert route_names(rig.session) == SYNCED_TO_ROOM
    # the attached room output published the agent's track, as RoomIO's would
    assert rig.room.local_participant.track_publications
    assert rig.transitions() == [
        (0.0, "start", "idle", "starting"),
        (0.0, "plugin_started", "starting", "routing"),
        (30.0, "join_timeout", "routing", "failed"),
        # given up (no retry, no rejoin): the attempt closed, its avatar removal asked
        (30.0, "route_restored", "failed", "retiring"),
        (30.0, "released", "retiring", "restored"),
    ]
    assert rig.avatar.installed is not None and rig.removed == [AVATAR]
    await rig.aclose()


async def test_never_joins_session_started_first_gets_roomio_output_back() -> None:
    rig = Rig(join_timeout=5.0)
    await rig.start_session()
    roomio_output = audio_tail(rig.session)
    assert isinstance(roomio_output, _ParticipantAudioOutput)
    await rig.start_avatar()
    assert rig.lifecycle.audio_route() == "avatar"
    await rig.clock.advance(5)
    assert rig.lifecycle.state == "restored"
    assert audio_tail(rig.session) is roomio_output  # the very output RoomIO made
    assert rig.lifecycle.audio_route() == "room"
    await rig.aclose()


async def test_failure_before_session_start_leaves_room_audio_to_session_start() -> None:
    rig = Rig(join_timeout=5.0)
    await rig.start_avatar()
    await rig.clock.advance(5)
    assert rig.lifecycle.state == "restored"
    assert rig.session.output.audio is None  # the stale route is gone ...
    await rig.start_session()
    assert rig.lifecycle.audio_route() == "room"  # ... so RoomIO set up room audio
    assert route_names(rig.session) == SYNCED_TO_ROOM
    await rig.aclose()


async def test_failure_while_the_session_starts_ends_on_room_audio_once_it_started() -> None:
    # session.start() saw the avatar's route and turned RoomIO's audio output off, then
    # waits for the agent's tools (an MCP server connecting); the avatar fails meanwhile
    rig = Rig(join_timeout=2.0)
    await rig.start_avatar()
    session_started = await rig.start_session_aside(tools_setup=3.0)
    assert route_names(rig.session) == SYNCED_TO_AVATAR
    await rig.clock.advance(2)
    assert rig.lifecycle.state == "restored"
    assert not session_started.done()  # still starting
    await rig.clock.advance(1)
    assert session_started.done() and session_started.exception() is None
    assert rig.lifecycle.audio_route() == "room"
    assert route_names(rig.session) == SYNCED_TO_ROOM
    # the agent's one audio track is in the room
    assert len(rig.room.local_participant.track_publications) == 1
    await rig.aclose()


@pytest.mark.parametrize("tools_setup", [0.5, 4.0])
async def test_a_session_start_begun_while_the_plugin_starts_gets_roomio_output_back(
    tools_setup: float,
) -> None:
    # the session starts after the lifecycle took the route the plugin would replace (none
    # then) and before the plugin installed its own over RoomIO's; the avatar fails after
    # the session started (0.5 s) or while it still waits for its tools (4 s)
    rig = Rig()
    rig.avatar = ScriptedAvatar(avatar_identity=AVATAR, start_delay=1.0, clock=rig.clock)
    rig.lifecycle = AvatarLifecycle(
        rig.avatar,
        join_timeout=2.0,
        clock=rig.clock,
        tracer=Tracer(rig.trace),
        remove_participant=rig._remove,
    )
    await rig.start_avatar_aside()
    session_started = await rig.start_session_aside(tools_setup=tools_setup)
    roomio_output = audio_tail(rig.session)  # no route was in: RoomIO made its own
    assert isinstance(roomio_output, _ParticipantAudioOutput)
    await rig.clock.advance(1)
    assert rig.lifecycle.audio_route() == "avatar"  # the plugin's route replaced it
    await rig.clock.advance(2)
    assert rig.lifecycle.state == "restored"
    assert session_started.done() == (tools_setup < 3)
    await rig.clock.advance(2)
    assert session_started.done() and session_started.exception() is None
    assert audio_tail(rig.session) is roomio_output  # the very output RoomIO made
    assert rig.lifecycle.audio_route() == "room"
    assert route_names(rig.session) == SYNCED_TO_ROOM
    assert len(rig.room.local_participant.track_publications) == 1  # no second track
    await rig.aclose()


@pytest.mark.parametrize("after_route", [False, True])
async def test_start_error_ends_on_room_audio(after_route: bool) -> None:
    avatar = ScriptedAvatar(avatar_identity=AVATAR, start_error="no capacity")
    avatar.error_after_route = after_route
    rig = Rig(avatar=avatar)
    await rig.start_session()
    await rig.start_avatar()  # the plugin's error is an outcome, not raised
    assert rig.lifecycle.state == "restored"
    assert rig.lifecycle.audio_route() == "room"
    errors = [r for r in rig.trace.records if r.kind == "effect" and r.outcome == "error"]
    assert [(r.effect, "no capacity" in r.detail) for r in errors] == [("start_plugin", True)]
    await rig.aclose()


# -- the avatar joins, then leaves ---------------------------------------------------------


@pytest.mark.parametrize("video_first", [False, True])
async def test_join_needs_participant_and_video_in_either_order(video_first: bool) -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    changes = rig.watch()
    if video_first:
        # a participant already in the room when the avatar is awaited, video later
        rig.room.add_participant(AVATAR, kind="agent")
        await settle()
        assert rig.lifecycle.state == "routing"
        rig.room.publish_track(AVATAR, "video")
    else:
        rig.room.add_participant(AVATAR, kind="agent")
        rig.room.publish_track(AVATAR, "audio")  # audio alone is not a join
        await settle()
        assert rig.lifecycle.state == "routing"
        rig.room.publish_track(AVATAR, "video")
    await settle()
    assert rig.lifecycle.state == "joined"
    assert rig.lifecycle.audio_route() == "avatar"
    assert changes == [("routing", "joined", "video_published")]  # the participant moved nothing
    await rig.clock.advance(60)  # the join timer died with routing
    assert rig.lifecycle.state == "joined"
    await rig.aclose()


async def test_joins_then_drops_restores_on_that_same_event() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    await rig.clock.advance(1)
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    await rig.clock.advance(9)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.SIGNAL_CLOSE)
    await settle()
    assert rig.lifecycle.state == "restored"
    assert rig.lifecycle.audio_route() == "room"
    assert rig.transitions()[-4:] == [
        # both facts arrived before the mailbox ran: the guard reads the room as it is
        (1.0, "avatar_connected", "routing", "joined"),
        (10.0, "avatar_left", "joined", "failed"),
        (10.0, "route_restored", "failed", "retiring"),
        (10.0, "released", "retiring", "restored"),
    ]
    assert rig.clock.pending == 0  # no timer was involved
    await rig.aclose()


async def test_someone_elses_later_route_is_left_alone() -> None:
    rig = Rig(join_timeout=5.0)
    await rig.start_session()
    await rig.start_avatar()
    other = OtherSink()
    rig.session.output.replace_audio_tail(other)
    await rig.clock.advance(5)
    assert rig.lifecycle.state == "restored"
    assert audio_tail(rig.session) is other
    restored = [r for r in rig.trace.records if r.event == "route_restored"]
    assert restored[0].data["outcome"] == "left_alone"
    await rig.lifecycle.aclose()
    assert audio_tail(rig.session) is other  # close leaves it alone too
    await rig.session.aclose()


# -- interruption --------------------------------------------------------------------------


async def test_interrupt_while_routing_clears_locally_and_sends_nothing() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    # the real path: the session's speech reaches the avatar's sink, which waits for an
    # avatar that is not there; the interruption clears it through the machine
    handle = rig.session.say("hello", audio=frames(), add_to_chat_ctx=False)
    await settle()
    assert not handle.done()
    changes = rig.watch()
    rig.session.interrupt()
    rig.lifecycle.interrupt()
    await settle()
    assert handle.done()  # no 5 s "speech not done in time" fallback
    assert changes == [] and rig.lifecycle.state == "routing"
    assert rig.rpcs() == []
    cleared = [r.effect for r in rig.trace.records if r.kind == "effect" and r.event == "interrupt"]
    assert cleared and set(cleared) == {"clear_local_buffer"}
    assert "clearing" not in {r.dest for r in rig.trace.records}
    await rig.aclose()


async def test_interrupt_after_avatar_left_sends_nothing_and_does_not_stall() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    streams = rig.room.local_participant.streams
    assert streams and streams[0].destination == [AVATAR]  # audio is going to the avatar
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert rig.lifecycle.state == "restored"
    changes = rig.watch()
    rig.lifecycle.interrupt()
    rig.session.interrupt()
    await settle()
    assert handle.done()
    assert rig.rpcs() == [] and changes == []
    await rig.aclose()


@pytest.mark.parametrize(
    ("result", "ends_at"),
    [
        ("ok", 0.5),  # the avatar says where it stopped: the plugin's clear is over then
        ("timeout", 7.0),  # the SDK's own round-trip bound; the plugin finishes the segment
        ("error", None),  # the plugin logs it and finishes the segment at once
        ("disconnected", None),  # the same; the room says whether the avatar left
    ],
)
async def test_interrupt_while_joined_is_the_plugins_own_clear(
    result: str, ends_at: float | None, caplog: pytest.LogCaptureFixture
) -> None:
    """While joined, the session's interruption is the sink's own ``clear_buffer()``, run at
    once and unchanged (its RPC, its hold on later audio, its fallback); ``clearing`` lasts
    exactly as long as the plugin's clear holds the sink."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert isinstance(sink, DataStreamAudioOutput) and sink._pending_playback_count == 1
    rig.room.local_participant.rpc_script["lk.clear_buffer"].append(result)
    with caplog.at_level(logging.DEBUG, logger="agent_runtime"):
        rig.session.interrupt()  # the session clears twice; the plugin sends one RPC
        await settle()
        hold = sink._clear_buffer_atask  # the sink's own hold on later audio
        assert hold is not None
        if ends_at is not None:
            assert rig.lifecycle.state == "clearing"
            assert not handle.done()
        if result == "ok":
            await rig.clock.advance(0.5)
            reply = await rig.room.invoke_rpc(
                "lk.playback_finished", AVATAR, playback_finished(0.2, interrupted=True)
            )
            assert reply == "ok"
        await rig.clock.advance(10)
    assert hold.done() and not hold.cancelled()
    assert handle.done()
    assert sink._pending_playback_count == 0
    calls = rig.rpcs()
    assert [(c.destination, c.payload, c.t) for c in calls] == [(AVATAR, "", 0.0)]
    assert rig.lifecycle.state == "joined"
    assert rig.lifecycle.audio_route() == "avatar"
    done = [r.t for r in rig.trace.records if r.event == "clear_buffer_done" and r.dest]
    if ends_at is not None:
        assert done == [ends_at]
    # expected outcomes: nothing above INFO from the runtime
    assert not [
        r for r in caplog.records if r.name.startswith("agent_runtime") and r.levelno > logging.INFO
    ]
    await rig.aclose()


async def test_interrupt_while_joined_with_nothing_playing_sends_nothing() -> None:
    # the plugin's own clear has nothing to clear, as without the lifecycle
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    changes = rig.watch()
    rig.lifecycle.interrupt()
    await settle()
    assert rig.rpcs() == [] and changes == []
    assert rig.lifecycle.state == "joined"
    interrupts = [(r.kind, r.source, r.dest) for r in rig.trace.records if r.event == "interrupt"]
    assert interrupts == [("transition", "joined", "joined")]  # delivered, nothing held
    await rig.aclose()


async def test_a_sink_set_not_to_hold_is_never_held_by_the_lifecycle() -> None:
    """A plugin that sets its output not to hold the next reply after an interruption
    (``clear_buffer_timeout=None``, as lemonslice does) keeps that: the clear goes out and
    nothing waits for it."""
    rig = Rig(avatar=ScriptedAvatar(avatar_identity=AVATAR, clear_buffer_timeout=None))
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert isinstance(sink, DataStreamAudioOutput)
    rig.session.interrupt()
    await settle()
    assert sink._clear_buffer_atask is None  # nothing holds the next reply
    assert [c.method for c in rig.rpcs()] == ["lk.clear_buffer"]
    assert "clearing" not in {r.dest for r in rig.trace.records}
    assert rig.lifecycle.state == "joined"
    await rig.aclose()


@pytest.mark.parametrize("ending", ["avatar_left", "close"])
async def test_leaving_clearing_early_releases_the_speech_and_the_hold(ending: str) -> None:
    """The avatar leaving (or the lifecycle closing) while the plugin's clear holds its sink:
    the route goes back at once, the interrupted speech ends at once (no 5 s stall), and the
    sink, which carries nothing any more, holds nothing."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = await rig.hold_clear()
    sink = rig.lifecycle.installed_sink
    assert isinstance(sink, DataStreamAudioOutput)
    assert rig.lifecycle.state == "clearing"
    hold = sink._clear_buffer_atask
    assert hold is not None and not hold.done()
    await rig.clock.advance(1)
    changes = rig.watch()
    if ending == "avatar_left":
        rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    else:
        await rig.lifecycle.aclose()
    await settle()
    assert handle.done()
    assert hold.done()
    assert sink._pending_playback_count == 0
    assert rig.lifecycle.state == {"avatar_left": "restored", "close": "closed"}[ending]
    assert (
        changes
        == {
            "avatar_left": [("clearing", "failed", "avatar_left"), *_restored],
            "close": [("clearing", "closed", "close")],
        }[ending]
    )
    assert rig.lifecycle.audio_route() == "room"
    assert rig.lifecycle.actor.live_tasks == 0
    await rig.aclose()


# -- lk.playback_finished ------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        "not json",
        "[]",
        '{"interrupted": false}',
        '{"playback_position": "1", "interrupted": false}',
        '{"playback_position": true, "interrupted": false}',
        '{"playback_position": -1, "interrupted": false}',
        '{"playback_position": 1.0}',
        '{"playback_position": 1.0, "interrupted": "no"}',
    ],
)
async def test_malformed_playback_finished_is_an_error_reply_and_changes_nothing(
    payload: str,
) -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(5), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert sink is not None
    before = (sink._pending_playback_count, len(rig.trace.records))
    with pytest.raises(rtc.RpcError) as err:
        await rig.room.invoke_rpc("lk.playback_finished", AVATAR, payload)
    assert err.value.code == rtc.RpcError.ErrorCode.APPLICATION_ERROR
    assert "malformed" in err.value.message
    await settle()
    assert (sink._pending_playback_count, len(rig.trace.records)) == before
    assert not handle.done()
    await rig.aclose()


async def test_playback_finished_from_anyone_but_the_avatar_is_refused() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    rig.session.say("hello", audio=frames(5), add_to_chat_ctx=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert sink is not None and sink._pending_playback_count == 1
    with pytest.raises(rtc.RpcError, match="only from the avatar"):
        await rig.room.invoke_rpc("lk.playback_finished", USER, playback_finished())
    await settle()
    assert sink._pending_playback_count == 1
    assert await rig.room.invoke_rpc("lk.playback_finished", AVATAR, playback_finished()) == "ok"
    await settle()
    assert sink._pending_playback_count == 0
    await rig.aclose()


async def test_our_playback_handler_stays_registered_over_the_sinks_own() -> None:
    rig = Rig(connected=False)
    await rig.start_session()
    await rig.start_avatar()
    handlers = rig.room.local_participant.rpc_handlers
    assert "lk.playback_finished" not in handlers  # no local participant before connecting
    rig.room.connect_locally()  # the sink would register its own handler now
    await settle()
    assert handlers["lk.playback_finished"] == rig.lifecycle._on_playback_finished_rpc
    await rig.aclose()
    assert "lk.playback_finished" not in handlers


# -- start before the room connects --------------------------------------------------------


@contextlib.contextmanager
def sdk_fills_in_silently(room: rtc.Room) -> Iterator[None]:
    """On connect the SDK lists who is already there without participant_connected."""
    room.emit = lambda *_: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del room.emit


async def test_start_before_room_connects_detects_an_avatar_present_at_connect() -> None:
    rig = Rig(connected=False)
    await rig.start_avatar()
    assert rig.lifecycle.state == "routing"
    # upstream's wait_for_join() returns at once here, as if the avatar had joined
    await rig.avatar.wait_for_join(timeout=1.0)
    with sdk_fills_in_silently(rig.room):
        rig.join()
    await settle()
    assert rig.lifecycle.state == "routing"
    rig.room.connect_locally()  # RoomConnected -> check presence
    await settle()
    assert rig.lifecycle.state == "joined"
    # routing's first look (on entry) saw nobody; the look on connect found the avatar
    presence = [r.event for r in rig.trace.records if r.effect == "check_presence"]
    assert presence == ["plugin_started", "room_connected"]
    await rig.aclose()


async def test_start_before_room_connects_detects_the_join_after() -> None:
    rig = Rig(connected=False)
    await rig.start_avatar()
    await rig.start_session()
    await rig.clock.advance(3)
    rig.room.connect_locally()
    await settle()
    assert rig.lifecycle.state == "routing"
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    assert rig.lifecycle.audio_route() == "avatar"
    await rig.aclose()


# -- closing -------------------------------------------------------------------------------


async def _drive_to(rig: Rig, state: str) -> None:
    if state == "idle":
        return
    if state == "starting":
        await rig.start_avatar_aside()  # a plugin whose start() never returns
        assert rig.lifecycle.audio_route() == "avatar"  # its route is in already
    else:
        await rig.start_avatar()
    if state in ("joined", "clearing"):
        rig.join()
        await settle()
    if state == "clearing":
        await rig.hold_clear()
    elif state == "restored":
        await rig.clock.advance(30)
    assert rig.lifecycle.state == state


@pytest.mark.parametrize("state", ["idle", "starting", "routing", "joined", "clearing", "restored"])
async def test_close_from_every_state_restores_and_unhooks_everything(state: str) -> None:
    rig = Rig(avatar=StuckAvatar(route_first=True) if state == "starting" else None)
    await rig.start_session()
    room_before, session_before = rig.room.listener_count(), session_listeners(rig.session)
    handlers_before = dict(rig.room.local_participant.rpc_handlers)
    await _drive_to(rig, state)
    await rig.lifecycle.aclose()
    await settle()
    assert rig.lifecycle.state == "closed"
    assert route_of(rig.session) == "room"
    assert rig.room.listener_count() == room_before
    assert session_listeners(rig.session) == session_before
    assert rig.room.local_participant.rpc_handlers == handlers_before
    assert rig.lifecycle.actor.live_tasks == 0
    assert rig.clock.pending == 0
    sink = rig.lifecycle.installed_sink
    if sink is not None:
        assert "clear_buffer" not in vars(sink)  # the sink is the SDK's own again
        assert isinstance(sink, DataStreamAudioOutput)
        assert sink._start_atask is None or sink._start_atask.done()
    # removal is tried once started (restored: by the retirement on the way there, then by
    # the close, which asks whoever may have joined since); "not found" (starting,
    # routing, restored) is fine
    assert rig.removed == {"idle": [], "restored": [AVATAR, AVATAR]}.get(state, [AVATAR])
    assert AVATAR not in rig.room.remote_participants
    await rig.lifecycle.aclose()  # idempotent
    await rig.session.aclose()


async def test_close_during_routing_stops_the_join_timer() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    await rig.clock.advance(5)
    await rig.lifecycle.aclose()
    assert rig.lifecycle.state == "closed"
    assert rig.lifecycle.audio_route() == "room"
    await rig.clock.advance(60)
    assert not [r for r in rig.trace.records if r.event == "join_timeout"]
    await rig.session.aclose()


async def test_a_second_close_returns_once_the_first_one_is_done() -> None:
    """Two parts of an app closing the avatar at once (the job's teardown and the user's
    own code): neither returns while the avatar is still in the room."""
    rig = Rig()
    removal = asyncio.Event()

    async def slow_removal(identity: str) -> None:
        await removal.wait()  # the server API answers when the test lets it
        rig.removed.append(identity)

    rig.lifecycle = AvatarLifecycle(rig.avatar, clock=rig.clock, remove_participant=slow_removal)
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    first = asyncio.ensure_future(rig.lifecycle.aclose())
    await settle()
    second = asyncio.ensure_future(rig.lifecycle.aclose())
    await settle()
    assert rig.lifecycle.state == "closed" and rig.removed == []
    assert not first.done() and not second.done()  # both wait for the removal
    with pytest.raises(RuntimeError, match="closed"):
        await rig.lifecycle.start(rig.session, rig.room)  # refused while it closes
    removal.set()
    await asyncio.gather(first, second)
    assert rig.removed == [AVATAR] and rig.lifecycle.actor.closed
    await rig.lifecycle.aclose()  # and a third, after: at once
    await rig.session.aclose()


async def test_a_start_behind_a_queued_close_is_refused_and_follows_nothing() -> None:
    """The job's link closes the avatar as its session closes: that close is queued for
    the scheduler's next run, and a ``start()`` called in between (the user's code, in the
    same turn of the loop) goes behind it. The table's ``(closed, start)`` refuses it, and
    so does ``start()``, with the same error as on a closed avatar; nothing it set up is
    left following the room."""
    rig = Rig()
    await rig.start_session()
    rig.lifecycle.post_linked(Event("close"))  # what the session's close link posts
    assert rig.lifecycle.state == "idle"  # queued, not yet stepped
    with pytest.raises(RuntimeError, match="this AvatarLifecycle is closed"):
        # awaited at once: start() runs up to its send in this same turn
        await rig.lifecycle.start(rig.session, rig.room)
    assert rig.lifecycle.state == "closed"
    assert [r.kind for r in rig.trace.records if r.event == "start"] == ["reject"]
    assert rig.avatar.start_calls == 0  # the plugin never started
    rig.join()  # the avatar's participant turning up reaches no machine any more
    await settle()
    assert not [r for r in rig.trace.records if r.event == "avatar_connected"]
    await rig.lifecycle.aclose()
    await rig.session.aclose()


async def test_close_leaves_a_playback_handler_registered_after_ours() -> None:
    """Our ``lk.playback_finished`` handler is let go on close only while it is the one
    registered: a handler the app registered after ours stays."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    handlers = rig.room.local_participant.rpc_handlers

    def apps_own(data: rtc.RpcInvocationData) -> str:
        return "app"

    assert handlers["lk.playback_finished"] == rig.lifecycle._on_playback_finished_rpc
    rig.room.local_participant.register_rpc_method("lk.playback_finished", apps_own)
    await rig.aclose()
    assert handlers["lk.playback_finished"] is apps_own


async def test_close_while_the_plugin_is_still_starting() -> None:
    rig = Rig()
    rig.avatar = ScriptedAvatar(avatar_identity=AVATAR, start_delay=20.0, clock=rig.clock)
    rig.lifecycle = AvatarLifecycle(rig.avatar, clock=rig.clock, tracer=Tracer(rig.trace))
    await rig.start_session()
    before = audio_tail(rig.session)
    start = asyncio.ensure_future(rig.lifecycle.start(rig.session, rig.room))
    await rig.clock.advance(1)
    assert rig.lifecycle.state == "starting"
    await rig.lifecycle.aclose()  # does not wait for the provider
    assert rig.lifecycle.state == "closed"
    assert audio_tail(rig.session) is before
    await settle()
    assert start.done() and start.exception() is None  # start() ends, raising nothing
    assert rig.avatar.installed is None  # cancelled: the plugin never got to its route
    await rig.clock.advance(60)  # neither the start's bound nor the provider's call is left
    assert rig.avatar.installed is None
    assert [r.event for r in rig.trace.records if r.kind == "stale" or r.kind == "ignore"] == []
    assert rig.clock.pending == 0
    await rig.session.aclose()


@pytest.mark.parametrize("session_first", [True, False])
async def test_close_during_starting_cancels_the_start_at_once_and_restores_its_route(
    session_first: bool,
) -> None:
    avatar = StuckAvatar(route_first=True)
    rig = Rig(avatar=avatar)
    if session_first:
        await rig.start_session()
    before = audio_tail(rig.session)
    start = await rig.start_avatar_aside()
    await rig.clock.advance(1)
    assert rig.lifecycle.state == "starting"
    assert isinstance(audio_tail(rig.session), DataStreamAudioOutput)  # the plugin's route
    assert rig.lifecycle.installed_sink is None  # its start() has not returned
    await rig.lifecycle.aclose()
    # at once: no time passed, the start was cancelled, the route it installed is gone
    assert rig.clock.now() == 1.0
    assert avatar.cancelled
    assert rig.lifecycle.state == "closed"
    assert audio_tail(rig.session) is before
    assert isinstance(rig.lifecycle.installed_sink, DataStreamAudioOutput)
    closing = [r for r in rig.trace.records if r.kind == "transition" and r.event == "close"]
    assert [(r.source, r.dest, r.effects) for r in closing] == [
        ("starting", "closed", ["record_route", "put_route_back", "unhook", "close_plugin"])
    ]
    await settle()
    assert start.done() and start.exception() is None
    if not session_first:
        await rig.start_session()  # with no route left in place, RoomIO sets up room audio
    assert rig.lifecycle.audio_route() == "room"
    await rig.session.aclose()


@pytest.mark.parametrize("route_first", [False, True])
async def test_a_start_that_never_returns_is_cut_at_join_timeout(route_first: bool) -> None:
    avatar = StuckAvatar(route_first=route_first)
    rig = Rig(avatar=avatar, join_timeout=5.0)
    await rig.start_session()
    start = await rig.start_avatar_aside()
    await rig.clock.advance(4.9)
    assert rig.lifecycle.state == "starting" and not start.done()
    await rig.clock.advance(0.1)
    await settle()
    assert avatar.cancelled
    assert start.done() and start.exception() is None  # an outcome, not an error
    assert rig.lifecycle.state == "restored"
    assert rig.lifecycle.audio_route() == "room"
    assert rig.transitions() == [
        (0.0, "start", "idle", "starting"),
        (5.0, "start_timeout", "starting", "failed"),
        # the cut start may have asked its provider for an avatar already: closed, removed
        (5.0, "route_restored", "failed", "retiring"),
        (5.0, "released", "retiring", "restored"),
    ]
    assert rig.removed == [AVATAR]
    restored = [r for r in rig.trace.records if r.event == "route_restored"]
    assert restored[0].data["outcome"] == ("previous" if route_first else "nothing_installed")
    await rig.aclose()


async def test_the_mailbox_moves_while_the_plugin_is_starting() -> None:
    """Room facts and interrupts are handled while the plugin's start() waits on its
    provider; routing then sees, on entry, the avatar that came meanwhile."""
    rig = Rig()
    rig.avatar = ScriptedAvatar(avatar_identity=AVATAR, start_delay=20.0, clock=rig.clock)
    rig.lifecycle = AvatarLifecycle(rig.avatar, clock=rig.clock, tracer=Tracer(rig.trace))
    await rig.start_session()
    start = asyncio.ensure_future(rig.lifecycle.start(rig.session, rig.room))
    await rig.clock.advance(1)
    rig.lifecycle.interrupt()
    rig.join()
    await settle()
    assert not start.done() and rig.lifecycle.state == "starting"
    handled = [
        (r.t, r.event, r.kind, r.effects)
        for r in rig.trace.records
        if r.kind in ("transition", "ignore") and r.source == "starting"
    ]
    assert handled == [
        (1.0, "interrupt", "transition", ["clear_local_buffer"]),
        (1.0, "avatar_connected", "ignore", []),
        (1.0, "video_published", "ignore", []),
    ]
    assert rig.rpcs() == []
    await rig.clock.advance(19)
    await settle()
    assert start.done() and start.exception() is None
    assert rig.lifecycle.state == "joined"
    assert rig.transitions()[-2:] == [
        (20.0, "plugin_started", "starting", "routing"),
        (20.0, "avatar_connected", "routing", "joined"),
    ]
    await rig.aclose()


async def test_room_output_attached_by_restore_outlives_close_until_the_session_ends() -> None:
    rig = Rig(join_timeout=5.0)
    await rig.start_avatar()
    await rig.start_session()
    await rig.clock.advance(5)
    attached = audio_tail(rig.session)
    assert isinstance(attached, _ParticipantAudioOutput)
    await rig.lifecycle.aclose()
    assert audio_tail(rig.session) is attached  # the agent stays audible
    forwarding = attached._forwarding_task
    assert forwarding is not None and not forwarding.done()
    await rig.session.aclose()
    await settle()
    assert forwarding.done()  # closed with the session


# -- retry ---------------------------------------------------------------------------------


@pytest.mark.parametrize("retry", [False, True])
async def test_late_join_after_restored_is_removed_unless_rejoin(retry: bool) -> None:
    """An avatar that joins after its attempt was given up: with rejoin (``retry=True``)
    it gets the audio again; without, it is removed from the room (its plugin closed
    again), and the agent stays on room audio."""
    rig = Rig(join_timeout=5.0, retry=retry)
    await rig.start_session()
    await rig.start_avatar()
    await rig.clock.advance(5)
    assert rig.lifecycle.state == "restored"
    changes = rig.watch()
    rig.join(video=False)
    await settle()
    if retry:  # routed to again, and awaited again: its video is the join
        assert changes == [("restored", "routing", "avatar_connected")]
        assert rig.lifecycle.state == "routing" and rig.lifecycle.audio_route() == "avatar"
        rig.room.publish_track(AVATAR, "video")
        await settle()
        assert changes[1:] == [("routing", "joined", "video_published")]
        assert rig.lifecycle.state == "joined"
        assert rig.lifecycle.audio_route() == "avatar"
        rig.room.remove_participant(AVATAR)
        await settle()
        assert rig.lifecycle.state == "restored"
    else:
        assert changes == [
            ("restored", "retiring", "avatar_connected"),
            ("retiring", "restored", "released"),
        ]
        assert rig.lifecycle.state == "restored"
        # asked when the attempt was given up (not found), then for the late avatar
        assert rig.removed == [AVATAR, AVATAR] and AVATAR not in rig.room.remote_participants
    assert rig.lifecycle.audio_route() == "room"
    await rig.aclose()


# -- the public surface --------------------------------------------------------------------


async def test_wait_for_and_state_changed_run_on_virtual_time() -> None:
    rig = Rig(join_timeout=5.0)
    seen: list[str] = []
    rig.lifecycle.on("state_changed", lambda ev: seen.append(ev.dest))
    await rig.start_session()
    await rig.start_avatar()
    too_soon = asyncio.ensure_future(rig.lifecycle.wait_for("joined", timeout=1.0))
    await rig.clock.advance(1)
    with pytest.raises(TimeoutError) as timed_out:
        await too_soon
    # it said nothing: which state, how long, where the lifecycle is instead
    assert str(timed_out.value) == (
        "the avatar lifecycle was not 'joined' within 1s (it is 'routing')"
    )
    await rig.lifecycle.wait_for("routing")  # already there
    waiting = asyncio.ensure_future(rig.lifecycle.wait_for("restored"))
    await rig.clock.advance(4)
    assert waiting.done() and waiting.exception() is None
    assert seen == ["starting", "routing", "failed", "retiring", "restored"]
    closed_first = asyncio.ensure_future(rig.lifecycle.wait_for("joined"))
    await settle()
    await rig.aclose()
    with pytest.raises(ActorClosed):
        await closed_first
    with pytest.raises(ValueError, match="unknown avatar state"):
        await rig.lifecycle.wait_for("limbo")


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (-1, ValueError, "wait_for's timeout takes a finite number of seconds, at least 0, not -1"),
        (
            float("nan"),
            ValueError,
            "wait_for's timeout takes a finite number of seconds, at least 0, not nan",
        ),
        ("5", TypeError, "wait_for's timeout takes a number of seconds, not str"),
    ],
)
async def test_wait_for_refuses_a_timeout_that_is_no_duration(
    timeout: Any, error: type[Exception], message: str
) -> None:
    # -1 was a TimeoutError with an empty message, at once; NaN waited for good (bounded
    # in real time here as a guard against that hang)
    rig = Rig(join_timeout=5.0)
    with pytest.raises(error) as e:
        await asyncio.wait_for(rig.lifecycle.wait_for("joined", timeout=timeout), 5)
    assert str(e.value) == message
    assert rig.lifecycle.state == "idle"
    await rig.aclose()


async def test_a_listener_that_raises_stalls_neither_start_nor_wait_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def buggy(_: object) -> None:
        raise TypeError("a state_changed listener with a bug")  # the SDK lets it through

    rig = Rig(join_timeout=5.0)
    rig.lifecycle.on("state_changed", buggy)
    await rig.start_session()
    started = await rig.start_avatar_aside()
    assert started.done()  # start() heard starting being left all the same
    assert rig.lifecycle.state == "routing"
    waiting = asyncio.ensure_future(rig.lifecycle.wait_for("restored"))
    await rig.clock.advance(5)
    assert waiting.done() and waiting.exception() is None
    assert "a state_changed listener failed" in caplog.text
    await rig.aclose()


async def test_bad_input_is_refused_and_changes_nothing() -> None:
    avatar = ScriptedAvatar()
    with pytest.raises(TypeError):
        AvatarLifecycle(object())  # type: ignore[arg-type]
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="join_timeout"):
            AvatarLifecycle(avatar, join_timeout=bad)
    with pytest.raises(TypeError, match="retry_avatar"):
        AvatarLifecycle(avatar, retry="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"retry_avatar\.attempts"):
        AvatarLifecycle(avatar, retry={"attempts": -1})
    with pytest.raises(ValueError, match="non-empty"):
        avatar.avatar_identity = ""
    rig = Rig()
    other = RoomEventAdapter(rtc.Room())
    lc = AvatarLifecycle(ScriptedAvatar(), clock=rig.clock, room_events=other)
    with pytest.raises(ValueError, match="same room"):
        await lc.start(rig.session, rig.room)
    assert lc.state == "idle" and rig.session.output.audio is None
    with pytest.raises(TypeError):
        await lc.start(object(), rig.room)  # type: ignore[arg-type]
    await rig.start_session()
    await rig.start_avatar()
    with pytest.raises(RuntimeError, match="already started"):
        await rig.lifecycle.start(rig.session, rig.room)
    await rig.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await rig.lifecycle.start(rig.session, rig.room)


async def test_a_shared_room_adapter_is_used_and_left_running() -> None:
    rig = Rig()
    adapter = RoomEventAdapter(rig.room)
    adapter.start()
    lc = AvatarLifecycle(rig.avatar, clock=rig.clock, room_events=adapter)
    await rig.start_session()
    await lc.start(rig.session, rig.room)
    rig.join()
    await settle()
    assert lc.state == "joined"
    await lc.aclose()
    assert adapter.started  # its owner closes it
    adapter.aclose()
    await rig.session.aclose()


async def test_restored_avatar_leaves_no_sdk_wait_behind() -> None:
    """Once the route is back on the room (and no retry is wanted), the plugin's data stream
    and the base class's join watcher stop waiting for the avatar, so a later room
    disconnect has no waiting task to fail unretrieved."""
    rig = Rig(join_timeout=5.0)
    await rig.start_session()
    await rig.start_avatar()
    sink = rig.lifecycle.installed_sink
    assert isinstance(sink, DataStreamAudioOutput)
    waits = [sink._start_atask, rig.avatar._wait_avatar_join_task]
    assert all(t is not None and not t.done() for t in waits)
    await rig.clock.advance(5)
    assert rig.lifecycle.state == "restored"
    assert all(t is not None and t.done() for t in waits)
    await rig.aclose()


# -- retry with backoff ----------------------------------------------------------------------


class FlakyAvatar(ScriptedAvatar):
    """A provider that fails the first ``failures`` starts (its error swallowed, as simli
    does: no route installed), then sends its avatar."""

    def __init__(self, failures: int) -> None:
        super().__init__(avatar_identity=AVATAR)
        self.failures = failures
        self.closes = 0

    async def start(self, agent_session: Any, room: rtc.Room) -> None:
        self.swallow_error = self.start_calls < self.failures
        await super().start(agent_session, room)

    async def aclose(self) -> None:
        self.closes += 1
        await super().aclose()


async def test_transient_failures_are_retried_after_backoff_on_room_audio() -> None:
    policy = {"attempts": 3, "backoff": {"initial": 1.0, "multiplier": 2.0, "max": 1.5}}
    rig = Rig(avatar=FlakyAvatar(failures=2), retry=policy)
    await rig.start_session()
    routes: list[tuple[float, str, str]] = []
    rig.lifecycle.on(
        "state_changed",
        lambda ev: routes.append((rig.clock.now(), ev.dest, rig.lifecycle.audio_route())),
    )
    await rig.start_avatar()
    assert rig.lifecycle.state == "backoff"
    await rig.clock.advance(1.0)  # first wait: initial
    await rig.clock.advance(1.5)  # second: capped at max
    assert rig.lifecycle.state == "routing"
    assert rig.avatar.start_calls == 3 and rig.lifecycle.attempts == 2
    assert rig.avatar.closes == 2  # each failed attempt released before the next
    # every wait was on room audio
    assert [(t, r) for t, s, r in routes if s == "backoff"] == [(0.0, "room"), (1.0, "room")]
    assert [t for t, s, _ in routes if s == "starting"] == [0.0, 1.0, 2.5]
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined"
    assert rig.lifecycle.audio_route() == "avatar"
    await rig.aclose()


async def test_a_retry_after_a_failure_during_the_session_s_start_stays_on_room_audio() -> None:
    # the first attempt fails while session.start() waits for the agent's tools; the
    # second routes over the room output the first one's restore attached, and fails too
    policy = {"attempts": 1, "backoff": {"initial": 1.0}}
    rig = Rig(join_timeout=2.0, retry=policy)
    await rig.start_avatar()
    session_started = await rig.start_session_aside(tools_setup=3.0)
    await rig.clock.advance(2)
    assert rig.lifecycle.state == "backoff" and not session_started.done()
    assert rig.lifecycle.audio_route() == "room"  # during the start already
    await rig.clock.advance(1)
    assert session_started.done() and rig.lifecycle.state == "routing"
    assert rig.lifecycle.audio_route() == "avatar"
    await rig.clock.advance(2)
    assert rig.lifecycle.state == "restored" and rig.lifecycle.attempts == 1
    assert rig.lifecycle.audio_route() == "room"
    assert route_names(rig.session) == SYNCED_TO_ROOM
    assert len(rig.room.local_participant.track_publications) == 1
    await rig.aclose()


@pytest.mark.parametrize(
    ("policy", "want", "starts"),
    [
        ({}, "restored", 1),  # the default retries nothing
        ({"attempts": 1, "transient": ["avatar_left"]}, "restored", 1),  # not transient
        ({"attempts": 1}, "backoff", 2),
    ],
)
async def test_only_transient_causes_with_attempts_left_are_retried(
    policy: dict[str, Any], want: str, starts: int
) -> None:
    rig = Rig(avatar=FlakyAvatar(failures=5), retry=policy)
    await rig.start_session()
    await rig.start_avatar()
    assert rig.lifecycle.state == want
    await rig.clock.advance(60)
    assert rig.lifecycle.state == "restored"  # the attempts, if any, are used up
    assert rig.lifecycle.audio_route() == "room"
    assert rig.avatar.start_calls == starts
    await rig.aclose()


async def test_an_avatar_that_returns_during_backoff_gets_the_audio_with_rejoin() -> None:
    rig = Rig(retry={"attempts": 2, "rejoin": True, "backoff": {"initial": 10.0}})
    await rig.join_and_leave()
    assert rig.lifecycle.state == "backoff"
    assert rig.lifecycle.audio_route() == "room"
    rig.join(video=False)
    await settle()
    assert rig.lifecycle.state == "routing"  # routed to again, its video awaited
    rig.room.publish_track(AVATAR, "video")
    await settle()
    assert rig.lifecycle.state == "joined"  # re-routed, not restarted
    assert rig.lifecycle.audio_route() == "avatar"
    assert rig.avatar.start_calls == 1
    await rig.aclose()


async def test_an_avatar_that_left_before_its_video_and_returns_gets_the_audio() -> None:
    """With rejoin, the avatar joins, leaves before its video is up (the plugin's sink was
    waiting for that video: its start failed there, and livekit's sink then refuses every
    frame for good), and comes back with its video: the route goes back in and the agent's
    audio reaches it, not an error from the sink's first start. The frame that waited goes
    to the room meanwhile."""
    rig = Rig(retry={"rejoin": True})
    await rig.start_session()
    await rig.start_avatar()
    rig.join(video=False)
    await settle()
    sink = rig.lifecycle.installed_sink
    assert isinstance(sink, DataStreamAudioOutput)
    frame = rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)
    capture = asyncio.ensure_future(sink.capture_frame(frame))  # waits for the video
    await settle()
    rig.room.remove_participant(AVATAR)
    await settle()
    await capture  # not the sink's failed start: the frame went where the route went
    room_output = audio_tail(rig.session)
    assert room_output is not sink and room_output.captured_playout_segments == 1
    assert rig.lifecycle.state == "restored"
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined" and route_of(rig.session) == "avatar"
    await sink.capture_frame(frame)
    sink.flush()
    await settle()
    assert lk.pending_playbacks(sink) == 1  # the segment went to the avatar
    await rig.aclose()


async def test_close_during_backoff_stops_the_timer() -> None:
    rig = Rig(avatar=FlakyAvatar(failures=5), retry={"attempts": 3})
    await rig.start_session()
    await rig.start_avatar()
    assert rig.lifecycle.state == "backoff"
    await rig.lifecycle.aclose()
    assert rig.lifecycle.state == "closed"
    assert rig.clock.pending == 0
    await rig.clock.advance(60)
    assert rig.avatar.start_calls == 1
    await rig.aclose()


@pytest.mark.parametrize("reaction", ["close", "interrupt"])
async def test_a_reaction_the_instant_the_avatar_fails_is_handled_in_failed(reaction: str) -> None:
    """An app that closes the avatar, or a user who interrupts, at the very moment the
    avatar fails (here from a ``state_changed`` listener): the machine takes it in
    ``failed``, before the restore has reported. A close still restores the room audio and
    closes the plugin; an interruption finishes the playout locally, sending nothing."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    handle = rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()
    closing: list[asyncio.Future[None]] = []

    def on_change(ev: Any) -> None:
        if ev.dest != "failed":
            return
        if reaction == "close":
            closing.append(asyncio.ensure_future(rig.lifecycle.aclose()))
        else:
            rig.lifecycle.interrupt()
            rig.session.interrupt()

    changes = rig.watch()
    rig.lifecycle.on("state_changed", on_change)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    await asyncio.gather(*closing)
    await settle()
    assert route_of(rig.session) == "room"
    assert rig.rpcs() == []
    then = [("failed", "closed", "close")] if reaction == "close" else _restored
    assert changes == [("joined", "failed", "avatar_left"), *then]
    if reaction == "close":
        assert rig.lifecycle.state == "closed" and rig.removed == [AVATAR]
    else:
        assert rig.lifecycle.state == "restored"
        assert handle.done()  # not left to the session's 5 s interruption fallback
    await rig.aclose()


async def test_the_restores_own_swap_is_no_interruption_one_asked_as_it_fails_is() -> None:
    """Putting the route back detaches the avatar's sink mid-speech, and livekit clears a
    sink it detaches: that clear is the restore's, not the user's. An interruption asked
    the instant the avatar fails, before the restore ran, is one: the machine hears it."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    rig.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
    await settle()

    def on_change(ev: Any) -> None:
        if ev.dest == "failed":
            rig.lifecycle.interrupt()

    rig.lifecycle.on("state_changed", on_change)
    rig.room.remove_participant(AVATAR, rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert route_of(rig.session) == "room" and rig.rpcs() == []
    steps = [r for r in rig.trace.records if r.kind == "transition"]
    assert [(r.source, r.dest) for r in steps if r.event == "interrupt"] == [("failed", "failed")]
    await rig.aclose()


# -- what does not concern the lifecycle leaves it where it is --------------------------------


@pytest.mark.parametrize("then", ["participant", "nothing"])
async def test_video_seen_before_its_participant_is_not_a_join(then: str) -> None:
    """Reordered events: the avatar's video published arrives before the participant it
    belongs to. Still routing, nothing restarted; the participant then makes the join, and
    without it the join timeout runs from the start, not from the video."""
    from tests.support.world import stranger, stranger_track

    rig = Rig(join_timeout=10.0)
    await rig.start_session()
    await rig.start_avatar()
    await rig.clock.advance(4.0)
    rig.room.emit("track_published", stranger_track("video"), stranger(AVATAR))
    await settle()
    assert rig.lifecycle.state == "routing" and rig.lifecycle.audio_route() == "avatar"
    assert rig.avatar.start_calls == 1
    if then == "participant":
        rig.join()
        await settle()
        assert rig.lifecycle.state == "joined"
    else:
        await rig.clock.advance(6.0)
        assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    await rig.aclose()


async def test_an_avatar_that_leaves_before_its_video_ends_the_wait_at_once() -> None:
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join(video=False)  # the participant, no video yet
    await settle()
    assert rig.lifecycle.state == "routing"
    await rig.clock.advance(1.0)
    changes = rig.watch()
    rig.room.remove_participant(AVATAR)
    await settle()
    assert changes == [("routing", "failed", "avatar_left"), *_restored]
    # not left waiting for the join timeout: back on room audio now
    assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    assert rig.clock.pending == 0
    await rig.aclose()


async def test_an_interruption_before_start_changes_nothing() -> None:
    rig = Rig()
    await rig.start_session()
    changes = rig.watch()
    rig.lifecycle.interrupt()  # the user talks over the agent before the avatar started
    await settle()
    assert rig.lifecycle.state == "idle" and rig.rpcs() == [] and changes == []
    await rig.start_avatar()
    rig.join()
    await settle()
    assert rig.lifecycle.state == "joined" and rig.lifecycle.audio_route() == "avatar"
    await rig.aclose()


@pytest.mark.parametrize(
    "meanwhile", ["interrupt", "video", "other_agent_leaves", "avatar_back", "avatar_back_and_gone"]
)
async def test_the_backoff_is_not_disturbed_by_what_does_not_concern_it(meanwhile: str) -> None:
    """Waiting to retry on room audio, without rejoin: an interruption, a video or a
    departure that is not the avatar's, or the avatar coming back (not to be re-routed
    without rejoin) leave the wait as it was; the retry starts at its time."""
    from tests.support.world import stranger, stranger_track

    rig = Rig(avatar=FlakyAvatar(failures=1), retry={"attempts": 1, "backoff": {"initial": 5.0}})
    rig.room.add_participant("other-agent", kind="agent")
    await rig.start_session()
    await rig.start_avatar()
    assert rig.lifecycle.state == "backoff"
    changes = rig.watch()
    await rig.clock.advance(2.0)
    if meanwhile == "interrupt":
        rig.lifecycle.interrupt()
    elif meanwhile == "video":
        rig.room.emit("track_published", stranger_track("video"), stranger(AVATAR))
    elif meanwhile == "other_agent_leaves":
        rig.room.remove_participant("other-agent")
    else:
        rig.join()
        if meanwhile == "avatar_back_and_gone":
            await settle()
            rig.room.remove_participant(AVATAR)
    await settle()
    assert rig.lifecycle.state == "backoff" and rig.lifecycle.audio_route() == "room"
    assert rig.avatar.start_calls == 1 and rig.rpcs() == [] and changes == []
    await rig.clock.advance(3.0)  # 5 s after the failure: the retry starts, on time
    assert rig.avatar.start_calls == 2
    await rig.aclose()


class _SlowCloseFlaky(FlakyAvatar):
    """FlakyAvatar whose provider takes 1 s (on ``clock``, the rig's) to end a session."""

    clock: Any = None

    async def aclose(self) -> None:
        await self.clock.sleep(1.0)
        await super().aclose()


@pytest.mark.parametrize("state", ["releasing", "retiring"])
async def test_an_interruption_while_the_failed_attempt_is_closed_leaves_it_alone(
    state: str,
) -> None:
    """The user interrupts while the failed attempt is being closed (its plugin's close
    under way), before a retry (``releasing``) or given up for good (``retiring``: no retry
    left, no rejoin): the close is not restarted nor cut, nothing goes to an avatar, the
    agent stays on room audio; when the close ends, the new attempt starts once, or (given
    up) the lifecycle rests on room audio, nothing started again."""
    avatar = _SlowCloseFlaky(failures=1)
    retry: Any = {"attempts": 1, "backoff": {"initial": 1.0}} if state == "releasing" else False
    rig = Rig(avatar=avatar, retry=retry)
    avatar.clock = rig.clock
    await rig.start_session()
    await rig.start_avatar()
    if state == "releasing":
        assert rig.lifecycle.state == "backoff"
        await rig.clock.advance(1.2)  # the backoff ran out: the old session's close is running
    else:
        await rig.clock.advance(0.2)  # 0.2 s into the old session's close
    assert rig.lifecycle.state == state and avatar.closes == 0
    changes = rig.watch()
    rig.lifecycle.interrupt()
    await settle()
    assert rig.lifecycle.state == state and changes == []
    assert rig.lifecycle.audio_route() == "room" and rig.rpcs() == []
    await rig.clock.advance(1.0)  # the provider's close ends: the attempt is closed
    assert avatar.closes == 1
    assert rig.decided("interrupt")[-1:] == [state]
    if state == "releasing":
        assert avatar.start_calls == 2
        assert [dest for _src, dest, _on in changes][:1] == ["starting"]
    else:
        assert avatar.start_calls == 1 and changes == [("retiring", "restored", "released")]
        await rig.clock.advance(60.0)
        assert rig.lifecycle.state == "restored" and avatar.start_calls == 1
        assert rig.lifecycle.audio_route() == "room" and rig.rpcs() == []
    closing = asyncio.ensure_future(rig.aclose())
    await rig.clock.advance(5.0)  # the new attempt's close takes its second too
    assert closing.done() and closing.exception() is None


@pytest.mark.parametrize("state", ["starting", "routing", "joined", "backoff", "restored"])
async def test_a_network_blip_leaves_the_avatar_where_it_was(state: str) -> None:
    """The room reconnects (its connection state back to connected): the lifecycle, its
    route, its timers and the plugin are as they were."""
    if state == "starting":
        rig = Rig(avatar=StuckAvatar(), join_timeout=10.0)
        await rig.start_session()
        started = await rig.start_avatar_aside()
    elif state == "backoff":
        rig = Rig(
            avatar=FlakyAvatar(failures=1), retry={"attempts": 1, "backoff": {"initial": 5.0}}
        )
        await rig.start_session()
        await rig.start_avatar()
    else:
        rig = Rig(avatar=FlakyAvatar(failures=1) if state == "restored" else None)
        await rig.start_session()
        await rig.start_avatar()
        if state == "joined":
            rig.join()
            await settle()
    assert rig.lifecycle.state == state
    before = (rig.lifecycle.audio_route(), rig.avatar.start_calls, rig.clock.pending)
    changes = rig.watch()
    await rig.clock.advance(2.0)
    rig.room.reconnect_locally()
    await settle()
    assert rig.lifecycle.state == state and changes == []
    assert (rig.lifecycle.audio_route(), rig.avatar.start_calls, rig.clock.pending) == before
    if state == "starting":  # its bound still counts from the start
        await rig.clock.advance(8.0)
        assert rig.lifecycle.state == "restored"
        await started
    elif state == "backoff":  # the retry at its time
        await rig.clock.advance(3.0)
        assert rig.avatar.start_calls == 2
    await rig.aclose()


@pytest.mark.parametrize("state", ["routing", "backoff", "restored"])
async def test_a_playback_report_while_not_joined_moves_nothing(state: str) -> None:
    """The avatar reports a playback before its video is up, or late, once it failed to
    join and is waited for again or kept for a rejoin (its report handler is still ours
    then): the report is answered and the lifecycle stays where it was, the route and the
    timers with it."""
    retry: dict[str, Any] = {"attempts": 1, "backoff": {"initial": 5.0}}
    if state != "backoff":
        retry = {"rejoin": True} if state == "restored" else {}
    rig = Rig(join_timeout=10.0, retry=retry)
    await rig.start_session()
    await rig.start_avatar()
    if state == "routing":
        rig.join(video=False)
        await settle()
    else:
        await rig.clock.advance(10.0)  # never joined
    assert rig.lifecycle.state == state
    before = (rig.lifecycle.audio_route(), rig.avatar.start_calls, rig.clock.pending)
    changes = rig.watch()
    reply = await rig.room.invoke_rpc("lk.playback_finished", AVATAR, playback_finished())
    await settle()
    assert reply == "ok"
    assert rig.decided("playback_finished") == [state]
    assert changes == [] and rig.lifecycle.state == state
    assert (rig.lifecycle.audio_route(), rig.avatar.start_calls, rig.clock.pending) == before
    await rig.aclose()


async def test_a_late_avatar_after_restore_is_removed_and_moves_nothing_else() -> None:
    """Restored on room audio (no retry, no rejoin): the avatar turning up late is removed
    from the room (its plugin, closed with the retirement, is not closed again), and
    neither the audio moves nor anything restarts; its report handler went with the
    retirement of its attempt."""
    avatar = FlakyAvatar(failures=1)
    rig = Rig(avatar=avatar)
    await rig.start_session()
    await rig.start_avatar()
    assert rig.lifecycle.state == "restored" and avatar.closes == 1
    changes = rig.watch()
    rig.join()
    await settle()
    assert changes == [
        ("restored", "retiring", "avatar_connected"),
        ("retiring", "restored", "released"),
    ]
    assert AVATAR not in rig.room.remote_participants and avatar.closes == 1
    assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    assert rig.avatar.start_calls == 1 and rig.clock.pending == 0 and rig.rpcs() == []
    assert "lk.playback_finished" not in rig.room.local_participant.rpc_handlers
    await rig.aclose()
    assert avatar.closes == 1  # one attempt, one aclose()


# -- what arrives while the machine passes through failed or clearing -------------------------


def _report_playback(rig: Rig, replies: list[asyncio.Future[str]]) -> None:
    """The avatar's lk.playback_finished, as the room delivers it (its handler runs on the
    loop's next turn); its reply lands in ``replies``."""
    report = rig.room.invoke_rpc("lk.playback_finished", AVATAR, playback_finished())
    replies.append(asyncio.ensure_future(report))


@pytest.mark.parametrize("meanwhile", ["back", "reconnect", "report", "left"])
async def test_what_the_room_says_as_the_avatar_fails_is_taken_in_failed(meanwhile: str) -> None:
    """The avatar fails and, in that same instant (before the route's restore has reported),
    the room says more: the avatar back with its video, the connection back, a playback
    report, or (it failed by its join timeout) the avatar leaving. All of it is taken in
    ``failed`` and changes nothing: a user's listener sees failed, then restored on the
    restore's report, and nothing else; the agent ends on room audio, nothing restarted."""
    rig = Rig(join_timeout=10.0)
    await rig.start_session()
    await rig.start_avatar()
    rig.join(video=meanwhile != "left")  # "left": there, its video never comes
    await settle()
    changes = rig.watch()
    reacted: list[str] = []
    replies: list[asyncio.Future[str]] = []

    def on_change(ev: Any) -> None:
        if ev.dest != "failed" or reacted:
            return
        reacted.append(ev.event)
        if meanwhile == "back":
            rig.join()
        elif meanwhile == "reconnect":
            rig.room.reconnect_locally()
        elif meanwhile == "report":
            _report_playback(rig, replies)
        else:
            rig.room.remove_participant(AVATAR)

    rig.lifecycle.on("state_changed", on_change)
    if meanwhile == "left":
        await rig.clock.advance(10.0)
    else:
        rig.room.remove_participant(AVATAR)
    await settle()
    event = {
        "back": "video_published",
        "reconnect": "room_connected",
        "report": "playback_finished",
        "left": "avatar_left",
    }[meanwhile]
    assert rig.decided(event)[-1] == "failed"  # the cell this test is about
    cause = "join_timeout" if meanwhile == "left" else "avatar_left"
    before = "routing" if meanwhile == "left" else "joined"
    assert changes == [(before, "failed", cause), *_restored]
    assert rig.lifecycle.audio_route() == "room"
    assert rig.avatar.start_calls == 1 and rig.clock.pending == 0 and rig.rpcs() == []
    assert [await r for r in replies] == (["ok"] if meanwhile == "report" else [])
    await rig.aclose()


@pytest.mark.parametrize("meanwhile", ["video", "reconnect", "announced", "interrupt", "report"])
async def test_what_comes_while_the_plugins_clear_holds_the_sink_lets_it_finish(
    meanwhile: str,
) -> None:
    """While the plugin's own clear holds its sink (``clearing``), the avatar publishing
    another video, the connection coming back, the avatar announced again, another
    interruption or its playback report: the clear is left to finish, then the lifecycle
    is joined again, audio still at the avatar; a user's listener sees only that."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join()
    await settle()
    await rig.hold_clear()
    assert rig.lifecycle.state == "clearing"
    changes = rig.watch()
    replies: list[asyncio.Future[str]] = []
    await rig.clock.advance(1.0)
    if meanwhile == "video":
        rig.room.publish_track(AVATAR, "video")
    elif meanwhile == "reconnect":
        rig.room.reconnect_locally()
    elif meanwhile == "announced":
        rig.room.emit("participant_connected", rig.room.remote_participants[AVATAR])
    elif meanwhile == "interrupt":
        rig.lifecycle.interrupt()
    else:
        _report_playback(rig, replies)
    await settle()
    event = {
        "video": "video_published",
        "reconnect": "room_connected",
        "announced": "avatar_connected",
        "interrupt": "interrupt",
        "report": "playback_finished",
    }[meanwhile]
    assert "clearing" in rig.decided(event)  # the cell this test is about
    await rig.clock.advance(10.0)
    assert changes == [("clearing", "joined", "clear_buffer_done")]
    assert rig.lifecycle.state == "joined" and rig.lifecycle.audio_route() == "avatar"
    assert rig.avatar.start_calls == 1
    assert [await r for r in replies] == (["ok"] if meanwhile == "report" else [])
    await rig.aclose()


@pytest.mark.parametrize("then", ["nothing", "video", "leaves"])
async def test_a_returning_avatar_whose_route_cannot_go_back_in_ends_on_room_audio(
    then: str,
) -> None:
    """With rejoin, the avatar comes back but its route cannot be put back in (its sink
    raises as it is attached again, a fault injected here): the attempt fails and the agent
    ends on room audio, whether the avatar's video came in the same instant (the join is
    decided before the failure, which ends it) or it left again in that instant (the
    failure then comes after the leaving's, and changes nothing)."""
    rig = Rig(retry={"rejoin": True})
    await rig.join_and_leave()
    assert rig.lifecycle.state == "restored"
    sink = rig.lifecycle.installed_sink
    assert sink is not None

    def refuse() -> None:
        raise RuntimeError("the avatar's stream is gone")

    sink.on_attached = refuse  # type: ignore[method-assign]
    changes = rig.watch()
    rig.join(video=then == "video")
    if then == "leaves":
        rig.room.remove_participant(AVATAR)
    await settle()
    assert rig.lifecycle.state == "restored" and rig.lifecycle.audio_route() == "room"
    assert route_of(rig.session) == "room"
    back = [("restored", "routing", "avatar_connected")]
    if then == "nothing":
        assert changes == [*back, ("routing", "failed", "start_error"), *_kept]
    elif then == "video":
        joined = ("routing", "joined", "video_published")
        assert changes == [*back, joined, ("joined", "failed", "start_error"), *_kept]
    else:
        assert changes == [*back, ("routing", "failed", "avatar_left"), *_kept]
        assert rig.decided("start_error") == ["failed"]
    await rig.aclose()


# given up (no retry, no rejoin): the failed attempt is closed on the way to restored
_restored = [("failed", "retiring", "route_restored"), ("retiring", "restored", "released")]
# given up with rejoin (and a route to reinstall): kept as it is for a late join
_kept = [("failed", "restored", "route_restored")]


@pytest.mark.parametrize(
    ("state", "meanwhile"),
    [
        ("routing", "report"),
        ("joined", "report"),
        ("joined", "video"),
        ("joined", "announced"),
    ],
)
async def test_what_does_not_concern_the_lifecycle_leaves_it_where_it_is(
    state: str, meanwhile: str
) -> None:
    """The avatar's playback report (the segment it played ends, nothing else), another
    video from it, or the room announcing it again: a user's listener sees no state
    change, the audio stays
    where it was, nothing is sent and nothing restarts. (Routing, the avatar's sink is
    one that streams before the avatar's video is up, as its plugin may set it.)"""
    plays_early = ScriptedAvatar(avatar_identity=AVATAR, wait_remote_track=None)
    rig = Rig(join_timeout=10.0, avatar=plays_early if state == "routing" else None)
    await rig.start_session()
    await rig.start_avatar()
    rig.join(video=state == "joined")
    await settle()
    assert rig.lifecycle.state == state
    handle = rig.session.say("hello", audio=frames(5), add_to_chat_ctx=False)
    await settle()
    route = rig.lifecycle.audio_route()
    changes = rig.watch()
    if meanwhile == "report":
        assert not handle.done()  # the avatar has the segment; only its report ends it
        assert (
            await rig.room.invoke_rpc("lk.playback_finished", AVATAR, playback_finished()) == "ok"
        )
    elif meanwhile == "video":
        rig.room.publish_track(AVATAR, "video")
    else:
        rig.room.emit("participant_connected", rig.room.remote_participants[AVATAR])
    await settle()
    if meanwhile == "report":
        assert handle.done()
    assert changes == [] and rig.lifecycle.state == state
    assert rig.lifecycle.audio_route() == route and rig.avatar.start_calls == 1
    assert rig.rpcs() == []
    await rig.aclose()


async def test_an_interruption_queued_behind_the_join_sends_nothing() -> None:
    """An interruption asked in the very instant the avatar's video arrives: the join is
    decided first, then the interruption, which was asked of a sink no avatar was playing
    from. It is cleared locally: nothing is sent to the avatar, and the lifecycle stays
    joined, audio at the avatar."""
    rig = Rig()
    await rig.start_session()
    await rig.start_avatar()
    rig.join(video=False)
    await settle()
    changes = rig.watch()
    rig.room.publish_track(AVATAR, "video")
    rig.lifecycle.interrupt()  # still routing as it is asked: not the plugin's clear
    await settle()
    assert rig.decided("interrupt") == ["joined"]
    assert rig.rpcs() == []
    assert changes == [("routing", "joined", "video_published")]
    assert rig.lifecycle.state == "joined" and rig.lifecycle.audio_route() == "avatar"
    await rig.aclose()


@pytest.mark.parametrize("state", ["releasing", "retiring"])
async def test_a_playback_report_as_the_failed_attempt_is_closed_changes_nothing(
    state: str,
) -> None:
    """The avatar that failed to join reports a playback in the very instant its attempt's
    close begins (its report handler is still ours until that close lets it go), before a
    retry (``releasing``) or given up for good (``retiring``): the report is answered,
    finds nothing left to report for, and the close goes on; a user's listener sees the
    close, then the retry (or the rest on room audio), and nothing else."""
    retry: Any = {"attempts": 1, "backoff": {"initial": 5.0}} if state == "releasing" else False
    rig = Rig(join_timeout=10.0, retry=retry)
    await rig.start_session()
    await rig.start_avatar()
    changes = rig.watch()
    replies: list[asyncio.Future[str]] = []

    def on_change(ev: Any) -> None:
        if ev.dest == state and not replies:
            _report_playback(rig, replies)

    rig.lifecycle.on("state_changed", on_change)
    await rig.clock.advance(10.0)  # never joined: its report handler is still ours
    if state == "releasing":
        assert rig.lifecycle.state == "backoff"
        await rig.clock.advance(5.0)
    await settle()
    assert [await r for r in replies] == ["ok"]
    assert rig.decided("playback_finished") == [state]  # the cell
    if state == "releasing":
        assert changes[2:] == [
            ("backoff", "releasing", "backoff_elapsed"),
            ("releasing", "starting", "released"),
            ("starting", "routing", "plugin_started"),
        ]
        assert rig.lifecycle.state == "routing" and rig.avatar.start_calls == 2
    else:
        assert changes == [
            ("routing", "failed", "join_timeout"),
            ("failed", "retiring", "route_restored"),
            ("retiring", "restored", "released"),
        ]
        assert rig.lifecycle.state == "restored" and rig.avatar.start_calls == 1
        assert rig.lifecycle.audio_route() == "room"
    await rig.aclose()
