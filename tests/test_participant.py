"""The linked participant machine on a real ``AgentSession`` started with an in-memory room.

The room is a real ``rtc.Room`` with no server behind it (``InMemoryRoom``): the SFU's
events are emitted on it. The session, RoomIO and the close path are livekit's own. The
link's timer runs on a ``VirtualClock``; the session's close needs no time, so "promptly"
is checked as "with the virtual clock standing still".
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.events import CloseEvent
from livekit.agents.voice.room_io import RoomOptions
from livekit.rtc._proto import participant_pb2

from agent_runtime import AgentJob, Event, JsonlSink, MemorySink, StateChanged, Tracer
from agent_runtime.runtimes.participant import ParticipantLink, SessionCloseTimedOut
from agent_runtime.runtimes.room_events import RoomEventAdapter
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import SettingError
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.tools.cli import main
from agent_runtime.tools.replay import replay_file
from statemachines.participant import PARTICIPANT

R = rtc.DisconnectReason


class GatedAgent(Agent):
    """An agent whose ``on_exit`` waits for the test: holds the session in its close."""

    def __init__(self) -> None:
        super().__init__(instructions="You are a test agent.")
        self.gate: asyncio.Event | None = None

    async def on_exit(self) -> None:
        if self.gate is not None:
            await self.gate.wait()


@dataclass
class World:
    clock: VirtualClock
    room: InMemoryRoom
    adapter: RoomEventAdapter
    session: AgentSession
    agent: GatedAgent
    closes: list[tuple[float, CloseReason]] = field(default_factory=list)
    links: list[ParticipantLink] = field(default_factory=list)
    sink: MemorySink = field(default_factory=MemorySink)
    changes: list[StateChanged] = field(default_factory=list)

    def link(self, **opts: Any) -> ParticipantLink:
        opts.setdefault("clock", self.clock)
        opts.setdefault("tracer", Tracer(self.sink))
        link = ParticipantLink(self.session, room_events=self.adapter, **opts)
        link.on("state_changed", self.changes.append)
        self.links.append(link)
        return link

    async def start_session(self, **room_opts: Any) -> None:
        # the documented way: RoomIO does not close on its own, the link decides
        room_opts.setdefault("close_on_disconnect", False)
        await self.session.start(self.agent, room=self.room, room_options=RoomOptions(**room_opts))
        await self.idle()

    async def idle(self) -> None:
        await settle()
        for link in self.links:
            await link.actor.join()
        await settle()

    async def session_closed(self) -> CloseReason:
        """Wait for the session's close event (bounded, so a failure does not hang)."""
        if not self.closes:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.session.once("close", lambda _: fut.done() or fut.set_result(None))
            await asyncio.wait_for(fut, 5)
        await self.idle()
        return self.closes[0][1]

    def states(self) -> list[tuple[str, str, str]]:
        return [(c.source, c.dest, c.event) for c in self.changes]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    clock = VirtualClock()
    room = InMemoryRoom(name="r1", clock=clock)
    room.connect_locally()
    adapter = RoomEventAdapter(room)
    adapter.start()
    session: AgentSession = AgentSession()
    w = World(clock, room, adapter, session, GatedAgent())

    def on_close(ev: CloseEvent) -> None:
        w.closes.append((clock.now(), ev.reason))

    session.on("close", on_close)
    yield w
    if w.agent.gate is not None:
        w.agent.gate.set()
    for link in w.links:
        await link.aclose()
    await session.aclose()
    adapter.aclose()


def ghost(identity: str, reason: int = R.CLIENT_INITIATED) -> rtc.RemoteParticipant:
    """A participant object the room never had."""
    info = participant_pb2.ParticipantInfo(identity=identity, sid="PA_ghost")
    info.disconnect_reason = reason  # type: ignore[assignment]
    return rtc.RemoteParticipant(participant_pb2.OwnedParticipant(info=info))


# -- the user-visible cases -------------------------------------------------------------------


