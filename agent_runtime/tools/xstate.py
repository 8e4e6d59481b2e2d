"""A machine spec as an XState v5 machine: one ES module per machine.

The module calls ``setup({...}).createMachine(config)``, so it loads in XState as it is and
opens in Stately's visual editor. The table maps one to one:

- every (state, event) cell is an ``on`` entry: the transition rows in order (a guard per
  row, ``and([...])`` when a row needs several), ``ignore`` as a transition that does
  nothing, ``reject`` as the named action ``reject``. A guarded cell of exclusive guards
  ends with the ``ignore`` that ``statemachines.step`` answers when no guard holds;
- a row's effects are named actions; ``dest=None`` is a targetless (internal) transition and
  ``dest == source`` re-enters (``reenter: true``), as the runtime leaves and enters again;
- a state timeout is ``after`` with a named delay (the setting that holds the duration,
  its default in ``setup``), taking the same transitions as the timeout event's cell: the
  runtime delivers that event when the timer fires;
- a state's tasks are ``invoke`` entries whose ``onError`` raises the effect's error event;
- guards, actions and actors are stubs (guards false, as ``step`` with no guard values):
  ``machine.provide({ guards, actions, actors, delays })`` gives them an implementation.

Pure: no I/O, no livekit, the same text for the same spec.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statemachines.spec import MachineSpec, Row

# what a cell declared ignore or reject becomes (the runtime: nothing; a logged refusal)
IGNORE = "ignore"
REJECT = "reject"
_IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")


@dataclass(frozen=True)
class _Code:
    """JavaScript written as it is (an ``and([...])`` guard, a ``raise`` action)."""

    text: str


def export_name(spec: MachineSpec) -> str:
    """The module's exported binding: ``session_host`` -> ``sessionHostMachine``."""
    head, *rest = spec.name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest) + "Machine"


def delay_ms(seconds: float) -> int | float:
    ms = seconds * 1000
    return int(ms) if float(ms).is_integer() else ms


def _note(kind: str, note: str) -> str:
    return f"{kind}: {note}" if note else kind


def _transition(r: Row) -> dict[str, Any]:
    t: dict[str, Any] = {}
    if r.dest is not None:
        t["target"] = r.dest
        if r.dest == r.source:
            t["reenter"] = True  # the runtime leaves and enters again: timer and tasks restart
    if len(r.guards) == 1:
        t["guard"] = r.guards[0]
    elif r.guards:
        t["guard"] = _Code(f"and({json.dumps(list(r.guards))})")
    if r.effects:
        t["actions"] = list(r.effects)
    if r.dest is None and not r.effects:
        t["description"] = "internal: nothing runs, the state stays"
    return t


def cell_transitions(spec: MachineSpec, state: str, event: str) -> list[dict[str, Any]]:
    """The XState transitions of one cell, tried in order as ``step`` tries the rows."""
    rows = [r for r in spec.rows if r.source == state and r.event == event]
    if rows:
        out = [_transition(r) for r in rows]
        if rows[-1].guards:  # exclusive guards: when none holds, step ignores
            out.append({"description": _note(IGNORE, "no guard holds")})
        return out
    notes = {(c.state, c.event): c.note for c in (*spec.ignore, *spec.reject)}
    if spec.cell_kind(state, event) == "ignore":
        return [{"description": _note(IGNORE, notes.get((state, event), ""))}]
    return [{"actions": [REJECT], "description": _note(REJECT, notes.get((state, event), ""))}]


def _one(transitions: list[dict[str, Any]]) -> dict[str, Any] | list[dict[str, Any]]:
    return transitions[0] if len(transitions) == 1 else transitions


