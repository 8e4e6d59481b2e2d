"""The machines as data. Pure: imports ``pydantic`` and ``transitions``, never ``livekit``."""

from .spec import Cell, Effect, MachineSpec, Row, SpecError, State, StateTimeout, cells, row
from .step import Step, UnknownEvent, UnknownState, step, table_of

__all__ = [
    "Cell",
    "Effect",
    "MachineSpec",
    "Row",
    "SpecError",
    "State",
    "StateTimeout",
    "Step",
    "UnknownEvent",
    "UnknownState",
    "cells",
    "row",
    "step",
    "table_of",
]
