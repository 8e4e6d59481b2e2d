"""The answer to ``finalize_simulation`` as its own machine, through the real session host.

Same stand-ins as ``test_session_host``: a paired in-memory transport carrying the real
protobuf messages (a room byte stream needs a server), the simulator speaking raw messages,
virtual time. The agent's end of the transport can hold the verdict's reply on a gate (a
slow or failing send) so the reply can be caught while it is under way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from livekit.agents.simulation import SimulationContext
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime import Event
from agent_runtime.runtimes.session_host import FINALIZE_UNFINISHED
from agent_runtime.testing.inmemory import InMemorySessionTransport
from statemachines.finalize import FINALIZE
from tests.support.host_rig import Rig

FIN = {"provisional_success": True, "provisional_reason": "fine"}


class HeldEnd(InMemorySessionTransport):
    """The agent's end: while ``hold`` is set, a verdict's reply waits for ``release``
    (and then fails if ``fail`` is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.fail = False
        self.release = asyncio.Event()

    async def send_message(
        self, msg: agent_pb.AgentSessionMessage, *, sender: str | None = None
    ) -> None:
        if self.hold and msg.response.HasField("finalize_simulation"):
            await self.release.wait()
            if self.fail:
                raise RuntimeError("the room went away")
        await super().send_message(msg, sender=sender)


class Setup:
    def __init__(self, *, simulation: bool = True) -> None:
        self.compute = asyncio.Event()
        self.compute.set()
        self.calls = 0

        async def on_simulation_end(ctx: SimulationContext) -> None:
            self.calls += 1
            await self.compute.wait()  # a model call, answered when the test says so
            ctx.fail(f"veto {self.calls}")

        kw: dict[str, Any] = {} if simulation else {"simulation": None}
        self.rig = Rig(on_simulation_end=on_simulation_end, transport=HeldEnd, **kw)
        self.end: HeldEnd = self.rig.agent_end  # type: ignore[assignment]

    @property
    def fin(self) -> Any:
        return self.rig.host.finalize


# -- the guarantees -------------------------------------------------------------------------


async def test_a_reply_that_cannot_be_delivered_is_sent_again_with_the_same_verdict() -> None:
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.end.hold = t.end.fail = True
    t.end.release.set()
    first = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    assert t.fin.state == "idle" and not rig.host.finalize_answered
    assert first not in rig.sim.responses and rig.answered == []
    t.end.fail = False
    resp = await rig.sim.ask("finalize_simulation", FIN)  # the simulator asks again
    assert resp.finalize_simulation.user_verdict.reason == "veto 1"
    assert t.calls == 1  # on_simulation_end ran once
    assert rig.host.finalize_answered and rig.answered == [{"success": False, "reason": "veto 1"}]
    await rig.host.aclose()


async def test_a_simulator_that_asks_again_while_answering_gets_the_verdict_on_both() -> None:
    """The simulator gave up on its first request (its own timeout: livekit's
    ``RemoteSession`` forgets a request it stopped waiting for) and asks again while
    ``on_simulation_end`` still runs. The verdict, once ready, answers both requests;
    the agent's callback runs once and the job is told once."""
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.compute.clear()
    first = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    second = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    assert second not in rig.sim.responses  # no error: it waits for the verdict
    t.compute.set()
    for rid in (first, second):
        resp = await rig.sim.reply(rid)
        assert not resp.error and resp.finalize_simulation.user_verdict.reason == "veto 1"
    assert t.calls == 1 and rig.answered == [{"success": False, "reason": "veto 1"}]
    await rig.host.aclose()


async def test_a_simulator_that_asks_again_after_the_answer_gets_the_same_verdict() -> None:
    """A reply the simulator did not wait for is lost to it: asked again, the agent sends
    the verdict it kept, without running ``on_simulation_end`` again (as livekit alone
    would) and without telling the job a second time."""
    t = Setup()
    rig = t.rig
    await rig.host.start()
    first = await rig.sim.ask("finalize_simulation", FIN)
    assert first.finalize_simulation.user_verdict.reason == "veto 1"
    for _ in range(2):  # and every one after it, alike
        again = await rig.sim.ask("finalize_simulation", FIN)
        assert not again.error and again.finalize_simulation.user_verdict.reason == "veto 1"
    assert t.calls == 1 and rig.answered == [{"success": False, "reason": "veto 1"}]
    await rig.host.aclose()


async def test_a_second_finalize_while_the_verdict_is_being_sent_gets_the_verdict_too() -> None:
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.end.hold = True  # the verdict's reply is under way
    first = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    assert t.fin.state == "replying"
    # taken in once the send returns, before its outcome: still replying
    second = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    t.end.release.set()
    for rid in (first, second):
        assert (await rig.sim.reply(rid)).finalize_simulation.user_verdict.reason == "veto 1"
    assert t.calls == 1 and rig.answered == [{"success": False, "reason": "veto 1"}]
    await rig.host.aclose()
    await rig.settle()
    rig.sim.pump()
    # one reply per request
    assert sorted(r.request_id for r in rig.sim.received) == sorted([first, second])


async def test_the_host_closing_while_answering_two_requests_tells_both() -> None:
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.compute.clear()  # on_simulation_end never returns
    first = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    second = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())
    await rig.clock.advance(3)  # the drain bound
    await rig.settle()
    assert closing.done() and t.fin.state == "closed"
    rig.sim.pump()
    assert sorted(rig.sim.responses) == sorted([first, second])
    assert {r.error for r in rig.sim.responses.values()} == {FINALIZE_UNFINISHED}
    assert rig.answered == []