def machine_config(spec: MachineSpec) -> dict[str, Any]:
    """The config given to ``createMachine`` (``_Code`` where JavaScript is needed)."""
    errors = {e.name: e.error_event for e in spec.effects}
    states: dict[str, Any] = {}
    for st in spec.states:
        node: dict[str, Any] = {}
        if st.description:
            node["description"] = st.description
        if st.final:
            node["type"] = "final"
        if st.timeout is not None:
            node["after"] = {
                st.timeout.setting: _one(cell_transitions(spec, st.name, st.timeout.event))
            }
        if st.invoke:
            invokes = []
            for name in st.invoke:
                inv: dict[str, Any] = {"id": name, "src": name}
                err = errors.get(name)
                if err is not None:
                    inv["onError"] = {"actions": _Code(f"raise({{ type: {json.dumps(err)} }})")}
                invokes.append(inv)
            node["invoke"] = invokes
        node["on"] = {e: _one(cell_transitions(spec, st.name, e)) for e in spec.events}
        states[st.name] = node
    config: dict[str, Any] = {"id": spec.name, "initial": spec.initial}
    if spec.description:
        config["description"] = spec.description
    config["states"] = states
    return config


def delays(spec: MachineSpec) -> dict[str, int | float]:
    """Each timeout setting's default, in milliseconds, by setting name."""
    out: dict[str, int | float] = {}
    for st in spec.states:
        if st.timeout is not None:
            out.setdefault(st.timeout.setting, delay_ms(st.timeout.default))
    return out


def _key(k: str) -> str:
    return k if _IDENT.match(k) else json.dumps(k)


def _js(value: Any, indent: int = 0) -> str:
    pad, inner = "  " * indent, "  " * (indent + 1)
    if isinstance(value, _Code):
        return value.text
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{_key(k)}: {_js(v, indent + 1)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return json.dumps(value)
        items = [f"{inner}{_js(v, indent + 1)}," for v in value]
        return "[\n" + "\n".join(items) + f"\n{pad}]"
    return json.dumps(value)


def _section(title: str, items: Iterable[tuple[str, str, str]]) -> list[str]:
    """A ``setup`` section: ``name: value, // doc`` lines."""
    lines = []
    for name, value, doc in items:
        comment = f" // {doc}" if doc else ""
        lines.append(f"    {_key(name)}: {value},{comment}")
    if not lines:
        return [f"  {title}: {{}},"]
    return [f"  {title}: {{", *lines, "  },"]


def module(spec: MachineSpec) -> str:
    """The ES module for ``spec``: ``export const NAMEMachine`` and a default export."""
    effects = {e.name: e for e in spec.effects}
    actions = sorted({a for r in spec.rows for a in r.effects})
    actors = sorted({name for st in spec.states for name in st.invoke})

    def effect_doc(name: str) -> str:
        e = effects[name]
        fails = f" (on failure the runtime sends {e.error_event})" if e.error_event else ""
        return e.description + fails

    action_docs = [(a, "() => {}", effect_doc(a)) for a in actions]
    action_docs.append((REJECT, "() => {}", "the table refuses the event; the runtime logs it"))
    imports = ["setup"]
    if actors:
        imports.append("fromCallback")
    if any(len(r.guards) > 1 for r in spec.rows):
        imports.append("and")
    if any(effects[a].error_event for a in actors):
        imports.append("raise")
    lines = [
        f"// Generated by `agent-runtime export xstate` from the {spec.name!r} machine spec",
        "// (statemachines/): do not edit; export it again after a change to the spec.",
        "//",
        "// Guards, actions and actors are stubs (guards false, as statemachines.step with no",
        "// guard values); implement them with machine.provide({ guards, actions, actors,",
        "// delays }). Delays are the runtime settings' defaults, in milliseconds.",
        f"import {{ {', '.join(sorted(imports))} }} from {json.dumps('xstate')};",
        "",
        f"export const {export_name(spec)} = setup({{",
        *_section("guards", ((g, "() => false", "") for g in spec.guards)),
        *_section("actions", action_docs),
        *_section("actors", ((a, "fromCallback(() => {})", effect_doc(a)) for a in actors)),
        *_section(
            "delays",
            ((k, json.dumps(v), f"the setting {k}'s default") for k, v in delays(spec).items()),
        ),
        f"}}).createMachine({_js(machine_config(spec))});",
        "",
        f"export default {export_name(spec)};",
        "",
    ]
    return "\n".join(lines)
