"""The job-owned session host, over a paired in-memory transport carrying the real protobuf
``AgentSessionMessage`` bytes. The simulator side is either livekit's own ``RemoteSession``
client or raw messages (for what a well-behaved client never sends). Real ``AgentSession``s;
virtual time. The only stand-in is the transport itself (a room byte stream needs a server).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from unittest.mock import patch

import pytest
from livekit.agents import (
    AgentSession,
)
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.voice.remote_session import RemoteSession, SessionHost

from agent_runtime import Event, EventRejected
from agent_runtime.runtimes.session_host import (
    FINALIZE_UNFINISHED,
    HOST_CLOSING,
    NO_ACTIVE_SESSION,
    NOT_THE_SIMULATOR,
    JobSessionHost,
    request_problem,
    simulation_context,
)
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemorySessionTransport
from agent_runtime.testing.wire import build_request
from tests.support.host_rig import DISPATCH, Rig, listeners, say, started_session

# -- requests with nothing attached --------------------------------------------------------


async def test_requests_while_detached_get_no_active_session_and_finalize_is_answered() -> None:
    seen: list[SimulationContext] = []
    rig = Rig(on_simulation_end=seen.append)
    await rig.host.start()
    for kind in ("ping", "get_chat_history", "get_agent_info", "get_session_state"):
        resp = await rig.sim.ask(kind)
        assert resp.error == NO_ACTIVE_SESSION, kind
    resp = await rig.sim.ask(
        "finalize_simulation", {"provisional_success": True, "provisional_reason": "good call"}
    )
    assert not resp.HasField("error")
    assert resp.HasField("finalize_simulation")
    assert [c.simulator_verdict.reason for c in seen] == ["good call"]
    assert rig.host.finalize_answered and rig.answered == [None]
    assert rig.host.state == "detached"
    await rig.host.aclose()


async def test_remote_session_client_sees_the_error_and_the_verdict() -> None:
    def veto(ctx: SimulationContext) -> None:
        ctx.fail(f"backend diverged after {ctx.simulator_verdict.reason}")

    rig = Rig(on_simulation_end=veto)
    await rig.host.start()
    remote = RemoteSession(rig.sim_end)
    await remote.start()
    with pytest.raises(RuntimeError, match="no active session"):
        await remote.get_chat_history()
    fin = await remote.finalize_simulation(provisional_success=True, provisional_reason="ok")
    assert fin.user_verdict.success is False
    assert fin.user_verdict.reason == "backend diverged after ok"
    assert rig.host.verdict == {"success": False, "reason": "backend diverged after ok"}
    await remote.aclose()
    await rig.host.aclose()


async def test_a_host_closed_while_its_transport_starts_reads_nothing_after() -> None:
    """start() returns once the host closed meanwhile, and nothing is left reading the
    transport (the host's reader is its hold on the transport, cancelled by the close)."""
    gate = asyncio.Event()
    starts: list[str] = []

    class SlowStart(InMemorySessionTransport):
        async def start(self) -> None:
            starts.append("start")
            await gate.wait()  # a server that does not answer yet
            await super().start()

    rig = Rig(transport=SlowStart)
    starting = asyncio.ensure_future(rig.host.start())
    await rig.settle()
    # a second call is the table's ignore: the transport starts once, and it too returns
    # once that start is over
    second = asyncio.ensure_future(rig.host.start())
    await rig.settle()
    assert rig.last("start").kind == "ignore"
    assert not starting.done() and not second.done() and starts == ["start"]
    await rig.host.aclose()
    await settle()
    assert starting.done() and starting.exception() is None
    assert second.done() and second.exception() is None
    gate.set()
    await settle()
    assert rig.host.state == "closed"
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("JobSessionHost")]
    await rig.host.start()  # closed: nothing starts again
    assert starts == ["start"]


async def test_attaching_before_start_starts_the_host_and_start_then_changes_nothing() -> None:
    """An agent that attaches its session first is served at once: attach starts the
    host (the table's new/attach cell); the start() that follows is ignored."""
    rig = Rig()
    a = await started_session("I am A")
    rig.host.attach(a)
    await rig.settle()
    assert rig.host.state == "attached" and rig.host.session is a
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am A"
    await rig.host.start()
    assert rig.last("start").kind == "ignore"
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am A"
    await a.aclose()
    await rig.host.aclose()
    assert rig.host.state == "closed" and rig.agent_end.closed


@pytest.mark.parametrize("how", ["attach", "start"])
async def test_a_transport_that_cannot_start_closes_the_host_and_refuses_attach_after(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The transport refuses to start (a topic another host holds): nothing can be read
    or answered, so the host closes, says why, and a later attach raises instead of
    leaving a session attached to a host that serves nothing. A host an attach started
    has nobody waiting on its start: only the table and the log tell."""

    class Refusing(InMemorySessionTransport):
        async def start(self) -> None:
            raise ValueError("topic lk.agent.session is taken")

    rig = Rig(transport=Refusing)
    a = await started_session("I am A")
    if how == "attach":
        rig.host.attach(a)
    else:
        with pytest.raises(RuntimeError, match="session_host=False"):
            await rig.host.start()
    await rig.settle()
    failed = rig.last("transport_failed")
    was = {"attach": "attached", "start": "detached"}[how]
    assert (failed.kind, failed.source, failed.dest) == ("transition", was, "closed")
    assert "topic lk.agent.session is taken" in str(failed.data["error"])
    assert rig.host.state == "closed" and rig.agent_end.closed
    assert "the session transport did not start" in caplog.text
    with pytest.raises(RuntimeError, match="the session host is closed"):
        rig.host.attach(a)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("JobSessionHost")]
    await a.aclose()
    await rig.host.aclose()


async def test_a_transport_whose_close_fails_is_logged_and_the_host_still_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reader closes the transport as it ends: a close that raises is logged, the host
    ends closed, and nothing is left reading or closing."""

    class FailingClose(InMemorySessionTransport):
        async def close(self) -> None:
            raise OSError("the room's stream is gone")

    for started in (True, False):  # the reader closes it, or (never opened) the host does
        caplog.clear()
        rig = Rig(transport=FailingClose)
        if started:
            await rig.host.start()
        await rig.host.aclose()
        await settle()
        assert rig.host.state == "closed"
        assert "the session transport did not close cleanly" in caplog.text
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("JobSessionHost")]


