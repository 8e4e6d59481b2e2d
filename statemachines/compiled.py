"""Every spec compiled into a ``transitions`` machine: a second, independent executor of
the same table, checked against ``step`` (``tests/test_compiled.py``) and deciding the
offline replay of the runtime's traces.

Each cell becomes what ``transitions`` itself does for it:

* transition rows, in the table's order, with their guards as conditions (checked in order,
  the first row whose conditions all pass is taken) and their effects as ``after``
  callbacks; ``dest=None`` is ``transitions``' internal transition (no exit, no entry);
* an ignore cell is an internal transition whose only callback marks the event ignored;
* a reject cell has no transition: with ``ignore_invalid_triggers`` off, triggering it
  raises ``MachineError``;
* a cell whose rows are all guarded by exclusive guards, none holding: the trigger returns
  False (no transition taken), which is an ignore.

What happened is read back from ``transitions``' callbacks (exit/enter, after, the
transition executed), never from the spec, and returned as a ``Step``, so the two executors
compare field by field. The machine is built once per spec and shared (no model is ever
added: a run passes its own small model to the event's trigger); like ``step``'s table
cache, the cache holds specs weakly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from transitions import Machine, MachineError

from .spec import MachineSpec
from .step import GuardValues, Step, UnknownEvent, UnknownState, step


@dataclass(frozen=True, slots=True)
class _Guard:
    """A condition: the guard's value, as the caller supplies it for this trigger."""

    name: str

    def __call__(self, event_data: Any) -> bool:
        run: _Run = event_data.model
        return run.check(self.name)


@dataclass(frozen=True, slots=True)
class _Effect:
    """An ``after`` callback: the effect is recorded, in the order ``transitions`` runs it."""

    name: str

    def __call__(self, event_data: Any) -> None:
        run: _Run = event_data.model
        run.effects.append(self.name)


def _ignored(event_data: Any) -> None:
    run: _Run = event_data.model
    run.ignored = True


def _exited(event_data: Any) -> None:
    run: _Run = event_data.model
    run.exited = True


def _taken(event_data: Any) -> None:
    run: _Run = event_data.model
    run.taken = tuple(c.func.name for c in event_data.transition.conditions)


class _Run:
    """The model of one trigger: its state and what the callbacks reported."""

    __slots__ = ("check", "effects", "exited", "ignored", "state", "taken")

    def __init__(self, state: str, check: Callable[[str], bool]) -> None:
        self.state = state
        self.check = check
        self.effects: list[str] = []
        self.exited = False
        self.ignored = False
        self.taken: tuple[str, ...] = ()


def _build(spec: MachineSpec) -> Any:
    states = [
        {"name": s.name, "final": s.final, "on_exit": [_exited], "ignore_invalid_triggers": False}
        for s in spec.states
    ]
    machine = Machine(
        model=None,
        states=states,
        initial=spec.initial,
        auto_transitions=False,
        send_event=True,  # callbacks get the EventData (and through it the run's model)
        ignore_invalid_triggers=False,  # a trigger with no transition raises MachineError
        after_state_change=[_taken],
        name=spec.name,
    )
    for r in spec.rows:
        machine.add_transition(
            r.event,
            r.source,
            r.dest,  # None: an internal transition
            conditions=[_Guard(g) for g in r.guards],
            after=[_Effect(e) for e in r.effects],
        )
    for c in spec.ignore:
        machine.add_transition(c.event, c.state, None, after=[_ignored])
    for e in spec.events:
        if e not in machine.events:  # rejected in every state: still an event it knows
            machine.add_transition(e, [], None)
    return machine


# keyed by id(), holding the spec weakly: tools build thousands of spec copies
_machines: dict[int, tuple[weakref.ref[MachineSpec], Any]] = {}


def _forget(key: int, ref: weakref.ref[MachineSpec]) -> None:
    hit = _machines.get(key)
    if hit is not None and hit[0] is ref:
        del _machines[key]


