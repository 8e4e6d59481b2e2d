"""The pure step function: ``(spec, state, event, guard values) -> Step``.

No I/O, no clock, no asyncio: the runtime performs what a ``Step`` names.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Literal

from .spec import MachineSpec, Row

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


Entry = tuple[Row, ...] | Literal["ignore", "reject"]


class Table:
    """A spec indexed by (state, event) for constant-time lookups."""

    __slots__ = ("cells", "spec_ref")

    def __init__(self, spec: MachineSpec) -> None:
        # weak: the cache must not keep a spec alive (tools build thousands of copies)
        self.spec_ref = weakref.ref(spec, partial(_forget, id(spec)))
        self.cells: dict[tuple[str, str], Entry] = {}
        grouped: dict[tuple[str, str], list[Row]] = {}
        for r in spec.rows:
            grouped.setdefault((r.source, r.event), []).append(r)
        for k, rows in grouped.items():
            self.cells[k] = tuple(rows)
        for c in spec.ignore:
            self.cells[(c.state, c.event)] = "ignore"
        for c in spec.reject:
            self.cells[(c.state, c.event)] = "reject"


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
    entry = table_of(spec).cells.get((state, event))
    if entry is None:
        if state not in spec.state_names:
            raise UnknownState(f"machine {spec.name!r} has no state {state!r}")
        raise UnknownEvent(f"machine {spec.name!r} has no event {event!r}")
    if entry == "ignore" or entry == "reject":
        return Step(entry, state, event, state)
    check: Callable[[str], bool]
    if guards is None:
        check = _no_guard_values
    elif callable(guards):
        check = guards
    else:
        values = guards

        def check(name: str) -> bool:
            return bool(values.get(name, False))

    for r in entry:
        if all(check(g) for g in r.guards):
            if r.dest is None:
                return Step("transition", state, event, state, r.effects, True, r.guards)
            return Step("transition", state, event, r.dest, r.effects, False, r.guards)
    # only reachable when every row is guarded by exclusive guards and none holds
    return Step("ignore", state, event, state)


def _no_guard_values(name: str) -> bool:
    return False
