"""Job shutdown with a job-owned session host: the verdict is never lost, and the job never
waits on a participant who cannot answer.

Real ``AgentSession`` on an ``InMemoryRoom`` (a real ``rtc.Room`` with no server), livekit's
own ``RemoteSession`` client playing the simulator over a paired in-memory transport that
carries the real protobuf messages, virtual time. Faked, because they need a server: the
room's server-side deletion (an injected ``delete_room``) and the transport's byte stream.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseEvent, CloseReason, UserInputTranscribedEvent
from livekit.agents.voice.remote_session import TOPIC_SESSION_MESSAGES, SessionTransport
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime import Event
from agent_runtime.runtimes.job import JobRuntime
from agent_runtime.runtimes.session_host import NOT_THE_SIMULATOR
from agent_runtime.sdk.session_transport import RoomRequestTransport
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.wire import build_request
from statemachines.system import bound_of
from tests.support.job_rig import DISPATCH, SIM, JobRig, bare_session, session_in


async def test_agent_hangs_up_then_finalize_arrives_verdict_delivered_room_deleted_after() -> None:
    rig = JobRig(delete_room_on_close=True)
    rt = rig.runtime
    session = await session_in(rig.room)
    rt.attach(session)
    await rt.start()
    remote = await rig.remote()
    assert (await remote.get_agent_info()).instructions == "You take orders."

    await session.aclose()  # the agent hangs up (an end-call tool closes user_initiated)
    await rig.settle()
    assert (rt.state, rt.host_state) == ("awaiting_finalize", "detached")

    await rig.clock.advance(20)  # the simulator judges the transcript meanwhile
    assert rt.state == "awaiting_finalize"
    assert rig.room.isconnected() and rig.deletions == []

    resp = await remote.finalize_simulation(provisional_success=True, provisional_reason="polite")
    await rig.settle()
    assert resp.user_verdict.success is False
    assert resp.user_verdict.reason == "orders table does not match the scenario"
    assert [v.reason for v in rig.verdicts_seen] == ["polite"]
    assert rt.finalize_answered
    assert rt.verdict == {"success": False, "reason": "orders table does not match the scenario"}
    # deleted only after the verdict went out, and at that moment (no lingering)
    assert rig.deletions == [(20.0, True)] and rt.room_deleted_at == 20.0
    assert (rt.state, rt.host_state, rt.closed_at) == ("closed", "closed", 20.0)
    assert rig.callbacks == [(20.0, "session closed: user_initiated")]
    assert rig.path() == [
        (0.0, "session_closed", "serving", "awaiting_finalize"),
        (20.0, "finalize_answered", "awaiting_finalize", "closing"),
        (20.0, "close_done", "closing", "closed"),
    ]
    await remote.aclose()
    await rt.aclose()


async def test_simulator_leaves_while_sip_leg_stays_job_closes_at_once() -> None:
    rig = JobRig(others=(("phone-leg", "sip"), ("avatar-worker", "agent")))
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    await session.aclose()
    await rig.settle()
    assert rt.state == "awaiting_finalize"

    await rig.clock.advance(3)
    rig.room.remove_participant("avatar-worker")  # others leaving do not end the hold
    await rig.settle()
    assert rt.state == "awaiting_finalize"

    await rig.clock.advance(2)
    rig.room.remove_participant("simulator")
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 5.0)
    assert "phone-leg" in rig.room.remote_participants
    assert not rt.finalize_answered and rt.verdict is None
    await rt.aclose()


async def test_a_finalize_cut_by_the_close_gets_its_error_reply_before_the_room_goes() -> None:
    """The simulator asked for the verdict, ``on_simulation_end`` never returns, the hold
    ends at ``session_end_timeout``. At the default ``close_timeout`` the host's drain used
    to end at the same instant as its step's share: the step was cut first, the room
    disconnected, and the error reply the simulator is owed found the room gone (silence).
    The drain now ends inside the share: the reply goes out while the room is connected."""
    never = asyncio.Event()

    async def hangs(ctx: Any) -> None:
        await never.wait()

    sent: list[tuple[float, bool]] = []  # (when, room connected) of each reply the job sends
    rigs: list[JobRig] = []

    def watch_replies(end: InMemorySessionTransport) -> InMemorySessionTransport:
        send = end.send_message

        async def watched(msg: agent_pb.AgentSessionMessage, **kw: Any) -> None:
            if msg.HasField("response"):
                sent.append((rigs[0].clock.now(), rigs[0].room.isconnected()))
            await send(msg, **kw)

        end.send_message = watched  # type: ignore[method-assign]
        return end

    rig = JobRig(on_simulation_end=hangs, wrap_transport=watch_replies)
    rigs.append(rig)
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    remote = await rig.remote()
    asked = asyncio.ensure_future(remote.finalize_simulation(provisional_success=True))
    await rig.settle()
    await session.aclose()  # the agent hangs up: the job holds for the verdict
    await rig.settle()
    assert rt.state == "awaiting_finalize"

    await rig.clock.advance(300.0)  # the hold's bound: the close begins, the host drains
    await rig.clock.advance(bound_of("host", 10.0))  # the host step's whole share
    await rig.settle()
    with pytest.raises(RuntimeError, match="did not finish before the session host closed"):
        await asked
    assert sent == [(302.4, True)]  # its drain's end, inside the share, the room still there
    assert not rig.room.isconnected()
    await remote.aclose()
    await rt.aclose()


@pytest.mark.parametrize("timeout", [None, 42.0])
async def test_simulator_neither_answers_nor_leaves_closes_at_session_end_timeout(
    timeout: float | None,
) -> None:
    opts = {} if timeout is None else {"session_end_timeout": timeout}
    rig = JobRig(delete_room_on_close=True, **opts)
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    await session.aclose()
    limit = timeout if timeout is not None else 300.0  # livekit-agents' default
    await rig.clock.advance(limit - 0.5)
    await rig.settle()
    assert rt.state == "awaiting_finalize" and rig.deletions == []
    await rig.clock.advance(0.5)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", limit)
    assert rig.deletions == [(limit, False)]
    assert rig.path()[1] == (limit, "hold_timeout", "awaiting_finalize", "closing")
    await rt.aclose()


@pytest.mark.parametrize("meanwhile", ["shutdown_again", "session_closes"])
async def test_what_happens_during_the_hold_does_not_extend_it(meanwhile: str) -> None:
    """Asked to shut down again (the app and the session both ask), or the session the job
    kept serving closing: the hold still ends session_end_timeout after the first ask."""
    rig = JobRig(session_end_timeout=30.0)
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    rt.shutdown("entrypoint done")
    await rig.settle()
    assert rt.state == "awaiting_finalize"
    await rig.clock.advance(20)
    if meanwhile == "shutdown_again":
        rt.shutdown("asked again")
    else:
        await session.aclose()
    await rig.settle()
    await rig.clock.advance(10)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 30.0)
    assert [r for _, r in rig.callbacks] == ["entrypoint done"]  # the first reason given
    await rt.aclose()


async def test_a_job_whose_close_was_cut_leaves_the_room_when_not_asked_to_delete() -> None:
    """The close work hangs and is cut at close_timeout, before the room work: releasing
    the job afterwards deletes nothing (nobody asked)."""
    rig = JobRig(simulation=None, close_timeout=4.0)
    rt = rig.runtime
    rt.add_shutdown_callback(asyncio.Event().wait)
    await rt.start()
    rt.shutdown("done")
    await rig.clock.advance(4)
    await rig.settle()
    assert rt.state == "closed"
    await rt.aclose()
    assert rig.deletions == [] and rt.room_deleted_at is None


async def test_the_room_disconnecting_while_serving_ends_the_job_at_once() -> None:
    rig = JobRig(session_end_timeout=30.0)
    rt = rig.runtime
    await rt.start()
    await rig.clock.advance(4)
    rig.room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 4.0)  # no hold: nothing left to hold for
    assert len(rig.callbacks) == 1 and rig.callbacks[0][0] == 4.0
    await rt.aclose()


async def test_room_disconnecting_during_the_hold_ends_it() -> None:
    rig = JobRig()
    rt = rig.runtime
    await rt.start()
    rt.shutdown("entrypoint done")
    await rig.settle()
    assert rt.state == "awaiting_finalize"
    await rig.clock.advance(7)
    rig.room.disconnect_locally(rtc.DisconnectReason.SIGNAL_CLOSE)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 7.0)
    assert rig.path()[1] == (7.0, "room_disconnected", "awaiting_finalize", "closing")
    assert rig.callbacks == [(7.0, "entrypoint done")]
    await rt.aclose()


async def test_ordinary_shutdown_without_simulation_does_not_hold() -> None:
    # even with a participant carrying the attribute: not a simulation job, no hold
    rig = JobRig(simulation=None, delete_room_on_close=True)
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    await session.aclose()
    await rig.settle()
    assert (rt.state, rt.closed_at, rt.room_deleted_at) == ("closed", 0.0, 0.0)
    assert [p[3] for p in rig.path()] == ["closing", "closed"]
    assert not rig.room.isconnected()
    await rt.aclose()


async def test_simulation_without_a_simulator_in_the_room_does_not_hold() -> None:
    rig = JobRig(simulator=False, others=(("phone-leg", "sip"),))
    await rig.runtime.start()
    rig.runtime.shutdown("done")
    await rig.settle()
    assert rig.runtime.state == "closed"
    await rig.runtime.aclose()


async def test_simulator_attribute_set_after_join_counts() -> None:
    rig = JobRig(simulator=False)
    rig.room.add_participant("late-sim")
    await rig.runtime.start()
    rig.room.set_participant_attributes("late-sim", SIM)
    rig.runtime.shutdown("done")
    await rig.settle()
    assert rig.runtime.state == "awaiting_finalize"
    assert rig.runtime.simulators == {"late-sim"}
    rig.room.remove_participant("late-sim")
    await rig.settle()
    assert rig.runtime.state == "closed"
    await rig.runtime.aclose()


async def test_finalize_answered_before_shutdown_means_no_hold() -> None:
    rig = JobRig()
    rt = rig.runtime
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    remote = await rig.remote()
    await remote.finalize_simulation(provisional_success=True)
    await rig.settle()
    assert rt.state == "serving" and rt.finalize_answered
    await session.aclose()
    await rig.settle()
    assert rt.state == "closed"
    assert "awaiting_finalize" not in [p[3] for p in rig.path()]
    await remote.aclose()
    await rt.aclose()


async def test_shutdown_while_the_session_is_live_keeps_serving_it_during_the_hold() -> None:
    rig = JobRig()
    rt = rig.runtime
    session = await bare_session("I am still here")
    rt.attach(session)
    await rt.start()
    rt.shutdown("job asked to end")
    await rig.settle()
    assert (rt.state, rt.host_state) == ("awaiting_finalize", "attached")
    remote = await rig.remote()
    assert (await remote.get_agent_info()).instructions == "I am still here"
    await remote.finalize_simulation(provisional_success=False, provisional_reason="rude")
    await rig.settle()
    assert rt.state == "closed"
    await remote.aclose()
    await session.aclose()
    await rt.aclose()


# -- sessions attached to the job --------------------------------------------------------------


async def test_attach_a_then_b_only_b_reaches_the_client_and_only_b_ends_the_job() -> None:
    rig = JobRig()
    rt = rig.runtime
    a, b = await bare_session("I am A"), await bare_session("I am B")
    rt.attach(a)
    await rt.start()
    rt.attach(b)
    await rig.settle()
    heard: list[str] = []
    remote = await rig.remote()
    remote.on(
        "user_input_transcribed", lambda ev: heard.append(ev.user_input_transcribed.transcript)
    )
    for s, text in ((a, "from A"), (b, "from B")):
        s.emit("user_input_transcribed", UserInputTranscribedEvent(transcript=text, is_final=True))
    await rig.settle()
    assert heard == ["from B"]
    assert (await remote.get_agent_info()).instructions == "I am B"

    await a.aclose()  # the replaced session ends: not the job's session any more
    await rig.settle()
    assert (rt.state, rt.host_state) == ("serving", "attached")
    assert rt.host.session is b

    await b.aclose()
    await rig.settle()
    assert (rt.state, rt.host_state) == ("awaiting_finalize", "detached")
    await remote.aclose()
    rig.room.remove_participant("simulator")
    await rig.settle()
    await rt.aclose()


async def test_requests_while_detached_during_the_hold() -> None:
    rig = JobRig()
    rt = rig.runtime
    await rt.start()  # nothing ever attached
    remote = await rig.remote()
    with pytest.raises(RuntimeError, match="no active session"):
        await remote.get_chat_history()
    rt.shutdown("done")
    await rig.settle()
    with pytest.raises(RuntimeError, match="no active session"):
        await remote.get_session_state()
    fin = await remote.finalize_simulation(provisional_success=True)
    assert fin.user_verdict.reason == "orders table does not match the scenario"
    await rig.settle()
    assert rt.state == "closed"
    await remote.aclose()
    await rt.aclose()


# -- closing -------------------------------------------------------------------------------


@pytest.mark.parametrize("late", ["shutdown", "simulator_left", "room_disconnected"])
async def test_what_happens_while_closing_does_not_extend_its_bound(late: str) -> None:
    """The close hangs; asked again, the simulator leaving or the room going meanwhile,
    it is still cut close_timeout after it began."""
    rig = JobRig(simulation=None, close_timeout=4.0)
    rt = rig.runtime
    never = asyncio.Event()
    rt.add_shutdown_callback(never.wait)
    await rt.start()
    rt.shutdown("done")
    await rig.settle()
    assert rt.state == "closing"
    await rig.clock.advance(3)
    if late == "shutdown":
        rt.shutdown("again")
    elif late == "simulator_left":
        assert "simulator" in rig.room.remote_participants
        rig.room.remove_participant("simulator")
    else:
        rig.room.disconnect_locally(rtc.DisconnectReason.SIGNAL_CLOSE)
    await rig.settle()
    await rig.clock.advance(1)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 4.0)
    await rt.aclose()


def _job_changes(rt: JobRuntime) -> list[tuple[str, str]]:
    """What a user's ``state_changed`` listener sees of the job machine from now on."""
    seen: list[tuple[str, str]] = []
    rt.on(
        "state_changed",
        lambda sc: seen.append((sc.source, sc.dest)) if sc.machine == "job" else None,
    )
    return seen