async def test_the_host_closing_while_answering_gets_the_simulator_one_error_reply() -> None:
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.compute.clear()  # on_simulation_end never returns
    rid = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())
    await rig.clock.advance(2.9)
    assert t.fin.state == "answering" and not closing.done()
    await rig.clock.advance(0.1)  # the drain bound
    await rig.settle()
    assert closing.done() and t.fin.state == "closed"
    rig.sim.pump()
    assert rig.sim.responses == {rid: rig.sim.responses[rid]}
    assert rig.sim.responses[rid].error == FINALIZE_UNFINISHED
    assert rig.answered == []


async def test_the_host_closing_while_the_verdict_is_being_sent_lets_it_arrive_once() -> None:
    """The host closes (the job is ending) while ``on_simulation_end`` still runs; it
    returns just before the drain's bound, so the verdict's reply is under way when the
    host's close reaches the answer. The reply still goes out, once, with no error reply
    after it; the job is told it was answered; the close returns without raising."""
    t = Setup()
    rig = t.rig
    await rig.host.start()
    t.compute.clear()
    t.end.hold = True
    rid = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    closing = asyncio.ensure_future(rig.host.aclose())
    await rig.clock.advance(2.9)
    t.compute.set()  # the verdict, 0.1 s before the drain's bound
    await rig.clock.advance(0.1)
    assert t.fin.state == "replying"
    await rig.clock.advance(0.5)
    t.end.release.set()  # the send returns, within its own bound
    await rig.clock.advance(5.0)
    await closing
    assert rig.last("close", machine="finalize").source == "replying"  # the cell in question
    rig.sim.pump()
    assert [r.request_id for r in rig.sim.received] == [rid]
    assert rig.sim.received[0].finalize_simulation.user_verdict.reason == "veto 1"
    assert rig.answered == [{"success": False, "reason": "veto 1"}] and t.calls == 1


# -- every cell of the table, through the host ----------------------------------------------

# (state, trigger) -> (outcome, dest, effects); written out by hand: a changed cell fails here
CELLS: dict[tuple[str, str], tuple[str, str, tuple[str, ...]]] = {
    ("idle", "request"): ("transition", "answering", ("take_request",)),
    ("idle", "request:no_simulation"): ("transition", "idle", ("refuse_not_simulation",)),
    ("idle", "verdict_ready"): ("ignore", "idle", ()),
    ("idle", "delivered"): ("ignore", "idle", ()),
    ("idle", "undelivered"): ("ignore", "idle", ()),
    ("idle", "close"): ("transition", "closed", ()),
    ("answering", "request"): ("transition", "answering", ("await_verdict",)),
    ("answering", "verdict_ready"): ("transition", "replying", ("send_verdict",)),
    ("answering", "delivered"): ("ignore", "answering", ()),
    ("answering", "undelivered"): ("ignore", "answering", ()),
    ("answering", "close"): ("transition", "closed", ("reply_unfinished",)),
    ("replying", "request"): ("transition", "replying", ("resend_verdict",)),
    ("replying", "verdict_ready"): ("ignore", "replying", ()),
    ("replying", "delivered"): ("transition", "answered", ("report_answered",)),
    ("replying", "undelivered"): ("transition", "idle", ()),
    ("replying", "close"): ("ignore", "replying", ()),
    ("answered", "request"): ("transition", "answered", ("resend_verdict",)),
    ("answered", "verdict_ready"): ("ignore", "answered", ()),
    ("answered", "delivered"): ("ignore", "answered", ()),
    ("answered", "undelivered"): ("ignore", "answered", ()),
    ("answered", "close"): ("transition", "closed", ()),
    **{("closed", e): ("ignore", "closed", ()) for e in FINALIZE.events},
}