async def test_a_host_never_started_closes_cleanly() -> None:
    rig = Rig()
    await rig.host.aclose()
    assert rig.host.state == "closed" and rig.agent_end.closed
    closes = [r for r in rig.sink.records if r.machine == "session_host" and r.event == "close"]
    assert [r.source for r in closes] == ["new"]
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("JobSessionHost")]
    await rig.host.start()  # closed: nothing starts
    assert rig.host.state == "closed"


async def test_a_subscribe_failing_after_registering_leaves_nothing_on_the_session() -> None:
    """livekit's per-session host was built, registered the session (its listeners are
    on it) and began its start, then starting it on the pipe fails (patched: the SDK call
    cannot be made to fail otherwise; as when its start waits): that host is closed
    aside, so the session is left with no listener of a host that nobody reads."""
    rig = Rig()
    await rig.host.start()
    a = await started_session("I am A")
    base_a = listeners(a)

    def refuse(host: Any) -> None:
        start = host.start()
        with contextlib.suppress(StopIteration):
            start.send(None)
        raise RuntimeError("the pipe refused")

    with patch("agent_runtime.runtimes.session_host.start_on_pipe", refuse):
        rig.host.attach(a)
        await rig.settle()
    assert rig.host.state == "detached" and rig.last("subscribe_failed").dest == "detached"
    assert listeners(a) == base_a
    await a.aclose()
    await rig.host.aclose()
    assert rig.host.state == "closed"


async def test_a_failed_subscribe_detaches_and_the_host_keeps_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """livekit's per-session host cannot be built (patched to raise here: the SDK call is
    the one thing a test cannot make fail otherwise): the session is not forwarded, the
    failure is logged with its label, requests get 'no active session', and another
    session attaches afterwards."""
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    base_a = listeners(a)
    with patch("agent_runtime.runtimes.session_host.SessionHost", _RefusedSessionHost):
        rig.host.attach(a)
        await rig.settle()
    assert rig.host.state == "detached" and rig.host.session is None
    assert rig.last("subscribe_failed").dest == "detached"
    assert "session-1 cannot be served" in caplog.text
    assert listeners(a) == base_a  # nothing of a's is forwarded
    say(a, "lost")
    await rig.settle()
    assert rig.sim.transcripts() == []
    assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
    rig.host.attach(b)
    await rig.settle()
    assert rig.host.state == "attached" and rig.host.session is b
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am B"
    await a.aclose()
    await b.aclose()
    await rig.host.aclose()
    assert rig.host.state == "closed"


async def test_events_queued_before_a_failed_subscribe_is_decided() -> None:
    """Between a failed subscribe and its outcome the session is attached but unserved:
    a request queued meanwhile gets 'no active session', a session attached meanwhile
    stays attached (the late outcome names a, not it)."""
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    with patch("agent_runtime.runtimes.session_host.SessionHost", _RefusedSessionHost):
        rid = await rig.sim.send("get_agent_info")  # its read is due before the step
        rig.host.attach(a)
        await rig.settle()
    request = rig.last("request")
    assert (request.source, request.effects) == ("attached", ["delegate_request"])
    assert (await rig.sim.reply(rid)).error == NO_ACTIVE_SESSION
    assert rig.host.state == "detached"
    with patch("agent_runtime.runtimes.session_host.SessionHost", _refusing(a)):
        rig.host.attach(a)  # its subscribe fails...
        rig.host.attach(b)  # ...and b's, queued before that outcome, works
        await rig.settle()
    await rig.settle()
    assert rig.last("subscribe_failed").kind == "transition"
    assert rig.last("subscribe_failed").dest == "attached"  # a's outcome: b stays
    assert rig.host.session is b
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am B"
    await a.aclose()
    await b.aclose()
    await rig.host.aclose()


# -- attach, replace, detach ----------------------------------------------------------------


async def test_attach_b_replaces_a_only_b_events_reach_the_client() -> None:
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    base_a = listeners(a)
    rig.host.attach(a)
    await rig.settle()
    say(a, "a1")
    await rig.settle()
    assert rig.sim.transcripts() == ["a1"]
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am A"

    rig.host.attach(b)
    await rig.settle()
    say(a, "a2")
    say(b, "b1")
    await rig.settle()
    assert rig.sim.transcripts() == ["b1"]
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am B"
    assert listeners(a) == base_a  # A's subscriptions went with it
    assert rig.host.session is b
    await a.aclose()
    await b.aclose()
    await rig.host.aclose()


async def test_attaching_the_attached_session_again_changes_nothing() -> None:
    rig = Rig()
    await rig.host.start()
    a = await started_session("I am A")
    base = listeners(a)
    rig.host.attach(a)
    await rig.settle()
    subscribed = listeners(a)
    rig.host.attach(a)  # an app that attaches on every reconnect, say
    await rig.settle()
    assert rig.host.state == "attached" and rig.host.session is a
    assert listeners(a) == subscribed  # subscribed once, not twice, not dropped
    say(a, "a1")
    await rig.settle()
    assert rig.sim.transcripts() == ["a1"]
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am A"
    await rig.host.aclose()
    assert listeners(a) == base
    await a.aclose()


async def test_detach_stops_forwarding_and_the_host_goes_on_answering() -> None:
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    base = listeners(a)
    rig.host.detach(a)  # nothing attached yet: nothing changes
    await rig.settle()
    assert rig.host.state == "detached"
    assert (await rig.sim.ask("ping")).error == NO_ACTIVE_SESSION
    rig.host.attach(a)
    await rig.settle()
    rig.host.detach(b)  # not the attached one: nothing changes
    await rig.settle()
    assert rig.host.state == "attached" and rig.host.session is a
    rig.host.detach(a)
    await rig.settle()
    assert rig.host.state == "detached" and listeners(a) == base
    say(a, "after")
    await rig.settle()
    assert rig.sim.transcripts() == []
    # still open: a request is told there is no session, not that the host is closing
    assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
    await rig.host.aclose()
    await a.aclose()
    await b.aclose()