async def test_a_verdict_delivered_while_the_host_drains_does_not_restart_the_close() -> None:
    """The simulator leaves while ``on_simulation_end`` still runs: the job closes, and the
    host's drain waits for the answer. The verdict going out during that drain is
    reported to a job already closing: the close runs once (one shutdown callback), ends
    when its work is done, and the job's path has no second close in it."""
    gate = asyncio.Event()

    async def judge(ctx: Any) -> None:
        await gate.wait()  # a model call
        ctx.fail("too slow to answer")

    rig = JobRig(on_simulation_end=judge, close_timeout=10.0)
    rt = rig.runtime
    changes = _job_changes(rt)
    await rt.start()
    req = build_request("finalize_simulation", {"provisional_success": True}, request_id="f")
    await rig.sim_end.send_message(agent_pb.AgentSessionMessage(request=req))
    await rig.settle()
    rig.room.remove_participant("simulator")
    await rig.settle()
    assert rt.state == "closing"
    await rig.clock.advance(1.0)
    gate.set()
    await rig.clock.advance(1.0)
    seen = [r.source for r in rig.sink.records if r.event == "finalize_answered" and r.source]
    assert seen == ["closing"]  # the cell this test is about
    await rig.clock.advance(10.0)
    await rig.settle()
    assert rt.state == "closed" and rt.closed_at == 1.0 and rt.finalize_answered
    assert len(rig.callbacks) == 1
    assert changes == [("serving", "closing"), ("closing", "closed")]
    await rt.aclose()


