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


async def test_a_machine_follows_exactly_its_routes_and_needs_every_condition() -> None:
    room = InMemoryRoom(name="r")
    adapter = RoomEventAdapter(room)
    adapter.start()
    with pytest.raises(ValueError, match="no definition of condition is_avatar, is_video"):
        follow(adapter, "avatar", lambda ev: None)
    got: list[Event] = []
    follow(
        adapter,
        "job",
        got.append,
        conditions={
            "last_simulator_left": lambda f: isinstance(f, ParticipantLeft) and f.identity == "sim",
            "last_simulator_attribute_removed": lambda f: False,
        },
    )
    room.connect_locally()
    room.add_participant("user")
    room.add_participant("sim")
    room.remove_participant("user")
    room.remove_participant("sim")
    assert [e.name for e in got] == ["simulator_left"]
    assert got[0].data["identity"] == "sim"
    adapter.aclose()
