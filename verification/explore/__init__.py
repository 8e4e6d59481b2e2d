"""Verification of the composed job: exhaustive exploration of an abstract model of the
machines together (``explore``), the invariants over one view of a job (``checks`` over
``view.JobView``), and path coverage plans for one machine (``paths.cover``). The model
reads the glue the runtime runs on (``statemachines.glue``); what only it says is in
``abstract``. Pure: no asyncio, no livekit, no clock; except ``real`` and ``realsearch``,
which explore the real job instead of the model (``dev.py explore --real``)."""

from agent_runtime.testing.invariants.checks import INVARIANTS, Invariant
from agent_runtime.testing.invariants.view import JobView, Request
from verification.explore.model import DEFAULT_GLUE, Config, Glue, Model, World
from verification.explore.search import (
    DEFAULT_CONFIGS,
    DEFAULT_DEPTH,
    LIFECYCLE_CONFIGS,
    PLAYOUT_CONFIGS,
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
    "LIFECYCLE_CONFIGS",
    "PLAYOUT_CONFIGS",
    "Config",
    "Glue",
    "Invariant",
    "JobView",
    "Model",
    "Plan",
    "Report",
    "Request",
    "Result",
    "Violation",
    "World",
    "deep_plans",
    "explore",
    "explore_plan",
    "explore_plans",
]
