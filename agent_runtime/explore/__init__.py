"""Verification of the composed job: exhaustive exploration of an abstract model of the
four machines together (``explore``), and path coverage plans for one machine
(``paths.cover``). Pure: no asyncio, no livekit, no clock."""

from .checks import INVARIANTS, Invariant
from .model import DEFAULT_GLUE, Config, Glue, Model, World
from .search import DEFAULT_CONFIGS, ConfigResult, Report, Violation, explore, explore_config

__all__ = [
    "DEFAULT_CONFIGS",
    "DEFAULT_GLUE",
    "INVARIANTS",
    "Config",
    "ConfigResult",
    "Glue",
    "Invariant",
    "Model",
    "Report",
    "Violation",
    "World",
    "explore",
    "explore_config",
]