async def test_a_detached_hosts_failing_close_is_logged_and_the_host_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The per-session host of a detached session closes aside, as the job's scheduler's
    work: a close that raises is a warning, the host still answers, and it closes after."""

    async def failing_close(self: object) -> None:
        raise OSError("the session's stream is gone")

    rig = Rig()
    await rig.host.start()
    a = await started_session("I am A")
    rig.host.attach(a)
    await rig.settle()
    monkeypatch.setattr(SessionHost, "aclose", failing_close)
    rig.host.detach(a)
    await rig.settle()
    assert "detached host: OSError: the session's stream is gone" in caplog.text
    assert rig.host.state == "detached"
    assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
    await rig.host.aclose()
    assert rig.host.state == "closed"
    await a.aclose()


async def test_a_replaced_by_b_then_a_closes_b_stays_attached() -> None:
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    rig.host.attach(a)
    rig.host.attach(b)
    await rig.settle()
    rig.host.session_closed(a, "user_initiated")  # A's close, after it was replaced
    rig.host.detach(a)  # and a stale explicit detach
    await rig.settle()
    assert rig.host.state == "attached" and rig.host.session is b
    assert rig.closed_reasons == []  # the job is not told: A is not its session any more
    say(b, "still here")
    await rig.settle()
    assert rig.sim.transcripts() == ["still here"]
    assert (await rig.sim.ask("ping")).HasField("pong")
    await a.aclose()
    await b.aclose()
    await rig.host.aclose()


async def test_attached_session_closing_detaches_it_and_tells_the_job() -> None:
    rig = Rig()
    await rig.host.start()
    a = await started_session("I am A")
    # wired as JobRuntime wires it: the session's own close event reaches the host
    a.on("close", lambda ev: rig.host.session_closed(a, ev.reason.value))
    rig.host.attach(a)
    await rig.settle()
    await a.aclose()  # the agent hangs up: upstream closes with user_initiated
    await rig.settle()
    assert rig.host.state == "detached"
    assert rig.closed_reasons == ["user_initiated"]
    assert (await rig.sim.ask("get_chat_history")).error == NO_ACTIVE_SESSION
    await rig.host.aclose()


async def test_attach_bad_input_and_after_close() -> None:
    rig = Rig()
    await rig.host.start()
    with pytest.raises(TypeError, match="AgentSession"):
        rig.host.attach("session")  # type: ignore[arg-type]
    assert rig.host.state == "detached"
    await rig.host.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        rig.host.attach(AgentSession())


# -- bad requests and finalize rules --------------------------------------------------------


async def test_unknown_request_kind_gets_an_error_reply() -> None:
    rig = Rig()
    await rig.host.start()
    resp = await rig.sim.ask("launch_rockets")
    assert resp.error == "unknown request kind"
    assert rig.host.state == "detached"
    await rig.host.aclose()


async def test_malformed_finalize_gets_an_error_and_changes_nothing() -> None:
    calls: list[SimulationContext] = []
    rig = Rig(on_simulation_end=calls.append)
    await rig.host.start()
    resp = await rig.sim.ask("finalize_simulation", {"provisional_success": "yes"})
    assert resp.error == "malformed finalize_simulation: provisional_success has the wrong type"
    assert calls == [] and not rig.host.finalize_answered
    # the well-formed one after it is answered as if nothing happened
    resp = await rig.sim.ask("finalize_simulation", {"provisional_success": False})
    assert not resp.HasField("error") and len(calls) == 1
    assert calls[0].simulator_verdict.success is False
    await rig.host.aclose()


async def test_second_finalize_after_one_was_answered_gets_the_same_verdict() -> None:
    calls: list[SimulationContext] = []

    def veto(ctx: SimulationContext) -> None:
        calls.append(ctx)
        ctx.fail("vetoed")

    rig = Rig(on_simulation_end=veto)
    await rig.host.start()
    assert not (await rig.sim.ask("finalize_simulation", {"provisional_success": True})).error
    for _ in range(2):  # and every one after it, alike: the kept verdict, not run again
        resp = await rig.sim.ask("finalize_simulation", {"provisional_success": True})
        assert not resp.error and resp.finalize_simulation.user_verdict.reason == "vetoed"
    assert len(calls) == 1 and rig.answered == [{"success": False, "reason": "vetoed"}]
    await rig.host.aclose()


async def test_finalize_while_one_is_being_answered_waits_for_the_same_verdict() -> None:
    rig_clock: list[VirtualClock] = []

    async def slow(ctx: SimulationContext) -> None:
        await rig_clock[0].sleep(10)  # on_simulation_end often calls a model
        ctx.fail("slow veto")

    rig = Rig(on_simulation_end=slow)
    rig_clock.append(rig.clock)
    await rig.host.start()
    first = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    second = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.clock.advance(10)
    for rid in (first, second):
        resp = await rig.sim.reply(rid)
        assert resp.finalize_simulation.user_verdict.reason == "slow veto"
    assert rig.host.verdict == {"success": False, "reason": "slow veto"}
    await rig.host.aclose()


async def test_on_simulation_end_raising_still_answers_with_an_error() -> None:
    def broken(ctx: SimulationContext) -> None:
        raise KeyError("scenario field")

    rig = Rig(on_simulation_end=broken)
    await rig.host.start()
    resp = await rig.sim.ask("finalize_simulation", {"provisional_success": True})
    assert "on_simulation_end failed: KeyError" in resp.error
    assert not resp.finalize_simulation.HasField("user_verdict")
    assert rig.host.finalize_answered and rig.host.verdict is None
    # the trace says the agent's callback failed: it read as a verdict computed ok, then
    # delivered with none, in replay, timeline and record alike
    [rec] = [r for r in rig.sink.records if r.effect == "compute_verdict"]
    assert (rec.outcome, rec.detail) == ("error", "KeyError: 'scenario field'")
    await rig.host.aclose()


async def test_on_simulation_end_raising_is_logged_once_at_warning_or_above(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(ctx: SimulationContext) -> None:
        raise KeyError("scenario field")

    rig = Rig(on_simulation_end=broken)
    await rig.host.start()
    with caplog.at_level(logging.DEBUG):
        await rig.sim.ask("finalize_simulation", {"provisional_success": True})
    # one failure, one line an operator sees: the callback's error with its traceback
    [line] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "on_simulation_end failed: KeyError" in line.getMessage() and line.exc_info
    await rig.host.aclose()


async def test_finalize_without_a_simulation_is_refused() -> None:
    rig = Rig(simulation=None)
    await rig.host.start()
    resp = await rig.sim.ask("finalize_simulation", {"provisional_success": True})
    assert resp.error == "this job is not a simulation"
    assert not rig.host.finalize_answered
    await rig.host.aclose()


async def test_finalize_after_closed_crashes_nothing() -> None:
    rig = Rig()
    await rig.host.start()
    await rig.close_keeping_actors()
    assert rig.host.state == "closed"
    with pytest.raises(RuntimeError, match="closed"):  # the simulator sees the transport gone
        await rig.sim.send("finalize_simulation", {"provisional_success": True})
    step = await rig.host.actor.send(Event("finalize", {"request_id": "late", "ref": 0}))
    assert step.outcome == "ignore"
    assert not rig.host.finalize_answered
    await rig.host.aclose()
    await rig.host.aclose()  # twice is fine


async def test_a_request_that_arrives_while_the_host_closes_gets_an_error_reply() -> None:
    gate = asyncio.Event()

    async def slow(ctx: SimulationContext) -> None:
        await gate.wait()

    rig = Rig(on_simulation_end=slow)
    await rig.host.start()
    fin = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())  # draining the verdict in flight
    await rig.settle()
    assert rig.host.state == "closing"
    resp = await rig.sim.ask("get_chat_history")
    assert resp.error == HOST_CLOSING
    assert rig.last("request").source == "closing"
    # an unknown kind, or a second finalize, gets the same answer: nothing is served now
    assert (await rig.sim.ask("launch_rockets")).error == HOST_CLOSING
    assert (await rig.sim.ask("finalize_simulation", {"provisional_success": True})).error == (
        HOST_CLOSING
    )
    gate.set()
    await rig.settle()
    assert closing.done() and rig.host.state == "closed"
    rig.sim.pump()
    assert not rig.sim.responses[fin].error and rig.host.finalize_answered


async def test_closing_drains_a_verdict_in_flight_within_its_bound() -> None:
    gate = asyncio.Event()

    async def slow(ctx: SimulationContext) -> None:
        await gate.wait()  # the model answers after a while
        ctx.fail("late but in time")

    rig = Rig(on_simulation_end=slow)
    await rig.host.start()
    rid = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())
    await rig.clock.advance(2)  # within the drain bound (3 s)
    assert rig.host.state == "closing" and not closing.done()
    gate.set()
    await rig.settle()
    assert closing.done() and rig.host.state == "closed"
    rig.sim.pump()
    assert rig.sim.responses[rid].finalize_simulation.user_verdict.reason == "late but in time"
    assert rig.host.finalize_answered and rig.last("drained").dest == "closed"


@pytest.mark.parametrize(
    "late", ["session_closed", "detach", "finalize", "request", "bad_request", "close"]
)
async def test_what_arrives_while_the_host_drains_does_not_extend_the_drain(late: str) -> None:
    """A verdict that never comes: the host closes 3 s (its drain bound) after it began,
    whatever arrives meanwhile (the attached session closing, another finalize)."""
    never = asyncio.Event()

    async def hangs(ctx: SimulationContext) -> None:
        await never.wait()

    rig = Rig(on_simulation_end=hangs)
    await rig.host.start()
    a = await started_session("I am A")
    rig.host.attach(a)
    await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())
    await rig.clock.advance(2)
    assert rig.host.state == "closing"
    again = None
    if late == "session_closed":
        rig.host.session_closed(a, "user_initiated")
    elif late == "detach":
        rig.host.detach(a)
    elif late == "close":
        again = asyncio.ensure_future(rig.host.aclose())  # a second close meanwhile
    else:
        kind = {"request": "ping", "bad_request": "launch_rockets"}.get(late, "")
        assert (await rig.sim.ask(kind or "finalize_simulation")).error == HOST_CLOSING
    await rig.settle()
    assert rig.host.state == "closing"
    await rig.clock.advance(1)
    await rig.settle()
    assert closing.done() and rig.host.state == "closed"
    assert again is None or again.done()
    assert rig.last("drain_timeout").dest == "closed"
    await a.aclose()


async def test_two_closes_asked_at_once_close_the_host_once() -> None:
    """The job and the app close the host in the same instant, while a verdict never
    comes: one close, one drain, cut at its bound 3 s after it began; both calls return
    then, and the simulator gets its one error reply."""
    never = asyncio.Event()

    async def hangs(ctx: SimulationContext) -> None:
        await never.wait()

    rig = Rig(on_simulation_end=hangs)
    await rig.host.start()
    rid = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    changes: list[tuple[str, str]] = []  # what a user's listener sees of the host
    rig.host.on(
        "state_changed",
        lambda sc: changes.append((sc.source, sc.dest)) if sc.machine == "session_host" else None,
    )
    closes = [asyncio.ensure_future(rig.host.aclose()) for _ in range(2)]
    await rig.clock.advance(2.9)
    assert rig.host.state == "closing" and not any(c.done() for c in closes)
    await rig.clock.advance(0.1)
    await rig.settle()
    assert all(c.done() for c in closes) and rig.host.state == "closed"
    closes_seen = [
        r.source for r in rig.sink.records if r.machine == "session_host" and r.event == "close"
    ]
    assert closes_seen == ["detached", "closing"]  # the second, taken in as it was asked
    assert changes == [("detached", "closing"), ("closing", "closed")]
    rig.sim.pump()
    assert [r.request_id for r in rig.sim.received] == [rid]
    assert rig.sim.received[0].error == FINALIZE_UNFINISHED


async def test_an_unreadable_message_does_not_stop_the_host() -> None:
    rig = Rig()
    await rig.host.start()
    # bytes that do not parse as an AgentSessionMessage, straight into the agent's inbox
    rig.agent_end._inbox.put_nowait(b"\xff\xff\xff")
    await settle()
    assert (await rig.sim.ask("ping")).error == NO_ACTIVE_SESSION
    await rig.host.aclose()


def test_request_problem_and_build_request() -> None:
    ok = build_request("finalize_simulation", {"provisional_success": True}, request_id="r")
    assert request_problem(ok) is None and ok.finalize_simulation.provisional_success
    bad = build_request("finalize_simulation", {"provisional_reason": 7}, request_id="r")
    assert request_problem(bad) == (
        "malformed finalize_simulation: provisional_reason has the wrong type"
    )
    assert request_problem(build_request("warp", request_id="r")) == "unknown request kind"
    with pytest.raises(ValueError, match="has no field 'verdict'"):
        build_request("finalize_simulation", {"verdict": True}, request_id="r")
    run = build_request("run_input", {"text": "hello"}, request_id="r")
    assert run.run_input.text == "hello"
    io = build_request("update_io", {"output": {"audio_enabled": False}}, request_id="r")
    assert io.update_io.output.HasField("audio_enabled")


def test_simulation_context_from_a_dispatch() -> None:
    ctx = simulation_context(DISPATCH)
    assert ctx is not None and ctx.simulation_run_id == "run-1"
    assert simulation_context(ctx) is ctx and simulation_context(None) is None
    with pytest.raises(ValueError, match="simulation_run_id"):
        simulation_context(SimulationDispatch())
    with pytest.raises(TypeError, match="SimulationDispatch"):
        simulation_context("run-1")  # type: ignore[arg-type]


# -- calls in the windows a user can reach --------------------------------------------------


def _host_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("JobSessionHost")]


@pytest.mark.parametrize("how", ["detach", "session_closed"])
async def test_a_session_let_go_before_the_host_starts_changes_nothing(how: str) -> None:
    """A session detached, or reported closed, before the host was started (an agent's
    cleanup that runs early): the host stays unstarted, the job is not told, and the
    start that follows opens the transport as ever: requests get 'no active session'
    until a session attaches, then that session's answers."""
    rig = Rig()
    a = await started_session("I am A")
    if how == "detach":
        rig.host.detach(a)
    else:
        rig.host.session_closed(a, "user_initiated")
    await rig.settle()
    assert rig.host.state == "new" and rig.closed_reasons == []
    await rig.host.start()
    assert rig.host.state == "detached" and rig.host.session is None
    assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
    rig.host.attach(a)
    await rig.settle()
    assert rig.host.session is a
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am A"
    await a.aclose()
    await rig.host.aclose()
    assert rig.host.state == "closed" and rig.agent_end.closed


