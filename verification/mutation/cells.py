"""Single-cell changes to a machine spec, for showing that the checks notice them.

The copies are made with ``model_copy``, which skips validation on purpose: a changed
cell may well break a rule the spec model enforces (a final state that moves, a row left
unreachable), and the point is what the tests and the explorer make of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

from statemachines import MachineSpec, Row
from statemachines.spec import Cell


def set_cell(
    spec: MachineSpec,
    state: str,
    event: str,
    *,
    rows: Sequence[Row] | None = None,
    kind: Literal["ignore", "reject"] | None = None,
) -> MachineSpec:
    """``spec`` with the cell (state, event) replaced by ``rows`` (in the cell's place in
    the table) or made an ``ignore``/``reject`` cell. Raises ``ValueError`` on a cell the
    spec does not have or on asking for both or neither."""
    if (rows is None) == (kind is None):
        raise ValueError("give either rows or kind")
    if state not in spec.state_names or event not in spec.events:
        raise ValueError(f"machine {spec.name!r} has no cell ({state}, {event})")
    for r in rows or ():
        if (r.source, r.event) != (state, event):
            raise ValueError(f"row {r.source, r.event} is not in cell ({state}, {event})")

    def other(c: Cell) -> bool:
        return (c.state, c.event) != (state, event)

    new_rows: list[Row] = []
    placed = False
    for r in spec.rows:
        if (r.source, r.event) == (state, event):
            if rows is not None and not placed:
                new_rows.extend(rows)
                placed = True
        else:
            new_rows.append(r)
    if rows is not None and not placed:
        new_rows.extend(rows)
    ignore = tuple(c for c in spec.ignore if other(c))
    reject = tuple(c for c in spec.reject if other(c))
    if kind == "ignore":
        ignore += (Cell(state=state, event=event),)
    elif kind == "reject":
        reject += (Cell(state=state, event=event),)
    return spec.model_copy(update={"rows": tuple(new_rows), "ignore": ignore, "reject": reject})


def set_dest(
    spec: MachineSpec, state: str, event: str, dest: str | None, *, guards: Sequence[str] = ()
) -> MachineSpec:
    """``spec`` with the row of cell (state, event) guarded by ``guards`` leading to
    ``dest`` instead (``None``: internal); everything else about the row is kept."""
    want = tuple(guards)
    cell = [r for r in spec.rows if (r.source, r.event) == (state, event)]
    if not any(r.guards == want for r in cell):
        raise ValueError(f"cell ({state}, {event}) has no row guarded by {list(want)}")
    changed = [r.model_copy(update={"dest": dest}) if r.guards == want else r for r in cell]
    return set_cell(spec, state, event, rows=changed)


def single_cell_mutants(
    spec: MachineSpec, *, behavioural: bool = False
) -> Iterator[tuple[str, MachineSpec]]:
    """Every change to one cell: a row's destination to any other (or internal); a
    transition cell made ignore or reject; an ignore/reject cell swapped, or made an
    unguarded transition to any state (or internal).

    ``behavioural`` leaves out the changes no behaviour can tell apart (they differ only
    in what ``send`` raises and what the trace says): ignore <-> reject, and an
    ignore/reject cell made an internal transition with no effects."""
    targets: list[str | None] = [*spec.state_names, None]
    for state in spec.state_names:
        for event in spec.events:
            kind = spec.cell_kind(state, event)
            where = f"{spec.name} ({state}, {event})"
            if kind == "transition":
                for r in spec.rows:
                    if (r.source, r.event) != (state, event):
                        continue
                    g = f" [{', '.join(r.guards)}]" if r.guards else ""
                    for d in targets:
                        if d != r.dest:
                            yield (
                                f"{where}{g} -> {d or 'internal'}",
                                set_dest(spec, state, event, d, guards=r.guards),
                            )
                yield f"{where} -> ignore", set_cell(spec, state, event, kind="ignore")
                if not behavioural:
                    yield f"{where} -> reject", set_cell(spec, state, event, kind="reject")
            else:
                swap: Literal["ignore", "reject"] = "reject" if kind == "ignore" else "ignore"
                if not behavioural:
                    yield f"{where} {kind} -> {swap}", set_cell(spec, state, event, kind=swap)
                for d in targets:
                    if behavioural and d is None:
                        continue
                    row = Row(source=state, event=event, dest=d)
                    yield (
                        f"{where} {kind} -> {d or 'internal'}",
                        set_cell(spec, state, event, rows=[row]),
                    )
