"""The declared routing of room facts to machine events is what the runtime follows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent_runtime import Event
from agent_runtime.runtimes.room_events import ParticipantLeft, RoomEventAdapter
from agent_runtime.runtimes.routing import FACT_NAMES, follow
from agent_runtime.testing.inmemory import InMemoryRoom
from statemachines.delivery import FOLLOWERS, index_links, links_fired
from statemachines.links import LINKS
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


async def test_machines_hear_a_fact_in_the_declared_order_whatever_order_they_follow() -> None:
    # statemachines.delivery is the one delivery: every follower of the room takes it, so
    # the declared order is the order the runtime runs
    room = InMemoryRoom(name="r")
    adapter = RoomEventAdapter(room)
    adapter.start()
    heard: list[tuple[str, str]] = []

    class Knows:
        # the avatar's participant, also the last one carrying lk.simulator: every
        # machine's route for its departure fires
        avatar_identity = "avatar-1"
        simulators = frozenset({"avatar-1"})

    for machine in reversed(FOLLOWERS):  # subscribed in the opposite order
        follow(adapter, machine, lambda e, m=machine: heard.append((m, e.name)), facts=Knows())
    room.connect_locally()
    room.add_participant("avatar-1", kind="agent")
    heard.clear()
    room.remove_participant("avatar-1")
    assert [m for m, _ in heard] == list(FOLLOWERS) == ["job", "avatar", "participant"]
    assert heard == [
        ("job", "simulator_left"),
        ("avatar", "avatar_left"),
        ("participant", "participant_disconnected"),
    ]
    adapter.aclose()


def test_a_link_with_a_flag_fires_only_when_the_job_sets_it() -> None:
    index = index_links(LINKS)
    key = ("job", "run_close", "room")  # the deletion is asked only when configured

    def targets(job: dict[str, bool]) -> list[str]:
        return [f"{k.target}.{k.event}" for k in links_fired(index, key, job)]

    assert "room_deletion.request" not in targets({})
    assert "room_deletion.request" not in targets({"delete_room_on_close": False})
    assert "room_deletion.request" in targets({"delete_room_on_close": True})
    # a session's close reaches the link and the avatar only for the job's own session
    own = [k.target for k in links_fired(index, ("session", "report_own_closed", ""), {})]
    other = [k.target for k in links_fired(index, ("session", "report_closed", ""), {})]
    assert {"participant", "avatar"} <= set(own)
    assert other == ["session_host"]
