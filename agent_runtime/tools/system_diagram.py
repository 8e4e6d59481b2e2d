"""The whole job in one diagram: every machine a box, every declared channel between them a
labelled arrow.

Read from the declarations the runtime delivers, never written by hand:

* ``statemachines.routing.ROUTES``: room facts to machine events (from the room);
* ``statemachines.links.LINKS``: an effect (or a session's close) posting an event;
* the state changes the playout machine follows (``glue.avatar_change_event``,
  ``glue.link_change_event``, ``glue.agent_state_event``), evaluated on every transition
  the watched machine declares;
* when ``statemachines.system`` exists: its ``WATCHES`` (state-change watches, drawn instead
  of the playout functions above), ``REPORTS`` (a runtime's reports of the livekit part it
  drives, when declared), ``FOLLOW_ORDER`` (the order machines follow the room) and
  ``TEARDOWN`` (the teardown order). That module is read by duck typing, so a shape it
  grows later still draws (fields it does not know are printed as they are).

Pure: no livekit, no I/O. The machines are whatever ``MACHINES`` holds.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_runtime.tools.drawing import BOX_WRAP, BULLET, wrap
from agent_runtime.tools.render import (
    _dot_escape,
    _dot_lines,
    _dot_quote,
    _md,
    _mermaid_ids,
)

if TYPE_CHECKING:
    from statemachines.spec import MachineSpec

NAME = "whole-job"  # its files: whole-job.mmd, whole-job.dot, whole-job.svg
ROOM = "room"
AGENT_SESSION = "agent_session"  # livekit's AgentSession, outside the machines
# livekit-agents' AgentState values (livekit.agents.voice.events; a test pins them): the
# session's agent_state_changed the playout machine follows
AGENT_STATES = ("initializing", "idle", "listening", "thinking", "speaking")


@dataclass(frozen=True)
class Channel:
    source: str
    target: str
    kind: str  # route | link | watch | report
    lines: tuple[str, ...]  # every declaration in full, as the table under the diagram lists
    short: tuple[str, ...] = ()  # what the arrow says: each fact or effect and its event
    heading: str = ""  # a line above them (the room's arrows: their place in the follow order)


@dataclass(frozen=True)
class SystemView:
    machines: tuple[str, ...]
    outside: tuple[str, ...]  # the room and the session: sources that are not machines
    channels: tuple[Channel, ...]
    follow_order: tuple[str, ...]  # empty: not declared
    # declared orders (statemachines.system's TEARDOWN, RELEASE): their steps as
    # (what the diagram says, what the table says)
    orders: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def _system_module() -> Any:
    """``statemachines.system`` if this version has it (issue 24), else None."""
    try:
        return importlib.import_module("statemachines.system")
    except ModuleNotFoundError as e:
        if e.name not in ("statemachines.system", "statemachines"):
            raise  # the module exists but something it imports does not: say so
        return None


def _declared(name: str, *modules: Any) -> tuple[Any, ...]:
    """``name`` from the first module that declares it (none: nothing declared)."""
    for module in modules:
        value = getattr(module, name, None) if module is not None else None
        if value is not None:
            return tuple(value)
    return ()


def _fields(item: Any) -> dict[str, Any]:
    """A declaration's fields, whatever it is: a pydantic model, a dataclass, a mapping, a
    tuple (positions), or anything else (its text)."""
    if hasattr(item, "model_dump") and hasattr(type(item), "model_fields"):
        return {k: getattr(item, k) for k in type(item).model_fields}
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if isinstance(item, Mapping):
        return {str(k): v for k, v in item.items()}
    if isinstance(item, tuple):
        return {str(i): v for i, v in enumerate(item)}
    return {"": item}


def _text(value: Any) -> str:
    if callable(value) and hasattr(value, "__name__"):
        return str(value.__name__)
    if isinstance(value, (tuple, list, frozenset, set)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return ", ".join(_text(v) for v in items)
    return str(value)


def _change_summary(
    fn: Callable[[str, str], str | None], spec: MachineSpec
) -> list[tuple[str, str]]:
    """(event, when) for a state-change function, evaluated on every transition ``spec``
    declares: ``when`` names the states left and entered."""
    pairs = sorted(
        {(r.source, r.dest) for r in spec.rows if r.dest is not None and r.dest != r.source},
        key=lambda p: (spec.state_names.index(p[0]), spec.state_names.index(p[1])),
    )
    by_event: dict[str, list[tuple[str, str]]] = {}
    for source, dest in pairs:
        try:
            event = fn(source, dest)
        except Exception:  # a function of another shape: named, not evaluated
            return []
        if event:
            by_event.setdefault(event, []).append((source, dest))
    out: list[tuple[str, str]] = []
    for event, got in by_event.items():
        left = list(dict.fromkeys(s for s, _ in got))
        entered = list(dict.fromkeys(d for _, d in got))
        out.append((event, f"leaves {', '.join(left)} for {', '.join(entered)}"))
    return out


def _watch(item: Any, machines: Mapping[str, MachineSpec]) -> Channel | None:
    """One declared watch as a channel; None when it does not name two ends."""
    fields = _fields(item)
    ends = (*machines, ROOM, AGENT_SESSION)
    source, target = fields.get("source"), fields.get("target")
    if source not in ends or target not in ends:
        named = [v for v in fields.values() if isinstance(v, str) and v in ends]
        if len(named) < 2:
            return None  # listed under the diagram only
        source, target = named[0], named[1]
    event = fields.get("event")
    note = fields.get("note") or fields.get("description") or ""
    what: list[str] = []
    if fields.get("leaving"):
        what.append(f"leaves {' or '.join(_text(x) for x in fields['leaving'])}")
    if fields.get("entering"):
        what.append(f"enters {' or '.join(_text(x) for x in fields['entering'])}")
    if not what:  # another shape: a function of a change, or fields printed as they are
        for key, value in fields.items():
            if key in ("source", "target", "event", "note", "description"):
                continue
            if value in (source, target) or value in ("", None, ()):
                continue
            if callable(value) and source in machines:
                summary = _change_summary(value, machines[str(source)])
                if summary:
                    what += [f"{when} → {ev}" for ev, when in summary]
                    continue
            what.append(f"{key} {_text(value)}".strip())
    short = [f"{w} → {event}" if event else w for w in what] or [
        f"state changes → {event}" if event else "state changes"
    ]
    full = [f"{line} - {note}" if note else line for line in short]
    return Channel(str(source), str(target), "watch", tuple(full), tuple(short))


def _watch_channels(machines: Mapping[str, MachineSpec], system: Any, glue: Any) -> list[Channel]:
    declared = getattr(system, "WATCHES", None) if system is not None else None
    out: list[Channel] = []
    if declared is not None:
        out += [ch for ch in (_watch(item, machines) for item in declared) if ch is not None]
    else:
        # no declared watches (before statemachines.system): the playout machine's follows
        follows = (("avatar", "avatar_change_event"), ("participant", "link_change_event"))
        for source, fn_name in follows:
            fn = getattr(glue, fn_name, None)
            if fn is None or source not in machines or "playout" not in machines:
                continue
            lines = tuple(f"{when} → {ev}" for ev, when in _change_summary(fn, machines[source]))
            if lines:
                out.append(Channel(source, "playout", "watch", lines, lines))
    # livekit's AgentSession is not a machine: playout follows its agent state by function
    agent_fn = getattr(glue, "agent_state_event", None)
    if agent_fn is not None and "playout" in machines:
        by_event: dict[str, list[str]] = {}
        for state in AGENT_STATES:
            event = agent_fn(state)
            if event:
                by_event.setdefault(event, []).append(state)
        lines = tuple(f"agent {' or '.join(st)} → {e}" for e, st in by_event.items())
        out.append(Channel(AGENT_SESSION, "playout", "watch", lines, lines))
    return out


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _order(items: Any) -> tuple[tuple[str, str], ...]:
    """Steps of a declared order as (what the diagram says, what the table says)."""
    steps: list[tuple[str, str]] = []
    previous = ""
    for item in items:
        if isinstance(item, str):
            steps.append((item, item))
        elif isinstance(item, (tuple, list, frozenset, set)) and all(
            isinstance(x, str) for x in item
        ):
            text = " and ".join(_text(x) for x in item) + (" (at once)" if len(item) > 1 else "")
            steps.append((text, text))
        else:
            fields = _fields(item)
            name = _text(fields.get("name", ""))
            bound = fields.get("bound")
            after = tuple(fields.get("after") or ())
            short = name or ", ".join(f"{k} {_text(v)}" for k, v in fields.items() if v)
            timed_by = fields.get("timed_by")
            if timed_by:  # bounded by that machine's own timers, not by its share
                short += f" (timed by {_text(timed_by)})"
            elif isinstance(bound, (int, float)) and not isinstance(bound, bool):
                short += f" ({bound:.0%})"
            if after and after != (previous,):
                short += f" after {' and '.join(_text(a) for a in after)}"
            rest = {
                k: v
                for k, v in fields.items()
                if k not in ("name", "bound", "after", "timed_by") and v not in ("", None, ())
            }
            full = short + "".join(
                f": {_text(v)}" if k in ("what", "description") else f", {k} {_text(v)}"
                for k, v in rest.items()
            )
            steps.append((short, full))
            previous = name
    return tuple(steps)


def system_view(machines: Mapping[str, MachineSpec]) -> SystemView:
    """Every channel the declarations name, grouped by (source, target, kind)."""
    from statemachines import glue, routing
    from statemachines import links as declared_links

    system = _system_module()
    grouped: dict[tuple[str, str, str], list[str]] = {}
    short: dict[tuple[str, str, str], list[str]] = {}
    follow = tuple(_text(x) for x in (getattr(system, "FOLLOW_ORDER", None) or ()))
    orders = tuple(
        (name, _order(getattr(system, name)))
        for name in ("TEARDOWN", "RELEASE")
        if system is not None and getattr(system, name, None)
    )
    # a teardown step's place in its order, so the arrows it fires carry it
    step_number = {
        _text(_fields(item).get("name", "")): i
        for i, item in enumerate(getattr(system, "TEARDOWN", None) or (), 1)
    }
    # the order machines hear a room fact in, on the room's arrows
    heading = {
        (ROOM, machine, "route"): f"{_ordinal(i)} to hear a fact"
        for i, machine in enumerate(follow, 1)
    }
    # the declarations may move into statemachines.system (issue 24): read them there first
    routes = _declared("ROUTES", system, routing)
    links = _declared("LINKS", system, declared_links)
    for r in routes:
        f = _fields(r)
        when = f" [{' and '.join(f.get('when') or ())}]" if f.get("when") else ""
        key = (ROOM, str(f.get("machine")), "route")
        grouped.setdefault(key, []).append(f"{f.get('fact')}{when} → {f.get('event')}")
        short.setdefault(key, []).append(f"{f.get('fact')} → {f.get('event')}")
    for k in links:
        f = _fields(k)
        on = f.get("on") or f.get("effect") or ""
        step = f" (step {f['step']})" if f.get("step") else ""
        when = f" [{' and '.join(f.get('when') or ())}]" if f.get("when") else ""
        source = str(f.get("source"))
        key = (source, str(f.get("target")), "link")
        grouped.setdefault(key, []).append(f"{on}{step}{when} → {f.get('event')}")
        at = ""
        if f.get("step"):
            number = step_number.get(_text(f["step"]))
            at = f" step {number}" if number else f" step {f['step']}"
        short.setdefault(key, []).append(f"{on}{at} → {f.get('event')}")
    for ch in _watch_channels(machines, system, glue):
        key = (ch.source, ch.target, ch.kind)
        grouped.setdefault(key, []).extend(ch.lines)
        short.setdefault(key, []).extend(ch.short)
    for r in _declared("REPORTS", system):
        f = _fields(r)
        key = (str(f.get("source")), str(f.get("target")), "report")
        arrow = f"{f.get('report')} → {f.get('event')}"
        note = f.get("note") or ""
        grouped.setdefault(key, []).append(f"{arrow} - {note}" if note else arrow)
        short.setdefault(key, []).append(arrow)
    # the arrow says which fact or effect gives which event; conditions, steps and flags
    # are in the table under the diagram (an arrow per declaration would not fit a page)
    channels = tuple(
        Channel(
            s,
            t,
            kind,
            tuple(v),
            tuple(dict.fromkeys(short[(s, t, kind)])),
            heading.get((s, t, kind), ""),
        )
        for (s, t, kind), v in grouped.items()
    )
    used = {c.source for c in channels} | {c.target for c in channels}
    return SystemView(
        machines=tuple(machines),
        outside=tuple(n for n in (ROOM, AGENT_SESSION) if n in used and n not in machines),
        channels=channels,
        follow_order=follow,
        orders=orders,
    )


_COLOURS = {"route": "#1f6feb", "watch": "#8250df", "report": "#bf3989"}
_KIND_STYLE = {  # DOT edge attributes per kind of channel, and the legend's words for them
    "route": ('color="#1f6feb", fontcolor="#1f6feb"', "room fact → event"),
    "link": ("", "effect outcome → event"),
    "watch": ('style=dashed, color="#8250df", fontcolor="#8250df"', "state change → event"),
    "report": (
        'style=dotted, color="#bf3989", fontcolor="#bf3989"',
        "report of a livekit part → event",
    ),
}


def _channel_label(ch: Channel, width: int) -> list[str]:
    rows = [f"{BULLET}{line}" for line in ch.short] if len(ch.short) > 1 else list(ch.short)
    if ch.heading:
        rows.insert(0, f"({ch.heading})")
    return [part for row in rows for part in wrap(row, width)]


def system_dot(view: SystemView) -> str:
    lines = [
        f"digraph {_dot_quote(NAME)} {{",
        '  graph [rankdir=LR, fontname="Helvetica", nodesep=0.3, ranksep=0.5];',
        '  node [shape=box, style="rounded,filled", fillcolor="#f6f8fa", fontname="Helvetica",'
        " fontsize=16];",
        '  edge [fontname="Helvetica", fontsize=13];',
    ]
    for name in view.outside:
        label = _dot_escape(name)
        lines.append(f'  {_dot_quote(name)} [label="{label}", shape=ellipse, style=dashed];')
    for name in view.machines:
        lines.append(f"  {_dot_quote(name)};")
    for ch in view.channels:
        style = _KIND_STYLE[ch.kind][0]
        label = "".join(_dot_escape(p) + "\\l" for p in _channel_label(ch, 22))
        attrs = f'label="{label}"' + (f", {style}" if style else "")
        lines.append(f"  {_dot_quote(ch.source)} -> {_dot_quote(ch.target)} [{attrs}];")
    for n, (name, steps) in enumerate(view.orders):
        items = [f"{i}. {short}" for i, (short, _) in enumerate(steps, 1)]
        label = f"{_dot_escape(name)}, in order\\n" + _dot_lines(items, left=True, width=BOX_WRAP)
        lines.append(f'  "__order_{n}__" [label="{label}", shape=note, fontsize=13];')
    # an HTML-like label, so each kind's line has its arrows' colour
    legend = "<br/>".join(
        f'<font color="{_COLOURS.get(kind, "#000000")}">{kind}: {words}</font>'
        for kind, (_, words) in _KIND_STYLE.items()
    )
    lines.append(f'  "__legend__" [label=<{legend}>, shape=plaintext, fontsize=13];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def system_mermaid(view: SystemView) -> str:
    """A Mermaid flowchart (left to right, as the DOT) of the same boxes and channels."""
    ids = _mermaid_ids([*view.outside, *view.machines])
    # closer than Mermaid's defaults (50, 50): the labels read at a page's width
    lines = [
        "---",
        f"title: {NAME}",
        "config:",
        "  flowchart:",
        "    nodeSpacing: 20",
        "    rankSpacing: 25",
        "---",
        "flowchart LR",
    ]
    for name in view.outside:
        lines.append(f'    {ids[name]}(["{_flow_text(name)}"])')
    for name in view.machines:
        lines.append(f'    {ids[name]}["{_flow_text(name)}"]')
    arrows = {"route": "-->", "link": "-->", "watch": "-.->", "report": "-.->"}
    for ch in view.channels:
        label = "<br>".join(_flow_text(p) for p in _channel_label(ch, 22))
        lines.append(f'    {ids[ch.source]} {arrows[ch.kind]}|"{label}"| {ids[ch.target]}')
    for n, (name, steps) in enumerate(view.orders):
        items = "<br>".join(_flow_text(f"{i}. {short}") for i, (short, _) in enumerate(steps, 1))
        lines.append(f'    order_{n}["{_flow_text(name)}, in order<br>{items}"]')
    for kind, colour in _COLOURS.items():
        numbers = [str(i) for i, ch in enumerate(view.channels) if ch.kind == kind]
        if numbers:  # the same colours as the SVG's
            lines.append(f"    linkStyle {','.join(numbers)} stroke:{colour},color:{colour}")
    for name in view.outside:
        lines.append(f"    style {ids[name]} stroke-dasharray:4 3")
    return "\n".join(lines) + "\n"


def _flow_text(text: str) -> str:
    """Text inside a flowchart's quoted label: no quotes or markup, ':' as its entity."""
    return re.sub(r'["<>|{}#]', "_", text).replace(":", "#58;")


