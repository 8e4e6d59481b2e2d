"""The user's session start as one of the explorer's inputs (config ``late-start``): only
the runtime follows the room at the run's start, so a shutdown or the avatar's start may
come before the session's. The explorer then reaches the lifecycle's ``held`` (the job
holds before any part of the agent started) and ``starting_held`` (it holds while a part
runs), every invariant holds there, and a path through them is a scenario that
``agent-runtime simulate`` replays, the session's start where the path has it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent_runtime.testing import runner
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.expect import check_expect
from agent_runtime.testing.invariants.view import JobView
from agent_runtime.testing.scenario import SessionStart, load_scenario
from agent_runtime.tools.cli import main as cli
from verification.explore.config import CONFIGS
from verification.explore.harness import Harness
from verification.explore.real import apply, run
from verification.explore.real_inputs import enabled
from verification.explore.realsearch import walks
from verification.explore.toscenario import write_scenario

LATE = CONFIGS["late-start"]
HELD = ["job_shutdown", "session_start"]  # held, then the session starts
# the avatar's start still running when the job holds; the session starts once the
# avatar's join timed out (so at a later virtual time than the start)
STARTING_HELD = [
    "avatar_start",
    "job_shutdown",
    "plugin_routed",
    "plugin_returns",
    "time",
    "session_start",
]


def _went(dests: list[str]) -> list[str]:
    """The states gone through, in order (a part of the start that goes on stays)."""
    return [d for i, d in enumerate(dests) if i == 0 or d != dests[i - 1]]


def _lifecycle(h: Harness) -> list[str]:
    return _went(
        [r.dest for r in h.trace.records if r.kind == "transition" and r.machine == "agent_job"]
    )


def test_the_walks_reach_held_and_starting_held_and_every_invariant_holds() -> None:
    report = walks(LATE, "late-start", seed=0, count=40, steps=20)
    assert report.ok, report.summary()
    never = report.unreached.get("agent_job", [])
    assert "held" not in never and "starting_held" not in never, report.summary()


async def _drive(path: list[str]) -> tuple[JobView, list[str], tuple[str, ...]]:
    """The view, the lifecycle's states and the inputs offered where ``path`` leads."""
    h = Harness(LATE)
    try:
        await h.start()
        for token in path:
            await apply(h, token)
        view = h.view()
        return view, _lifecycle(h), enabled(h, view)
    finally:
        await h.aclose()


@pytest.mark.parametrize(
    ("path", "through"),
    [(HELD, ["held", "starting_held", "running"]), (STARTING_HELD, ["starting_held", "running"])],
    ids=["held", "starting_held"],
)
def test_a_session_started_during_the_hold_hangs_up(path: list[str], through: list[str]) -> None:
    view, lifecycle, offered = on_virtual_time(_drive(path))
    assert view.states["agent_job"] == "running" and not view.on_call
    assert view.session == "closing"  # hung up, its close waiting for the world's word
    assert lifecycle[lifecycle.index(through[0]) :] == through
    assert "session_start" not in offered  # started once: not offered again
    # every invariant held on the way, and once time passed every bound
    assert run(LATE, path).violation is None


def test_only_a_session_never_started_is_offered_a_start() -> None:
    """Offered in late-start until the session starts; never in a config that starts it,
    nor once the session closed (the SDK says a closed session is not started)."""
    closed = ["close_a", "a_closed"]
    assert "session_start" in run(LATE, [], check_eventual=False).enabled
    late = run(LATE, ["session_start", *closed], check_eventual=False).enabled
    assert "session_start" not in late
    for name, config in CONFIGS.items():
        if config.session_started:
            for path in ([], closed):
                offered = run(config, path, check_eventual=False).enabled
                assert "session_start" not in offered, (name, path)


def test_an_avatar_interrupted_before_the_session_began_has_no_agent_audio_to_cut() -> None:
    """Only a session's speech pushes audio to the avatar: the explorer's interrupt pushes
    none before the session began (a segment pushed there waited at the avatar unseen by
    playout, which starts with the session: invariant 12 once the agent spoke)."""
    joined = ["avatar_start", "plugin_routed", "plugin_returns", "avatar_joins", "avatar_video"]
    r = run(LATE, [*joined, "interrupt", "session_start", "agent_says"])
    assert r.violation is None, r.violation


def _simulate(path: Path) -> tuple[list[str], dict[str, object]]:
    scenario = load_scenario(path)
    result = asyncio.run(runner.run_scenario(scenario))
    return check_expect(scenario.expect, result), result


@pytest.mark.parametrize("path", [HELD, STARTING_HELD], ids=["held", "starting_held"])
def test_a_late_start_is_a_scenario_simulate_replays(
    tmp_path: Path, path: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    jobs: list[Harness] = []
    r = run(LATE, path, setup=jobs.append)
    assert r.violation is None, r.violation
    written = write_scenario(tmp_path, "late", "late-start", LATE, r.log)
    steps = load_scenario(written).steps
    (start,) = [s for s in steps if isinstance(s, SessionStart)]
    # where the path has it, at the virtual time it was driven
    driven = next(a for a in r.log if a.token == "session_start")
    assert steps.index(start) > 0 and start.at == driven.at
    failures, result = _simulate(written)
    assert failures == []
    facts = result["facts"]
    assert isinstance(facts, dict) and facts["step_errors"] == []
    # the runner's job went the explorer's way through the lifecycle
    transitions = result["transitions"]
    assert isinstance(transitions, list)
    replayed = _went([t["dest"] for t in transitions if t["machine"] == "agent_job"])
    assert replayed == _lifecycle(jobs[0])
    assert cli(["simulate", str(written)]) == 0
    capsys.readouterr()
