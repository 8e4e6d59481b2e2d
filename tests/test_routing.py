"""The declared routing of room facts to machine events is what the runtime follows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_runtime import Event
from agent_runtime.room_events import ParticipantLeft, RoomEventAdapter
from agent_runtime.routing import FACT_NAMES, follow
from agent_runtime.testing.inmemory import InMemoryRoom
from statemachines.routing import CONDITIONS, FACTS, ROUTES, Route


def test_every_room_fact_has_its_declared_name() -> None:
    assert sorted(FACT_NAMES.values()) == sorted(FACTS)


def test_routes_name_real_machines_events_and_conditions() -> None:
    for r in ROUTES:
        assert set(r.when) <= set(CONDITIONS)
    with pytest.raises(ValidationError, match="has no event 'avatar_joined'"):
        Route(fact="participant_joined", machine="avatar", event="avatar_joined")
    with pytest.raises(ValidationError, match="unknown condition 'is_user'"):
        Route(
            fact="participant_joined", machine="avatar", event="avatar_connected", when=("is_user",)
        )


class _Known:
    """What a runtime knows of the room: the simulators, as the job tracks them."""

    avatar_identity: str | None = None

    def __init__(self, *simulators: str) -> None:
        self.simulators = frozenset(simulators)


async def test_a_machine_follows_exactly_its_routes_with_the_shared_conditions() -> None:
    room = InMemoryRoom(name="r")
    adapter = RoomEventAdapter(room)
    adapter.start()
    got: list[Event] = []
    seen: list[str] = []
    # the conditions are evaluated on what the runtime knew just before the fact
    known = _Known("sim")
    follow(
        adapter,
        "job",
        got.append,
        facts=known,
        after=lambda f: seen.append(f.identity) if isinstance(f, ParticipantLeft) else None,
    )
    room.connect_locally()
    room.add_participant("user")
    room.add_participant("sim")
    room.remove_participant("user")
    room.remove_participant("sim")
    assert [e.name for e in got] == ["simulator_left"]
    assert got[0].data["identity"] == "sim"
    assert seen == ["user", "sim"]
    # another simulator still there: the one who left was not the last
    got.clear()
    known.simulators = frozenset({"sim", "sim-2"})
    room.add_participant("sim")
    room.remove_participant("sim")
    assert got == []
    # the avatar's routes: only its own participant, only its video
    avatar: list[Event] = []

    class AvatarKnows:
        avatar_identity = "avatar-1"
        simulators: frozenset[str] = frozenset()

    follow(adapter, "avatar", avatar.append, facts=AvatarKnows())
    room.add_participant("someone")
    room.publish_track("someone", "video")
    room.add_participant("avatar-1", kind="agent")
    room.publish_track("avatar-1", "audio")
    room.publish_track("avatar-1", "video")
    assert [e.name for e in avatar] == ["avatar_connected", "video_published"]
    adapter.aclose()