@pytest.mark.parametrize("first", ["shutdown", "close"])
async def test_the_session_closing_as_the_job_shuts_down_closes_it_once(first: str) -> None:
    """The user hangs up in the very instant the job is asked to shut down. The close runs
    once, at once, and the job's path has one close in it, in either order. The session's
    close reaches the host one step after livekit's event (the session machine tells it):
    after a shutdown asked first the host is already closing and no longer hears it (the
    job is ending anyway); a close that came first reaches the job while it closes."""
    rig = JobRig(simulation=None, close_timeout=10.0)
    rt = rig.runtime
    changes = _job_changes(rt)
    session = await session_in(rig.room)
    rt.attach(session)
    await rt.start()
    if first == "shutdown":
        rt.shutdown("done")
    session.emit("close", CloseEvent(reason=CloseReason.USER_INITIATED))
    if first == "close":
        rt.shutdown("done")
    await rig.settle()
    heard = {
        (r.machine, r.kind, r.source)
        for r in rig.sink.records
        if r.event == "session_closed" and r.machine in ("job", "session_host")
    }
    if first == "close":
        assert ("job", "ignore", "closing") in heard  # the job's cell (closing, ...)
    else:
        assert heard == {("session_host", "ignore", "closing")}  # "already unsubscribed"
    await rig.clock.advance(10.0)
    assert (rt.state, rt.closed_at) == ("closed", 0.0)
    assert [reason for _, reason in rig.callbacks] == ["done"]
    assert changes == [("serving", "closing"), ("closing", "closed")]
    await rt.aclose()