async def test_client_initiated_closes_the_session_promptly(world: World) -> None:
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    assert (link.state, link.linked_identity) == ("waiting", None)
    world.room.add_participant("u")
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "u")

    world.room.remove_participant("u", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    assert world.closes == [(0.0, CloseReason.PARTICIPANT_DISCONNECTED)]  # no time passed
    assert link.state == "closed"
    assert world.states() == [
        ("waiting", "linked", "participant_connected"),
        ("linked", "closing", "participant_disconnected"),
        ("closing", "closed", "session_closed"),
    ]


async def test_signal_close_then_rejoin_after_3s_relinks_and_the_agent_hears_them(
    world: World,
) -> None:
    first = world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    assert world.session.room_io.linked_participant is first

    world.room.remove_participant("u", R.SIGNAL_CLOSE)
    await world.idle()
    assert link.state == "grace"
    await world.clock.advance(3.0)
    again = world.room.add_participant("u")
    world.room.publish_track("u", "audio")
    await world.idle()

    assert (link.state, link.linked_identity) == ("linked", "u")
    assert world.session.room_io.linked_participant is again  # the new participant object
    await world.clock.advance(60.0)  # the grace timer died with the grace state
    assert world.closes == []
    assert link.state == "linked"
    # and a later closing departure of the rejoined user still closes
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED


async def test_connection_timeout_without_rejoin_closes_when_grace_ends(world: World) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(grace_period=15.0)
    link.start()
    world.room.remove_participant("u", R.CONNECTION_TIMEOUT)
    await world.idle()
    assert link.state == "grace"

    await world.clock.advance(14.9)
    assert (link.state, world.closes) == ("grace", [])
    await world.clock.advance(0.1)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    assert world.closes[0][0] == pytest.approx(15.0)
    assert link.state == "closed"
    assert [(r.machine, r.event) for r in world.sink.records if r.kind == "transition"] == [
        ("participant", "participant_connected"),
        ("participant", "participant_disconnected"),
        ("participant", "grace_timeout"),
        # alone too, the session's close comes from a session machine (the link's own)
        ("session", "session_closed"),
        ("participant", "session_closed"),
    ]


async def test_the_log_says_who_dropped_why_and_how_long_the_session_waits(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A drop was silent until the grace ended, and the close then named only
    ``grace_timeout``: reading the log, a developer could not tell why the user was
    dropped nor that the session had been waiting for them."""
    world.room.add_participant("u")
    world.room.add_participant("bob")
    await world.start_session()
    link = world.link(grace_period=15.0)
    link.start()
    await world.idle()
    with caplog.at_level(logging.INFO, logger="agent_runtime.participant"):
        world.room.remove_participant("u", R.SIGNAL_CLOSE)
        world.room.remove_participant("bob", R.CLIENT_INITIATED)  # not the linked one
        await world.idle()
        world.room.add_participant("u")
        await world.idle()
        world.room.remove_participant("u", R.CONNECTION_TIMEOUT)
        await world.idle()
        await world.clock.advance(15.0)
        await world.session_closed()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "participant u dropped (SIGNAL_CLOSE): the session waits up to 15s for them to rejoin",
        "participant u rejoined: relinked",
        "participant u dropped (CONNECTION_TIMEOUT): the session waits up to 15s for them "
        "to rejoin",
        "closing the session: participant u did not rejoin within 15s",
    ]


async def drop_and_rejoin_at_once(world: World, caplog: pytest.LogCaptureFixture) -> list[str]:
    """``u`` drops and rejoins in one turn of the loop (a quick reconnect), before the
    link's machine steps; the link's log lines."""
    with caplog.at_level(logging.INFO, logger="agent_runtime.participant"):
        world.room.remove_participant("u", R.SIGNAL_CLOSE)
        world.room.add_participant("u")
        await world.idle()
    return [r.getMessage() for r in caplog.records]


DROPPED_AND_RELINKED = [
    "participant u dropped (SIGNAL_CLOSE): the session waits up to 15s for them to rejoin",
    "participant u rejoined: relinked",
]


async def test_a_drop_and_rejoin_heard_together_still_log_why_the_user_dropped(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The room reports the drop and the rejoin in one turn of the loop (a quick
    reconnect), before the link's machine steps: the drop's line still names its reason
    (it said ``UNKNOWN_REASON``: the rejoin, heard first, had forgotten it)."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(grace_period=15.0)
    link.start()
    await world.idle()
    assert await drop_and_rejoin_at_once(world, caplog) == DROPPED_AND_RELINKED
    assert link.state == "linked"


@pytest.mark.parametrize("while_", ["linked", "waiting"])
async def test_a_long_job_of_guests_coming_and_going_holds_bounded_memory_and_logs_alike(
    world: World, caplog: pytest.LogCaptureFixture, while_: str
) -> None:
    """The link kept why each identity last left, for the log line of a drop, and never
    forgot one: every guest who ever left the room stayed in memory for the job's life.
    Only the identity it follows, or may still follow, is kept now (guests come and go
    while it follows ``u``, or while it waits for ``u``, the one identity it may follow);
    the user's drop, heard with their rejoin in one turn, still names its reason."""
    import gc
    import tracemalloc

    if while_ == "linked":
        world.room.add_participant("u")
    await world.start_session()
    opts = {"participant_identity": "u"} if while_ == "waiting" else {}
    link = world.link(grace_period=15.0, tracer=Tracer(), **opts)  # no sink keeps records
    link.start()
    await world.idle()
    guests = iter(range(10**9))

    async def churn(times: int) -> None:
        for _ in range(times):
            guest = f"guest-{next(guests)}"
            world.room.add_participant(guest)
            world.room.remove_participant(guest, R.SIGNAL_CLOSE)
        await world.idle()

    await churn(50)  # whatever is made once (a dict's first slots, the loop's) is made
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await churn(1_000)
        gc.collect()  # what is still held, not garbage not yet collected
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a reason kept per guest: about 150 kB; the user's alone: nothing to see
    assert grown < 50_000, f"{grown:,} bytes held for 1,000 guests who came and went"
    if while_ == "waiting":
        world.room.add_participant("u")
        await world.idle()
    assert await drop_and_rejoin_at_once(world, caplog) == DROPPED_AND_RELINKED
    assert link.state == "linked"


async def test_the_log_says_a_departure_leaves_the_session_open_without_close_on_disconnect(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(close_on_disconnect=False)
    link.start()
    await world.idle()
    with caplog.at_level(logging.INFO, logger="agent_runtime.participant"):
        world.room.remove_participant("u", R.CLIENT_INITIATED)
        await world.idle()
    assert link.state == "grace"
    assert [r.getMessage() for r in caplog.records] == [
        "participant u left (CLIENT_INITIATED): close_on_disconnect is off, the session "
        "stays open and waits for them to rejoin"
    ]


@pytest.mark.parametrize("someone_else", ["joins", "leaves"])
async def test_someone_else_during_grace_does_not_extend_it(
    world: World, someone_else: str
) -> None:
    world.room.add_participant("u")
    if someone_else == "leaves":
        world.room.add_participant("v")
    await world.start_session()
    link = world.link(grace_period=15.0)
    link.start()
    world.room.remove_participant("u", R.CONNECTION_TIMEOUT)
    await world.idle()
    await world.clock.advance(10.0)
    if someone_else == "joins":
        world.room.add_participant("v")  # not the user who dropped
    else:
        world.room.remove_participant("v", R.CLIENT_INITIATED)
    await world.idle()
    assert link.state == "grace"
    await world.clock.advance(5.0)  # 15 s after the drop
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    assert world.closes[0][0] == pytest.approx(15.0)


@pytest.mark.parametrize("user", ["linked", "not_yet_there"])
async def test_the_session_closing_ends_the_link_at_once(world: World, user: str) -> None:
    if user == "linked":
        world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    assert link.state == ("linked" if user == "linked" else "waiting")
    await world.session.aclose()
    assert await world.session_closed() == CloseReason.USER_INITIATED
    assert link.state == "closed" and world.clock.pending == 0  # nothing left to wait for
    if user != "linked":
        world.room.add_participant("u")  # too late: nothing is linked, nothing closed again
        await world.idle()
    await world.clock.advance(120.0)
    assert link.state == "closed"
    assert [c[1] for c in world.closes] == [CloseReason.USER_INITIATED]


async def test_someone_leaving_before_the_user_came_changes_nothing(world: World) -> None:
    world.room.add_participant("v")
    await world.start_session()
    link = world.link(participant_identity="u")
    link.start()
    await world.idle()
    world.room.remove_participant("v", R.CLIENT_INITIATED)
    await world.idle()
    assert link.state == "waiting" and world.closes == [] and world.clock.pending == 0
    world.room.add_participant("u")  # the user comes later and is linked as ever
    await world.idle()
    assert link.state == "linked"


@pytest.mark.parametrize("meanwhile", ["rejoin", "someone_leaves"])
async def test_while_the_link_closes_the_session_nothing_undoes_or_extends_it(
    world: World, meanwhile: str
) -> None:
    link = await _user_leaves_while_the_close_hangs(world, session_close_timeout=10.0)
    await world.clock.advance(6.0)
    if meanwhile == "rejoin":
        world.room.add_participant("u")
    else:
        world.room.add_participant("v")
        await world.idle()
        world.room.remove_participant("v", R.CLIENT_INITIATED)
    await world.idle()
    assert link.state == "closing"
    await world.clock.advance(4.0)  # 10 s after the close began: given up, as bounded
    await world.idle()
    assert link.state == "closed"


async def test_someone_else_leaving_changes_nothing(world: World) -> None:
    user = world.room.add_participant("u")
    world.room.add_participant("v")
    await world.start_session()
    link = world.link()
    link.start()
    world.room.remove_participant("v", R.CLIENT_INITIATED)
    await world.idle()
    await world.clock.advance(60.0)
    assert (link.state, link.linked_identity) == ("linked", "u")
    assert world.session.room_io.linked_participant is user
    assert world.closes == []


async def test_grace_period_zero_closes_at_once_for_any_reason(world: World) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(grace_period=0)
    link.start()
    world.room.remove_participant("u", R.SIGNAL_CLOSE)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    assert world.closes[0][0] == 0.0
    assert ("linked", "closing", "participant_disconnected") in world.states()


async def test_close_on_disconnect_off_never_closes_and_waits_for_the_same_user(
    world: World,
) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(close_on_disconnect=False)
    link.start()
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    await world.idle()
    await world.clock.advance(3600.0)
    assert (link.state, world.closes, world.clock.pending) == ("grace", [], 0)
    world.room.add_participant("v")  # someone else does not take the link
    back = world.room.add_participant("u")
    await world.idle()
    assert link.state == "linked"
    assert world.session.room_io.linked_participant is back


async def test_custom_closing_reasons(world: World) -> None:
    link = world.link(closing_reasons=["SIGNAL_CLOSE"])
    assert link.closing_reasons == frozenset({"SIGNAL_CLOSE"})
    world.room.add_participant("u")
    await world.start_session()
    link.start()
    world.room.remove_participant("u", R.SIGNAL_CLOSE)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED


async def test_participant_identity_filter_points_roomio_at_the_chosen_one(world: World) -> None:
    world.room.add_participant("alice")
    bob = world.room.add_participant("bob")
    await world.start_session()
    assert world.session.room_io.linked_participant.identity == "alice"  # RoomIO's own pick
    link = world.link(participant_identity="bob")
    link.start()
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "bob")
    assert world.session.room_io.linked_participant is bob

    world.room.remove_participant("alice", R.CLIENT_INITIATED)
    await world.idle()
    assert (link.state, world.closes) == ("linked", [])
    world.room.remove_participant("bob", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED


async def test_participant_kinds_filter_and_avatar_workers(world: World) -> None:
    link = world.link(participant_kinds=["sip"])
    assert link.participant_kinds == frozenset({"sip"})
    await world.start_session()
    link.start()
    world.room.add_participant("web", kind="standard")
    world.room.add_participant(
        "avatar", kind="sip", attributes={"lk.publish_on_behalf": "agent"}
    )  # publishes for the agent: never the user
    await world.idle()
    assert link.state == "waiting"
    world.room.add_participant("phone", kind="sip")
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "phone")


async def test_default_kinds_skip_agents(world: World) -> None:
    await world.start_session()
    link = world.link()
    assert link.participant_kinds == frozenset({"standard", "sip", "connector"})
    link.start()
    world.room.add_participant("other-agent", kind="agent")
    world.room.add_participant("egress", kind="egress")
    await world.idle()
    assert link.state == "waiting"


async def test_participants_already_in_the_room_are_linked_in_join_order(world: World) -> None:
    world.room.add_participant("bot", kind="agent")
    world.room.add_participant("first")
    world.room.add_participant("second")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "first")


async def test_track_muted_in_either_order_or_garbage_raises_nothing(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    p = world.room.add_participant("u")
    pub = world.room.publish_track("u", "audio")
    await world.start_session()
    link = world.link()
    link.start()
    with caplog.at_level(logging.WARNING):
        for name in ("track_muted", "track_unmuted"):
            world.room.emit(name, p, pub)  # the Python SDK's order
            world.room.emit(name, pub, p)  # other SDKs' order
            world.room.emit(name, "garbage", 42)
            world.room.emit(name)
        world.room.mute_track("u")
        await world.idle()
    assert (link.state, world.closes) == ("linked", [])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_unknown_identities_are_ignored(world: World) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    world.room.emit("participant_disconnected", ghost("nobody"))
    await world.idle()
    assert (link.state, world.closes) == ("linked", [])

    world.room.remove_participant("u", R.SIGNAL_CLOSE)
    world.room.emit("participant_disconnected", ghost("nobody"))
    world.room.emit("participant_disconnected", ghost("u"))  # a second leave of the same user
    await world.idle()
    assert link.state == "grace"
    await world.clock.advance(15.0)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED


async def test_session_closed_for_another_reason_ends_the_link(world: World) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    world.room.remove_participant("u", R.SIGNAL_CLOSE)
    await world.idle()
    await world.session.aclose()
    assert await world.session_closed() == CloseReason.USER_INITIATED
    assert link.state == "closed"
    assert world.clock.pending == 0  # the grace timer died with its state
    await world.clock.advance(60.0)
    assert [c[1] for c in world.closes] == [CloseReason.USER_INITIATED]


async def test_events_after_aclose_change_nothing(world: World) -> None:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    assert link.state == "linked"
    await link.aclose()
    assert link.state == "closed"
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    world.room.add_participant("u")
    await world.idle()
    await world.clock.advance(60.0)
    assert link.state == "closed"
    assert world.closes == []  # the link no longer closes the session
    await link.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        link.start()
    await world.session.aclose()
    assert link.state == "closed"


async def test_start_before_the_session_is_refused_and_hooks_nothing(world: World) -> None:
    before = world.room.listener_count()
    link = world.link()
    with pytest.raises(RuntimeError, match=r"after `await session\.start"):
        link.start()
    assert world.room.listener_count() == before
    await link.aclose()
    assert link.state == "closed"


async def test_aclose_unhooks_everything(world: World) -> None:
    await world.start_session()
    room_hooks = world.room.listener_count()
    session_hooks = len(world.session._events.get("close", ()))
    subscribers = len(world.adapter._subscribers)
    link = world.link()
    link.start()
    assert len(world.adapter._subscribers) == subscribers + 1
    await link.aclose()
    # the shared adapter keeps running for others; nothing of the link is left on it
    assert world.room.listener_count() == room_hooks
    assert len(world.session._events.get("close", ())) == session_hooks
    assert len(world.adapter._subscribers) == subscribers


@pytest.mark.parametrize(
    ("opts", "error", "match"),
    [
        ({"grace_period": -1}, ValueError, "grace_period"),
        ({"grace_period": float("nan")}, ValueError, "grace_period"),
        ({"grace_period": "15"}, ValueError, "grace_period"),
        ({"closing_reasons": ["NOPE"]}, ValueError, "unknown disconnect reason 'NOPE'"),
        ({"closing_reasons": "CLIENT_INITIATED"}, TypeError, "collection"),
        ({"participant_kinds": ["robot"]}, ValueError, "unknown participant kind 'robot'"),
        ({"participant_kinds": []}, ValueError, "empty"),
        ({"participant_identity": ""}, ValueError, "participant_identity"),
        ({"participant_identity": " \t"}, ValueError, "participant_identity: .* whitespace"),
    ],
)
async def test_bad_options_are_refused(
    world: World, opts: dict[str, Any], error: type[Exception], match: str
) -> None:
    before = world.room.listener_count()
    with pytest.raises(error, match=match):
        ParticipantLink(world.session, room_events=world.adapter, **opts)
    with pytest.raises(TypeError, match="RoomEventAdapter"):
        ParticipantLink(world.session, room_events=world.room)  # type: ignore[arg-type]
    assert world.room.listener_count() == before


async def test_options_accept_sdk_enums(world: World) -> None:
    link = world.link(
        participant_kinds=[rtc.ParticipantKind.PARTICIPANT_KIND_SIP, "STANDARD"],
        closing_reasons=[R.ROOM_DELETED, "client_initiated"],
    )
    assert link.participant_kinds == frozenset({"sip", "standard"})
    assert link.closing_reasons == frozenset({"ROOM_DELETED", "CLIENT_INITIATED"})


# -- coexistence with RoomIO's own close_on_disconnect ---------------------------------------


async def test_roomio_alone_relinks_a_rejoin_but_never_closes_on_other_reasons(
    world: World,
) -> None:
    """What upstream does without the link: the job would linger."""
    first = world.room.add_participant("u")
    await world.start_session(close_on_disconnect=True)
    world.room.remove_participant("u", R.CONNECTION_TIMEOUT)
    await world.idle()
    assert world.session.room_io.linked_participant is None
    await world.clock.advance(600.0)
    assert world.closes == []
    again = world.room.add_participant("u")
    await world.idle()
    assert world.session.room_io.linked_participant is again is not first


async def test_with_roomio_closing_too_the_session_closes_once_and_a_warning_says_why(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.room.add_participant("u")
    await world.start_session(close_on_disconnect=True)
    link = world.link()
    with caplog.at_level(logging.WARNING, logger="agent_runtime.participant"):
        link.start()
    assert "RoomOptions(close_on_disconnect=False)" in caplog.text
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    assert len(world.closes) == 1
    assert link.state == "closed"


# -- every cell of the table, through the link's actor ----------------------------------------


@dataclass(frozen=True)
class Case:
    state: str
    event: str
    data: dict[str, Any]
    outcome: str
    dest: str
    effects: tuple[str, ...] = ()
    guards: tuple[str, ...] = ()  # the guards of the row taken
    opts: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.data.items() if k != "attributes")
        opts = ",".join(f"{k}={v}" for k, v in self.opts)
        return f"{self.state}-{self.event}[{extra}]{'{' + opts + '}' if opts else ''}"


U = {"identity": "u", "kind": "standard", "attributes": {}}
V = {"identity": "v", "kind": "standard", "attributes": {}}
BOT = {"identity": "bot", "kind": "agent", "attributes": {}}


def left(identity: str, reason: str) -> dict[str, Any]:
    return {"identity": identity, "kind": "standard", "reason": reason}


CLOSED = ("transition", "closed")
# what the actor posts when the link's close_session effect raises
FAILED = {"effect": "close_session", "outcome": "error", "detail": "RuntimeError: no loop"}
CASES = [
    Case("waiting", "participant_connected", U, "transition", "linked", ("link",), ("eligible",)),
    Case("waiting", "participant_connected", BOT, "transition", "waiting"),
    Case("waiting", "participant_disconnected", left("u", "CLIENT_INITIATED"), "ignore", "waiting"),
    Case("waiting", "grace_timeout", {}, "ignore", "waiting"),
    Case("waiting", "session_close_timeout", {}, "ignore", "waiting"),
    Case("waiting", "close_failed", FAILED, "ignore", "waiting"),
    Case("waiting", "session_closed", {"reason": "error"}, *CLOSED),
    Case("waiting", "close", {}, *CLOSED),
    Case("linked", "participant_connected", V, "ignore", "linked"),
    Case(
        "linked",
        "participant_disconnected",
        left("u", "CLIENT_INITIATED"),
        "transition",
        "closing",
        ("close_session",),
        ("is_linked", "closing_reason"),
    ),
    Case(
        "linked",
        "participant_disconnected",
        left("u", "SIGNAL_CLOSE"),
        "transition",
        "grace",
        (),
        ("is_linked", "grace_enabled"),
    ),
    Case(
        "linked",
        "participant_disconnected",
        left("u", "SIGNAL_CLOSE"),
        "transition",
        "closing",
        ("close_session",),
        ("is_linked",),
        opts=(("grace_period", 0),),
    ),
    Case(
        "linked",
        "participant_disconnected",
        left("v", "CLIENT_INITIATED"),
        "transition",
        "linked",
    ),
    Case("linked", "grace_timeout", {}, "ignore", "linked"),
    Case("linked", "session_close_timeout", {}, "ignore", "linked"),
    Case("linked", "close_failed", FAILED, "ignore", "linked"),
    Case("linked", "session_closed", {"reason": "error"}, *CLOSED),
    Case("linked", "close", {}, *CLOSED),
    Case(
        "grace", "participant_connected", U, "transition", "linked", ("relink",), ("same_identity",)
    ),
    Case("grace", "participant_connected", V, "transition", "grace"),
    Case("grace", "participant_disconnected", left("u", "CLIENT_INITIATED"), "ignore", "grace"),
    Case("grace", "grace_timeout", {}, "transition", "closing", ("close_session",)),
    Case("grace", "session_close_timeout", {}, "ignore", "grace"),
    Case("grace", "close_failed", FAILED, "ignore", "grace"),
    Case("grace", "session_closed", {"reason": "error"}, *CLOSED),
    Case("grace", "close", {}, *CLOSED),
    Case("closing", "participant_connected", U, "ignore", "closing"),
    Case("closing", "participant_disconnected", left("u", "CLIENT_INITIATED"), "ignore", "closing"),
    Case("closing", "grace_timeout", {}, "ignore", "closing"),
    # the session's close hangs: given up on, and the job told (close_timed_out)
    Case(
        "closing",
        "session_close_timeout",
        {"after": 60.0},
        "transition",
        "closed",
        ("report_close_timed_out",),
    ),
    # the session could not be asked to close: given up on at once, and the job told
    Case("closing", "close_failed", FAILED, "transition", "closed", ("report_close_timed_out",)),
    Case("closing", "session_closed", {"reason": "participant_disconnected"}, *CLOSED),
    Case("closing", "close", {}, *CLOSED),
    *[
        Case("closed", e, d, "ignore", "closed")
        for e, d in (
            ("participant_connected", U),
            ("participant_disconnected", left("u", "CLIENT_INITIATED")),
            ("grace_timeout", {}),
            ("session_close_timeout", {}),
            ("close_failed", FAILED),
            ("session_closed", {"reason": "error"}),
            ("close", {}),
        )
    ],
]


@pytest.mark.snapshot  # pins each cell as written
def test_the_cases_cover_every_cell_and_every_row() -> None:
    cells = {(c.state, c.event) for c in CASES}
    assert cells == {(s, e) for s in PARTICIPANT.state_names for e in PARTICIPANT.events}
    taken = {(c.state, c.event, c.guards) for c in CASES if c.outcome == "transition"}
    assert taken == {(r.source, r.event, r.guards) for r in PARTICIPANT.rows}


async def _drive_to(world: World, link: ParticipantLink, state: str) -> None:
    """Reach ``state`` the way it happens in a room."""
    await world.start_session()
    link.start()
    if state == "waiting":
        return
    if state == "closed":
        await world.session.aclose()
        await world.session_closed()
        return
    world.room.add_participant("u")
    await world.idle()
    if state == "grace":
        world.room.remove_participant("u", R.SIGNAL_CLOSE)
    elif state == "closing":
        world.agent.gate = asyncio.Event()  # the session's close waits for on_exit
        world.room.remove_participant("u", R.CLIENT_INITIATED)
    await world.idle()


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_every_cell_through_the_actor(world: World, case: Case) -> None:
    link = world.link(**dict(case.opts))
    await _drive_to(world, link, case.state)
    assert link.state == case.state

    st = await link.actor.send(Event(case.event, case.data))

    assert (st.outcome, st.dest, st.effects) == (case.outcome, case.dest, case.effects)
    if case.outcome == "transition":
        assert st.guards == case.guards
    await world.idle()
    if "close_session" in case.effects:
        # the session closes with the reason the job machine looks for
        if world.agent.gate is not None:
            world.agent.gate.set()
        assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
        assert link.state == "closed"
    else:
        assert link.state == case.dest
    if case.event == "close" or case.dest == "closed":
        assert world.clock.pending == 0  # no timer outlives the link's live states


async def test_a_close_that_cannot_be_asked_ends_the_link_and_says_so(
    world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Asking livekit to close the session raises (fault injected: ``_close_soon`` fails).
    The link took its own failure for the session's close (``session_closed``) and said
    nothing, so whoever wired ``close_timed_out`` to the job's shutdown kept the job
    serving an empty room. Now it gives up on the close at once and says so."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    timed_out: list[SessionCloseTimedOut] = []
    link.on("close_timed_out", timed_out.append)

    def broken(**_: Any) -> None:
        raise RuntimeError("no loop")  # fault injection

    monkeypatch.setattr(world.session, "_close_soon", broken)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.participant"):
        world.room.remove_participant("u", R.CLIENT_INITIATED)
        await world.idle()
    reason = (
        "the session could not be asked to close after participant u left (RuntimeError: no loop)"
    )
    assert link.state == "closed" and world.closes == []
    (told,) = timed_out  # nothing was said: the session "closed"
    assert (told.identity, told.after, told.reason) == ("u", 0.0, reason)
    assert told.error == "RuntimeError: no loop"
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "agent_runtime.actor",
            "participant[r1]: effect 'close_session' failed: RuntimeError: no loop",
        ),
        ("agent_runtime.participant", f"{reason}; the link gives up on it"),
    ]
    assert world.states()[-1] == ("closing", "closed", "close_failed")
    effects = [(r.effect, r.outcome) for r in world.sink.records if r.kind == "effect"]
    assert effects[-2:] == [("close_session", "error"), ("report_close_timed_out", "ok")]
    assert world.clock.pending == 0


async def test_identity_filter_wins_when_roomio_picks_someone_else_in_the_same_tick(
    world: World,
) -> None:
    await world.start_session()  # RoomIO waits for its first participant
    link = world.link(participant_identity="bob")
    link.start()
    world.room.add_participant("alice")  # RoomIO takes her, within the same callback
    bob = world.room.add_participant("bob")
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "bob")
    assert world.session.room_io.linked_participant is bob