async def test_a_detached_session_that_closes_later_leaves_the_host_serving() -> None:
    """A session detached from the host (another one is on the way) closes afterwards: the
    host goes on answering, the job is not told, and the next session attaches."""
    rig = Rig()
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    rig.host.attach(a)
    await rig.settle()
    rig.host.detach(a)
    await rig.settle()
    await a.aclose()
    rig.host.session_closed(a, "user_initiated")  # as the job's close listener reports it
    await rig.settle()
    assert rig.host.state == "detached" and rig.closed_reasons == []
    assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
    rig.host.attach(b)
    await rig.settle()
    assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am B"
    await b.aclose()
    await rig.host.aclose()
    assert rig.host.state == "closed" and rig.agent_end.closed


@pytest.mark.parametrize("then", ["detach", "close"])
async def test_a_session_whose_subscribe_fails_let_go_in_the_same_instant(then: str) -> None:
    """livekit's per-session host cannot be built (patched to raise: the one thing a test
    cannot make fail otherwise) for a session attached and, in the same instant, detached
    again or followed by the host's close: the failure's outcome comes after, and changes
    nothing. Detached, the host keeps answering and the next session attaches; closing,
    it still drains the verdict in flight (sent once it is computed), then ends with its
    transport closed and nothing left reading."""
    gate = asyncio.Event()

    async def slow(ctx: SimulationContext) -> None:
        await gate.wait()

    rig = Rig(on_simulation_end=slow)
    await rig.host.start()
    a, b = await started_session("I am A"), await started_session("I am B")
    rid = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    with patch("agent_runtime.runtimes.session_host.SessionHost", _RefusedSessionHost):
        rig.host.attach(a)
        closing = None
        if then == "detach":
            rig.host.detach(a)
        else:
            closing = rig.host.release()
        await rig.settle()
    assert rig.last("subscribe_failed").source == {"detach": "detached", "close": "closing"}[then]
    if then == "detach":
        assert rig.host.state == "detached" and rig.host.session is None
        assert (await rig.sim.ask("get_agent_info")).error == NO_ACTIVE_SESSION
        rig.host.attach(b)
        await rig.settle()
        assert (await rig.sim.ask("get_agent_info")).get_agent_info.instructions == "I am B"
        gate.set()
        await rig.host.aclose()
    else:
        assert closing is not None
        await rig.clock.advance(1.0)
        assert rig.host.state == "closing" and not closing.done()
        gate.set()
        await rig.settle()
        assert closing.done()
    rig.sim.pump()
    assert not rig.sim.responses[rid].error and rig.host.finalize_answered
    assert rig.host.state == "closed" and rig.agent_end.closed and rig.closed_reasons == []
    assert not _host_tasks()
    await a.aclose()
    await b.aclose()


