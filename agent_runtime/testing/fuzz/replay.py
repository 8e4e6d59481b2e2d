"""Replaying a scenario file against an agent's entrypoint (``replay``): the one run of a
scenario that a replay and the fuzz's preflight both make, and where either runs (the
caller's thread, or one of the fuzzer's when the caller's runs a loop)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.entrypoint import NoAgentJob, check_agent, served
from agent_runtime.testing.fuzz.harness import CONFIG, TAKES, Declined, Harness
from agent_runtime.testing.fuzz.machine import finish
from agent_runtime.testing.fuzz.properties import Check, Problem, check_checks, during
from agent_runtime.testing.fuzz.report import FuzzReport, fill_report
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.sdk_logs import quiet_sdk_logs


class NotReplayable(ValueError):
    """A scenario file the fuzzer cannot replay against an entrypoint (the one line says
    which steps or settings, and why)."""


def check_replayable(scenario: sc.Scenario, source: str) -> None:
    """``NotReplayable`` naming what of ``scenario`` a replay against an entrypoint cannot
    do: steps the fuzzer does not take, settings that are the entrypoint's own, no
    ``session.start`` (the entrypoint would never run) or more than one."""
    why: list[str] = []
    foreign = [s for s in scenario.steps if not isinstance(s, TAKES)]
    if foreign:
        names = ", ".join(f"t={seconds_text(s.at)} {s.event}" for s in foreign)
        why.append(f"steps the fuzzer does not take ({names}: agent-runtime simulate runs them)")
    starts = sum(isinstance(s, sc.SessionStart) for s in scenario.steps)
    if starts != 1:
        why.append(
            "no session.start step (the entrypoint would never run)"
            if not starts
            else f"{starts} session.start steps (the entrypoint runs once)"
        )
    own = sorted(set(scenario.config.model_fields_set) - set(CONFIG))
    if own:
        why.append(
            f"config {', '.join(own)} (the entrypoint's own AgentJob options; a replay takes "
            f"only {', '.join(CONFIG)})"
        )
    if scenario.expect is not None:
        why.append("an expect block (a replay checks the fuzzer's properties)")
    if why:
        raise NotReplayable(f"{source}: cannot replay it against the agent: {'; '.join(why)}")


def replay(
    server: Any,
    path: str | os.PathLike[str],
    *,
    checks: Sequence[Check] = (),
    logs: bool = False,
) -> FuzzReport:
    """Run a scenario file (one ``fuzz`` wrote, or one written by hand) against
    ``server``'s entrypoint and check the same properties. ``ScenarioError`` if invalid,
    ``NotReplayable`` if it has what a replay cannot do (``check_replayable``),
    ``NoAgentJob`` if the entrypoint builds no ``AgentJob``, ``BadCheck`` if a check cannot
    check an outcome (as for ``fuzz``); ``logs`` as ``FuzzOptions.logs``. ``server`` as for
    ``fuzz``: a function an ``AgentServer`` of its module registered runs with that server's
    hooks."""
    server = served(server)
    check_agent(server)
    check_checks(checks)
    scenario = sc.load_scenario(path_of("path", path))
    check_replayable(scenario, str(path))
    began = time.monotonic()
    refused: list[str] = []
    kept: list[str] = []
    problems = in_thread(
        lambda: on_virtual_time(
            run_scenario(server, scenario, list(checks), refused, logs=kept, keep_logs=not logs)
        )
    )
    report = FuzzReport(
        seed=None, examples=1, paths=1, seconds=time.monotonic() - began, skipped=refused
    )
    if problems:
        fill_report(report, problems, None, None)
        report.logs = kept
    return report


async def run_scenario(
    server: Any,
    scenario: sc.Scenario,
    checks: list[Check],
    refused: list[str] | None = None,
    *,
    probe: list[Harness] | None = None,
    logs: list[str] | None = None,
    keep_logs: bool = True,
) -> list[Problem]:
    """The scenario's run; its log kept (``keep_logs``, else printed), its lines added
    to ``logs``."""
    with quiet_sdk_logs(logging.ERROR):
        h = Harness(server, scenario.config, keep_logs=keep_logs)
        if probe is not None:
            probe.append(h)
        steps = [s.model_dump() for s in scenario.steps]
        try:
            await h.open(scenario.participants)
            for step in scenario.steps:
                if isinstance(step, sc.End):
                    await h.advance_to(step.at)
                    break
                await h.step(step)
                if isinstance(h.entry, Declined) and _with_a_user(scenario):
                    # as the preflight's room: an agent that builds no job with a user
                    # there builds none anywhere (a usage error, not a property); a room
                    # with none is one it may decline
                    await h.close()
                    raise h.entry.error
                problems = during(h)
                if problems:
                    await h.close()
                    return problems
            problems = await finish(h, checks, steps)
            if h.started and h.entry is None and _with_a_user(scenario) and not _built(h):
                # still waiting at the run's end, with a user there from the start: it
                # builds none anywhere, as one that returns (passing every run would hide it)
                raise NoAgentJob(
                    "the entrypoint built no AgentJob: it was still waiting for something "
                    f"when the run ended at t={seconds_text(h.clock.now())}, with a user in "
                    "the room from t=0 (call AgentJob.from_job_context(ctx, session=...) in "
                    "it and start the job there)"
                )
            return problems
        finally:
            h.release_log()  # a run cut short (a step raised) leaves no filter behind
            if refused is not None:
                refused += h.refused
            if logs is not None:
                logs += h.log_lines()


def _built(h: Harness) -> bool:
    """The entrypoint built an ``AgentJob`` (also one built after its start stalled)."""
    try:
        return h.job is not None or h.runner.job is not None
    except RuntimeError:  # none built
        return False


def _with_a_user(scenario: sc.Scenario) -> bool:
    """Someone other than the simulator is in the room as the run begins."""
    return any(ATTRIBUTE_SIMULATOR not in p.attributes for p in scenario.participants)


def path_of(name: str, value: Any) -> Path:
    """``value``, a path argument called ``name``, as a ``Path``; ``TypeError`` if it is
    not one."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise TypeError(f"{name} must be a path (a str or a Path), not {type(value).__name__}")


def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` where no event loop runs: this thread, or a fresh one when this one runs a
    loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except: what fn raises is not "during" the lookup
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    # a daemon: a run cut short (Ctrl-C in the caller's join) does not keep the process
    t = threading.Thread(target=target, name="agent-runtime-fuzz", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")
