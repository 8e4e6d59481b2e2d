"""Views of a machine spec: Mermaid, Graphviz DOT, Markdown and terminal tables, the golden
files (``diagrams/``) and their README. What a diagram shows, and the cell table, are
``drawing.py``'s; this file draws them, and ``machine_svg.py`` draws the SVG.

Pure functions of a ``MachineSpec``: no livekit, same output for the same spec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from agent_runtime.tools.drawing import (
    BOX_WRAP,
    BULLET,
    cell_table,
    describe_cell,
    drawing,
    region_id,
    seconds,
    wrap,
)
from agent_runtime.tools.machine_svg import diagram_svg

if TYPE_CHECKING:
    from statemachines.spec import MachineSpec


# -- helpers shared by the renderers ---------------------------------------------------------


def _notes(spec: MachineSpec) -> dict[tuple[str, str], str]:
    notes: dict[tuple[str, str], str] = {}
    for c in (*spec.ignore, *spec.reject):
        if c.note:
            notes[(c.state, c.event)] = c.note
    return notes


def _timeout_text(spec: MachineSpec, state: str) -> str:
    t = spec.state(state).timeout
    if t is None:
        return ""
    return f"after {t.setting} (default {seconds(t.default)}) fires {t.event}"


def _final_states(spec: MachineSpec) -> list[str]:
    return [s.name for s in spec.states if s.final]


_MERMAID_RESERVED = {"state", "note", "end", "direction", "as", "class", "classDef", "style"}
_MERMAID_UNSAFE = re.compile(r"[^A-Za-z0-9_ .,/()\[\]=+*!?'\-:;\u2022]")
# Mermaid's own entity codes: a bare ':' or ';' would end the label
_MERMAID_ENTITIES = {":": "#58;", ";": "#59;"}


def _mermaid_text(text: str) -> str:
    """Label text Mermaid reads literally: no markup, ``:`` and ``;`` as entity codes."""
    safe = _MERMAID_UNSAFE.sub("_", text).strip() or "_"
    return re.sub(r"[:;]", lambda m: _MERMAID_ENTITIES[m.group()], safe)


def _mermaid_ids(names: Sequence[str]) -> dict[str, str]:
    ids: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        base = re.sub(r"\W", "_", name, flags=re.ASCII) or "s"
        if base in _MERMAID_RESERVED or base[0].isdigit():
            base = f"s_{base}"
        ident, n = base, 2
        while ident in used:
            ident, n = f"{base}_{n}", n + 1
        used.add(ident)
        ids[name] = ident
    return ids


def mermaid(spec: MachineSpec) -> str:
    """A Mermaid ``stateDiagram-v2``, top to bottom: one edge per (source, dest) pair with a
    line per row; an event into one state from several is one dashed box listing where it
    comes from; internal rows, timeouts and state tasks listed inside the state."""
    d = drawing(spec)
    ids = _mermaid_ids([*(b.name for b in d.states), *(h.ident for h in d.hubs)])
    title = re.sub(r"[^\w .-]", "_", spec.name, flags=re.ASCII)  # plain YAML scalar
    lines = ["---", f"title: {title}", "---", "stateDiagram-v2"]
    if d.hubs:
        lines.append("    classDef hub fill:#fff,stroke:#555,stroke-dasharray:4 3")
    for box in d.states:
        if ids[box.name] != box.name:
            label = _mermaid_text(box.name).replace('"', "'")
            lines.append(f'    state "{label}" as {ids[box.name]}')
    lines.append(f"    [*] --> {ids[spec.initial]}")
    for edge in d.edges:
        rows = [f"{BULLET}{r}" for r in edge.lines] if len(edge.lines) > 1 else list(edge.lines)
        label = "<br>".join(_mermaid_text(r) for r in rows)
        lines.append(f"    {ids[edge.source]} --> {ids[edge.dest]} : {label}")
    for hub in d.hubs:
        lines.append(f'    state "{_mermaid_text(hub.title)}" as {ids[hub.ident]}')
        lines.extend(
            f"    {ids[hub.ident]} : {_mermaid_text(part)}"
            for line in hub.lines
            for part in wrap(line, BOX_WRAP)
        )
        lines.append(f"    {ids[hub.ident]} --> {ids[hub.dest]}")
        lines.append(f"    class {ids[hub.ident]} hub")
    for box in d.states:
        details = [part for line in box.details for part in wrap(line, BOX_WRAP)]
        if details and ids[box.name] == box.name:
            # Mermaid shows a lone description instead of the name; lead with the name so
            # the box reads as a title with the details below it
            details.insert(0, box.name)
        lines.extend(f"    {ids[box.name]} : {_mermaid_text(t)}" for t in details)
    for box in d.states:
        if box.final:
            lines.append(f"    {ids[box.name]} --> [*]")
    return "\n".join(lines) + "\n"


# -- Graphviz DOT ------------------------------------------------------------------------------


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _dot_lines(lines: Sequence[str], *, left: bool, width: int | None = None) -> str:
    """DOT label text: each line wrapped; ``\\l`` left-aligns, ``\\n`` centres."""
    end = "\\l" if left else "\\n"
    return "".join(_dot_escape(part) + end for line in lines for part in wrap(line, width))


def dot(spec: MachineSpec) -> str:
    """Graphviz DOT, top to bottom so it fits a page's width: one edge per (source, dest)
    pair with a line per row; an event into one state from several is one dashed box
    listing where it comes from; internal rows, timeouts and tasks listed in the state;
    final states drawn with a double border."""
    d = drawing(spec)
    lines = [
        f"digraph {_dot_quote(spec.name)} {{",
        '  graph [rankdir=TB, fontname="Helvetica", nodesep=0.15, ranksep=0.3];',
        '  node [shape=box, style=rounded, fontname="Helvetica", fontsize=14, margin="0.12,0.06"];',
        '  edge [fontname="Helvetica", fontsize=13];',
        '  "__initial__" [shape=point, width=0.15, label=""];',
    ]
    for box in d.states:
        label = _dot_escape(box.name) + "\\n"
        if box.details:
            label += _dot_lines(box.details, left=True, width=BOX_WRAP)
        attrs = [f'label="{label}"', f'id="{region_id("state", box.name)}"']
        if box.final:
            attrs.append("peripheries=2")
        lines.append(f"  {_dot_quote(box.name)} [{', '.join(attrs)}];")
    lines.append(f'  "__initial__" -> {_dot_quote(spec.initial)};')
    for edge in d.edges:
        if len(edge.lines) == 1:
            label = _dot_lines(edge.lines, left=False)
        else:  # one item per row, so a wrapped row still reads as one
            label = _dot_lines([f"{BULLET}{line}" for line in edge.lines], left=True)
        ident = region_id("edge", edge.source, edge.dest)
        lines.append(
            f"  {_dot_quote(edge.source)} -> {_dot_quote(edge.dest)} "
            f'[label="{label}", id="{ident}"];'
        )
    for hub in d.hubs:
        label = _dot_lines([hub.title], left=False, width=BOX_WRAP) + _dot_lines(
            hub.lines, left=True, width=BOX_WRAP
        )
        lines.append(
            f'  {_dot_quote(hub.ident)} [label="{label}", style="dashed", fontsize=13, '
            f'id="{region_id("into", hub.dest)}"];'
        )
        lines.append(f"  {_dot_quote(hub.ident)} -> {_dot_quote(hub.dest)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- Markdown ----------------------------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(spec: MachineSpec) -> str:
    """The whole event x state table, then the states, effects and guards."""
    table = cell_table(spec)
    notes = _notes(spec)
    states = table["states"]
    finals = _final_states(spec)
    out = [f"# {_md(spec.name)}", ""]
    if spec.description:
        out += [_md(spec.description), ""]
    out += [
        "Generated from the spec by `agent-runtime diagrams`; do not edit by hand.",
        "",
        f"Initial state: `{spec.initial}`. Final: {', '.join(f'`{s}`' for s in finals) or 'none'}.",
        "",
        "## Transitions",
        "",
        "Rows are events, columns are states. A cell is a transition (`→ dest`, or `internal`: "
        "the state stays), `ignore` (dropped, traced) or **reject** (refused: `send` raises). "
        "Effects follow `/` and run in order after the state has changed. Rows of one cell "
        "are tried in order; the first whose guards all hold is taken.",
        "",
        "| event \\ state | " + " | ".join(f"`{_md(s)}`" for s in states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for e in table["events"]:
        rendered: list[str] = []
        for s in states:
            cell = table["cells"][s][e]
            if cell["kind"] == "transition":
                lines = describe_cell(cell, arrow="→")
                text = "<br>".join(
                    f"{i}. {_md(t)}" if len(lines) > 1 else _md(t) for i, t in enumerate(lines, 1)
                )
            else:
                text = "**reject**" if cell["kind"] == "reject" else "ignore"
                note = notes.get((s, e))
                if note:
                    text += f" ({_md(note)})"
            rendered.append(text)
        out.append(f"| `{_md(e)}` | " + " | ".join(rendered) + " |")
    out += [
        "",
        "## States",
        "",
        "| state | | timeout | tasks while in the state | description |",
        "|---|---|---|---|---|",
    ]
    for st in spec.states:
        flags = ", ".join(
            f for f, on in (("initial", st.name == spec.initial), ("final", st.final)) if on
        )
        timeout = ""
        if st.timeout is not None:
            timeout = (
                f"`{_md(st.timeout.event)}` after `{_md(st.timeout.setting)}` "
                f"(default {seconds(st.timeout.default)})"
            )
        tasks = ", ".join(f"`{_md(i)}`" for i in st.invoke)
        out.append(f"| `{_md(st.name)}` | {flags} | {timeout} | {tasks} | {_md(st.description)} |")
    out += ["", "## Effects", ""]
    if spec.effects:
        out += ["| effect | on error or timeout | description |", "|---|---|---|"]
        for eff in spec.effects:
            err = f"`{_md(eff.error_event)}`" if eff.error_event else "(traced only)"
            out.append(f"| `{_md(eff.name)}` | {err} | {_md(eff.description)} |")
    else:
        out.append("None.")
    out += ["", "## Guards", ""]
    if spec.guards:
        out += ["| guard | at most one of |", "|---|---|"]
        for g in spec.guards:
            groups = [grp for grp in spec.exclusive_guards if g in grp]
            excl = "; ".join(", ".join(f"`{_md(x)}`" for x in grp) for grp in groups)
            out.append(f"| `{_md(g)}` | {excl} |")
    else:
        out.append("None.")
    return "\n".join(out) + "\n"


# -- terminal ------------------------------------------------------------------------------------


def terminal_table(spec: MachineSpec) -> str:
    """The table for a terminal: one block per state, one line per event (and guarded row)."""
    table = cell_table(spec)
    notes = _notes(spec)
    width = max((len(e) for e in table["events"]), default=0) + 2
    finals = _final_states(spec)
    head = spec.name + (f" - {spec.description}" if spec.description else "")
    out = [
        head,
        f"initial: {spec.initial}    final: {', '.join(finals) or 'none'}",
        "rows of a cell are tried in order; the first whose guards all hold is taken",
    ]
    for st in spec.states:
        extras: list[str] = []
        timeout = _timeout_text(spec, st.name)
        if timeout:
            extras.append(f"timeout: {timeout}")
        extras += [f"task: {name}" for name in st.invoke]
        if st.final:
            extras.append("final")
        out.append("")
        out.append(st.name + (f"   ({'; '.join(extras)})" if extras else ""))
        for e in table["events"]:
            cell = table["cells"][st.name][e]
            lines = describe_cell(cell)
            if cell["kind"] != "transition":
                lines = [cell["kind"].upper() if cell["kind"] == "reject" else cell["kind"]]
                note = notes.get((st.name, e))
                if note:
                    lines[0] += f"  ({note})"
            out.append(f"  {e:<{width}}{lines[0]}")
            out.extend(f"  {'':<{width}}{rest}" for rest in lines[1:])
    return "\n".join(out) + "\n"


_WHOLE_JOB = "whole-job"  # agent_runtime.tools.system_diagram.NAME (imported lazily)

# -- the diagrams directory --------------------------------------------------------------------

DIAGRAM_SUFFIXES = (".mmd", ".dot", ".md", ".svg")  # what ``diagrams --check`` compares


def diagram_files(machines: Mapping[str, MachineSpec]) -> dict[str, str]:
    """Every file of the diagrams directory this module draws, by file name, in a stable
    order: all but the whole job's SVG, which Graphviz renders from its DOT."""
    files: dict[str, str] = {}
    for name, spec in machines.items():
        files[f"{name}.mmd"] = mermaid(spec)
        files[f"{name}.dot"] = dot(spec)
        files[f"{name}.md"] = markdown_table(spec)
        files[f"{name}.svg"] = diagram_svg(spec)
    # imported here: `agent-runtime diff` loads this module on its own, by path
    from agent_runtime.tools.system_diagram import system_files

    files.update(system_files(machines))
    files["README.md"] = diagrams_readme(machines)
    return files


