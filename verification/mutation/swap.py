"""Putting a changed spec where the runtime reads it, and seeing which cells run.

The runtimes read their spec from module constants (``statemachines.job.JOB``, imported
as ``JOB`` by ``agent_runtime.runtimes.job``, and so on) and the tools from
``statemachines.machines.MACHINES``. ``swapped`` replaces the spec object by identity in
every loaded module's namespace and in ``MACHINES``, and puts it back after; an actor
built meanwhile runs the changed table. ``Visits`` records the (machine, state, event)
cells the actors decide, by wrapping ``Actor._step``, the one place every event of every
actor is decided (a mailbox drained in a loop callback and one drained by a task alike).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import statemachines
from statemachines import MachineSpec, Step, step
from statemachines.machines import MACHINES

Cell = tuple[str, str, str]  # (machine, state, event)


# only the project's own modules can hold a spec: those in the checkout of statemachines
_ROOT = str(Path(statemachines.__file__).resolve().parent.parent)
_local: list[dict[str, Any]] = []
_seen = 0


def _namespaces() -> list[dict[str, Any]]:
    """The namespaces of the loaded modules whose file is in the project (kept up to date
    as modules load)."""
    global _seen
    if len(sys.modules) != _seen:
        _seen = len(sys.modules)
        _local[:] = [
            vars(mod)
            for mod in list(sys.modules.values())
            if _is_local(str(getattr(mod, "__file__", None) or ""))
        ]
    return _local


def _is_local(file: str) -> bool:
    return file.startswith(_ROOT) and "site-packages" not in file  # a .venv in the checkout


def _replace(old: object, new: object) -> int:
    """Put ``new`` wherever a module attribute or a ``MACHINES`` entry is ``old``."""
    count = 0
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            if value is old:
                namespace[name] = new
                count += 1
    for name, value in list(MACHINES.items()):
        if value is old:
            MACHINES[name] = new  # type: ignore[assignment]
            count += 1
    return count


@contextmanager
def swapped(original: MachineSpec, mutant: MachineSpec) -> Iterator[int]:
    """``mutant`` in place of ``original`` for the duration; yields how many places."""
    places = _replace(original, mutant)
    try:
        yield places
    finally:
        _replace(mutant, original)


class Visits:
    """The cells decided while installed: by the actors, and (``pure=True``) by every
    caller of the pure ``step`` (the playout table's exploration steps its spec with it)."""

    def __init__(self) -> None:
        self.cells: set[Cell] = set()
        self.watch: tuple[MachineSpec, str, str] | None = None  # a mutant's changed cell
        self.watched = False  # ... decided under the mutant since the last reset

    def visit(self, spec: MachineSpec, state: str, event: str) -> None:
        self.cells.add((spec.name, state, event))
        w = self.watch
        if w is not None and spec is w[0] and state == w[1] and event == w[2]:
            self.watched = True

    @contextmanager
    def installed(self, *, pure: bool = False) -> Iterator[Visits]:
        from agent_runtime.actor import Actor, Event

        original = Actor._step
        real_step = step  # a local: the module's own name is replaced too
        visits = self

        def deciding(actor: Actor, event: Event) -> tuple[Step, bool]:
            visits.visit(actor.spec, actor.state, event.name)
            return original(actor, event)

        def stepping(spec: MachineSpec, state: str, event: str, guards: Any = None) -> Any:
            visits.visit(spec, state, event)
            return real_step(spec, state, event, guards)

        Actor._step = deciding  # type: ignore[method-assign,assignment]
        if pure:
            _replace(real_step, stepping)
        try:
            yield self
        finally:
            Actor._step = original  # type: ignore[method-assign]
            if pure:
                _replace(stepping, real_step)
