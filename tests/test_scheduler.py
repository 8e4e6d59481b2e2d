"""One scheduler for several actors: which actor steps when, and what costs a task.

Small machines on a virtual clock; the order asserted is the one a job's machines rely on
(every machine an input reaches has it before any of them steps; an event posted inside a
step is handled after that step; an awaited effect holds only its own actor).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent_runtime import Actor, Event, MemorySink, Scheduler, Tracer
from agent_runtime.scheduler import after, ending, relay, when_all, within
from agent_runtime.testing.clock import VirtualClock
from statemachines import Effect, MachineSpec, State, cells, row

# a relay: `ping` moves it to `on` and runs `tell` (which may post to another actor);
# `work` runs an effect that may be awaited; `note` only logs
RELAY = MachineSpec(
    name="relay",
    initial="off",
    states=(State(name="off"), State(name="on")),
    events=("ping", "work", "note", "reset"),
    effects=(Effect(name="tell"), Effect(name="slow", error_event="note"), Effect(name="log")),
    rows=(
        *row(["off", "on"], "ping", "on", effects=["tell"]),
        *row(["off", "on"], "work", None, effects=["slow", "log"]),
        *row(["off", "on"], "note", None, effects=["log"]),
        *row("on", "reset", "off"),
    ),
    ignore=(*cells("off", "reset"),),
)


class Net:
    """Named relays on one scheduler; ``seen`` is every effect run, as ``name:effect``."""

    def __init__(self, *names: str, effect_timeout: float = 5.0) -> None:
        self.clock = VirtualClock()
        self.scheduler = Scheduler()
        self.sink = MemorySink()
        self.seen: list[str] = []
        self.tells: dict[str, Callable[[], None]] = {}
        self.slow: dict[str, Callable[[], Awaitable[Any] | None]] = {}
        self.actors = {n: self._relay(n, effect_timeout) for n in names}

    def _relay(self, name: str, effect_timeout: float) -> Actor:
        def tell(ev: Event) -> None:
            self.seen.append(f"{name}:tell")
            if name in self.tells:
                self.tells[name]()

        def slow(ev: Event) -> Awaitable[Any] | None:
            self.seen.append(f"{name}:slow")
            return self.slow[name]() if name in self.slow else None

        def log(ev: Event) -> None:
            self.seen.append(f"{name}:log {ev.name}")

        return Actor(
            RELAY,
            instance=name,
            effects={"tell": tell, "slow": slow, "log": log},
            clock=self.clock,
            tracer=Tracer(self.sink),
            scheduler=self.scheduler,
            effect_timeout=effect_timeout,
        )

    async def join(self) -> None:
        for actor in self.actors.values():
            await actor.join()


async def test_every_actor_an_input_reaches_has_it_before_any_of_them_steps() -> None:
    net = Net("a", "b")
    states: list[tuple[str, str]] = []
    # a's effect looks at b: b must not have stepped yet, though b's ping was posted first
    net.tells["a"] = lambda: states.append(("b", net.actors["b"].state))
    net.actors["b"].post(Event("ping"))
    net.actors["a"].post(Event("ping"))
    assert net.seen == []  # posted from outside a step: nothing steps inside post()
    await net.join()
    assert net.seen == ["b:tell", "a:tell"]  # in the order they became ready
    assert states == [("b", "on")]


async def test_an_event_posted_inside_a_step_is_handled_after_that_step() -> None:
    net = Net("a", "b")
    net.tells["a"] = lambda: net.actors["b"].post(Event("note"))
    net.tells["b"] = lambda: net.actors["a"].post(Event("note"))
    net.actors["a"].post(Event("ping"))
    net.actors["a"].post(Event("note"))
    await net.join()
    # a finishes its mailbox (ping, then the note queued from outside) before b's note;
    # b's reply to a comes last
    assert net.seen == ["a:tell", "a:log note", "b:log note"]


async def test_an_awaited_effect_holds_its_own_actor_only() -> None:
    net = Net("a", "b")
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    net.slow["a"] = lambda: gate
    net.actors["a"].post(Event("work"))
    net.actors["a"].post(Event("note"))
    net.actors["b"].post(Event("note"))
    await net.actors["b"].join()
    # a waits on its effect (its `log` and its queued note wait too); b went on
    assert net.seen == ["a:slow", "b:log note"]
    assert not net.actors["a"].idle
    gate.set_result(None)
    await net.join()
    assert net.seen == ["a:slow", "b:log note", "a:log work", "a:log note"]


async def test_an_effect_past_its_bound_is_a_timeout_and_the_mailbox_goes_on() -> None:
    net = Net("a", effect_timeout=2.0)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    net.slow["a"] = lambda: never
    net.actors["a"].post(Event("work"))
    net.actors["a"].post(Event("note"))
    await net.clock.advance(1.9)
    assert net.seen == ["a:slow"]
    await net.clock.advance(0.1)
    await net.join()
    assert never.cancelled()  # the work is cut, not left running
    outcomes = [r.outcome for r in net.sink.records if r.kind == "effect" and r.effect == "slow"]
    assert outcomes == ["timeout"]
    # the rest of the step runs, then the queued note, then the effect's error event
    assert net.seen == ["a:slow", "a:log work", "a:log note", "a:log note"]
    notes = [r.data for r in net.sink.records if r.kind == "transition" and r.event == "note"]
    assert len(notes) == 2 and notes[-1] != {}  # the second is the error event, with why


async def test_a_failing_step_is_its_actors_alone() -> None:
    net = Net("a", "b")

    def boom() -> None:
        raise RuntimeError("a's effect failed")

    net.tells["a"] = boom
    net.actors["a"].post(Event("ping"))
    net.actors["b"].post(Event("ping"))
    await net.join()
    assert net.actors["b"].state == "on" and "b:tell" in net.seen


async def test_synchronous_effects_cost_no_task_and_one_loop_call_per_input() -> None:
    """The cost the scheduler exists for: stepping is not a task per actor, nor a callback
    per posted event."""
    net = Net("a", "b", "c")
    net.tells["a"] = lambda: (net.actors["b"].post(Event("ping")), None)[1]
    net.tells["b"] = lambda: (net.actors["c"].post(Event("ping")), None)[1]
    loop = asyncio.get_running_loop()
    tasks: list[str] = []

    def factory(loop_: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        tasks.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop_, **kw)

    calls: list[str] = []
    call_soon = loop.call_soon

    def counted(cb: Any, *args: Any, **kw: Any) -> asyncio.Handle:
        calls.append(getattr(cb, "__qualname__", repr(cb)))
        return call_soon(cb, *args, **kw)

    loop.call_soon = counted  # type: ignore[method-assign]
    loop.set_task_factory(factory)
    try:
        for _ in range(10):
            net.actors["a"].post(Event("ping"))
            net.actors["a"].post(Event("note"))
            await asyncio.sleep(0)  # one input, then the loop turns
    finally:
        loop.set_task_factory(None)
        del loop.call_soon  # the class's own again
    await net.join()
    assert net.seen.count("c:tell") == 10
    assert tasks == []
    # one scheduler run per input, whatever it reached, and no other call
    # (the other calls are this test's own task waking from its sleep)
    assert [c for c in calls if "TaskStepMethWrapper" not in c] == ["Scheduler.run"] * 10
    assert net.scheduler.quiet


async def test_when_all_ends_with_its_result_however_the_work_ended() -> None:
    loop = asyncio.get_running_loop()
    ok, failed, cut = (loop.create_future() for _ in range(3))
    done = when_all([ok, failed, cut], "drained")
    ok.set_result(1)
    failed.set_exception(RuntimeError("a close that failed"))
    await asyncio.sleep(0)
    assert not done.done()  # one still running
    cut.cancel()
    assert await done == "drained"


async def test_when_settled_is_a_future_done_at_the_first_quiet_moment_in_the_state_asked() -> None:
    net = Net("a")
    a = net.actors["a"]
    loop = asyncio.get_running_loop()
    gate: asyncio.Future[None] = loop.create_future()
    net.slow["a"] = lambda: gate
    assert a.when_settled() is None  # idle, nothing asked: nothing to wait for
    on = a.when_settled(lambda state: state == "on")
    assert on is not None
    tasks = asyncio.all_tasks()
    a.post(Event("ping"))
    a.post(Event("work"))  # its effect is awaited: `on` holds while it runs
    await asyncio.sleep(0)
    assert a.state == "on" and not on.done()
    assert asyncio.all_tasks() == tasks  # waiting costs no task
    gate.set_result(None)
    await on
    assert net.seen == ["a:tell", "a:slow", "a:log work"]
    off = a.when_settled(lambda state: state == "off")
    assert off is not None
    a.release()
    await off  # a close wakes every waiter: nothing would ever settle it


async def test_after_and_ending_chain_waits_without_a_task() -> None:
    loop = asyncio.get_running_loop()
    first: asyncio.Future[None] = loop.create_future()
    second: asyncio.Future[None] = loop.create_future()
    ran: list[str] = []

    def then() -> asyncio.Future[None] | None:
        ran.append("then")
        return ending(second, None)

    tasks = asyncio.all_tasks()
    chained = after(first, then)
    assert chained is not None and asyncio.all_tasks() == tasks
    first.set_exception(RuntimeError("its owner's to report"))
    await asyncio.sleep(0)
    assert ran == ["then"] and not chained.done()  # then() runs however first ended
    second.set_result(None)
    await chained
    # nothing to wait for: then() at once, and None back
    assert after(None, lambda: None) is None and ending(None, second) is None


async def test_a_cut_chain_cancels_what_it_waits_on_and_still_runs_the_rest() -> None:
    loop = asyncio.get_running_loop()
    waited: asyncio.Future[None] = loop.create_future()
    ran: list[str] = []
    chained = after(waited, lambda: ran.append("released") and None)
    assert chained is not None
    out = relay(chained, "released")
    out.cancel()  # the state's bound cut it
    for _ in range(4):  # each link of the chain hears it on the loop's next turn
        await asyncio.sleep(0)
    assert waited.cancelled() and ran == ["released"]


async def test_within_ends_at_the_work_or_at_its_bound_and_leaves_the_work_running() -> None:
    clock = VirtualClock()
    loop = asyncio.get_running_loop()
    quick: asyncio.Future[None] = loop.create_future()
    bounded = within(quick, 3.0, clock)
    quick.set_result(None)
    await asyncio.sleep(0)
    assert bounded.done() and clock.next_deadline() is None  # its timer went with it
    hung: asyncio.Future[None] = loop.create_future()
    cut = within(hung, 3.0, clock)
    await clock.advance(2.9)
    assert not cut.done()
    await clock.advance(0.1)
    assert cut.done() and cut.result() is None
    assert not hung.done()  # the work is its owner's to cut
    given_up = within(hung, 3.0, clock)
    given_up.cancel()  # the wait cut: its timer goes with it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert clock.next_deadline() is None and not hung.done()
    hung.cancel()