async def test_a_close_whose_teardown_fails_ends_the_link_and_says_so(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone, the session's close fails (a plugin raises in its teardown: livekit then
    never emits ``close``). The link took the end of that close for the session's close and
    said nothing; now it gives up on it and says so (``close_timed_out``)."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    timed_out: list[SessionCloseTimedOut] = []
    link.on("close_timed_out", timed_out.append)

    async def failing_teardown(**_: Any) -> None:
        raise RuntimeError("a plugin failed while closing")  # fault injection

    # the session then never emits `close`; the end of its close task is what remains
    monkeypatch.setattr(world.session, "_teardown_activity", failing_teardown)
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    for _ in range(4):
        await world.idle()
    assert world.closes == []
    assert link.state == "closed"
    error = "RuntimeError: a plugin failed while closing"
    (told,) = timed_out  # nothing was said: the session "closed"
    reason = f"the session's close failed after participant u left ({error})"
    assert (told.identity, told.after, told.reason) == ("u", 0.0, reason)
    assert told.error == error
    last = [r for r in world.sink.records if r.kind == "transition"][-1]
    assert (last.event, last.data) == ("close_failed", {"detail": error})


async def test_alone_a_session_stopped_by_a_failed_close_is_given_up_on_when_the_user_leaves(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's own close failed earlier (a plugin raised in its teardown: livekit
    stops the session and never emits ``close``), then the user leaves. The link asks the
    session to close; livekit returns at once, again without ``close``. Alone, the link
    took that for the session's close, went ``closed`` and said nothing, so whoever wired
    ``close_timed_out`` to the job's shutdown kept serving an empty room (the composed job
    gives up on it and shuts down). It says so now."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    timed_out: list[SessionCloseTimedOut] = []
    link.on("close_timed_out", timed_out.append)

    async def failing_teardown(**_: Any) -> None:
        raise RuntimeError("a plugin failed while closing")  # fault injection

    with monkeypatch.context() as patch:
        patch.setattr(world.session, "_teardown_activity", failing_teardown)
        with pytest.raises(RuntimeError, match="a plugin failed while closing"):
            await world.session.aclose()
    assert world.closes == [] and link.state == "linked"
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    for _ in range(4):
        await world.idle()
    assert world.closes == [] and link.state == "closed"
    (told,) = timed_out
    assert told.identity == "u" and told.after == 0.0
    assert told.error is not None and "without closing" in told.error
    assert told.reason == f"the session's close failed after participant u left ({told.error})"
    assert world.states()[-1] == ("closing", "closed", "close_failed")


