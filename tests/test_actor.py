"""The actor's guarantees, on a small machine and a virtual clock (no real sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_runtime import Actor, ActorClosed, Event, EventRejected, MemorySink, Output, Tracer
from agent_runtime.testing.clock import VirtualClock
from statemachines import Effect, MachineSpec, State, StateTimeout, UnknownEvent, cells, row

LAMP = MachineSpec(
    name="lamp",
    initial="off",
    states=(
        State(name="off"),
        State(
            name="on",
            timeout=StateTimeout(event="tick", setting="auto_off", default=10.0),
            invoke=("hum",),
        ),
        State(name="broken", final=True),
    ),
    events=("press", "tick", "fault", "note", "hummed"),
    guards=("armed",),
    effects=(
        Effect(name="glow"),
        Effect(name="fuse", error_event="fault"),
        Effect(name="hum", error_event="fault"),
        Effect(name="log"),
    ),
    rows=(
        *row("off", "press", "on", effects=["glow", "fuse"]),
        *row("on", "press", "off", guards=["armed"]),
        *row("on", "press", None, effects=["log"]),
        *row("on", "tick", "off"),
        *row(["off", "on"], "fault", "broken"),
        *row(["off", "on"], "note", None, effects=["log"]),
    ),
    ignore=(
        *cells("off", ["tick", "hummed"]),
        *cells("on", "hummed"),
        *cells("broken", ["tick", "fault", "note", "hummed"]),
    ),
    reject=(*cells("broken", "press"),),
)


class Harness:
    def __init__(self, owner: Callable[[Any], None] | None = None, **settings: Any) -> None:
        self.clock = VirtualClock()
        self.log: list[str] = []
        self.sink = MemorySink()
        self.fuse_raises = False
        self.hum_started = asyncio.Event()
        self.armed = True

        async def fuse(ev: Event) -> None:
            self.log.append(f"fuse in {self.actor.state}")
            if self.fuse_raises:
                raise RuntimeError("blown")

        async def hum(ev: Event) -> None:
            self.hum_started.set()
            await asyncio.Event().wait()  # runs for as long as the state

        def glow(ev: Event) -> Event:
            self.log.append(f"glow in {self.actor.state}")
            return Event("note", {"from": "glow"})

        def log(ev: Event) -> None:
            self.log.append(f"log {ev.name} {dict(ev.data)}")

        self.actor = Actor(
            LAMP,
            instance="1",
            effects={"glow": glow, "fuse": fuse, "hum": hum, "log": log},
            guards={"armed": lambda ev: self.armed},
            settings=settings,
            clock=self.clock,
            tracer=Tracer(self.sink),
            owner=owner,
        )


async def test_effects_run_after_the_state_change_and_raised_events_queue_behind() -> None:
    h = Harness()
    h.actor.post(Event("press"))
    h.actor.post(Event("note", {"n": 1}))
    await h.actor.join()
    assert h.actor.state == "on"
    # glow and fuse see the new state; glow's event runs after the already queued note
    assert h.log == ["glow in on", "fuse in on", "log note {'n': 1}", "log note {'from': 'glow'}"]


async def test_send_returns_the_step_and_reject_changes_nothing() -> None:
    h = Harness()
    h.actor.post(Event("fault"))
    await h.actor.join()
    assert h.actor.state == "broken"
    with pytest.raises(EventRejected, match=r"lamp\[1\] rejects event 'press' in state 'broken'"):
        await h.actor.send(Event("press"))
    assert h.actor.state == "broken"
    assert [r.kind for r in h.sink.records][-1] == "reject"


async def test_unknown_event_is_a_clear_error() -> None:
    h = Harness()
    with pytest.raises(UnknownEvent, match="machine 'lamp' has no event 'explode'"):
        h.actor.post(Event("explode"))
    assert h.actor.state == "off"


async def test_effect_exception_becomes_the_declared_event() -> None:
    h = Harness()
    h.fuse_raises = True
    await h.actor.send(Event("press"))
    await h.actor.join()
    assert h.actor.state == "broken"
    eff = [r for r in h.sink.records if r.kind == "effect" and r.effect == "fuse"]
    assert eff[0].outcome == "error" and "blown" in eff[0].detail


async def test_state_timeout_fires_on_virtual_time_and_dies_with_its_state() -> None:
    h = Harness(auto_off=5.0)
    await h.actor.send(Event("press"))
    await h.clock.advance(4.9)
    assert h.actor.state == "on"
    await h.clock.advance(0.2)
    assert h.actor.state == "off"
    assert h.clock.now() == pytest.approx(5.1)
    # leaving the state early cancels its timer
    await h.actor.send(Event("press"))
    await h.clock.advance(1.0)
    await h.actor.send(Event("press"))  # armed: on -> off
    assert not h.actor.timer_armed
    assert h.clock.pending == 0


async def test_internal_transition_keeps_the_timer() -> None:
    h = Harness(auto_off=5.0)
    h.armed = False
    await h.actor.send(Event("press"))
    await h.clock.advance(3.0)
    step = await h.actor.send(Event("press"))  # not armed: internal, timer keeps running
    assert step.internal and h.actor.state == "on"
    await h.clock.advance(2.5)
    assert h.actor.state == "off"


async def test_state_tasks_start_on_entry_and_are_cancelled_on_exit() -> None:
    h = Harness()
    await h.actor.send(Event("press"))
    await h.clock.advance(0)
    assert h.hum_started.is_set() and h.actor.live_tasks == 1
    await h.actor.send(Event("press"))
    await h.clock.advance(0)
    assert h.actor.state == "off" and h.actor.live_tasks == 0


async def test_stale_timeout_already_queued_is_dropped() -> None:
    h = Harness(auto_off=1.0)
    await h.actor.send(Event("press"))
    # the timer fires and queues `tick` behind a `press` that leaves the state first
    h.actor.post(Event("press"))
    await h.clock.advance(1.0)
    assert h.actor.state == "off"
    assert not any(r.kind == "transition" and r.event == "tick" for r in h.sink.records)


async def test_events_after_close_are_refused_and_tasks_released() -> None:
    h = Harness()
    await h.actor.send(Event("press"))
    await h.clock.advance(0)
    await h.actor.aclose()
    assert h.actor.live_tasks == 0 and h.clock.pending == 0
    with pytest.raises(ActorClosed):
        await h.actor.send(Event("press"))
    h.actor.post(Event("press"))  # logged and dropped, never raised
    assert h.actor.state == "on"


async def test_effect_that_hangs_is_bounded() -> None:
    h = Harness()

    async def hang(ev: Event) -> None:
        await asyncio.Event().wait()

    h.actor._effects = {**h.actor._effects, "fuse": hang}
    h.actor.effect_timeout = 2.0
    h.actor.post(Event("press"))
    await h.clock.advance(2.0)
    await h.actor.join()
    assert h.actor.state == "broken"  # the timeout raised fuse's error event
    eff = [r for r in h.sink.records if r.kind == "effect" and r.effect == "fuse"]
    assert eff[0].outcome == "timeout"


async def test_state_changed_is_emitted() -> None:
    h = Harness()
    seen: list[tuple[str, str]] = []
    h.actor.on("state_changed", lambda ch: seen.append((ch.source, ch.dest)))
    await h.actor.send(Event("press"))
    assert seen == [("off", "on")]


async def test_the_owner_hears_each_change_before_the_listeners() -> None:
    heard: list[str] = []

    def owner(ch: Any) -> None:
        heard.append(f"owner {ch.dest}")

    h = Harness(owner)  # given as it is built: nothing sets it later
    h.actor.on("state_changed", lambda ch: heard.append(f"listener {ch.dest}"))
    await h.actor.send(Event("press"))
    assert heard == ["owner on", "listener on"]


async def test_an_owner_that_raises_is_logged_dropped_and_the_transition_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []

    def owner(ch: Any) -> None:
        heard.append(f"owner {ch.dest}")
        raise RuntimeError("owner broke")

    h = Harness(owner)
    h.actor.on("state_changed", lambda ch: heard.append(f"listener {ch.dest}"))
    await h.actor.send(Event("press"))
    await h.actor.send(Event("tick"))
    # the listeners still heard, the effects ran, the owner failed once and was dropped
    assert heard == ["owner on", "listener on", "listener off"]
    assert h.log[:2] == ["glow in on", "fuse in on"]
    failed = [r for r in caplog.records if "owner broke" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "ERROR"


async def test_missing_handler_is_refused() -> None:
    with pytest.raises(ValueError, match="no handler for glow"):
        Actor(LAMP, effects={}, guards={"armed": lambda e: True})


async def test_until_waits_for_a_state_and_returns_when_the_actor_closes() -> None:
    h = Harness(auto_off=5.0)
    await h.actor.until(lambda state: state == "off")  # already there: at once
    h.actor.post(Event("press"))
    waiting = asyncio.ensure_future(h.actor.until(lambda state: state == "off"))
    await h.clock.advance(4.0)
    assert not waiting.done() and h.actor.state == "on"
    await h.clock.advance(1.0)  # the timeout takes it back to off
    assert waiting.done() and h.actor.state == "off"
    await h.actor.send(Event("press"))
    never = asyncio.ensure_future(h.actor.until(lambda state: state == "broken"))
    await h.clock.advance(0)
    assert not never.done()
    await h.actor.aclose()  # a closed actor changes no more: the wait ends
    await h.clock.advance(0)
    assert never.done() and h.actor.state == "on"


# -- an effect's success is passed on to its declared links (XState's onDone) ---------------


class Heard:
    """Where an actor passes its effects' outputs (the job's Wiring, in a job)."""

    def __init__(self, into: list[tuple[str, dict[str, Any]]]) -> None:
        self.into = into

    def fire(self, source: str, on: str, data: Any = None) -> None:
        assert source == "lamp"
        self.into.append((on, dict(data or {})))


async def test_a_linked_effect_passes_its_output_on_success_and_nothing_on_failure() -> None:
    h = Harness()
    heard: list[tuple[str, dict[str, Any]]] = []
    h.actor.pass_outputs(frozenset({"glow", "fuse"}), Heard(heard))
    await h.actor.send(Event("press"))
    await h.actor.join()
    # glow returned an event for its own machine: its links hear empty data; fuse's coroutine
    # returned nothing; log is not linked
    assert heard == [("glow", {}), ("fuse", {})]
    h2 = Harness()
    h2.fuse_raises = True
    heard.clear()
    h2.actor.pass_outputs(frozenset({"fuse"}), Heard(heard))
    await h2.actor.send(Event("press"))
    await h2.actor.join()
    assert h2.actor.state == "broken" and heard == []  # a failure is the error event's, only


async def test_an_output_carries_the_links_data() -> None:
    h = Harness()
    heard: list[tuple[str, dict[str, Any]]] = []

    def log(ev: Event) -> Output:
        return Output({"said": ev.name})

    actor = Actor(
        LAMP,
        effects={
            "glow": lambda ev: None,
            "fuse": lambda ev: None,
            "hum": lambda ev: None,
            "log": log,
        },
        guards={"armed": lambda ev: True},
        clock=h.clock,
    )
    actor.pass_outputs(frozenset({"log"}), Heard(heard))
    await actor.send(Event("note"))
    assert heard == [("log", {"said": "note"})]
