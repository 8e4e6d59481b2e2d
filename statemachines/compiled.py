"""Each spec compiled once into a ``transitions`` machine, the table of record that tests
compare with the spec. Instances never get a Machine of their own (``add_model`` grows
quadratically and a Machine per job costs more than a job should).
"""

from __future__ import annotations

import functools
from typing import Any

from transitions import Machine

from .spec import MachineSpec


@functools.cache
def compile_machine(spec: MachineSpec) -> Any:
    """The shared ``transitions.Machine`` for ``spec`` (no models attached)."""
    states = [
        {"name": s.name, "final": s.final, "ignore_invalid_triggers": False} for s in spec.states
    ]
    rows = [
        {
            "trigger": r.event,
            "source": r.source,
            "dest": r.dest,  # None: an internal transition
            "conditions": list(r.guards),
            "after": list(r.effects),
        }
        for r in spec.rows
    ]
    return Machine(
        model=None,
        states=states,
        transitions=rows,
        initial=spec.initial,
        auto_transitions=False,
        name=spec.name,
    )


def compiled_rows(spec: MachineSpec) -> list[tuple[str, str, str | None, tuple[str, ...]]]:
    """(source, event, dest, guards) for every transition the compiled machine holds."""
    machine = compile_machine(spec)
    out: list[tuple[str, str, str | None, tuple[str, ...]]] = []
    for trigger, event in machine.events.items():
        for source, transitions in event.transitions.items():
            for t in transitions:
                guards = tuple(c.func for c in t.conditions)
                out.append((source, trigger, t.dest, guards))
    return out