async def test_closing_is_bounded_by_close_timeout() -> None:
    rig = JobRig(simulation=None, close_timeout=4.0)
    rt = rig.runtime
    never = asyncio.Event()
    cancelled: list[bool] = []

    async def hangs() -> None:
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    rt.add_shutdown_callback(hangs)
    await rt.start()
    rt.shutdown("done")
    await rig.settle()
    assert rt.state == "closing"
    await rig.clock.advance(4)
    await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 4.0)
    assert cancelled == [True] and rt.actor.live_tasks == 0
    assert rig.path()[-1] == (4.0, "close_timeout", "closing", "closed")
    await rt.aclose()


async def test_room_deletion_requested_early_waits_for_the_hold() -> None:
    rig = JobRig()
    rt = rig.runtime
    await rt.start()
    rt.request_room_deletion()  # an end-call tool with delete_room=True
    rt.shutdown("end call")
    await rig.clock.advance(30)
    assert rig.deletions == [] and rig.room.isconnected()
    remote = await rig.remote()
    await remote.finalize_simulation(provisional_success=True)
    await rig.settle()
    assert rig.deletions == [(30.0, True)]
    await remote.aclose()
    await rt.aclose()


async def test_deletion_requested_after_close_runs_at_once() -> None:
    rig = JobRig(simulation=None)
    await rig.runtime.start()
    rig.runtime.shutdown("done")
    await rig.settle()
    assert rig.runtime.state == "closed" and rig.deletions == []
    rig.runtime.request_room_deletion()
    await rig.runtime.aclose()
    assert rig.deletions == [(0.0, False)]


async def test_failing_deletion_and_callbacks_do_not_stop_the_close() -> None:
    async def fails() -> None:
        raise RuntimeError("server said no")

    rig = JobRig(simulation=None, delete_room=fails)
    rig.runtime.add_shutdown_callback(fails)
    await rig.runtime.start()
    rig.runtime.request_room_deletion()
    rig.runtime.shutdown("done")
    await rig.settle()
    assert rig.runtime.state == "closed" and rig.runtime.room_deleted_at is None
    assert rig.callbacks == [(0.0, "done")]
    await rig.runtime.aclose()


async def test_aclose_releases_room_and_session_listeners() -> None:
    rig = JobRig(simulation=None)
    session: AgentSession[Any] = AgentSession()
    before_room = rig.room.listener_count()
    before_session = sum(len(v) for v in session._events.values())
    rig.runtime.attach(session)
    await rig.runtime.start()
    await rig.settle()
    assert rig.room.listener_count() > before_room
    await rig.runtime.aclose()
    assert rig.room.listener_count() == before_room
    assert sum(len(v) for v in session._events.values()) == before_session
    assert rig.clock.pending == 0


