"""A scenario run through the scenario runner's job, left standing at its last step so a
test can look at the live ``AgentJob`` (its snapshot, its OTel output) before release."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import yaml

from agent_runtime import MemorySink, Tracer
from agent_runtime.testing.inmemory import quiet_sdk_logs
from agent_runtime.testing.runner import _Simulation
from agent_runtime.testing.scenario import parse_scenario


@contextlib.asynccontextmanager
async def scenario_job(text: str, **_: Any) -> AsyncIterator[tuple[_Simulation, MemorySink]]:
    """Run the scenario in ``text`` (YAML) up to its ``end`` step; yield the simulation (its
    ``agent_job``) and the records; release everything afterwards."""
    sink = MemorySink()
    with quiet_sdk_logs():
        sim = _Simulation(parse_scenario(yaml.safe_load(text)), Tracer(sink))
        try:
            await sim.run()
            yield sim, sink
        finally:
            await sim.aclose()