async def test_alone_the_link_hears_the_sessions_close_once(world: World) -> None:
    """Alone, the link hears the session's ``close`` from its own listener; it also
    followed the end of the close it asked, and told itself again: a second
    ``session_closed`` (``close_finished``) ignored in ``closed``, in every such trace."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link()
    link.start()
    await world.idle()
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    for _ in range(4):
        await world.idle()
    heard = [
        (r.kind, r.source, r.dest, r.data.get("reason"))
        for r in world.sink.records
        if r.machine == "participant" and r.event == "session_closed"
    ]
    assert heard == [("transition", "closing", "closed", "participant_disconnected")]
    # nor is the close it asked, which ended well, taken for a failure after it
    assert not [r for r in world.sink.records if r.event == "close_failed"]


# -- issue 13 item 2: a session close that hangs is bounded ------------------------------------


async def _user_leaves_while_the_close_hangs(world: World, **opts: Any) -> ParticipantLink:
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(grace_period=0, **opts)
    link.start()
    await world.idle()
    world.agent.gate = asyncio.Event()  # AgentSession.aclose() waits for on_exit: forever
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    await world.idle()
    assert link.state == "closing"
    return link


async def test_a_session_close_that_hangs_ends_the_link_and_says_so(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``AgentSession.aclose`` hanging, the link stayed in ``closing`` for good (and the
    job in ``serving``), nothing logged. ``closing`` is bounded by ``session_close_timeout``
    (livekit's own bound on the session's close at job shutdown, 60 s): then the link is
    ``closed``, a warning says so, and ``close_timed_out`` tells whoever composes the job."""
    timed_out: list[SessionCloseTimedOut] = []
    link = await _user_leaves_while_the_close_hangs(world)
    link.on("close_timed_out", timed_out.append)
    await world.clock.advance(59.9)
    assert (link.state, timed_out) == ("closing", [])
    with caplog.at_level(logging.WARNING, logger="agent_runtime.participant"):
        await world.clock.advance(0.1)
        await world.idle()
    assert link.state == "closed" and world.closes == []  # the session is still stuck
    assert timed_out == [
        SessionCloseTimedOut(
            identity="u",
            after=60.0,
            reason="the session did not close within 60s after participant u left",
        )
    ]
    assert [r.getMessage() for r in caplog.records] == [
        "the session did not close within 60s after participant u left; the link gives up on it"
    ]
    assert world.states()[-1] == ("closing", "closed", "session_close_timeout")
    assert world.clock.pending == 0


