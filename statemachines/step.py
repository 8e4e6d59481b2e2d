"""The pure step function: ``(spec, state, event, guard values) -> Step``.

No I/O, no clock, no asyncio: the runtime performs what a ``Step`` names.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Literal

from .spec import MachineSpec, Row, State

Outcome = Literal["transition", "ignore", "reject"]
GuardValues = Mapping[str, bool] | Callable[[str], bool]


class UnknownEvent(ValueError):
    """An event name the machine does not declare."""


class UnknownState(ValueError):
    """A state name the machine does not declare."""


@dataclass(frozen=True, slots=True)
class Step:
    outcome: Outcome
    source: str
    event: str
    dest: str  # equals source for ignore, reject and internal transitions
    effects: tuple[str, ...] = ()
    internal: bool = False  # a transition that runs effects without leaving the state
    guards: tuple[str, ...] = ()  # the guards of the row taken

    @property
    def changed(self) -> bool:
        """True when the state is left (and re-entered, for a self-transition)."""
        return self.outcome == "transition" and not self.internal


class Guarded:
    """A cell whose rows have guards: the first row whose guards all hold is taken.

    Each row's ``Step`` is built once with the table; ``fallback`` (an ignore) is what a
    cell of exclusive guards answers when none holds."""

    __slots__ = ("fallback", "rows")

    def __init__(self, rows: tuple[tuple[tuple[str, ...], Step], ...], fallback: Step) -> None:
        self.rows = rows
        self.fallback = fallback

    def decide(self, check: Callable[[str], bool]) -> Step:
        for names, result in self.rows:
            for g in names:
                if not check(g):
                    break
            else:
                return result
        return self.fallback


Entry = Step | Guarded


def _result(r: Row) -> Step:
    if r.dest is None:
        return Step("transition", r.source, r.event, r.source, r.effects, True, r.guards)
    return Step("transition", r.source, r.event, r.dest, r.effects, False, r.guards)


class Table:
    """A spec indexed by (state, event) for constant-time lookups, every answer prebuilt:
    a cell is its ``Step`` (ignore, reject, or a transition whose first row is unguarded)
    or, when guards decide, a ``Guarded`` list of rows. Also the spec's states by name."""

    __slots__ = ("cells", "effect_names", "events", "guard_names", "name", "spec_ref", "states")

    def __init__(self, spec: MachineSpec) -> None:
        # weak: the cache must not keep a spec alive (tools build thousands of copies)
        self.spec_ref = weakref.ref(spec, partial(_forget, id(spec)))
        self.name = spec.name
        self.states: dict[str, State] = {s.name: s for s in spec.states}
        self.events = frozenset(spec.events)
        # what an actor of the spec needs a handler for
        self.effect_names = frozenset(e.name for e in spec.effects)
        self.guard_names = frozenset(spec.guards)
        self.cells: dict[tuple[str, str], Entry] = {}
        grouped: dict[tuple[str, str], list[Row]] = {}
        for r in spec.rows:
            grouped.setdefault((r.source, r.event), []).append(r)
        for (state, event), rows in grouped.items():
            if not rows[0].guards:
                self.cells[(state, event)] = _result(rows[0])
            else:
                self.cells[(state, event)] = Guarded(
                    tuple((r.guards, _result(r)) for r in rows),
                    Step("ignore", state, event, state),
                )
        for c in spec.ignore:
            self.cells[(c.state, c.event)] = Step("ignore", c.state, c.event, c.state)
        for c in spec.reject:
            self.cells[(c.state, c.event)] = Step("reject", c.state, c.event, c.state)

    def cell(self, state: str, event: str) -> Entry:
        """The answer of the cell, or ``UnknownState``/``UnknownEvent``."""
        entry = self.cells.get((state, event))
        if entry is None:
            if state not in self.states:
                raise UnknownState(f"machine {self.name!r} has no state {state!r}")
            raise UnknownEvent(f"machine {self.name!r} has no event {event!r}")
        return entry


# keyed by id(): hashing a spec hashes all of it, on every step; an entry goes with its spec
_tables: dict[int, Table] = {}


def _forget(key: int, ref: weakref.ref[MachineSpec]) -> None:
    t = _tables.get(key)
    if t is not None and t.spec_ref is ref:
        del _tables[key]


def table_of(spec: MachineSpec) -> Table:
    """The index of a spec, built once per spec object and shared by every instance."""
    t = _tables.get(id(spec))
    if t is None or t.spec_ref() is not spec:
        t = _tables[id(spec)] = Table(spec)
    return t


def step(spec: MachineSpec, state: str, event: str, guards: GuardValues | None = None) -> Step:
    entry = table_of(spec).cell(state, event)
    if isinstance(entry, Step):
        return entry
    if guards is None:
        return entry.decide(_no_guard_values)
    if callable(guards):
        return entry.decide(guards)
    values = guards
    return entry.decide(lambda name: bool(values.get(name, False)))


def _no_guard_values(name: str) -> bool:
    return False
