"""A violation the real explorer finds becomes a scenario file that ``agent-runtime
simulate`` replays to the same failure (``verification.explore.toscenario``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_runtime.testing import runner
from agent_runtime.testing.expect import check_expect
from agent_runtime.testing.scenario import HeldEnd, ScenarioError, load_scenario, parse_scenario
from agent_runtime.tools.cli import main as cli
from verification.explore.config import CONFIGS
from verification.explore.real import run
from verification.explore.realsearch import bfs, drop
from verification.explore.toscenario import NotReproducible, scenario_of, write_scenario

FAULT = "session:report_closed:session_host"  # caught breadth first at depth 1 (invariant 11)


def _plant(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """The scenario runner's job with the same link dropped as the explorer's."""
    base = runner.AgentJob

    class Faulty(base):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            drop(fault)(SimpleNamespace(job=self))  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "AgentJob", Faulty)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _plant(monkeypatch, FAULT)
    yield


def _simulate(path: Path) -> list[str]:
    scenario = load_scenario(path)
    return check_expect(scenario.expect, asyncio.run(runner.run_scenario(scenario)))


def _found(tmp_path: Path) -> Path:
    report = bfs(
        CONFIGS["example"],
        "example",
        inputs="job",
        depth=1,
        setup=drop(FAULT),
        stop_at_first=True,
        scenario_dir=str(tmp_path),
    )
    assert report.violations[0].invariant == 11, report.summary()
    assert "scenario written; replay: agent-runtime simulate" in report.summary()
    (written,) = tmp_path.glob("*.yaml")
    return written


def test_a_violation_is_written_and_simulate_fails_on_the_same_invariant(
    tmp_path: Path, planted: None, capsys: pytest.CaptureFixture[str]
) -> None:
    written = _found(tmp_path)
    failures = _simulate(written)
    assert len(failures) == 1 and failures[0].startswith("invariant 11 (ends_with_the_session)")
    assert "the primary session closed but the job still serves" in failures[0]
    assert cli(["simulate", str(written)]) == 1
    assert "expect failed: invariant 11" in capsys.readouterr().out


def test_the_same_scenario_passes_on_the_runtime_as_it_ships(tmp_path: Path) -> None:
    written = _found(tmp_path)  # the fault planted in the explorer only
    assert _simulate(written) == []


def test_a_path_without_a_violation_replays_cleanly(tmp_path: Path) -> None:
    path = ["user_joins", "finalize", "verdict_ready", "ctx_shutdown", "a_closed"]
    r = run(CONFIGS["example"], path)
    assert r.violation is None
    written = write_scenario(tmp_path, "clean", "example", CONFIGS["example"], r.log)
    assert _simulate(written) == []


@pytest.mark.parametrize(
    ("token", "step", "broken"),
    [("job_shutdown", "job.shutdown", True), ("ctx_shutdown", "ctx.shutdown", False)],
)
def test_each_shutdown_is_written_as_its_own_step_and_replays_as_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str, step: str, broken: bool
) -> None:
    """The agent's ``job.shutdown()`` and livekit's ``ctx.shutdown()`` are two inputs and two
    steps: without the ``job_holding`` watch only the agent's own call holds on the call
    (invariant 13; livekit's closed the session first), in the explorer and in simulate."""
    fault = "job:job_holding:agent_job"
    r = run(CONFIGS["example"], [token], setup=drop(fault))
    assert (r.violation is not None and r.violation.invariant == 13) is broken
    written = write_scenario(tmp_path, token, "example", CONFIGS["example"], r.log)
    assert [s.event for s in load_scenario(written).steps][1:-1] == [step]
    _plant(monkeypatch, fault)
    failures = _simulate(written)
    assert bool(failures) is broken
    assert all(f.startswith("invariant 13 (off_the_call)") for f in failures), failures


def test_an_input_no_scenario_step_reproduces_is_refused_by_name() -> None:
    r = run(CONFIGS["example"], ["request_deletion"])
    with pytest.raises(NotReproducible, match=r"input 1 \(request_deletion\): no scenario step"):
        scenario_of("example", CONFIGS["example"], r.log, "asked")


def test_an_input_while_a_stand_in_waits_holds_that_call(tmp_path: Path) -> None:
    r = run(CONFIGS["example"], ["close_a", "ping", "a_closed"])
    assert r.violation is None
    written = write_scenario(tmp_path, "held", "example", CONFIGS["example"], r.log)
    scenario = load_scenario(written)
    assert scenario.config.hold == ("session_close",)
    ends = [(s.at, s.call, s.result) for s in scenario.steps if isinstance(s, HeldEnd)]
    assert ends == [(0.0, "session_close", "ok")]
    assert _simulate(written) == []


def test_a_hang_and_a_failure_are_held_ends(tmp_path: Path) -> None:
    r = run(CONFIGS["example"], ["close_a", "a_hangs"])
    text = scenario_of("example", CONFIGS["example"], r.log, "hang")
    assert "hold:\n  - session_close\n" in text and "result: hang" in text
    written = write_scenario(tmp_path, "hang", "example", CONFIGS["example"], r.log)
    assert _simulate(written) == []


# drops whose path needs a held call (a hang, or a wait still open at the end): the fault,
# how the explorer finds it (its depth, after the prefix), the invariant and the calls the
# scenario holds
HELD_DROPS = [
    ("session:report_own_closed:playout", "example", (), 1, 9, ("shutdown_callback",)),
    ("participant:report_close_timed_out:job", "sip", (), 2, 8, ("session_close",)),
    # from the simulator's request: the search from the start finds the same run, later
    ("finalize:report_answered:job", "example", ("finalize",), 1, 7,
     ("session_close", "simulation_end")),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "config", "prefix", "depth", "invariant", "held"), HELD_DROPS)
def test_a_violation_that_needs_a_held_call_replays_to_the_same_invariant(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    config: str,
    prefix: tuple[str, ...],
    depth: int,
    invariant: int,
    held: tuple[str, ...],
) -> None:
    report = bfs(CONFIGS[config], config, inputs="job", depth=depth, setup=drop(fault),
                 prefix=prefix, stop_at_first=True, scenario_dir=str(tmp_path))  # fmt: skip
    assert report.violations[0].invariant == invariant, report.summary()
    (written,) = tmp_path.glob("*.yaml")
    assert load_scenario(written).config.hold == held
    assert _simulate(written) == []  # the runtime as it ships
    _plant(monkeypatch, fault)
    failures = _simulate(written)
    assert len(failures) == 1 and failures[0].startswith(f"invariant {invariant} ("), failures


@pytest.mark.parametrize(
    ("invariants", "message"),
    [([42], "no invariant 42 (invariants: 0, 1,"), (["9"], "'all' or a list"), ("x", "got 'x'")],
)
def test_a_bad_invariants_expectation_is_one_clear_line(invariants: Any, message: str) -> None:
    raw = {"name": "x", "steps": [{"at": 0, "event": "end"}], "expect": {"invariants": invariants}}
    with pytest.raises(ScenarioError) as e:
        parse_scenario(raw, source="f.yaml")
    assert str(e.value).startswith("f.yaml: expect.invariants")
    assert message in str(e.value) and "\n" not in str(e.value)