async def test_a_close_that_hangs_after_grace_is_bounded_too(world: World) -> None:
    """Grace ends, the session's close hangs: the link gives up session_close_timeout
    later, and a user who comes back meanwhile is not linked to the closing session."""
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(grace_period=15.0, session_close_timeout=10.0)
    link.start()
    await world.idle()
    world.agent.gate = asyncio.Event()  # AgentSession.aclose() waits for on_exit: forever
    world.room.remove_participant("u", R.CONNECTION_TIMEOUT)
    await world.idle()
    await world.clock.advance(15.0)
    await world.idle()
    assert link.state == "closing"
    world.room.add_participant("u")  # too late
    await world.idle()
    assert link.state == "closing"
    await world.clock.advance(10.0)
    await world.idle()
    assert link.state == "closed" and world.clock.pending == 0


async def test_session_close_timeout_is_a_setting_with_its_range(world: World) -> None:
    link = await _user_leaves_while_the_close_hangs(world, session_close_timeout=5)
    await world.clock.advance(5)
    await world.idle()
    assert link.state == "closed"
    for bad in (0, -1, math.inf, True):
        with pytest.raises(SettingError, match="session_close_timeout"):
            world.link(session_close_timeout=bad)


async def test_a_hung_session_close_shuts_the_job_down_when_wired(world: World) -> None:
    """How the composed job wires it: the link's ``close_timed_out`` shuts the job down
    with its reason (JobRuntime here; the composed AgentJob does the same)."""
    from agent_runtime.runtimes.job import JobRuntime
    from agent_runtime.testing.inmemory import InMemorySessionTransport

    transport, _simulator_end = InMemorySessionTransport.pair()
    job = JobRuntime(
        room=world.room,
        clock=world.clock,
        transport=transport,
        room_events=world.adapter,
        delete_room=_no_deletion,
    )
    job.attach(world.session)
    await job.start()
    link = await _user_leaves_while_the_close_hangs(world)
    link.on("close_timed_out", lambda ev: job.shutdown(ev.reason))
    await world.clock.advance(60)
    await world.idle()
    await asyncio.wait_for(job.wait_closed(), 5)
    assert (link.state, job.state, job.closed_at) == ("closed", "closed", 60.0)
    await job.aclose()