def diagrams_readme(machines: Mapping[str, MachineSpec]) -> str:
    out = [
        "# State machine diagrams",
        "",
        "Generated from the specs in `statemachines/` by `agent-runtime diagrams`; never edit "
        "these files by hand. `agent-runtime diagrams --check` fails while they are out of date.",
        "",
        "Each machine has its Mermaid diagram below (`NAME.mmd`), its whole state x event "
        "table (`NAME.md`), Graphviz DOT (`NAME.dot`) and `NAME.svg`, drawn by "
        "`agent-runtime diagrams` itself (the picture the timeline page shows; a link to "
        "`NAME.svg#edge--SOURCE--DEST`, as `agent-runtime diff` prints, outlines that edge). "
        f"The whole job, every machine and the channels between them, is [below](#the-whole-job) "
        f"(`{_WHOLE_JOB}.mmd`, `.dot`, and `.svg` when Graphviz was installed). The diagrams "
        "are drawn to be read at a page's width (a machine top to bottom, labels wrapped).",
        "",
        "- An edge is labelled `event [guards] / effects`, one line (`•`) per row when several "
        "rows lead from one state to the same other state; the rows of one cell are tried in "
        "order (`else if`, `else`).",
        "- An event that leads into one state from three states or more is drawn once: a "
        "dashed box with one arrow into that state says where it comes from (`from every "
        "other state`, `from any of a, b, c`) and lists the rows; a row that only some of "
        "them have is prefixed with those states (`idle: close / unhook`).",
        "- Internal transitions (effects run, the state stays), state timeouts and state tasks "
        "are listed inside the state.",
        "- `ignore` and `reject` cells are not drawn: the table (`NAME.md`) has every cell.",
        "",
        "| machine | initial | states | events | table | SVG | Graphviz |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, spec in machines.items():
        out.append(
            f"| [{_md(name)}](#{name.lower()}) | `{_md(spec.initial)}` | {len(spec.states)} "
            f"| {len(spec.events)} | [{name}.md]({name}.md) | [{name}.svg]({name}.svg) "
            f"| [{name}.dot]({name}.dot) |"
        )
    for name, spec in machines.items():
        out += ["", f"## {_md(name)}", ""]
        if spec.description:
            out += [_md(spec.description), ""]
        out += ["```mermaid", mermaid(spec).rstrip("\n"), "```", ""]
        out.append(f"The whole table: [{name}.md]({name}.md).")
    from agent_runtime.tools.system_diagram import system_markdown, system_view

    out += ["", *system_markdown(system_view(machines)), "", *routing_markdown()]
    return "\n".join(out) + "\n"


def routing_markdown() -> list[str]:
    """The declared routing of room facts to machine events (``statemachines.routing``)."""
    # imported here: `agent-runtime diff` loads this module against older revisions
    from statemachines.routing import CONDITIONS, ROUTES

    out = [
        "## Room facts to machine events",
        "",
        "Declared in `statemachines/routing.py`; the runtime subscribes every machine to the "
        "room through this table alone. A route fires when its fact arrives and all of its "
        "conditions hold.",
        "",
        "| room fact | conditions | machine | event | note |",
        "|---|---|---|---|---|",
    ]
    for r in ROUTES:
        when = ", ".join(f"`{c}`" for c in r.when) or "always"
        out.append(f"| `{r.fact}` | {when} | {_md(r.machine)} | `{r.event}` | {_md(r.note)} |")
    out += ["", "| condition | holds when |", "|---|---|"]
    out += [f"| `{name}` | {_md(text)} |" for name, text in CONDITIONS.items()]
    return out