def system_markdown(view: SystemView) -> list[str]:
    """The README section: the diagram, and each channel as a table row."""
    out = [
        "## The whole job",
        "",
        "Every machine, and every declared channel between them: room facts to events "
        "(`ROUTES`), effect outcomes to events (`LINKS`), the state changes a machine "
        "follows"
        + (
            " (`WATCHES`)"
            + (
                ", a runtime's reports of the livekit part it drives (`REPORTS`)"
                if any(c.kind == "report" for c in view.channels)
                else ""
            )
            + ", the order machines follow the room in and the teardown orders "
            "(`statemachines/system.py`)"
            if view.orders or view.follow_order
            else " (the playout machine's, `statemachines/glue.py`)"
        )
        + f". Graphviz: [{NAME}.dot]({NAME}.dot), [{NAME}.svg]({NAME}.svg).",
        "",
        "```mermaid",
        system_mermaid(view).rstrip("\n"),
        "```",
        "",
        "| from | to | kind | what → event |",
        "|---|---|---|---|",
    ]
    for ch in view.channels:
        what = "<br>".join(_md(line) for line in ch.lines)
        out.append(f"| {_md(ch.source)} | {_md(ch.target)} | {ch.kind} | {what} |")
    if view.follow_order:
        out += ["", "Room facts are followed in this order: " + ", ".join(view.follow_order) + "."]
    for name, steps in view.orders:
        out += ["", f"`{name}`, in order (a step's share of the whole bound in brackets):", ""]
        out += [f"{i}. {_md(full)}" for i, (_, full) in enumerate(steps, 1)]
    return out


def system_files(machines: Mapping[str, MachineSpec]) -> dict[str, str]:
    view = system_view(machines)
    return {f"{NAME}.mmd": system_mermaid(view), f"{NAME}.dot": system_dot(view)}


__all__ = [
    "AGENT_STATES",
    "NAME",
    "Channel",
    "SystemView",
    "system_dot",
    "system_files",
    "system_markdown",
    "system_mermaid",
    "system_view",
]
