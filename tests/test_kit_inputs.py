"""What a test hands the testing kit's own stand-ins is checked as the runtime's options
are: ``VirtualClock.advance`` refuses a duration that is no finite number of seconds
(``NaN`` stopped the clock for good, a negative one was skipped without a word, a string
was a ``TypeError`` from an addition), naming ``advance``; ``InMemoryRoom`` refuses a
participant who is not there saying who is (a bare ``KeyError: 'nobody'``, or nothing at
all for a removal), an identity that is no string, and one already in the room. Nothing
moves, and the room emits nothing."""

from __future__ import annotations

import gc
import math
from typing import Any

import pytest
from livekit import rtc

from agent_runtime import MemorySink, Tracer
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom, NotInRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar


@pytest.mark.parametrize(
    ("seconds", "error", "message"),
    [
        (math.nan, ValueError, "advance takes a finite number of seconds, at least 0, not nan"),
        (math.inf, ValueError, "advance takes a finite number of seconds, at least 0, not inf"),
        (-3, ValueError, "advance takes a finite number of seconds, at least 0, not -3"),
        ("x", TypeError, "advance takes a number of seconds, not str"),
        (True, TypeError, "advance takes a number of seconds, not bool"),
        (None, TypeError, "advance takes a number of seconds, not NoneType"),
    ],
)
async def test_advance_refuses_what_is_no_duration_naming_it_and_time_stays(
    seconds: Any, error: type[Exception], message: str
) -> None:
    clock = VirtualClock()
    await clock.advance(5)
    fired: list[float] = []
    clock.call_later(5, lambda: fired.append(clock.now()))
    with pytest.raises(error) as e:
        await clock.advance(seconds)
    assert str(e.value) == message
    assert clock.now() == 5.0 and fired == []  # nothing moved, nothing fired
    await clock.advance(10)  # and the clock still runs: its timer fires on time
    assert (clock.now(), fired) == (15.0, [10.0])


async def test_advance_by_zero_settles_and_run_until_a_past_time_is_still_fine() -> None:
    clock = VirtualClock()
    await clock.advance(2.5)
    await clock.advance(0)
    await clock.run_until(1)  # already past: only settles
    assert clock.now() == 2.5
    with pytest.raises(ValueError, match=r"^run_until takes a finite number of seconds, not nan$"):
        await clock.run_until(math.nan)
    assert clock.now() == 2.5


def _room() -> tuple[InMemoryRoom, list[str]]:
    room = InMemoryRoom(name="kit-room")
    room.connect_locally()
    room.add_participant("user")
    room.add_participant("avatar", kind="agent")
    events: list[str] = []
    for name in ("participant_connected", "participant_disconnected", "track_published"):
        room.on(name, lambda *_, name=name: events.append(name))
    return room, events


@pytest.mark.parametrize(
    ("act", "message"),
    [
        (
            lambda room: room.publish_track("nobody", "video"),
            "publish_track: 'nobody' is not in the room (in the room: 'user', 'avatar')",
        ),
        (
            lambda room: room.remove_participant("nobody"),
            "remove_participant: 'nobody' is not in the room (in the room: 'user', 'avatar')",
        ),
        (
            lambda room: room.mute_track("nobody"),
            "mute_track: 'nobody' is not in the room (in the room: 'user', 'avatar')",
        ),
        (
            lambda room: room.set_participant_attributes("nobody", {"a": "b"}),
            "set_participant_attributes: 'nobody' is not in the room "
            "(in the room: 'user', 'avatar')",
        ),
    ],
)
async def test_a_participant_who_is_not_in_the_room_is_refused_saying_who_is(
    act: Any, message: str
) -> None:
    room, events = _room()
    with pytest.raises(NotInRoom) as e:
        act(room)
    assert str(e.value) == message
    assert isinstance(e.value, KeyError)  # what the room's own lookup raised
    assert events == [] and sorted(room.remote_participants) == ["avatar", "user"]


@pytest.mark.parametrize(
    ("identity", "error", "message"),
    [
        (5, TypeError, "identity must be a non-empty string, not 5"),
        ("", ValueError, "identity must be a non-empty string, not ''"),
        ("user", ValueError, "'user' is already in the room (a rejoin: remove, then add)"),
    ],
)
async def test_add_participant_refuses_an_identity_that_cannot_join(
    identity: Any, error: type[Exception], message: str
) -> None:
    room, events = _room()
    before = room.remote_participants["user"]
    with pytest.raises(error) as e:
        room.add_participant(identity)
    assert str(e.value) == message
    # the user already there is the same participant (a second add replaced it silently)
    assert events == [] and room.remote_participants["user"] is before
    assert sorted(room.remote_participants) == ["avatar", "user"]


