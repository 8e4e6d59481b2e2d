"""The room adapter on a real, unconnected ``rtc.Room`` (the in-memory room's SFU side)."""

from __future__ import annotations

import logging

import pytest
from livekit import rtc

from agent_runtime.runtimes.room_events import (
    AttributesChanged,
    ParticipantJoined,
    ParticipantLeft,
    RoomConnected,
    RoomDisconnected,
    RoomEventAdapter,
    RoomFact,
    TrackMuted,
    TrackPublished,
)
from agent_runtime.testing.inmemory import InMemoryRoom


@pytest.fixture
async def wired() -> tuple[InMemoryRoom, RoomEventAdapter, list[RoomFact]]:
    room = InMemoryRoom()
    adapter = RoomEventAdapter(room)
    facts: list[RoomFact] = []
    adapter.subscribe(facts.append)
    adapter.start()
    return room, adapter, facts


async def test_sfu_events_become_facts(
    wired: tuple[InMemoryRoom, RoomEventAdapter, list[RoomFact]],
) -> None:
    room, _, facts = wired
    room.connect_locally()
    room.add_participant("sip-1", kind="sip", attributes={"x": "1"})
    room.publish_track("sip-1", "video")
    room.mute_track("sip-1")
    room.set_participant_attributes("sip-1", {"lk.simulator": "true"})
    room.remove_participant("sip-1", rtc.DisconnectReason.SIGNAL_CLOSE)
    room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    assert facts == [
        RoomConnected(),
        ParticipantJoined("sip-1", "sip", {"x": "1"}),
        TrackPublished("sip-1", "video"),
        TrackMuted("sip-1", "video", True),
        AttributesChanged("sip-1", {"lk.simulator": "true"}, {"x": "1", "lk.simulator": "true"}),
        ParticipantLeft("sip-1", "sip", "SIGNAL_CLOSE", {"x": "1", "lk.simulator": "true"}),
        RoomDisconnected("ROOM_DELETED"),
    ]


async def test_track_muted_accepts_either_order_and_garbage(
    wired: tuple[InMemoryRoom, RoomEventAdapter, list[RoomFact]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    room, _, facts = wired
    p = room.add_participant("u")
    pub = room.publish_track("u", "audio")
    facts.clear()
    room.emit("track_muted", p, pub)  # Python SDK order
    room.emit("track_muted", pub, p)  # other SDKs' order
    with caplog.at_level(logging.WARNING):
        room.emit("track_muted", "garbage", 42)  # never raises
        room.emit("track_muted")
        room.emit("participant_disconnected", object())
    assert facts == [TrackMuted("u", "audio", True)] * 2
    assert "unexpected arguments" in caplog.text


async def test_close_unhooks_every_listener() -> None:
    room = InMemoryRoom()
    before = room.listener_count()
    adapter = RoomEventAdapter(room)
    adapter.start()
    assert room.listener_count() > before
    adapter.aclose()
    assert room.listener_count() == before


async def test_a_failing_subscriber_does_not_reach_the_room(
    wired: tuple[InMemoryRoom, RoomEventAdapter, list[RoomFact]],
) -> None:
    room, adapter, facts = wired

    def boom(f: RoomFact) -> None:
        raise RuntimeError("subscriber bug")

    adapter.subscribe(boom)
    room.add_participant("u")
    assert facts == [ParticipantJoined("u", "standard", {})]


# every kind livekit's rtc knows (UNKNOWN is what the server never sends): the kit took five
# of seven, and refused connector (a default linkable kind) and bridge
SDK_KINDS = [n for n in rtc.ParticipantKind.keys() if n != "PARTICIPANT_KIND_UNKNOWN"]  # noqa: SIM118


@pytest.mark.parametrize("sdk_name", SDK_KINDS)
async def test_the_in_memory_room_takes_every_participant_kind_the_sdk_knows(
    wired: tuple[InMemoryRoom, RoomEventAdapter, list[RoomFact]], sdk_name: str
) -> None:
    room, _, facts = wired
    name = sdk_name.removeprefix("PARTICIPANT_KIND_").lower()
    p = room.add_participant("p", kind=name)
    assert p.kind == rtc.ParticipantKind.Value(sdk_name)
    assert facts == [ParticipantJoined("p", name, {})]