# -- bad input --------------------------------------------------------------------------------


async def test_bad_options_and_arguments_get_clear_errors() -> None:
    room = InMemoryRoom()
    with pytest.raises(TypeError, match=r"rtc\.Room"):
        JobRuntime(room="room")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="session_end_timeout"):
        JobRuntime(room=room, session_end_timeout=-1)
    with pytest.raises(ValueError, match="close_timeout"):
        JobRuntime(room=room, close_timeout="10")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delete_room"):
        JobRuntime(room=room, delete_room="yes")  # type: ignore[arg-type]
    rig = JobRig(simulation=None)
    rt = rig.runtime
    await rt.start()
    with pytest.raises(TypeError, match="AgentSession"):
        rt.attach(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        rt.add_shutdown_callback(3)  # type: ignore[arg-type]
    # one it could not call at the close is refused now, not logged as failed then
    with pytest.raises(TypeError, match="must take the job's reason or no argument"):
        rt.add_shutdown_callback(lambda reason, other: None)
    with pytest.raises(TypeError, match="reason"):
        rt.shutdown(5)  # type: ignore[arg-type]
    await rig.settle()
    assert (rt.state, rt.host_state) == ("serving", "detached")
    with pytest.raises(RuntimeError, match=r"serving, not closed: aclose\(\)"):
        await rt.release()  # it would skip the close: the host and listeners stay
    await rig.settle()
    assert (rt.state, rt.host_state) == ("serving", "detached")
    rt.shutdown("done")
    await rig.settle()
    with pytest.raises(RuntimeError, match="closed"):
        rt.attach(AgentSession())
    with pytest.raises(RuntimeError, match="closed"):
        rt.add_shutdown_callback(lambda: None)
    rt.shutdown("again")  # nothing crashes after closed
    await rt.aclose()


async def test_a_session_hosting_itself_is_refused_with_the_fix_named() -> None:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions="agent"), room=room)  # session_host left on
    rt = JobRuntime(room=room, clock=clock)
    with pytest.raises(ValueError, match="session_host=False"):
        rt.attach(session)
    with pytest.raises(RuntimeError, match="session_host=False"):
        await rt.start()  # the session's own host holds the lk.agent.session topic
    await session.aclose()


async def test_a_failing_state_listener_does_not_stop_the_job() -> None:
    rig = JobRig(simulation=None)

    def broken(_sc: Any) -> None:
        raise RuntimeError("listener bug")

    rig.runtime.on("state_changed", broken)
    await rig.runtime.start()
    rig.runtime.shutdown("done")
    await rig.settle()
    assert rig.runtime.state == "closed" and rig.callbacks == [(0.0, "done")]
    await rig.runtime.aclose()


# -- production transport and the livekit-agents job ----------------------------------------


async def test_default_transport_is_the_room_byte_stream_topic() -> None:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    rt = JobRuntime(room=room, clock=clock)
    # livekit's byte stream on lk.agent.session, each message with its sender's identity
    assert isinstance(rt.host._transport, RoomRequestTransport)
    session = await bare_session("agent")
    rt.attach(session)
    await rt.start()
    await settle()
    session.emit(
        "user_input_transcribed", UserInputTranscribedEvent(transcript="hi", is_final=True)
    )
    await settle()
    sent = [
        agent_pb.AgentSessionMessage.FromString(data)
        for _, data, _ in room.local_participant.sent_bytes
    ]
    topics = {topic for topic, _, _ in room.local_participant.sent_bytes}
    assert topics == {TOPIC_SESSION_MESSAGES}
    assert [
        m.event.user_input_transcribed.transcript
        for m in sent
        if m.event.HasField("user_input_transcribed")
    ] == ["hi"]
    await session.aclose()
    await rt.aclose()


# -- every cell of the table, through the actor -------------------------------------------

CELLS: dict[tuple[str, str], tuple[str, str]] = {
    ("serving", "shutdown"): ("transition", "closing"),
    ("serving", "shutdown:hold"): ("transition", "awaiting_finalize"),
    ("serving", "abort"): ("transition", "closing"),  # a simulator there: no hold all the same
    ("serving", "session_closed"): ("transition", "closing"),
    ("serving", "session_closed:hold"): ("transition", "awaiting_finalize"),
    ("serving", "finalize_answered"): ("ignore", "serving"),
    ("serving", "simulator_left"): ("transition", "closing"),
    ("serving", "room_disconnected"): ("transition", "closing"),
    ("serving", "hold_timeout"): ("ignore", "serving"),
    ("serving", "close_done"): ("ignore", "serving"),
    ("serving", "close_timeout"): ("ignore", "serving"),
    ("awaiting_finalize", "shutdown"): ("ignore", "awaiting_finalize"),
    ("awaiting_finalize", "abort"): ("transition", "closing"),
    ("awaiting_finalize", "session_closed"): ("ignore", "awaiting_finalize"),
    ("awaiting_finalize", "finalize_answered"): ("transition", "closing"),
    ("awaiting_finalize", "simulator_left"): ("transition", "closing"),
    ("awaiting_finalize", "room_disconnected"): ("transition", "closing"),
    ("awaiting_finalize", "hold_timeout"): ("transition", "closing"),
    ("awaiting_finalize", "close_done"): ("ignore", "awaiting_finalize"),
    ("awaiting_finalize", "close_timeout"): ("ignore", "awaiting_finalize"),
    **{
        ("closing", e): ("ignore", "closing")
        for e in (
            "shutdown",
            "abort",
            "session_closed",
            "finalize_answered",
            "simulator_left",
            "room_disconnected",
            "hold_timeout",
        )
    },
    ("closing", "close_done"): ("transition", "closed"),
    ("closing", "close_timeout"): ("transition", "closed"),
    **{
        ("closed", e): ("ignore", "closed")
        for e in (
            "shutdown",
            "abort",
            "session_closed",
            "finalize_answered",
            "simulator_left",
            "room_disconnected",
            "hold_timeout",
            "close_done",
            "close_timeout",
        )
    },
}


