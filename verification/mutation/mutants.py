"""The single-cell mutants of the machines, numbered the same way in every process."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from statemachines import MachineSpec, SpecError
from statemachines.machines import MACHINES
from verification.mutation.cells import single_cell_mutants


@dataclass(frozen=True)
class Mutant:
    machine: str
    index: int  # its place in single_cell_mutants(spec): the same in every process
    label: str  # e.g. "job (serving, shutdown) [hold_needed] -> closing"
    state: str
    event: str
    spec: MachineSpec | None  # None when the spec model refuses the changed table
    refused: str = ""

    @property
    def key(self) -> str:
        return f"{self.machine}#{self.index}"


def _cell(label: str) -> tuple[str, str]:
    inside = label[label.index("(") + 1 : label.index(")")]
    state, event = inside.split(", ")
    return state, event


def mutants_of(spec: MachineSpec) -> list[Mutant]:
    """Every one-cell change of ``spec``: a row's destination to each other state or
    internal; a transition cell made ignore or reject; an ignore/reject cell swapped, or
    made a transition to each state or internal. Each is built through the spec model;
    one it refuses (a final state left, a state made unreachable, ...) cannot load, and
    keeps the reason instead of a spec."""
    return [
        _build(spec, i, label, changed)
        for i, (label, changed) in enumerate(single_cell_mutants(spec))
    ]


def mutant(spec: MachineSpec, label: str) -> Mutant:
    """The mutant of ``spec`` with that label, numbered as in ``mutants_of`` but built
    alone: building (validating) every mutant of the avatar takes seconds."""
    for i, (name, changed) in enumerate(single_cell_mutants(spec)):
        if name == label:
            return _build(spec, i, name, changed)
    raise ValueError(f"{spec.name} has no mutant {label!r}")


def _build(spec: MachineSpec, index: int, label: str, changed: MachineSpec) -> Mutant:
    state, event = _cell(label)
    try:
        built = MachineSpec.model_validate(changed.model_dump())
    except SpecError as e:
        return Mutant(spec.name, index, label, state, event, None, str(e))
    return Mutant(spec.name, index, label, state, event, built)


def all_mutants(machines: Iterable[str] | None = None) -> list[Mutant]:
    names = list(MACHINES) if machines is None else list(machines)
    unknown = [n for n in names if n not in MACHINES]
    if unknown:
        raise ValueError(f"no machine {unknown[0]!r}; machines: {', '.join(MACHINES)}")
    return [m for n in names for m in mutants_of(MACHINES[n])]