async def test_a_transport_that_fails_to_start_while_the_host_closes_ends_it_in_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The host is closing (a session detached before, whose own host is still closing
    aside, holds its drain) when its transport's start, slow until then, fails: the
    failure is logged and ``start()`` raises it, and the close goes on as it was: the host
    ends at its drain bound (3 s from the close), then lets the slow one go at its own,
    with nothing left reading."""
    started, never = asyncio.Event(), asyncio.Event()

    class FailsLate(InMemorySessionTransport):
        async def start(self) -> None:
            await started.wait()  # the server answers late, and says no
            raise ValueError("topic lk.agent.session is taken")

    slow: list[SessionHost] = []

    class ClosesSlowly(SessionHost):
        async def aclose(self) -> None:
            slow.append(self)
            await never.wait()  # its in-flight requests take their time
            await super().aclose()

    rig = Rig(transport=FailsLate)
    starting = asyncio.ensure_future(rig.host.start())
    a = await started_session("I am A")
    with patch("agent_runtime.runtimes.session_host.SessionHost", ClosesSlowly):
        rig.host.attach(a)
        await rig.settle()
        assert rig.host.session is a
        rig.host.detach(a)  # its own host closes aside, slowly
        await settle()  # not the rig's: its join waits for the host closing aside
        closing = rig.host.release()
        await settle()
    assert closing is not None
    await rig.clock.advance(1.0)
    started.set()
    await settle()
    assert rig.last("transport_failed").source == "closing"
    with pytest.raises(RuntimeError, match="session_host=False"):
        await starting
    assert "the session transport did not start" in caplog.text
    await rig.clock.advance(1.0)
    assert rig.host.state == "closing" and not closing.done()
    await rig.clock.advance(1.0)
    await settle()
    assert rig.host.state == "closed" and not closing.done()
    # the session's own host gets the drain bound once more, then it is cut
    await rig.clock.advance(3.0)
    await settle()
    assert closing.done() and rig.agent_end.closed and not _host_tasks()
    # the host's cut left livekit's own host to its fate: the test closes it, as the
    # process's end would
    assert len(slow) == 1
    await SessionHost.aclose(slow[0])
    await a.aclose()


@pytest.mark.parametrize("answers", [True, False], ids=["answered", "cut"])
async def test_a_start_that_comes_while_the_host_closes_neither_reopens_nor_extends_it(
    answers: bool,
) -> None:
    """``start()`` called once the host's close was asked (an agent starting its runtime
    as the job ends), while a verdict is still being computed: it returns without error
    and the close goes on as asked. The verdict goes out if it comes within the drain's
    bound (3 s from the close, not from the start); else the simulator gets its one error
    reply at that bound. Then the transport is closed and nothing is left reading; a start
    after that changes nothing either."""
    gate = asyncio.Event()

    async def slow(ctx: SimulationContext) -> None:
        await gate.wait()

    rig = Rig(on_simulation_end=slow)
    await rig.host.start()
    rid = await rig.sim.send("finalize_simulation", {"provisional_success": True})
    await rig.settle()
    closing = rig.host.release()
    assert closing is not None
    await rig.clock.advance(1.0)
    await rig.host.start()
    assert rig.last("start").source == "closing"
    await rig.clock.advance(1.0)
    assert rig.host.state == "closing" and not closing.done()
    if answers:
        gate.set()
        await rig.settle()
        rig.sim.pump()
        assert not rig.sim.responses[rid].error and rig.host.finalize_answered
    else:
        await rig.clock.advance(0.9)
        assert rig.host.state == "closing" and not closing.done()
        await rig.clock.advance(0.1)
        await rig.settle()
        rig.sim.pump()
        assert [r.request_id for r in rig.sim.received] == [rid]
        assert rig.sim.received[0].error == FINALIZE_UNFINISHED
    assert closing.done() and rig.host.state == "closed" and rig.agent_end.closed
    assert not _host_tasks()
    await rig.host.start()
    assert rig.host.state == "closed"


# -- every cell of the table, through the actor -------------------------------------------

OPEN_TO_CLOSING = ("close_finalize", "close_transport")
# (state, trigger) -> (outcome, dest, effects); written out by hand: a changed cell fails here
CELLS: dict[tuple[str, str], tuple[str, str, tuple[str, ...]]] = {
    ("new", "start"): ("transition", "detached", ("open_transport",)),
    ("new", "attach"): ("transition", "attached", ("open_transport", "subscribe")),
    **{
        ("new", e): ("ignore", "new", ())
        for e in (
            "detach",
            "session_closed",
            "request",
            "bad_request",
            "finalize",
            "drained",
            "drain_timeout",
            "subscribe_failed",
            "transport_failed",
        )
    },
    ("new", "close"): ("transition", "closing", ()),
    # what the reader's failed start posts (posted by hand: the table's part, alone)
    ("detached", "transport_failed"): ("transition", "closed", OPEN_TO_CLOSING),
    ("attached", "transport_failed"): ("transition", "closed", ("unsubscribe", *OPEN_TO_CLOSING)),
    ("closing", "transport_failed"): ("ignore", "closing", ()),
    ("detached", "start"): ("ignore", "detached", ()),
    ("detached", "subscribe_failed"): ("ignore", "detached", ()),
    ("attached", "start"): ("ignore", "attached", ()),
    ("attached", "subscribe_failed"): ("transition", "detached", ("unsubscribe",)),
    ("attached", "subscribe_failed:other"): ("transition", "attached", ()),
    ("closing", "start"): ("ignore", "closing", ()),
    ("closing", "subscribe_failed"): ("ignore", "closing", ()),
    ("detached", "attach"): ("transition", "attached", ("subscribe",)),
    ("detached", "detach"): ("ignore", "detached", ()),
    ("detached", "session_closed"): ("ignore", "detached", ()),
    ("detached", "request"): ("transition", "detached", ("reply_no_session",)),
    ("detached", "bad_request"): ("transition", "detached", ("reply_error",)),
    ("detached", "finalize"): ("transition", "detached", ("forward_finalize",)),
    ("detached", "finalize:stranger"): ("transition", "detached", ("refuse_stranger",)),
    ("detached", "close"): ("transition", "closing", ()),
    ("detached", "drained"): ("ignore", "detached", ()),
    ("detached", "drain_timeout"): ("ignore", "detached", ()),
    ("attached", "attach:same"): ("transition", "attached", ()),
    ("attached", "attach"): ("transition", "attached", ("unsubscribe", "subscribe")),
    ("attached", "detach"): ("transition", "detached", ("unsubscribe",)),
    ("attached", "detach:other"): ("transition", "attached", ()),
    ("attached", "session_closed"): (
        "transition",
        "detached",
        ("unsubscribe", "report_session_closed"),
    ),
    ("attached", "session_closed:other"): ("transition", "attached", ()),
    ("attached", "request"): ("transition", "attached", ("delegate_request",)),
    ("attached", "bad_request"): ("transition", "attached", ("reply_error",)),
    ("attached", "finalize"): ("transition", "attached", ("forward_finalize",)),
    ("attached", "finalize:stranger"): ("transition", "attached", ("refuse_stranger",)),
    ("attached", "close"): ("transition", "closing", ("unsubscribe",)),
    ("attached", "drained"): ("ignore", "attached", ()),
    ("attached", "drain_timeout"): ("ignore", "attached", ()),
    ("closing", "attach"): ("reject", "closing", ()),
    ("closing", "detach"): ("ignore", "closing", ()),
    ("closing", "session_closed"): ("ignore", "closing", ()),
    ("closing", "request"): ("transition", "closing", ("reply_closing",)),
    ("closing", "bad_request"): ("transition", "closing", ("reply_closing",)),
    ("closing", "finalize"): ("transition", "closing", ("reply_closing",)),
    ("closing", "close"): ("ignore", "closing", ()),
    ("closing", "drained"): ("transition", "closed", OPEN_TO_CLOSING),
    ("closing", "drain_timeout"): ("transition", "closed", OPEN_TO_CLOSING),
    **{
        ("closed", e): ("ignore", "closed", ())
        for e in (
            "detach",
            "session_closed",
            "request",
            "bad_request",
            "finalize",
            "close",
            "drained",
            "drain_timeout",
            "start",
            "subscribe_failed",
            "transport_failed",
        )
    },
    ("closed", "attach"): ("reject", "closed", ()),
}


@pytest.mark.snapshot  # pins each cell as written
def test_every_cell_of_the_spec_is_in_the_cell_table() -> None:
    from statemachines.session_host import SESSION_HOST

    covered = {(s, t.split(":")[0]) for s, t in CELLS}
    assert covered == {(s, e) for s in SESSION_HOST.state_names for e in SESSION_HOST.events}


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize(("state", "trigger"), list(CELLS), ids=[f"{s}-{t}" for s, t in CELLS])
async def test_cell(state: str, trigger: str) -> None:
    outcome, dest, effects = CELLS[(state, trigger)]
    gate = asyncio.Event()

    async def on_simulation_end(ctx: SimulationContext) -> None:
        if state == "closing":
            await gate.wait()  # a verdict still being computed keeps the host draining

    rig = Rig(on_simulation_end=on_simulation_end, is_simulator=lambda who: who == "simulator")
    if state != "new":
        await rig.host.start()
    a, b = AgentSession(), AgentSession()  # unstarted: subscriptions and ping need no more
    event = trigger.split(":")[0]
    if state in ("attached", "closing", "closed"):
        rig.host.attach(a)
        await rig.settle()
    if state == "closing":
        fin = await rig.sim.send("finalize_simulation", {"provisional_success": True})
        await rig.settle()
        rig.host.actor.post(Event("close"))
        await rig.settle()
    if state == "closed":
        await rig.close_keeping_actors()
    assert rig.host.state == state
    mark = len(rig.sink.records)

    if event == "start":
        await rig.host.start()
    elif state == "new" and event in ("request", "bad_request", "finalize", "subscribe_failed"):
        # nothing reads the transport yet: what the reader would post, posted by hand
        data = {"session": "session-1", "ref": 0, "request_id": "early", "error": "x"}
        await rig.host.actor.send(Event(event, data))
    elif trigger == "subscribe_failed":
        if state == "attached":
            # livekit's per-session host cannot be built for b (the failure injected here:
            # an SDK that changed under us is the real-world cause)
            with patch("agent_runtime.runtimes.session_host.SessionHost", _RefusedSessionHost):
                rig.host.attach(b)
                await rig.settle()
        else:  # detached, closing, closed: the outcome of a subscribe left behind
            await rig.host.actor.send(Event(event, {"session": "session-1", "error": "x"}))
    elif trigger == "subscribe_failed:other":
        # a's subscribe failed, b attached before that outcome was decided
        await rig.host.actor.send(Event(event, {"session": "session-9", "error": "x"}))
    elif state == "closed":
        # the host reads no more: only what was read before the close reaches the actor
        if event == "attach":
            with pytest.raises(RuntimeError, match="closed"):
                rig.host.attach(b)
            with pytest.raises(EventRejected):
                await rig.host.actor.send(Event("attach", {"session": rig.host.label_of(b)}))
        else:
            data = {"session": "session-1", "ref": 0, "request_id": "late", "error": "x"}
            await rig.host.actor.send(Event(event, data))
    elif state == "closing" and event == "attach":
        with pytest.raises(RuntimeError, match="closed"):
            rig.host.attach(b)
        with pytest.raises(EventRejected):
            await rig.host.actor.send(Event("attach", {"session": rig.host.label_of(b)}))
    elif state == "closing" and event in ("request", "bad_request", "finalize"):
        kind = {"request": "ping", "bad_request": "launch_rockets"}.get(event, event)
        if event == "finalize":
            kind = "finalize_simulation"
        assert (await rig.sim.ask(kind)).error == HOST_CLOSING
    elif state == "closing" and event == "drained":
        gate.set()  # the verdict goes out, the drain ends
    elif state == "closing" and event == "drain_timeout":
        await rig.clock.advance(3)
    elif state == "closing" and event == "close":
        rig.host.actor.post(Event("close"))
    elif trigger in ("attach", "attach:same"):
        rig.host.attach(a if trigger == "attach:same" or state in ("new", "detached") else b)
    elif trigger in ("detach", "detach:other"):
        rig.host.detach(b if trigger.endswith("other") else a)
    elif trigger in ("session_closed", "session_closed:other"):
        rig.host.session_closed(b if trigger.endswith("other") else a, "user_initiated")
    elif state == "new" and event == "close":
        await rig.host.aclose()  # a host never started closes all the same
    elif event == "request":
        resp = await rig.sim.ask("ping")
        assert resp.HasField("pong") == (state == "attached")
    elif event == "bad_request":
        assert (await rig.sim.ask("launch_rockets")).error == "unknown request kind"
    elif trigger == "finalize:stranger":
        resp = await rig.sim.ask("finalize_simulation", {"provisional_success": True}, sender="u")
        assert resp.error == NOT_THE_SIMULATOR and not rig.host.finalize_answered
        assert rig.host.finalize.state == "idle"  # it never reached the finalize machine
    elif event == "finalize":
        resp = await rig.sim.ask("finalize_simulation", {"provisional_success": True})
        assert not resp.error and rig.host.finalize_answered
    elif event == "close":
        rig.host.actor.post(Event("close"))
    else:  # drained / drain_timeout outside closing: what a stale task or timer would post;
        # transport_failed: what the reader posts when the transport's start fails
        rig.host.actor.post(Event(event, {"late": True}))
    await rig.settle()

    rec = rig.last(event)
    assert rig.sink.records.index(rec) >= mark
    assert (rec.kind, rec.source, rec.dest, tuple(rec.effects)) == (
        outcome,
        state,
        dest,
        effects,
    )
    if not (event == "close" and state in ("new", "detached", "attached")):
        assert rig.host.state == dest
    bad = {k: v for k, v in rig.effect_outcomes().items() if v != "ok"}
    assert bad == {}
    if "report_session_closed" in effects:
        assert rig.closed_reasons == ["user_initiated"]
    if event == "close" and state in ("new", "detached", "attached"):
        # nothing in flight: the drain ends at once and the transport is closed
        assert rig.host.state == "closed" and rig.agent_end.closed
    if (state, event) in (("new", "start"), ("new", "attach")):
        # the transport is read now: a request is answered (by the session, once attached)
        resp = await rig.sim.ask("ping")
        assert resp.HasField("pong") == (event == "attach")
        assert resp.error == ("" if event == "attach" else NO_ACTIVE_SESSION)
    elif state == "new" and event != "close":
        # still not started: nothing reads the transport
        rid = await rig.sim.send("ping")
        await rig.settle()
        rig.sim.pump()
        assert rid not in rig.sim.responses
    if trigger == "subscribe_failed" and state == "attached":
        # b is not forwarded: requests get no active session, and a attaches again
        assert rig.host.session is None
        assert (await rig.sim.ask("ping")).error == NO_ACTIVE_SESSION
        rig.host.attach(a)
        await rig.settle()
        assert rig.host.session is a and (await rig.sim.ask("ping")).HasField("pong")
    if state == "closing" and event in ("drained", "drain_timeout"):
        assert rig.host.state == "closed" and rig.agent_end.closed
        rig.sim.pump()
        # the verdict in flight went out, or was cut at the bound with an error reply
        reply = rig.sim.responses[fin]
        if event == "drained":
            assert not reply.error and rig.host.finalize_answered
        else:
            assert reply.error == FINALIZE_UNFINISHED and not rig.host.finalize_answered
    gate.set()
    await rig.host.aclose()
    assert rig.host.actor.live_tasks == 0 and rig.host.finalize.actor.live_tasks == 0
    assert rig.clock.pending == 0
    await asyncio.sleep(0)


class _RefusedSessionHost:
    """Stands in for livekit's ``SessionHost`` where its construction fails."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("SessionHost refused")


