"""What a fuzz prints of its runs' logs: a passing fuzz its summary alone (the drawn world's
strangers, silent simulators and leaving users make the job log, run after run); a failing
one the failing run's records in its report; ``--logs`` every run's as it comes. Each run
takes its own job's records only, and leaves nothing on the loggers when it ends, however
it ends.

Real: livekit's fake ``JobContext``, ``AgentSession``, the runtime, hypothesis, the
``logging`` module (pytest's ``caplog`` stands for the user's own handlers). Faked: the
room (``InMemoryRoom``) and the session transport.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import VirtualTimeLoop
from agent_runtime.testing.fuzz import FuzzOptions, fuzz, replay
from agent_runtime.testing.fuzz.harness import SIMULATOR, Harness
from agent_runtime.tools.cli import main
from tests.support import planted

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "tests/support/planted.py"
REFUSED = "refused finalize_simulation from"
SIM = {"identity": "simulator", "attributes": {"lk.simulator": "true"}}

ASKED: list[str] = []  # who asked for the verdict, in the runs the check below saw


def notes_who_asked(outcome: Any) -> bool:
    """A --check that passes, noting who asked for the verdict in each run."""
    ASKED.extend(s["caller"] for s in outcome.steps if s.get("request") == "finalize_simulation")
    return True


def no_stranger_asks(outcome: Any) -> bool:
    """A check that fails any run where someone other than the simulator asks."""
    return not any(
        s.get("request") == "finalize_simulation" and s["caller"] != SIMULATOR
        for s in outcome.steps
    )


def _ask(at: float, caller: str) -> dict[str, Any]:
    return {
        "at": at,
        "event": "session_request",
        "caller": caller,
        "request": "finalize_simulation",
        "payload": {"provisional_success": True},
    }


def _world(tmp_path: Path, *steps: dict[str, Any]) -> Path:
    doc = {
        "name": "strangers",
        "config": {"simulation": True},
        "participants": [SIM, {"identity": "stranger"}],
        "steps": [{"at": 0, "event": "session.start"}, *steps],
    }
    path = tmp_path / "world.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _filters() -> dict[str, list[logging.Filter | Any]]:
    """Every logger's filters (the user's handlers see what these let through)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return {
        log.name: list(log.filters)
        for log in loggers
        if isinstance(log, logging.Logger) and log.filters
    }


def test_a_passing_fuzz_prints_its_summary_not_the_strangers_it_drew(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the drawn strangers' finalize is refused by the job, with a warning, run after run:
    # a fuzz that found nothing printed them all (the user's logging at INFO: the job's
    # lines that name no job, "job closed (aborted)", are the run's too)
    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.INFO)
    ASKED.clear()
    before = _filters()
    check = f"{__name__}:notes_who_asked"  # this module, as pytest imported it
    args = [f"{PLANTED}:FIXED_SIMULATOR_LOOKUP", "--examples", "40", "--seed", "1"]
    code = main(["fuzz", *args, "--check", check])
    out, err = capsys.readouterr()
    assert code == 0 and "40 example(s) run" in out and "nothing found" in out, out + err
    assert {"stranger", "user"} <= set(ASKED)  # the world had them ask
    assert REFUSED not in caplog.text + out + err
    assert [r for r in caplog.records if r.name.startswith("agent_runtime.")] == []
    assert _filters() == before


