"""What a machine's diagram shows, before any format draws it: the JSON cell table (what
golden files, ``agent-runtime diff`` and the table tests compare), the drawing (the states
with their details, one edge per (source, dest) pair, a hub for an event entering a state
from many), and where each cell is drawn. Mermaid and DOT (``render.py``) lay it out.

Pure functions of a ``MachineSpec``: no livekit, no I/O, same output for the same spec.
``agent-runtime diff`` loads this file on its own (by path, next to an old ``statemachines``
package), so it must import nothing from ``agent_runtime`` and only read specs by duck typing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from statemachines.spec import MachineSpec


class CellRow(TypedDict):
    dest: str | None  # None: internal (effects run, the state stays)
    guards: list[str]
    effects: list[str]


class CellData(TypedDict, total=False):
    kind: str  # transition | ignore | reject
    rows: list[CellRow]  # transition cells only, in the order they are tried


class CellTable(TypedDict):
    machine: str
    initial: str
    states: list[str]
    events: list[str]
    cells: dict[str, dict[str, CellData]]  # state -> event -> cell


# -- the cell table (what a machine decides; notes and descriptions left out) -------------


def cell_table(spec: MachineSpec) -> CellTable:
    """Every (state, event) cell of ``spec`` as plain JSON-able data."""
    rows: dict[tuple[str, str], list[CellRow]] = {}
    for r in spec.rows:
        rows.setdefault((r.source, r.event), []).append(
            {"dest": r.dest, "guards": list(r.guards), "effects": list(r.effects)}
        )
    kinds: dict[tuple[str, str], str] = {}
    for c in spec.ignore:
        kinds[(c.state, c.event)] = "ignore"
    for c in spec.reject:
        kinds[(c.state, c.event)] = "reject"
    states = [s.name for s in spec.states]
    cells: dict[str, dict[str, CellData]] = {}
    for s in states:
        cells[s] = {}
        for e in spec.events:
            if (s, e) in rows:
                cells[s][e] = {"kind": "transition", "rows": rows[(s, e)]}
            else:
                # validation guarantees every cell is declared; "reject" is the spec's default
                cells[s][e] = {"kind": kinds.get((s, e), "reject")}
    return {
        "machine": spec.name,
        "initial": spec.initial,
        "states": states,
        "events": list(spec.events),
        "cells": cells,
    }


def dump_cell_table(table: CellTable) -> str:
    """JSON with one cell a line, so a changed cell is a one-line diff in review."""
    out = ["{"]
    for key in ("machine", "initial", "states", "events"):
        out.append(f"  {json.dumps(key)}: {json.dumps(table[key])},")
    out.append('  "cells": {')
    states = list(table["cells"])
    for i, s in enumerate(states):
        out.append(f"    {json.dumps(s)}: {{")
        events = list(table["cells"][s])
        for j, e in enumerate(events):
            comma = "," if j < len(events) - 1 else ""
            out.append(f"      {json.dumps(e)}: {json.dumps(table['cells'][s][e])}{comma}")
        out.append("    }" + ("," if i < len(states) - 1 else ""))
    out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def describe_row(row: CellRow, index: int, count: int, *, arrow: str = "->") -> str:
    """``[g1 and g2] -> dest / e1, e2``; an unguarded row after guarded ones is ``else``."""
    if row["guards"]:
        cond = f"[{' and '.join(row['guards'])}] "
    elif count > 1 and index > 0:
        cond = "else "
    else:
        cond = ""
    target = f"{arrow} {row['dest']}" if row["dest"] is not None else "internal"
    effects = f" / {', '.join(row['effects'])}" if row["effects"] else ""
    return f"{cond}{target}{effects}"


def describe_cell(cell: CellData, *, arrow: str = "->") -> list[str]:
    """One line per row of a transition cell, or just ``ignore`` / ``reject``."""
    rows = cell.get("rows", [])
    if cell["kind"] != "transition" or not rows:
        return [cell["kind"]]
    return [describe_row(r, i, len(rows), arrow=arrow) for i, r in enumerate(rows)]


def seconds(value: float) -> str:
    return f"{value:g}s"


def _edge_label(cell: list[CellRow], index: int, event: str) -> str:
    """The label of one row's edge: ``event [guards] / effects``, order made explicit."""
    r = cell[index]
    if r["guards"]:
        prefix = "else if " if index > 0 else ""
        cond = f" [{prefix}{' and '.join(r['guards'])}]"
    elif len(cell) > 1:
        cond = " [else]"
    else:
        cond = ""
    effects = f" / {', '.join(r['effects'])}" if r["effects"] else ""
    return f"{event}{cond}{effects}"