@pytest.mark.snapshot  # pins each cell as written
def test_every_cell_of_the_spec_is_in_the_cell_table() -> None:
    from statemachines.job import JOB

    covered = {(s, t.split(":")[0]) for s, t in CELLS}
    assert covered == {(s, e) for s in JOB.state_names for e in JOB.events}


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize(("state", "trigger"), list(CELLS), ids=[f"{s}-{t}" for s, t in CELLS])
async def test_cell(state: str, trigger: str) -> None:
    outcome, dest = CELLS[(state, trigger)]
    event = trigger.split(":")[0]
    no_hold = state == "serving" and event in ("shutdown", "session_closed") and trigger == event
    rig = JobRig(simulator=not no_hold, close_timeout=10.0, session_end_timeout=60.0)
    rt = rig.runtime
    gate = asyncio.Event()
    if state == "closing":
        rt.add_shutdown_callback(gate.wait)  # keeps the job in closing until the gate opens
    session: AgentSession[Any] = AgentSession()
    rt.attach(session)
    await rt.start()
    if state in ("awaiting_finalize", "closed"):
        rt.shutdown("setup")
    elif state == "closing":
        rig.room.remove_participant("simulator")
    await rig.settle()
    if state == "closed" and rt.state == "awaiting_finalize":
        rig.room.remove_participant("simulator")
        await rig.settle()
    assert rt.state == state
    mark = len(rig.sink.records)
    host_open = rt.host_state != "closed"

    if event == "shutdown":
        rt.shutdown("asked")
    elif event == "abort":
        rt.abort()
    elif event == "session_closed" and host_open:
        session.emit("close", CloseEvent(reason=CloseReason.USER_INITIATED))
    elif event == "finalize_answered" and host_open:
        req = build_request("finalize_simulation", {"provisional_success": True}, request_id="f")
        await rig.sim_end.send_message(agent_pb.AgentSessionMessage(request=req))
    elif event == "simulator_left" and "simulator" in rig.room.remote_participants:
        rig.room.remove_participant("simulator")
    elif event == "room_disconnected" and rig.room.isconnected():
        rig.room.disconnect_locally(rtc.DisconnectReason.SIGNAL_CLOSE)
    elif event == "hold_timeout" and state == "awaiting_finalize":
        await rig.clock.advance(60)
    elif event == "close_done" and state == "closing":
        gate.set()
    elif event == "close_timeout" and state == "closing":
        await rig.clock.advance(10)
    else:  # nothing in the world produces it in this state any more: post it as a stale one
        rt.actor.post(Event(event, {"reason": "late"}))
    await rig.settle()

    recs = [
        r
        for r in rig.sink.records[mark:]
        if r.machine == "job" and r.event == event and r.kind in ("transition", "ignore")
    ]
    assert recs, f"the job never saw {event}"
    assert (recs[0].kind, recs[0].source, recs[0].dest) == (outcome, state, dest)
    gate.set()
    if "simulator" in rig.room.remote_participants:  # it may have left, or never came
        rig.room.remove_participant("simulator")
    rt.shutdown("teardown")
    await rig.clock.advance(100)
    await rt.aclose()
    assert rt.state == "closed" and rt.actor.live_tasks == 0


async def test_trace_path_writes_a_replayable_production_trace(tmp_path: Path) -> None:
    """A trace written by a live JobRuntime replays with no divergence."""
    from agent_runtime.testing.inmemory import InMemoryRoom
    from agent_runtime.tools.replay import replay_file

    clock = VirtualClock()
    room = InMemoryRoom(clock=clock)
    room.connect_locally()
    path = tmp_path / "job.jsonl"
    runtime = JobRuntime(room=room, clock=clock, trace_path=path, delete_room=_noop_delete)
    assert runtime.tracer is not None
    await runtime.start()
    runtime.shutdown("done")
    await clock.advance(0)
    await runtime.wait_closed()
    await runtime.aclose()
    report = replay_file(path)
    assert report.ok and report.decisions >= 2