def test_a_passing_replay_over_strangers_prints_nothing_of_them(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.WARNING)
    path = _world(tmp_path, _ask(1, "stranger"), _ask(2, "simulator"), {"at": 3, "event": "end"})
    code = main(["fuzz", f"{PLANTED}:FIXED_SIMULATOR_LOOKUP", "--replay", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and "nothing found" in out, out + err
    assert REFUSED not in caplog.text + out + err
    # --logs: every run's records go to the user's logging as they come
    code = main(["fuzz", f"{PLANTED}:FIXED_SIMULATOR_LOOKUP", "--replay", str(path), "--logs"])
    out, err = capsys.readouterr()
    assert code == 0 and "nothing found" in out, out + err
    refusals = [r for r in caplog.records if REFUSED in r.getMessage()]
    assert [r.getMessage().split(REFUSED)[1] for r in refusals] == [
        " 'stranger': not the simulator participant"
    ]


def test_a_strangers_playback_report_to_the_avatar_is_not_printed_either(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # the avatar's sink refused it in a line that named no job: no run could tell it its own
    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.WARNING)
    report = {"playback_position": 1.0, "interrupted": False}
    rpc = {"event": "rpc", "method": "lk.playback_finished", "caller": "stranger"}
    path = _world(tmp_path, {"at": 1, **rpc, "payload": report}, {"at": 2, "event": "end"})
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["config"]["avatar_identity"] = "avatar"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    code = main(["fuzz", f"{PLANTED}:FIXED_AVATAR_MUTE", "--replay", str(path), "--logs"])
    out, err = capsys.readouterr()
    assert code == 0 and "nothing found" in out, out + err
    refused = [r for r in caplog.records if "lk.playback_finished refused" in r.getMessage()]
    assert [getattr(r, "job_id", None) for r in refused] == ["fuzz-job"], caplog.text
    caplog.clear()
    code = main(["fuzz", f"{PLANTED}:FIXED_AVATAR_MUTE", "--replay", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and "nothing found" in out, out + err
    assert "lk.playback_finished refused" not in caplog.text


def test_a_failing_replay_shows_its_runs_job_warnings_in_the_report(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(ROOT)
    caplog.set_level(logging.WARNING)
    leave = {"at": 2, "event": "participant_disconnected", "identity": SIMULATOR}
    path = _world(tmp_path, _ask(1, "stranger"), leave, {"at": 2, "event": "end"})
    code = main(["fuzz", f"{PLANTED}:BUGGY_SIMULATOR_LOOKUP", "--replay", str(path)])
    out, _ = capsys.readouterr()
    assert code == 1 and "on_session_end raised IndexError" in out, out
    log = out.split("  the run's log (the job's and livekit's records):\n")[1]
    assert log.splitlines()[0] == (
        "    t=1 WARNING agent_runtime.session_host: job fuzz-job (room fuzz-room), "
        "session_host[fuzz-room]: refused finalize_simulation from 'stranger': not the "
        "simulator participant"
    )
    assert REFUSED not in caplog.text  # in the report, not printed as it came


def test_a_failing_fuzz_shows_the_shrunk_runs_job_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    before = _filters()
    options = FuzzOptions(examples=100, seed=1, avatar=False)
    report = fuzz(planted.FIXED_SIMULATOR_LOOKUP, options, checks=[no_stranger_asks])
    assert not report.ok and report.scenario is not None
    askers = [s["caller"] for s in report.scenario["steps"] if s.get("caller")]
    refused = [line for line in report.logs if REFUSED in line]
    assert len(refused) == len(askers) == 1, report.summary()
    assert f"from {askers[0]!r}" in refused[0]
    assert f"    {refused[0]}" in report.summary().splitlines()
    assert REFUSED not in caplog.text
    assert _filters() == before


def test_two_runs_at_once_take_their_own_jobs_records(caplog: pytest.LogCaptureFixture) -> None:
    # two runs in one process, each on its own loop, their steps interleaved: each run's
    # report has its own job's refusal, not the other's, and neither is printed
    caplog.set_level(logging.WARNING)
    before = _filters()
    participants = (
        sc.Participant(identity="user"),
        sc.Participant(identity="stranger"),
        sc.Participant(identity=SIMULATOR, attributes={"lk.simulator": "true"}),
    )
    runs = {}
    for caller in ("stranger", "user"):
        loop = VirtualTimeLoop()
        h = loop.run_until_complete(_made(sc.Config(simulation=True)))
        runs[caller] = (loop, h)
        loop.run_until_complete(h.open(participants))
        loop.run_until_complete(h.step(sc.SessionStart(at=0, event="session.start")))
    for caller, (loop, h) in runs.items():
        step = sc.parse_scenario({"name": "ask", "steps": [_ask(1, caller)]}).steps[0]
        loop.run_until_complete(h.step(step))
    for loop, h in runs.values():
        loop.run_until_complete(h.close())
        loop.close()
    for caller, (_, h) in runs.items():
        refused = [line for line in h.log_lines() if REFUSED in line]
        assert [line.split(REFUSED)[1].split(":")[0] for line in refused] == [f" {caller!r}"]
    assert REFUSED not in caplog.text
    assert _filters() == before


async def _made(config: sc.Config) -> Harness:
    return Harness(planted.FIXED_SIMULATOR_LOOKUP, config)


def test_a_run_whose_step_raised_leaves_nothing_on_the_loggers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = _filters()
    path = _world(tmp_path, _ask(1, "stranger"), {"at": 2, "event": "end"})
    quiesce = Harness.quiesce

    async def breaks(self: Harness) -> None:
        await quiesce(self)
        if self.started:
            raise RuntimeError("the harness broke")

    monkeypatch.setattr(Harness, "quiesce", breaks)
    with pytest.raises(RuntimeError, match="the harness broke"):
        replay(planted.FIXED_SIMULATOR_LOOKUP, path)
    assert _filters() == before