async def _no_deletion() -> None:
    return None


@pytest.mark.parametrize("where", ["grace", "closing"])
async def test_aclose_while_waiting_on_the_user_or_the_close_ends_the_link_at_once(
    world: World, where: str
) -> None:
    """Released while it waits for a rejoin (grace) or for a hung session close: the link
    says ``closed`` and tells its listeners, and nothing of it fires later."""
    if where == "grace":
        world.room.add_participant("u")
        await world.start_session()
        link = world.link(grace_period=15.0)
        link.start()
        world.room.remove_participant("u", R.SIGNAL_CLOSE)
        await world.idle()
    else:
        link = await _user_leaves_while_the_close_hangs(world)
    assert link.state == where
    timed_out: list[SessionCloseTimedOut] = []
    link.on("close_timed_out", timed_out.append)
    await link.aclose()
    assert link.state == "closed"
    assert world.states()[-1] == (where, "closed", "close")
    await world.clock.advance(120.0)  # past the grace period and the close bound
    assert (world.closes, timed_out) == ([], [])


async def test_a_connector_user_is_linked_by_the_default_kinds_and_a_bridge_is_not(
    world: World,
) -> None:
    """connector is one of livekit's default linkable kinds: the in-memory room refused it."""
    await world.start_session()
    link = world.link()
    link.start()
    world.room.add_participant("bridge-1", kind="bridge")
    await world.idle()
    assert link.state == "waiting"
    world.room.add_participant("phone", kind="connector")
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "phone")
    world.room.remove_participant("phone", R.SIGNAL_CLOSE)
    await world.idle()
    assert link.state == "grace"
    world.room.add_participant("phone", kind="connector")
    await world.idle()
    assert (link.state, link.linked_identity) == ("linked", "phone")


