"""The spec model: a machine is plain data, validated when it is built.

Every (state, event) cell must be declared as transition rows, ``ignore`` or ``reject``;
the table, the diagrams, the generated tests and the runtime all read this one object.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpecError(Exception):
    """A machine spec is not well formed; the message names the machine and the cell.

    Deliberately not a ``ValueError``: pydantic lets it through unwrapped, so callers see
    the exact message.
    """


class _Frozen(BaseModel):
    # schemas are built on first use, not at import: `import statemachines` then costs
    # little beyond pydantic itself (the first build also loads pydantic's plugin lookup)
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class StateTimeout(_Frozen):
    """A gen_statem-style state timeout: armed on entry, cancelled on exit, fired as an event."""

    event: str
    setting: str  # the runtime setting that holds the duration in seconds
    default: float = Field(ge=0)


class State(_Frozen):
    name: str
    final: bool = False
    timeout: StateTimeout | None = None
    # effects run as tasks for as long as the state lasts (started on entry, cancelled on exit)
    invoke: tuple[str, ...] = ()
    description: str = ""


class Effect(_Frozen):
    """An effect is data: a name the runtime maps to a handler.

    ``error_event`` is raised when the handler fails or runs past its bound, so failure goes
    through the table like any other event.
    """

    name: str
    error_event: str | None = None
    description: str = ""


class Row(_Frozen):
    """One transition. ``dest=None`` is an internal transition: effects run, the state stays."""

    source: str
    event: str
    dest: str | None
    guards: tuple[str, ...] = ()
    effects: tuple[str, ...] = ()


class Cell(_Frozen):
    state: str
    event: str
    note: str = ""


CellKind = Literal["transition", "ignore", "reject"]


class MachineSpec(_Frozen):
    name: str
    description: str = ""
    initial: str
    states: tuple[State, ...]
    events: tuple[str, ...]
    guards: tuple[str, ...] = ()
    # groups of guards of which at most one holds at a time: rows guarded by them may share
    # a cell without an unguarded fallback
    exclusive_guards: tuple[tuple[str, ...], ...] = ()
    effects: tuple[Effect, ...] = ()
    rows: tuple[Row, ...] = ()
    ignore: tuple[Cell, ...] = ()
    reject: tuple[Cell, ...] = ()

    @model_validator(mode="after")
    def _validate(self) -> MachineSpec:
        validate_spec(self)
        return self

    # -- read-only views ------------------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    def state(self, name: str) -> State:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(f"machine {self.name!r} has no state {name!r}")

    def effect(self, name: str) -> Effect:
        for e in self.effects:
            if e.name == name:
                return e
        raise KeyError(f"machine {self.name!r} has no effect {name!r}")

    def cell_kind(self, state: str, event: str) -> CellKind:
        if any(r.source == state and r.event == event for r in self.rows):
            return "transition"
        if any(c.state == state and c.event == event for c in self.ignore):
            return "ignore"
        return "reject"


# -- builders: keep the tables short without hiding a cell ------------------------------


def row(
    source: str | Iterable[str],
    event: str,
    dest: str | None,
    *,
    guards: Iterable[str] = (),
    effects: Iterable[str] = (),
) -> list[Row]:
    """Rows for ``event`` from each source; ``dest=None`` stays in the source (internal)."""
    sources = [source] if isinstance(source, str) else list(source)
    return [
        Row(source=s, event=event, dest=dest, guards=tuple(guards), effects=tuple(effects))
        for s in sources
    ]


def cells(states: str | Iterable[str], events: str | Iterable[str], note: str = "") -> list[Cell]:
    """The product of states x events, for ``ignore=`` or ``reject=``."""
    ss = [states] if isinstance(states, str) else list(states)
    es = [events] if isinstance(events, str) else list(events)
    return [Cell(state=s, event=e, note=note) for s in ss for e in es]


# -- validation --------------------------------------------------------------------------


def validate_spec(spec: MachineSpec) -> None:
    m = spec.name
    states = spec.state_names
    events = set(spec.events)
    guards = set(spec.guards)
    effects = {e.name for e in spec.effects}

    def fail(msg: str) -> SpecError:
        return SpecError(f"machine {m!r}: {msg}")

    for label, names in (("state", states), ("event", spec.events), ("guard", spec.guards)):
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise fail(f"{label} {n!r} is declared twice")
            seen.add(n)
    if spec.initial not in states:
        raise fail(f"initial state {spec.initial!r} is not a declared state")

    for eff in spec.effects:
        if eff.error_event is not None and eff.error_event not in events:
            raise fail(f"effect {eff.name!r} raises undeclared event {eff.error_event!r}")
    for st in spec.states:
        if st.timeout is not None and st.timeout.event not in events:
            raise fail(f"state {st.name!r} times out with undeclared event {st.timeout.event!r}")
        for inv in st.invoke:
            if inv not in effects:
                raise fail(f"state {st.name!r} invokes unknown effect {inv!r}")
    for group in spec.exclusive_guards:
        for g in group:
            if g not in guards:
                raise fail(f"exclusive guard group names unknown guard {g!r}")

    declared: dict[tuple[str, str], str] = {}
    rows_by_cell: dict[tuple[str, str], list[Row]] = {}
    for r in spec.rows:
        cell = f"({r.source}, {r.event})"
        if r.source not in states:
            raise fail(f"row {cell} starts from unknown state {r.source!r}")
        if r.event not in events:
            raise fail(f"row {cell} uses unknown event {r.event!r}")
        if r.dest is not None and r.dest not in states:
            raise fail(f"row {cell} leads to unknown state {r.dest!r}")
        for g in r.guards:
            if g not in guards:
                raise fail(f"row {cell} uses unknown guard {g!r}")
        for e in r.effects:
            if e not in effects:
                raise fail(f"row {cell} uses unknown effect {e!r}")
        rows_by_cell.setdefault((r.source, r.event), []).append(r)
        declared[(r.source, r.event)] = "transition"

    for kind, cell_list in (("ignore", spec.ignore), ("reject", spec.reject)):
        for c in cell_list:
            key = (c.state, c.event)
            if c.state not in states:
                raise fail(f"{kind} cell ({c.state}, {c.event}) names unknown state {c.state!r}")
            if c.event not in events:
                raise fail(f"{kind} cell ({c.state}, {c.event}) names unknown event {c.event!r}")
            if key in declared:
                raise fail(
                    f"cell ({c.state}, {c.event}) is declared twice ({declared[key]} and {kind})"
                )
            declared[key] = kind

    exclusive = [set(g) for g in spec.exclusive_guards]
    for (s, e), rs in rows_by_cell.items():
        seen_guards: set[tuple[str, ...]] = set()
        for r in rs:
            if r.guards in seen_guards:
                raise fail(f"cell ({s}, {e}) has duplicate rows guarded by {list(r.guards)}")
            seen_guards.add(r.guards)
        for r in rs[:-1]:
            if not r.guards:
                raise fail(f"cell ({s}, {e}): an unguarded row shadows the rows after it")
        if rs[-1].guards:
            used = {g for r in rs for g in r.guards}
            if not any(used <= grp for grp in exclusive):
                raise fail(
                    f"cell ({s}, {e}): guarded rows need an unguarded last row "
                    "or guards declared exclusive"
                )

    for s in states:
        for e in spec.events:
            if (s, e) not in declared:
                raise fail(f"cell ({s}, {e}) is not declared: add a transition, ignore or reject")

    for st in spec.states:
        if st.final:
            for r in spec.rows:
                if r.source == st.name:
                    raise fail(
                        f"final state {st.name!r} has a transition on {r.event!r}; "
                        "a final state only ignores or rejects"
                    )
            if st.timeout is not None or st.invoke:
                raise fail(f"final state {st.name!r} cannot have a timeout or invoke tasks")

    reachable = {spec.initial}
    frontier = [spec.initial]
    while frontier:
        cur = frontier.pop()
        for r in spec.rows:
            if r.source == cur and r.dest is not None and r.dest not in reachable:
                reachable.add(r.dest)
                frontier.append(r.dest)
    for s in states:
        if s not in reachable:
            raise fail(f"state {s!r} is unreachable from {spec.initial!r}")

    for st in spec.states:
        if st.final:
            continue
        exits = [r for r in spec.rows if r.source == st.name and r.dest not in (None, st.name)]
        if not exits:
            raise fail(f"state {st.name!r} is not final and has no transition out of it")