@pytest.mark.parametrize("reason", [None, "bogus", "CLIENT_INITIATED", 999, 3.5, True])
async def test_remove_participant_refuses_a_reason_that_is_no_disconnect_reason(
    reason: Any,
) -> None:
    # the removal went halfway: the user was gone from the room, but no
    # participant_disconnected was emitted (the job still followed the user) and a retry
    # with a good reason was refused as "not in the room"
    room, events = _room()
    with pytest.raises(ValueError) as e:
        room.remove_participant("user", reason)
    assert str(e.value) == f"remove_participant: {reason!r} is no rtc.DisconnectReason value"
    assert events == [] and sorted(room.remote_participants) == ["avatar", "user"]
    room.remove_participant("user", rtc.DisconnectReason.CONNECTION_TIMEOUT)
    assert events == ["participant_disconnected"] and "user" not in room.remote_participants


@pytest.mark.parametrize("attributes", [{"a": 1}, {1: "a"}, ["a"], "a=b"])
async def test_add_participant_refuses_attributes_that_are_no_strings(attributes: Any) -> None:
    # the protobuf's own refusal was "bad argument type for built-in operation"
    room, events = _room()
    with pytest.raises(TypeError) as e:
        room.add_participant("guest", attributes=attributes)
    assert str(e.value) == f"attributes must map strings to strings, not {attributes!r}"
    assert events == [] and "guest" not in room.remote_participants


@pytest.mark.parametrize(
    ("start", "error", "message"),
    [
        (-5, ValueError, "VirtualClock(start=...) takes a finite number of seconds, at least 0, "),
        (math.nan, ValueError, "VirtualClock(start=...) takes a finite number of seconds, at "),
        ("x", TypeError, "VirtualClock(start=...) takes a number of seconds, not str"),
    ],
)
def test_a_virtual_clock_refuses_a_start_that_is_no_time(
    start: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as e:
        VirtualClock(start)
    assert str(e.value).startswith(message)


async def test_call_later_refuses_what_it_could_never_fire_and_arms_nothing() -> None:
    # a None callback was taken, and the advance() that fired it raised "'NoneType' object
    # is not callable"; a NaN delay broke the timers' order
    clock = VirtualClock()
    with pytest.raises(TypeError, match=r"^call_later takes a callback to call, not None$"):
        clock.call_later(1, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^call_later takes a finite number of seconds, not nan$"):
        clock.call_later(math.nan, lambda: None)
    assert clock.pending == 0
    fired: list[float] = []
    clock.call_later(-1, lambda: fired.append(clock.now()))  # as the loop's: due now
    await clock.advance(1)
    assert fired == [0.0]


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (-1, ValueError, "start_timeout takes a finite number of seconds, at least 0, not -1"),
        (
            math.nan,
            ValueError,
            "start_timeout takes a finite number of seconds, at least 0, not nan",
        ),
        ("5", TypeError, "start_timeout takes a number of seconds, not str"),
    ],
)
async def test_run_entrypoint_refuses_a_start_timeout_that_is_no_duration_before_running(
    run_entrypoint: Any, timeout: Any, error: type[Exception], message: str
) -> None:
    # -1 and NaN were taken; "5" failed as "unsupported operand type(s) for +"
    ran: list[object] = []

    async def entrypoint(ctx: Any) -> None:
        ran.append(ctx)

    with pytest.raises(error) as e:
        await run_entrypoint(entrypoint, start_timeout=timeout)
    assert str(e.value) == message and ran == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: InMemoryRoom(name=5), "InMemoryRoom: name must be a str, not int"),
        (
            lambda: InMemoryRoom(agent_identity=None),
            "InMemoryRoom: agent_identity must be a str, not NoneType",
        ),
        (
            lambda: InMemoryRoom(clock="x"),
            "clock must be a Clock (with now, call_later, sleep and wait_for), not str",
        ),
        (
            lambda: EntrypointRunner(room=InMemoryRoom(), clock="x"),
            "clock must be a Clock (with now, call_later, sleep and wait_for), not str",
        ),
        (
            lambda: EntrypointRunner(room=InMemoryRoom(), transport="x"),
            "transport must be a livekit SessionTransport, not str",
        ),
        (
            lambda: ScriptedAvatar(clock=3),
            "clock must be a Clock (with now, call_later, sleep and wait_for), not int",
        ),
    ],
)
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
async def test_the_kit_s_stand_ins_refuse_parts_of_the_wrong_type_naming_them(
    build: Any, message: str
) -> None:
    # InMemoryRoom(name=5) was "bad argument type for built-in operation" from protobuf;
    # a clock or transport of the wrong type was taken, and failed deep in the job's run
    # (the job refusing a clock the test never gave it)
    with pytest.raises(TypeError) as e:
        build()
    assert str(e.value) == message
    gc.collect()  # a room refused half-built failed in rtc.Room.__del__ (unraisable)


def test_a_tracer_refuses_a_sink_class_for_a_sink() -> None:
    # Tracer(MemorySink) was taken (the class has a write method) and failed at the first
    # record: the job's trace was lost with a warning, for a missing pair of brackets
    with pytest.raises(TypeError, match=r"a sink class, MemorySink: pass MemorySink\(\)"):
        Tracer(MemorySink)
