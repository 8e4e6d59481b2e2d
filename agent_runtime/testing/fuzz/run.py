"""Fuzzing an agent's entrypoint: hypothesis runs the state machine (``machine.py``) for a
number of examples from a seed, shrinks what fails, and the failure becomes a scenario file
that ``replay`` runs again against the same entrypoint."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import get_state_machine_test
from pydantic import BaseModel, ConfigDict, Field

from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.fuzz.harness import AVATAR, Harness
from agent_runtime.testing.fuzz.machine import FuzzFailure, Stats, finish, make_machine
from agent_runtime.testing.fuzz.properties import Check, Problem
from agent_runtime.testing.inmemory import quiet_sdk_logs

MAX_EXAMPLES = 100_000
MAX_SEED = 2**32 - 1


class FuzzOptions(BaseModel):
    """How to fuzz: how many runs, from which seed, the configuration deployed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    examples: int = Field(default=1000, ge=1, le=MAX_EXAMPLES, strict=True)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, strict=True)
    steps: int = Field(default=25, ge=1, le=100, strict=True)  # per run, at most
    avatar: bool = Field(default=True, strict=True)  # the scripted avatar stands in for the plugin
    simulation: bool = Field(default=True, strict=True)  # a simulation dispatch, its simulator
    progress_every: float = Field(default=5.0, gt=0, le=3600, strict=True)  # real seconds


class FuzzReport(BaseModel):
    """What a fuzz (or a replay) found."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    seed: int | None
    examples: int
    paths: int
    seconds: float
    problems: list[str] = Field(default_factory=list)
    details: list[str] = Field(default_factory=list)
    scenario: dict[str, Any] | None = None
    written: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"{self.examples} example(s) run, {self.paths} distinct path(s), "
            f"{self.seconds:.1f}s" + (f", seed {self.seed}" if self.seed is not None else "")
        )
        if self.ok:
            return f"{head}: nothing found"
        lines = [f"{head}: a property failed", *(f"  {p}" for p in self.problems)]
        if self.scenario is not None:
            lines.append("  the shortest sequence found:")
            lines += [f"    {_step_line(s)}" for s in self.scenario["steps"]]
        if self.written:
            lines.append(f"  written to {self.written} (replay: --replay {self.written})")
        return "\n".join(lines)


def config_of(options: FuzzOptions) -> sc.Config:
    return sc.Config(
        avatar_identity=AVATAR if options.avatar else None, simulation=options.simulation
    )


def fuzz(
    server: Any,
    options: FuzzOptions,
    *,
    checks: Sequence[Check] = (),
    out: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> FuzzReport:
    """Fuzz ``server``'s entrypoint; returns what was found (the failure shrunk, written to
    ``out`` as a scenario file when given). Each run has an event loop of its own, in a
    thread of the fuzzer's (the caller's loop, if it has one, is left alone)."""
    return _in_thread(lambda: _fuzz(server, options, list(checks), out, progress), always=True)  # type: ignore[no-any-return]


def _fuzz(
    server: Any,
    options: FuzzOptions,
    checks: list[Check],
    out: Path | None,
    progress: Callable[[str], None] | None,
) -> FuzzReport:
    seed = options.seed if options.seed is not None else random.randrange(MAX_SEED)
    stats = Stats()
    began = time.monotonic()
    last = [began]

    def on_example(s: Stats) -> None:
        now = time.monotonic()
        if progress is not None and now - last[0] >= options.progress_every:
            last[0] = now
            # hypothesis' count: draws, and shrinks once something failed
            progress(
                f"fuzz: {s.examples} runs (of {options.examples} to draw), "
                f"{len(s.paths)} distinct paths, {now - began:.0f}s"
            )

    stats.on_example = on_example
    machine = make_machine(server, config_of(options), list(checks), stats)
    test = get_state_machine_test(
        machine,
        settings=settings(
            max_examples=options.examples,
            stateful_step_count=options.steps,
            deadline=None,
            database=None,
            derandomize=False,
            report_multiple_bugs=False,
            print_blob=False,
            verbosity=Verbosity.quiet,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.generate, Phase.shrink),
        ),
    )
    failure: FuzzFailure | None = None
    with quiet_sdk_logs(logging.ERROR):
        try:
            hypothesis_seed(seed)(test)()
        except FuzzFailure as e:
            failure = e
    report = FuzzReport(
        seed=seed,
        examples=stats.examples,
        paths=len(stats.paths),
        seconds=time.monotonic() - began,
    )
    if failure is not None:
        _fill(report, failure.problems, failure.scenario, seed)
        if out is not None:
            report.written = str(write_scenario(report.scenario or {}, out, seed))
    return report


def replay(server: Any, path: Path, *, checks: Sequence[Check] = ()) -> FuzzReport:
    """Run a scenario file (one ``fuzz`` wrote, or one written by hand) against
    ``server``'s entrypoint and check the same properties. ``ScenarioError`` if invalid."""
    scenario = sc.load_scenario(path)
    began = time.monotonic()
    problems = _in_thread(lambda: on_virtual_time(_replay(server, scenario, list(checks))))
    report = FuzzReport(seed=None, examples=1, paths=1, seconds=time.monotonic() - began)
    if problems:
        _fill(report, problems, None, None)
    return report


async def _replay(server: Any, scenario: sc.Scenario, checks: list[Check]) -> list[Problem]:
    from agent_runtime.testing.fuzz import properties as props

    with quiet_sdk_logs(logging.ERROR):
        h = Harness(server, scenario.config)
        await h.open(scenario.participants)
        steps = [s.model_dump() for s in scenario.steps]
        for step in scenario.steps:
            if isinstance(step, sc.End):
                await h.advance_to(step.at)
                break
            await h.step(step)
            problems = [p for check in props.DURING for p in check(h)]
            if problems:
                await h.close()
                return problems
        return await finish(h, checks, steps)


def _fill(
    report: FuzzReport, problems: list[Problem], scenario: dict[str, Any] | None, seed: int | None
) -> None:
    report.problems = [str(p) for p in problems]
    report.details = [p.detail for p in problems if p.detail]
    if scenario is not None:
        what = problems[0]
        report.scenario = {
            "name": f"fuzz: {what.prop}",
            "description": f"found by agent-runtime fuzz (seed {seed}), shrunk: {what.message}",
            **scenario,
        }


def write_scenario(scenario: dict[str, Any], out: Path, seed: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fuzz-{seed}.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False, width=100))
    return path


def _in_thread(fn: Callable[[], Any], *, always: bool = False) -> Any:
    """``fn()`` where no event loop runs (a fresh thread when this one runs one, or
    ``always``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running and not always:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="agent-runtime-fuzz")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _step_line(step: dict[str, Any]) -> str:
    rest = ", ".join(f"{k}={v!r}" for k, v in step.items() if k not in ("at", "event"))
    return f"t={step['at']:g} {step['event']}" + (f" ({rest})" if rest else "")


def print_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