# what the simulator is told about the request a cell's event is (or its first request)
REPLIES = {
    ("idle", "request:no_simulation"): "this job is not a simulation",
    ("answering", "close"): FINALIZE_UNFINISHED,
}


@pytest.mark.snapshot  # pins each cell as written
def test_every_cell_of_the_spec_is_in_the_cell_table() -> None:
    covered = {(s, t.split(":")[0]) for s, t in CELLS}
    assert covered == {(s, e) for s in FINALIZE.state_names for e in FINALIZE.events}


async def _reach(t: Setup, state: str, event: str) -> str | None:
    """Drive the host's finalize into ``state``; returns the first request's id, if any."""
    rig = t.rig
    await rig.host.start()
    if state == "closed":
        rig.host.wiring.fire("session_host", "close_finalize")  # what the host's close sends
        await t.fin.actor.join()
        return None
    if state == "idle":
        return None
    if state == "answering" or (state == "replying" and event == "close"):
        t.compute.clear()
    if state == "replying":
        t.end.hold = True
    rid = await rig.sim.send("finalize_simulation", FIN)
    await rig.settle()
    if state == "replying" and event == "close":
        # the host starts closing while the verdict is computed; it is ready just before the
        # drain's bound, so the close reaches the machine while the reply is under way
        rig.host.actor.post(Event("close"))
        await rig.clock.advance(2.5)
        t.compute.set()
        await rig.settle()
    return rid


async def _cause(t: Setup, state: str, trigger: str) -> str | None:
    """Make the event reach the machine as the world would; where nothing in the world
    sends it in this state, post it as a late one. Returns a new request's id, if any."""
    rig = t.rig
    event = trigger.split(":")[0]
    if state == "replying" and event not in ("delivered", "undelivered"):
        # the reply under way holds the machine's mailbox for at most its bound; what
        # arrives meanwhile is handled, in replying, as soon as the send returns
        asked = await _cause(t, "waiting", trigger)
        if event == "close":
            await rig.clock.advance(0.5)  # the drain's bound: the host closes the machine
        t.end.release.set()
        return asked
    if event == "request":
        return await rig.sim.send("finalize_simulation", FIN)
    if state == "answering" and event == "verdict_ready":
        t.compute.set()
    elif state == "replying" and event in ("delivered", "undelivered"):
        t.end.fail = event == "undelivered"
        t.end.release.set()
    elif state == "waiting" and event == "close":
        pass  # the host is already closing: its drain's bound closes the machine
    elif event == "close" and state in ("idle", "answered"):
        rig.host.actor.post(Event("close"))  # the host closes; nothing left to drain
    elif event == "close" and state == "answering":
        rig.host.actor.post(Event("close"))
        await rig.settle()
        await rig.clock.advance(3)  # on_simulation_end outlives the drain's bound
    else:
        t.fin.actor.post(Event(event, {"request_id": "late"}))
    return None


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize(("state", "trigger"), list(CELLS), ids=[f"{s}-{t}" for s, t in CELLS])
async def test_cell(state: str, trigger: str) -> None:
    outcome, dest, effects = CELLS[(state, trigger)]
    event = trigger.split(":")[0]
    t = Setup(simulation=not trigger.endswith("no_simulation"))
    rig = t.rig
    first = await _reach(t, state, event)
    assert t.fin.state == state
    mark = len(rig.sink.records)

    asked = await _cause(t, state, trigger)
    await rig.settle()

    rec = rig.last(event, machine="finalize")
    assert rig.sink.records.index(rec) >= mark, f"the machine never saw {event}"
    assert (rec.kind, rec.source, rec.dest, tuple(rec.effects)) == (
        outcome,
        state,
        dest,
        effects,
    )
    rig.sim.pump()
    want = REPLIES.get((state, trigger))
    if want is not None:
        rid = asked if event == "request" else first
        assert rid is not None and rig.sim.responses[rid].error == want
    # the job is told of the verdict exactly when the simulator got it
    got = [rig.sim.responses.get(r) for r in (first, asked) if r is not None]
    verdicts = [r for r in got if r is not None and r.HasField("finalize_simulation")]
    # (a request asked again gets the kept verdict too; the job is told once)
    assert len(rig.answered) == min(len(verdicts), 1)
    if event == "request" and state in ("replying", "answered"):
        assert asked is not None
        assert rig.sim.responses[asked].finalize_simulation.user_verdict.reason == "veto 1"
    if dest == "answered" and state != "answered":
        assert rig.answered == [{"success": False, "reason": "veto 1"}]
    t.compute.set()
    t.end.release.set()
    await rig.clock.advance(10)
    await rig.host.aclose()
    assert rig.host.finalize.actor.closed and rig.host.finalize.actor.live_tasks == 0
    assert rig.clock.pending == 0
