"""Fuzzing an agent's lifecycle: hypothesis' stateful testing over the orders of what can
happen to a job, against the agent's own entrypoint (``agent-runtime fuzz``,
``fuzz_entrypoint``)."""

from agent_runtime.testing.fuzz.properties import BadCheck, FuzzOutcome, Problem
from agent_runtime.testing.fuzz.report import FuzzReport
from agent_runtime.testing.fuzz.run import FuzzOptions, PluginOffMainThread, fuzz, replay

__all__ = [
    "BadCheck",
    "FuzzOptions",
    "FuzzOutcome",
    "FuzzReport",
    "PluginOffMainThread",
    "Problem",
    "fuzz",
    "replay",
]