async def _close_heard(*, alone: bool) -> tuple[list[tuple[str, str, str, str]], int, int]:
    """A user leaves (a closing reason) and the link closes the session: the trace's
    transitions of the session and participant machines (machine, event, and the link's
    states), and the listeners on the session's ``close`` while the link follows and once
    it was let go."""
    clock = VirtualClock()
    room = InMemoryRoom(name="r1", clock=clock)
    room.connect_locally()
    room.add_participant("u")
    sink, session = MemorySink(), AgentSession()
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    session.once("close", lambda _: closed.set_result(None))
    if alone:
        adapter = RoomEventAdapter(room)
        opts = RoomOptions(close_on_disconnect=False)
        await session.start(Agent(instructions="agent"), room=room, room_options=opts)
        link = ParticipantLink(session, room_events=adapter, clock=clock, tracer=Tracer(sink))
        link.start()
    else:
        job = AgentJob(room=room, session=session, clock=clock, tracer=Tracer(sink))
        await job.start(Agent(instructions="agent"))
    await settle()
    following = ours(session)
    room.remove_participant("u", R.CLIENT_INITIATED)
    await asyncio.wait_for(closed, 5)
    await settle()
    if alone:
        await link.aclose()
        adapter.aclose()
    else:
        await job.aclose()
    heard = [
        (r.machine, r.event, r.source if r.machine == "participant" else "", r.dest)
        for r in sink.records
        if r.kind == "transition" and r.machine in ("session", "participant")
    ]
    return heard, following, ours(session)