async def _noop_delete() -> None:
    return None


# -- a close cut at its bound says what it cut off ---------------------------------------------


async def test_a_hung_shutdown_callback_is_cut_at_close_timeout_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def never_returns() -> None:
        await asyncio.Event().wait()

    rig = JobRig(simulation=None, close_timeout=4.0)
    rt = rig.runtime
    rt.add_shutdown_callback(never_returns)
    await rt.start()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rt.shutdown("done")
        await rig.clock.advance(4)
        await rig.settle()
    assert (rt.state, rt.closed_at) == ("closed", 4.0)
    cut = [r for r in caplog.records if r.name == "agent_runtime.job"]
    assert [(r.levelno, r.getMessage()) for r in cut] == [
        (
            logging.WARNING,
            "job[sim-room]: closing the job was cut off after 4s (close_timeout): shutdown "
            f"callback {never_returns.__qualname__} had not returned",
        )
    ]
    await rt.aclose()


async def test_a_failing_shutdown_callback_is_logged_though_another_one_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # its failure was logged only once every callback had returned: never, when the close
    # was cut at its bound
    async def never_returns() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ValueError("the upload's bucket is gone")

    rig = JobRig(simulation=None, close_timeout=4.0)
    rt = rig.runtime
    rt.add_shutdown_callback(never_returns)
    rt.add_shutdown_callback(fails)
    await rt.start()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rt.shutdown("done")
        await rig.clock.advance(4)
        await rig.settle()
    assert rt.state == "closed"
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "agent_runtime.job"]
    assert logged[0] == (
        logging.ERROR,
        f"job[sim-room]: shutdown callback {fails.__qualname__} failed",
    )
    failed = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], ValueError)
    assert logged[1][0] == logging.WARNING and "never_returns had not returned" in logged[1][1]
    await rt.aclose()


async def test_a_shutdown_callback_raising_a_base_exception_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Abandoned(BaseException):
        pass

    async def abandons() -> None:
        raise Abandoned("a library's own BaseException")

    rig = JobRig(simulation=None)
    rt = rig.runtime
    rt.add_shutdown_callback(abandons)
    await rt.start()
    with caplog.at_level(logging.ERROR, logger="agent_runtime"):
        rt.shutdown("done")
        await rig.clock.advance(1)
        await rig.settle()
    assert rt.state == "closed"
    (failed,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], Abandoned)
    await rt.aclose()


async def test_a_hung_room_deletion_is_cut_at_its_share_and_the_callbacks_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def never_answers() -> None:
        await asyncio.Event().wait()

    rig = JobRig(simulation=None, close_timeout=4.0, delete_room=never_answers)
    rt = rig.runtime
    await rt.start()
    rt.request_room_deletion()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rt.shutdown("done")
        await rig.clock.advance(4)
        await rig.settle()
    # the room step's share of close_timeout cut the wait, not the whole close: the
    # callbacks ran and the job closed then; the deletion itself ends at its own bound
    share = bound_of("room", 4.0)
    assert 0 < share < 4.0
    assert (rt.state, rt.closed_at, rt.room_deleted_at) == ("closed", share, None)
    assert rig.callbacks == [(share, "done")]
    assert rt.deletion.state == "abandoned"
    warnings = {r.name: r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}
    assert warnings == {
        "agent_runtime.job": f"job[sim-room]: closing room took longer than {share:g}s; cut "
        "off, the close goes on (the room deletion had not returned)",
        "agent_runtime.room_deletion": "room_deletion[sim-room]: deleting the room was cut off "
        "after 4s "
        "(close_timeout): the server did not answer",
    }
    await rt.aclose()


async def test_a_job_without_delete_room_on_close_never_deletes_the_room() -> None:
    """The close work allows a deletion nobody asked for; releasing the job then must not
    run one."""
    rig = JobRig(simulation=None)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("done")
    await rig.settle()
    assert (rt.state, rt.deletion.state) == ("closed", "allowed")
    await rt.aclose()
    await rig.settle()
    await rig.clock.advance(60)
    assert (rt.deletion.state, rt.room_deleted_at, rig.deletions) == ("closed", None, [])


# -- only the simulator gets the verdict -------------------------------------------------------


async def test_a_finalize_from_anyone_but_the_simulator_is_refused_and_changes_nothing() -> None:
    rig = JobRig(delete_room_on_close=True, others=(("user", "standard"),))
    rt = rig.runtime
    await rt.start()
    rt.shutdown("end call")
    await rig.settle()
    assert rt.state == "awaiting_finalize"
    # a participant without the lk.simulator attribute asks for the verdict
    req = build_request("finalize_simulation", {"provisional_success": True}, request_id="x")
    await rig.sim_end.send_message(agent_pb.AgentSessionMessage(request=req), sender="user")
    await rig.settle()
    (reply,) = rig.sim_end.receive_nowait()
    assert (reply.response.request_id, reply.response.error) == ("x", NOT_THE_SIMULATOR)
    assert rig.verdicts_seen == []  # on_simulation_end did not run
    assert (rt.state, rt.finalize_answered, rig.deletions) == ("awaiting_finalize", False, [])
    await rig.clock.advance(5)
    # the real simulator's finalize afterwards is answered, and only then does the job close
    remote = await rig.remote()
    resp = await remote.finalize_simulation(provisional_success=True)
    await rig.settle()
    assert resp.user_verdict.reason == "orders table does not match the scenario"
    assert (rt.state, rt.closed_at, rig.deletions) == ("closed", 5.0, [(5.0, True)])
    await remote.aclose()
    await rt.aclose()