def _refusing(refused: AgentSession[Any]) -> type[SessionHost]:
    """livekit's ``SessionHost``, refusing to register ``refused`` (and only it)."""

    class Refusing(SessionHost):
        def register_session(self, session: AgentSession[Any]) -> None:
            if session is refused:
                raise RuntimeError("register_session refused")
            super().register_session(session)

    return Refusing


class _BrokenReads(InMemorySessionTransport):
    """A transport whose every read fails at once, without waiting for anything."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def receive(self) -> Any:
        self.reads += 1
        raise ValueError("garbled")


async def test_a_transport_failing_every_read_is_given_up_on_not_spun_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport = _BrokenReads()
    host = JobSessionHost(transport, clock=VirtualClock())
    await host.start()  # would never return if the reader held the loop
    await settle()
    assert transport.reads == 1000
    assert "failed 1000 reads in a row" in caplog.text
    await host.aclose()
    assert host.state == "closed"


async def test_a_host_let_go_before_its_close_refuses_a_session_and_keeps_none() -> None:
    """``release_now()`` lets the host go where it is (its table's ``close`` leads to
    ``closing``, which no release steps): it says ``detached`` still, yet takes nothing
    more. ``attach`` refused it, as for a closed host; it went on, kept the session and
    posted an attach the released machine dropped, the session attached to nothing."""
    host = JobSessionHost(InMemorySessionTransport(), clock=VirtualClock())
    await host.start()
    assert host.state == "detached"
    ending = host.release_now()
    if ending is not None:
        await ending
    session = await started_session("late")
    with pytest.raises(RuntimeError, match="the session host is closed"):
        host.attach(session)
    assert host.known_label(session) is None
    await session.aclose()
