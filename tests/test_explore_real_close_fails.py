"""A session's close that fails (its teardown raises, as a plugin's may: the session stops
and livekit never says ``close``) is an outcome the real explorer offers wherever a close
may finish or hang (``a_fails``). The explorer reaches it and every invariant holds there:
the participant link gives up on the close and the job shuts down with the failure as its
reason. A path through it is written as a scenario that ``agent-runtime simulate``
replays, and a job that no longer shuts down on it is caught, by the explorer and by the
scenario."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_runtime.testing import runner
from agent_runtime.testing.expect import check_expect
from agent_runtime.testing.scenario import HeldEnd, load_scenario
from agent_runtime.tools.cli import main as cli
from verification.explore.command import main as explore
from verification.explore.config import CONFIGS
from verification.explore.harness import Harness
from verification.explore.real import Run, run
from verification.explore.realsearch import bfs, drop
from verification.explore.toscenario import write_scenario

SIP = CONFIGS["sip"]  # grace 0: the SIP leg leaving closes the session at once
LEAVES = ["sip_leaves:CLIENT_INITIATED", "a_fails"]
# the link that ends the job when the session will not say it closed
GIVE_UP = "participant:report_close_timed_out:job"


def test_the_explorer_reaches_a_failed_close_and_every_invariant_holds_there() -> None:
    through: list[Run] = []

    def note(r: Run) -> None:
        if "a_fails" in r.path:
            through.append(r)

    report = bfs(SIP, "sip", inputs="job", depth=1, on_run=note)
    assert report.ok, report.summary()
    # the failure reached from the SIP leg's leaving and from the user's own close
    firsts = {r.path[0] for r in through}
    assert {"sip_leaves:CLIENT_INITIATED", "close_a"} <= firsts, firsts


def test_a_failed_close_closes_the_link_and_shuts_the_job_down_with_its_reason() -> None:
    jobs: list[Harness] = []
    r = run(SIP, LEAVES, setup=jobs.append, check_eventual=False)
    assert r.violation is None, r.violation
    offered = run(SIP, LEAVES[:1], check_eventual=False).enabled
    assert {"a_closed", "a_hangs", "a_fails"} <= set(offered)
    view = jobs[0].view()
    assert view.session == "failed"
    assert view.states["participant"] == "closed" and view.states["job"] != "serving"
    assert view.close_failed is not None and "a plugin raised" in view.close_failed
    assert any(view.close_failed in reason for reason in view.shutdown_reasons)
    # and once every bound passed (the checker said the session was still running)
    assert run(SIP, LEAVES).violation is None


@pytest.mark.parametrize("policy", ["return", "hang"])
def test_a_close_that_fails_after_the_link_gave_up_on_it_breaks_nothing(policy: str) -> None:
    """The link gave up at the close's bound (the job shut down for that), then the close
    failed: the link, closed, ignores it, and the job's reason is the bound's."""
    jobs: list[Harness] = []
    path = [LEAVES[0], "time", "a_fails"]
    r = run(SIP, path, setup=jobs.append, policy=policy)  # type: ignore[arg-type]
    assert r.violation is None, r.violation
    view = jobs[0].view()
    assert view.session == "failed" and view.close_failed is None
    assert any("did not close within 60s" in reason for reason in view.shutdown_reasons)


def test_a_job_left_serving_by_a_failed_close_is_found_and_replayed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = run(SIP, LEAVES, setup=drop(GIVE_UP))
    assert found.violation is not None and found.violation.invariant == 8
    assert "the session's close failed, the link is closed" in found.violation.detail
    argv = ["--config", "sip", "--replay", ",".join(LEAVES)]
    assert explore([*argv, "--drop-link", GIVE_UP]) == 1
    assert "invariant 8 violated" in capsys.readouterr().out
    assert explore(argv) == 0


def _simulate(path: Path) -> list[str]:
    scenario = load_scenario(path)
    return check_expect(scenario.expect, asyncio.run(runner.run_scenario(scenario)))


def test_a_path_through_a_failed_close_is_a_scenario_simulate_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    r = run(SIP, LEAVES)
    written = write_scenario(tmp_path, "fails", "sip", SIP, r.log)
    scenario = load_scenario(written)
    assert scenario.config.hold == ("session_close",)
    ends = [(s.call, s.result) for s in scenario.steps if isinstance(s, HeldEnd)]
    assert ends == [("session_close", "error")]
    assert cli(["simulate", str(written)]) == 0
    capsys.readouterr()
    # the scenario runner's job with the same link dropped fails it on the same invariant
    base = runner.AgentJob

    class Faulty(base):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            drop(GIVE_UP)(SimpleNamespace(job=self))  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "AgentJob", Faulty)
    failures = _simulate(written)
    assert len(failures) == 1 and failures[0].startswith("invariant 8 ("), failures