class _SenderBlind(SessionTransport):
    """A transport as livekit's ``SessionTransport`` defines one: messages, no senders."""

    def __init__(self, inner: InMemorySessionTransport) -> None:
        self._inner = inner

    async def start(self) -> None:
        await self._inner.start()

    async def send_message(self, msg: agent_pb.AgentSessionMessage) -> None:
        await self._inner.send_message(msg)

    async def close(self) -> None:
        await self._inner.close()

    def __aiter__(self) -> _SenderBlind:
        return self

    async def __anext__(self) -> agent_pb.AgentSessionMessage:
        return await self._inner.__anext__()


async def test_a_transport_that_names_no_sender_gets_every_finalize_refused() -> None:
    rig = JobRig(wrap_transport=_SenderBlind)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("end call")
    await rig.settle()
    # even the simulator's own finalize: over this transport nobody can tell who sent it
    req = build_request("finalize_simulation", {"provisional_success": True}, request_id="x")
    await rig.sim_end.send_message(agent_pb.AgentSessionMessage(request=req))
    await rig.settle()
    (reply,) = rig.sim_end.receive_nowait()
    assert (reply.response.request_id, reply.response.error) == ("x", NOT_THE_SIMULATOR)
    assert rig.verdicts_seen == []  # on_simulation_end did not run
    assert (rt.state, rt.finalize_answered) == ("awaiting_finalize", False)
    # the hold then ends at its bound, as when no simulator asks
    await rig.clock.advance(300)
    await rig.settle()
    assert (rt.state, rt.finalize_answered) == ("closed", False)
    await rt.aclose()


class _StreamFromTheRoom:
    """What ``rtc.Room`` hands a byte stream handler: one stream's chunks (a real
    ``ByteStreamReader`` reads them from the FFI, which needs a server)."""

    def __init__(self, data: bytes) -> None:
        self._chunks = [data[:5], data[5:]]
        self.closed = False

    def __aiter__(self) -> _StreamFromTheRoom:
        return self

    async def __anext__(self) -> bytes:
        if not self._chunks:
            self.closed = True
            raise StopAsyncIteration
        return self._chunks.pop(0)

    def close(self) -> None:
        self.closed = True


async def test_over_the_room_the_sender_of_each_byte_stream_decides() -> None:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("simulator", attributes=SIM)
    room.add_participant("user")
    rt = JobRuntime(room=room, clock=clock, simulation=DISPATCH)
    await rt.start()
    handler = room._byte_stream_handlers[TOPIC_SESSION_MESSAGES]

    def stream(request_id: str) -> Any:
        req = build_request(
            "finalize_simulation", {"provisional_success": True}, request_id=request_id
        )
        return _StreamFromTheRoom(agent_pb.AgentSessionMessage(request=req).SerializeToString())

    def replies() -> dict[str, agent_pb.SessionResponse]:
        msgs = [
            agent_pb.AgentSessionMessage.FromString(d)
            for _, d, _ in room.local_participant.sent_bytes
        ]
        return {m.response.request_id: m.response for m in msgs if m.HasField("response")}

    handler(stream("from-user"), "user")  # the identity the server stamped on the stream
    await settle()
    assert replies()["from-user"].error == NOT_THE_SIMULATOR and not rt.finalize_answered
    handler(stream("from-simulator"), "simulator")
    await settle()
    answer = replies()["from-simulator"]
    assert not answer.HasField("error") and answer.HasField("finalize_simulation")
    assert rt.finalize_answered
    await rt.aclose()
    assert TOPIC_SESSION_MESSAGES not in room._byte_stream_handlers


async def test_a_part_given_with_its_own_ingredients_is_refused_and_builds_nothing() -> None:
    """A composer hands the job its host and deletion (``JobSystem``); handing a part and
    what would build it too is ambiguous: a clear error, nothing subscribed."""
    room = InMemoryRoom(name="r")
    alone = JobRuntime(room=room)  # builds its own host and deletion, and forwards them
    listeners = room.listener_count()

    async def delete() -> None:
        return None

    with pytest.raises(ValueError, match="give a host, or its transport"):
        JobRuntime(room=room, host=alone.host, transport=InMemorySessionTransport())
    with pytest.raises(ValueError, match="give a deletion, or delete_room"):
        JobRuntime(room=room, deletion=alone.deletion, delete_room=delete)
    with pytest.raises(ValueError, match="delete_room_on_close is the wiring's flag"):
        JobRuntime(room=room, wiring=alone.wiring, delete_room_on_close=True)
    assert room.listener_count() == listeners