def ours(session: AgentSession) -> int:
    """The runtime's listeners on the session's ``close`` (livekit has its own)."""
    return sum(
        type(fn).__module__.startswith("agent_runtime.")
        for fn in lk.listeners(session).get("close", ())
    )


async def test_alone_the_link_hears_its_sessions_close_by_the_path_a_job_takes() -> None:
    """Used alone, the link listened to its session's ``close`` itself, and in a job the
    session machine's declared link told it: two paths, which differed before (a failed
    close told nobody in one of them). Now a link alone builds a session machine of its
    own: the close reaches the participant machine after the session machine heard it,
    exactly as in a job, and ``aclose()`` lets that machine go: no listener of the link's
    is left on the session."""
    alone, following, left = await _close_heard(alone=True)
    composed, _, _ = await _close_heard(alone=False)
    link_path = [(m, e, s, d) for m, e, s, d in alone if m == "participant"]
    assert link_path == [
        ("participant", "participant_connected", "waiting", "linked"),
        ("participant", "participant_disconnected", "linked", "closing"),
        ("participant", "session_closed", "closing", "closed"),
    ]
    assert link_path == [row for row in composed if row[0] == "participant"]
    closes = [(m, e) for m, e, _, _ in alone if e == "session_closed"]
    assert closes == [("session", "session_closed"), ("participant", "session_closed")]
    assert closes == [(m, e) for m, e, _, _ in composed if e == "session_closed"]
    assert (following, left) == (1, 0)  # its own session machine's, then taken back


async def test_a_trace_of_a_link_used_alone_is_read_by_the_trace_tools(
    world: World, tmp_path: Path
) -> None:
    """A link used alone now traces its own session machine's steps beside its own:
    ``replay`` agrees with both machines, ``record`` and ``timeline`` read the trace."""
    path = tmp_path / "link.jsonl"
    sink = JsonlSink(path)
    world.room.add_participant("u")
    await world.start_session()
    link = world.link(tracer=Tracer(sink))
    link.start()
    await world.idle()
    world.room.remove_participant("u", R.CLIENT_INITIATED)
    assert await world.session_closed() == CloseReason.PARTICIPANT_DISCONNECTED
    await link.aclose()
    sink.close()
    report = replay_file(path)
    assert report.ok and report.instances == {"participant": 1, "session": 1}
    assert main(["record", str(path), "-o", str(tmp_path / "link.yaml")]) == 0
    assert main(["timeline", str(path), "-o", str(tmp_path / "link.html")]) == 0
