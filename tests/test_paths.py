"""Path coverage through the real actor: for every machine, paths from its initial state
that reach every state and take every transition row at least once.

Each path runs on a fresh ``Actor`` with a ``VirtualClock``; effect handlers are stubs that
record their calls (state-scoped tasks block until cancelled), and before each row the guard
values are set so that exactly that row's guards hold. A row whose event is its state's own
timeout is taken by letting virtual time pass, not by sending the event. After each row the
test checks where the actor is, which effects ran in which order, that the trace recorded
the row, that a left state's timer and tasks are gone and an entered state's are there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_runtime import Actor, Event, MemorySink, Tracer
from agent_runtime.testing.clock import VirtualClock
from statemachines import MachineSpec, Row
from statemachines.machines import MACHINES
from verification.explore.paths import CoverageError, PathStep, cover

# paths planned from the specs as written
pytestmark = pytest.mark.snapshot

PLANS = {name: cover(spec) for name, spec in MACHINES.items()}


def _path_params() -> list[Any]:
    return [
        pytest.param(name, k, id=f"{name}-path{k + 1}")
        for name, paths in PLANS.items()
        for k in range(len(paths))
    ]


class Rig:
    """One actor with stub effects and guard values chosen per row."""

    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self.clock = VirtualClock()
        self.sink = MemorySink()
        self.calls: list[str] = []
        self.tasks_started: list[str] = []
        self.guards: dict[str, bool] = dict.fromkeys(spec.guards, False)
        invoked = {name for st in spec.states for name in st.invoke}
        effects: dict[str, Any] = {}
        for eff in spec.effects:
            effects[eff.name] = (
                self._task(eff.name) if eff.name in invoked else self._effect(eff.name)
            )
        self.actor = Actor(
            spec,
            instance="paths",
            effects=effects,
            guards={g: self._guard(g) for g in spec.guards},
            clock=self.clock,
            tracer=Tracer(self.sink),
        )

    def _effect(self, name: str) -> Any:
        def run(ev: Event) -> None:
            self.calls.append(name)

        return run

    def _task(self, name: str) -> Any:
        async def run(ev: Event) -> None:
            self.tasks_started.append(name)
            await asyncio.Event().wait()  # runs for as long as its state

        return run

    def _guard(self, name: str) -> Any:
        return lambda ev: self.guards[name]

    async def take(self, step: PathStep) -> None:
        r = step.row
        self.guards = {g: g in r.guards for g in self.spec.guards}
        self.calls.clear()
        before = len(self.sink.records)
        if step.by_timeout:
            timeout = self.spec.state(r.source).timeout
            assert timeout is not None and self.actor.timer_armed
            await self.clock.advance(timeout.default)
            await self.actor.join()
        else:
            st = await self.actor.send(Event(r.event))
            assert (st.outcome, st.dest, st.effects) == ("transition", step.dest, r.effects)
        assert self.actor.state == step.dest, f"{step}: the actor is in {self.actor.state}"
        assert self.calls == list(r.effects), f"{step}: effects {self.calls}"
        moves = [x for x in self.sink.records[before:] if x.kind == "transition"]
        assert [(x.source, x.event, x.dest) for x in moves] == [(r.source, r.event, step.dest)]
        # the guards consulted held exactly where this row wants them
        assert all(moves[0].guards.get(g) is True for g in r.guards)
        assert all(v == (g in r.guards) for g, v in moves[0].guards.items())

    async def check_state_scoped(self, entered: bool) -> None:
        await asyncio.sleep(0)  # let a task started on entry begin
        st = self.spec.state(self.actor.state)
        if entered:
            assert self.actor.timer_armed == (st.timeout is not None)
        assert self.actor.live_tasks == len(st.invoke)


@pytest.mark.parametrize(("machine", "k"), _path_params())
async def test_path_through_the_real_actor(machine: str, k: int) -> None:
    spec = MACHINES[machine]
    rig = Rig(spec)
    rig.actor.start()
    await rig.check_state_scoped(entered=True)
    for step in PLANS[machine][k]:
        await rig.take(step)
        await rig.check_state_scoped(entered=step.row.dest is not None)
    await rig.actor.aclose()
    assert rig.actor.live_tasks == 0 and rig.clock.pending == 0


@pytest.mark.parametrize("machine", list(MACHINES))
def test_paths_take_every_row_and_reach_every_state(machine: str) -> None:
    spec = MACHINES[machine]
    taken = [s.row for path in PLANS[machine] for s in path]
    assert {id(r) for r in taken} == {id(r) for r in spec.rows}
    reached = {spec.initial} | {s.dest for path in PLANS[machine] for s in path}
    assert reached == set(spec.state_names)
    # every path starts where the machine starts and each row follows on from the last
    for path in PLANS[machine]:
        at = spec.initial
        for s in path:
            assert s.row.source == at
            at = s.dest


def test_every_timeout_row_is_taken_by_letting_time_pass() -> None:
    for name, spec in MACHINES.items():
        timeout_rows = [
            r
            for r in spec.rows
            if (t := spec.state(r.source).timeout) is not None and t.event == r.event
        ]
        by_time = {id(s.row) for p in PLANS[name] for s in p if s.by_timeout}
        assert {id(r) for r in timeout_rows} <= by_time, name


def _with_rows(spec: MachineSpec, rows: list[Row]) -> MachineSpec:
    # model_copy skips validation: the broken spec is what the planner must refuse
    return spec.model_copy(update={"rows": tuple(rows)})


def test_a_row_an_earlier_row_always_beats_is_reported() -> None:
    job = MACHINES["job"]
    rows = list(job.rows)
    # (serving, shutdown): the unguarded row moved first hides the hold_needed one
    guarded = next(
        r
        for r in rows
        if (r.source, r.event, r.guards) == ("serving", "shutdown", ("hold_needed",))
    )
    rows.remove(guarded)
    at = next(k for k, r in enumerate(rows) if (r.source, r.event) == ("serving", "shutdown"))
    rows.insert(at + 1, guarded)
    with pytest.raises(CoverageError) as err:
        cover(_with_rows(job, rows))
    assert str(err.value) == (
        "machine 'job': row (serving, shutdown) [hold_needed] is never taken: the earlier "
        "row guarded by nothing wins whenever its guards hold"
    )


def test_an_unreachable_state_is_reported() -> None:
    job = MACHINES["job"]
    rows = [r for r in job.rows if r.dest != "awaiting_finalize"]
    with pytest.raises(CoverageError) as err:
        cover(_with_rows(job, rows))
    msg = str(err.value)
    assert "state 'awaiting_finalize' is unreachable from 'serving'" in msg
    assert "row (awaiting_finalize, finalize_answered) starts from an unreachable state" in msg