def compile_machine(spec: MachineSpec) -> Any:
    """The shared ``transitions.Machine`` for ``spec`` (no models attached)."""
    hit = _machines.get(id(spec))
    if hit is not None and hit[0]() is spec:
        return hit[1]
    machine = _build(spec)
    _machines[id(spec)] = (weakref.ref(spec, partial(_forget, id(spec))), machine)
    return machine


def reference_step(
    spec: MachineSpec, state: str, event: str, guards: GuardValues | None = None
) -> Step:
    """What the compiled ``transitions`` machine does with ``event`` in ``state``: the same
    signature and result as ``step``, decided by ``transitions``."""
    machine = compile_machine(spec)
    ev = machine.events.get(event)
    if ev is None:
        raise UnknownEvent(f"machine {spec.name!r} has no event {event!r}")
    if state not in machine.states:
        raise UnknownState(f"machine {spec.name!r} has no state {state!r}")
    check: Callable[[str], bool]
    if guards is None:
        check = _false
    elif callable(guards):
        check = guards
    else:
        values = guards

        def check(name: str) -> bool:
            return bool(values.get(name, False))

    run = _Run(state, check)
    try:
        taken = ev.trigger(run)
    except MachineError:
        return Step("reject", state, event, state)
    if not taken or run.ignored:
        return Step("ignore", state, event, state)
    return Step(
        "transition", state, event, run.state, tuple(run.effects), not run.exited, run.taken
    )


def _false(name: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Disagreement:
    """One cell, under one assignment of guard values, where the two executors differ."""

    state: str
    event: str
    guards: tuple[tuple[str, bool], ...]
    step: Step
    reference: Step
    step_consulted: tuple[str, ...]  # the guards each asked for, in order
    reference_consulted: tuple[str, ...]

    def __str__(self) -> str:
        values = ", ".join(f"{g}={v}" for g, v in self.guards) or "no guards"
        return (
            f"({self.state}, {self.event}) with {values}: step gives {self.step}, "
            f"consulting {list(self.step_consulted)}; transitions gives {self.reference}, "
            f"consulting {list(self.reference_consulted)}"
        )


def compare(
    spec: MachineSpec, state: str, event: str, values: dict[str, bool], *, compiled: MachineSpec
) -> Disagreement | None:
    """``step`` on ``spec`` beside the ``transitions`` machine compiled from ``compiled``,
    for one cell and one assignment of guard values."""

    asked: tuple[list[str], list[str]] = ([], [])

    def checker(log: list[str]) -> Callable[[str], bool]:
        def check(name: str) -> bool:
            log.append(name)
            return values.get(name, False)

        return check

    mine = step(spec, state, event, checker(asked[0]))
    ref = reference_step(compiled, state, event, checker(asked[1]))
    if mine == ref and asked[0] == asked[1]:
        return None
    return Disagreement(
        state, event, tuple(sorted(values.items())), mine, ref, tuple(asked[0]), tuple(asked[1])
    )


def disagreements(
    spec: MachineSpec,
    *,
    compiled: MachineSpec | None = None,
    cells: Iterable[tuple[str, str]] | None = None,
) -> list[Disagreement]:
    """Every cell of ``spec`` (or only ``cells``) under every combination of the machine's
    guards, through ``step`` and through the ``transitions`` machine compiled from
    ``compiled`` (by default the same spec); an empty list when they agree everywhere."""
    return list(each_disagreement(spec, compiled=compiled, cells=cells))


def each_disagreement(
    spec: MachineSpec,
    *,
    compiled: MachineSpec | None = None,
    cells: Iterable[tuple[str, str]] | None = None,
) -> Iterator[Disagreement]:
    """``disagreements`` one at a time, in the same order: the first costs only the
    combinations before it (a mutant's cell has up to 2^7 of them)."""
    other = spec if compiled is None else compiled
    names = sorted({*spec.guards, *other.guards})
    if cells is None:
        cells = [(s, e) for s in spec.state_names for e in spec.events]
    for state, event in cells:
        for bits in range(1 << len(names)):
            values = {g: bool(bits >> i & 1) for i, g in enumerate(names)}
            d = compare(spec, state, event, values, compiled=other)
            if d is not None:
                yield d