def _edges(spec: MachineSpec) -> list[tuple[str, str | None, str, str]]:
    """(source, dest, event, label) per row in spec order; dest None for internal rows."""
    by_cell: dict[tuple[str, str], list[CellRow]] = {}
    for r in spec.rows:
        by_cell.setdefault((r.source, r.event), []).append(
            {"dest": r.dest, "guards": list(r.guards), "effects": list(r.effects)}
        )
    seen: dict[tuple[str, str], int] = {}
    out: list[tuple[str, str | None, str, str]] = []
    for r in spec.rows:
        key = (r.source, r.event)
        i = seen.get(key, 0)
        seen[key] = i + 1
        out.append((r.source, r.dest, r.event, _edge_label(by_cell[key], i, r.event)))
    return out


# -- the drawing: what the Mermaid and DOT diagrams both draw -----------------------------------

# A diagram reads at a 1,000 px review column only if its labels are short and its edges few:
# rows of one (source, dest) pair share one edge, and an event that leads from HUB_SOURCES or
# more states into one state is drawn once, as a box listing where it comes from.
HUB_SOURCES = 3
WRAP = 22  # characters an edge label's line holds before it wraps
BOX_WRAP = 28  # the same for the lines listed in a box (a state's details, a hub's rows)
# marks each row of a list (an edge's rows, a state's internal rows); not "- ", which
# Mermaid reads as a Markdown list it then refuses to draw
BULLET = "\u2022 "


@dataclass(frozen=True)
class Edge:
    source: str
    dest: str
    lines: tuple[str, ...]  # one row's label each, in the order the rows are tried


@dataclass(frozen=True)
class Hub:
    """The rows into ``dest`` of events that lead there from several states, drawn as one
    arrow from a box that says where they come from."""

    ident: str  # unique among the drawing's node names
    dest: str
    title: str  # "from every other state", "from any of a, b, c"
    lines: tuple[str, ...]  # one per distinct row label: "close / unhook (from idle)"


@dataclass(frozen=True)
class StateBox:
    name: str
    final: bool
    details: tuple[str, ...]  # timeout, tasks, internal rows


@dataclass(frozen=True)
class Drawing:
    name: str
    initial: str
    states: tuple[StateBox, ...]
    edges: tuple[Edge, ...]
    hubs: tuple[Hub, ...]


