"""Verification of the composed job: exhaustive exploration of an abstract model of the
four machines together (``explore``), and path coverage plans for one machine
(``paths.cover``). Pure: no asyncio, no livekit, no clock."""

from .checks import INVARIANTS, Invariant
from .model import DEFAULT_GLUE, Config, Glue, Model, World
from .search import (
    DEFAULT_CONFIGS,
    DEFAULT_DEPTH,
    Plan,
    Report,
    Result,
    Violation,
    deep_plans,
    explore,
    explore_plan,
    explore_plans,
)

__all__ = [
    "DEFAULT_CONFIGS",
    "DEFAULT_DEPTH",
    "DEFAULT_GLUE",
    "INVARIANTS",
    "Config",
    "Glue",
    "Invariant",
    "Model",
    "Plan",
    "Report",
    "Result",
    "Violation",
    "World",
    "deep_plans",
    "explore",
    "explore_plan",
    "explore_plans",
]
