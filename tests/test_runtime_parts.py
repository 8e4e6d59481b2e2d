"""The single-machine runtimes a user can build alone (``AvatarLifecycle``,
``ParticipantLink``, ``PlayoutTracker``, ``JobRuntime``, ``JobSessionHost``,
``RoomEventAdapter``) check what they are handed as ``AgentJob`` does: a part of the wrong
type is refused at construction naming it (``SettingTypeError``), before anything is hooked
(an ``AvatarLifecycle`` given ``clock="x"`` was accepted, then its ``start()`` and its
``aclose()`` never returned); ``on()`` refuses an event the runtime never emits (a typo's
listener never ran); a failing listener's log line names the room, and never an empty
job id."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from livekit.agents import AgentSession

from agent_runtime import (
    AgentJob,
    AvatarLifecycle,
    JobRuntime,
    JobSessionHost,
    ParticipantLink,
    PlayoutTracker,
    RoomEventAdapter,
)
from agent_runtime.settings import SettingTypeError
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

ROOM = "parts-room"


def _avatar(room: InMemoryRoom, **kw: Any) -> AvatarLifecycle:
    return AvatarLifecycle(ScriptedAvatar(avatar_identity="avatar"), **kw)


def _link(room: InMemoryRoom, **kw: Any) -> ParticipantLink:
    kw.setdefault("room_events", RoomEventAdapter(room))
    return ParticipantLink(kw.pop("session", AgentSession()), **kw)


def _playout(room: InMemoryRoom, **kw: Any) -> PlayoutTracker:
    return PlayoutTracker(AgentSession(), **kw)


def _job(room: InMemoryRoom, **kw: Any) -> JobRuntime:
    return JobRuntime(room=room, **kw)


def _host(room: InMemoryRoom, **kw: Any) -> JobSessionHost:
    return JobSessionHost(kw.pop("transport", InMemorySessionTransport()), **kw)


CLOCK = "clock must be a Clock (with now, call_later, sleep and wait_for), not str"
TRACER = "tracer must be an agent_runtime Tracer, not str"
SCHEDULER = "scheduler must be an agent_runtime Scheduler, not str"
BUILDERS: dict[str, Callable[..., Any]] = {
    "AvatarLifecycle": _avatar,
    "ParticipantLink": _link,
    "PlayoutTracker": _playout,
    "JobRuntime": _job,
    "JobSessionHost": _host,
}


@pytest.mark.parametrize(
    ("runtime", "option", "value", "message"),
    [
        *(
            (runtime, option, "x", message)
            for runtime in BUILDERS
            for option, message in (
                ("clock", CLOCK),
                ("tracer", TRACER),
                ("scheduler", SCHEDULER),
            )
        ),
        (
            "AvatarLifecycle",
            "remove_participant",
            5,
            "remove_participant must be an async callable taking the avatar's identity, not int",
        ),
        (
            "AvatarLifecycle",
            "remove_participant",
            lambda: None,
            "remove_participant must be an async callable taking the avatar's identity, "
            "not function",
        ),
        (
            "AvatarLifecycle",
            "room_audio",
            "yes",
            "room_audio must be callable as room_audio(), saying whether the session asked",
        ),
        ("AvatarLifecycle", "room_events", 5, "room_events must be a RoomEventAdapter, not int"),
        ("ParticipantLink", "room_events", "x", "room_events must be a RoomEventAdapter, not str"),
        ("ParticipantLink", "room_events", None, "room_events must be a RoomEventAdapter, not"),
        ("ParticipantLink", "session", "not a session", "session must be an AgentSession, not"),
        (
            "PlayoutTracker",
            "on_reprompt",
            lambda: None,
            "on_reprompt must be callable as on_reprompt(session, attempt), not function",
        ),
        ("PlayoutTracker", "avatar", "x", "avatar must be an AvatarLifecycle, not str"),
        ("PlayoutTracker", "link", 5, "link must be a ParticipantLink, not int"),
        ("JobRuntime", "room_events", 5, "room_events must be a RoomEventAdapter, not int"),
        (
            "JobRuntime",
            "delete_room",
            lambda name: None,
            "delete_room must be an async callable taking no arguments, not function",
        ),
        ("JobSessionHost", "transport", "x", "transport must be a livekit SessionTransport"),
        ("JobSessionHost", "transport", None, "transport must be a livekit SessionTransport"),
        (
            "JobSessionHost",
            "on_simulation_end",
            lambda: None,
            "on_simulation_end must be callable as on_simulation_end(simulation_context)",
        ),
    ],
)
async def test_a_runtime_refuses_a_part_of_the_wrong_type_naming_it_and_hooks_nothing(
    room: InMemoryRoom, runtime: str, option: str, value: Any, message: str
) -> None:
    listeners = room.listener_count()
    with pytest.raises(SettingTypeError) as e:
        BUILDERS[runtime](room, **{option: value})
    assert str(e.value).startswith(message)
    assert isinstance(e.value, TypeError)  # as Python's own type errors
    assert room.listener_count() == listeners


async def test_an_avatar_lifecycle_with_a_bad_clock_is_refused_before_it_can_hang(
    room: InMemoryRoom,
) -> None:
    # it was accepted; its start() then logged an AttributeError from the scheduler and
    # never returned, nor did its aclose()
    with pytest.raises(SettingTypeError, match=r"^clock must be a Clock"):
        AvatarLifecycle(ScriptedAvatar(avatar_identity="avatar"), clock="x")  # type: ignore[arg-type]


def test_a_room_event_adapter_over_no_room_is_refused_naming_it() -> None:
    with pytest.raises(SettingTypeError, match=r"^room must be an rtc\.Room, not str$"):
        RoomEventAdapter("x")  # type: ignore[arg-type]


# -- on(): only the events a runtime emits ---------------------------------------------------


EMITS = {
    "AvatarLifecycle": {"state_changed", "segment_flushed", "playback_finished"},
    "ParticipantLink": {"state_changed", "close_timed_out"},
    "PlayoutTracker": {"state_changed", "playout_done", "reprompt"},
    "JobRuntime": {"state_changed", "closed"},
    "JobSessionHost": {"state_changed"},
}


@pytest.mark.parametrize("runtime", sorted(EMITS))
async def test_on_refuses_an_event_the_runtime_never_emits(
    room: InMemoryRoom, clock: VirtualClock, runtime: str
) -> None:
    built = BUILDERS[runtime](room, clock=clock)
    names = ", ".join(repr(n) for n in sorted(EMITS[runtime]))
    with pytest.raises(ValueError) as e:
        built.on("state_chnaged", print)
    assert str(e.value) == f"{runtime} emits no 'state_chnaged' event (it emits {names})"
    for name in EMITS[runtime]:  # each it emits is taken
        built.on(name, print)


# -- a failing listener's log line -------------------------------------------------------------


def _boom(*_: Any) -> None:
    raise ValueError("boom")


def _listener_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage().split(":")[0]
        for r in caplog.records
        if r.name == "agent_runtime.emitter" and "listener failed" in r.getMessage()
    ]


async def test_a_failing_listener_of_a_job_built_directly_names_its_room_not_an_empty_id(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.on("state_changed", _boom)
    job.link.on("state_changed", _boom)
    with caplog.at_level(logging.ERROR):
        await job.aclose()
    # it was "job  (room parts-room), AgentJob" (no job id, a double space); the link's
    # line named neither job nor room
    assert sorted(_listener_lines(caplog)) == [
        f"room {ROOM}, AgentJob",
        f"room {ROOM}, ParticipantLink",
    ]


async def test_a_failing_listener_of_a_lone_participant_link_names_its_room(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    link = ParticipantLink(AgentSession(), room_events=RoomEventAdapter(room), clock=clock)
    link.on("state_changed", _boom)
    with caplog.at_level(logging.ERROR):
        await link.aclose()
    assert link.state == "closed"
    assert _listener_lines(caplog) == [f"room {ROOM}, ParticipantLink"]