def wrap(text: str, width: int | None = None) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces; a ``/`` or a
    bullet stays with the word after it, and a word longer than ``width`` keeps its own
    line."""
    width = WRAP if width is None else width
    words: list[str] = []
    for w in text.split(" "):
        if words and words[-1] in ("/", BULLET.strip()):
            words[-1] += " " + w
        elif w:
            words.append(w)
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines or [""]


def _sources_text(sources: Sequence[str], dest: str, spec: MachineSpec) -> str:
    others = [s.name for s in spec.states if s.name != dest and not s.final]
    if list(sources) == others and len(others) > 1:
        return "every other state"
    return "any of " + ", ".join(sources)


def _hubbed(rows: list[tuple[str, str | None, str, str]]) -> set[tuple[str, str]]:
    """The (dest, event) pairs entered from HUB_SOURCES states or more."""
    sources: dict[tuple[str, str], set[str]] = {}
    for source, dest, event, _ in rows:
        if dest is not None and source != dest:
            sources.setdefault((dest, event), set()).add(source)
    return {k for k, v in sources.items() if len(v) >= HUB_SOURCES}


def drawing(spec: MachineSpec) -> Drawing:
    """What both diagrams draw: the states with their details, one edge per (source, dest)
    pair, and a hub per state that an event enters from ``HUB_SOURCES`` states or more."""
    rows = _edges(spec)
    order = [s.name for s in spec.states]
    hubbed = _hubbed(rows)
    into: dict[str, dict[str, list[str]]] = {}  # dest -> label -> sources, in row order
    edges: dict[tuple[str, str], list[str]] = {}
    internal: dict[str, list[str]] = {}
    for source, dest, event, label in rows:
        if dest is None:
            internal.setdefault(source, []).append(label)
        elif (dest, event) in hubbed and source != dest:
            into.setdefault(dest, {}).setdefault(label, []).append(source)
        else:
            edges.setdefault((source, dest), []).append(label)
    hubs: list[Hub] = []
    used = set(order)
    for dest in sorted(into, key=order.index):
        labels = into[dest]
        union = sorted({s for v in labels.values() for s in v}, key=order.index)
        lines = tuple(
            label if set(srcs) == set(union) else f"{', '.join(srcs)}: {label}"
            for label, srcs in labels.items()
        )
        ident, n = f"into_{dest}", 2
        while ident in used:
            ident, n = f"into_{dest}_{n}", n + 1
        used.add(ident)
        hubs.append(Hub(ident, dest, f"from {_sources_text(union, dest, spec)}", lines))
    boxes: list[StateBox] = []
    for s in spec.states:
        details: list[str] = []
        if s.timeout is not None:
            t = s.timeout
            details.append(f"after {t.setting} ({seconds(t.default)}): {t.event}")
        details.extend(f"task {name}" for name in s.invoke)
        if s.name in internal:
            # internal rows (effects run, the state stays) under one heading
            details.append("internal:")
            details.extend(f"{BULLET}{label}" for label in internal[s.name])
        boxes.append(StateBox(name=s.name, final=s.final, details=tuple(details)))
    return Drawing(
        name=spec.name,
        initial=spec.initial,
        states=tuple(boxes),
        edges=tuple(Edge(s, d, tuple(v)) for (s, d), v in edges.items()),
        hubs=tuple(hubs),
    )


# -- where a cell is drawn (for `agent-runtime diff`) --------------------------------------------


def region_id(kind: str, *states: str) -> str:
    """The SVG element id of a region of a machine's diagram: ``state--NAME`` (its box),
    ``edge--SOURCE--DEST``, ``into--DEST`` (the box of rows entering DEST from many states)."""
    return "--".join([kind, *(re.sub(r"\W", "_", s, flags=re.ASCII) for s in states)])


def cell_regions(spec: MachineSpec) -> dict[str, dict[str, list[list[str]]]]:
    """state -> event -> the regions its rows are drawn in, as ``[id, words]`` pairs, the
    way ``drawing`` places them; an ``ignore`` or ``reject`` cell is drawn nowhere (the
    table beside the diagram has it)."""
    rows = _edges(spec)
    hubbed = _hubbed(rows)
    out: dict[str, dict[str, list[list[str]]]] = {}
    for source, dest, event, _ in rows:
        if dest is None:
            region = [region_id("state", source), f"inside state {source}"]
        elif (dest, event) in hubbed and source != dest:
            region = [region_id("into", dest), f"the box of edges into {dest}"]
        else:
            region = [region_id("edge", source, dest), f"edge {source} -> {dest}"]
        cell = out.setdefault(source, {}).setdefault(event, [])
        if region not in cell:
            cell.append(region)
    return out


# -- Mermaid -----------------------------------------------------------------------------------
