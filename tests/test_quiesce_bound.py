"""The scenario runner lets the real work a step starts finish before virtual time moves
on (``quiesce``). Work that never settles (a session close stuck on nothing the scenario
holds: a bug) is cut at a bound. That bound was wall-clock only: the loop's seconds a
stuck step got, and so which of the SDK's own loop-time timers fired in it, depended on
how fast the machine ran the loop (about a thousand loop seconds per step on a fast one,
far fewer on a loaded one). It is the loop's seconds now, as the fuzz harness's is; the
wall-clock limit stays behind it as a guard.

Real: the scenario runner, its job and sessions, the virtual-time loop. Stood in: the
wall clock the bound reads (a machine of a given speed), and the stuck work (``_busy``)."""

from __future__ import annotations

import asyncio
import itertools
import time
import types

import pytest

from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.testing import runner
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.scenario import parse_scenario


def _loop_seconds_of_a_stuck_step(monkeypatch: pytest.MonkeyPatch, tick: float) -> float:
    """The loop's seconds one step's quiesce lets pass when its work never settles, on a
    machine whose wall clock moves ``tick`` seconds each time the bound reads it."""
    ticks = itertools.count()
    wall = types.SimpleNamespace(monotonic=lambda: next(ticks) * tick)
    monkeypatch.setattr(runner, "time", wall)
    scenario = parse_scenario(
        {
            "name": "stuck",
            "participants": [{"identity": "user"}],
            "steps": [{"at": 0, "event": "end"}],
        }
    )

    async def main() -> float:
        sim = runner._Simulation(scenario, Tracer(MemorySink()))
        try:
            sim._busy = lambda: True  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            began = loop.time()
            await sim.quiesce()
            return loop.time() - began
        finally:
            monkeypatch.setattr(runner, "time", time)
            await sim.aclose()

    return on_virtual_time(main())


def test_a_stuck_step_gets_the_same_loop_seconds_on_any_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = _loop_seconds_of_a_stuck_step(monkeypatch, tick=0.0005)
    slow = _loop_seconds_of_a_stuck_step(monkeypatch, tick=0.001)
    assert fast == pytest.approx(slow, abs=0.01)
    assert 10.0 <= fast <= 10.01
