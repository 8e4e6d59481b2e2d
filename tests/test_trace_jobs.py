"""A trace holding more than one job, on one clock (its times never go back): the readers
all find where the second job starts, from the one trace reader.

``replay`` replays each job from the machines' initial states (a second job's first
decisions used to be replayed from the first job's last states: a divergence that was
none); ``record`` and ``timeline`` refuse it, naming the line; ``watch`` starts its view
over there. Two jobs *at once* in one trace cannot be told apart: every reader refuses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.tools.cli import main
from agent_runtime.tools.commands.watch import Watch

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "user_leaves.yaml"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """One job's records (the room_deletion machine ends in ``allowed``, not final)."""
    import asyncio

    from agent_runtime.testing.runner import run_scenario
    from agent_runtime.testing.scenario import load_scenario

    path = tmp_path_factory.mktemp("jobs") / "one.jsonl"
    asyncio.run(run_scenario(load_scenario(SCENARIO), trace_path=path))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def one_after_the_other(job: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same job again, 100 s later, in the same room, on the clock both shared (a
    test's injected clock); each job's own clock starts at zero."""
    return job + [{**r, "t": r["t"] + 100} for r in job]


def at_once(job: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A second job in another room starting 5 s into the first, into one tracer."""
    other = [{**r, "t": r["t"] + 5, "instance": f"other-{r['instance']}"} for r in job]
    return sorted(job + other, key=lambda r: float(r["t"]))  # stable: each job's order kept


def second_start(records: list[dict[str, Any]], first: int) -> tuple[int, dict[str, Any]]:
    """(line, record) of the second job's first agent_job record (``first``: its length
    when the jobs follow one another, else found by instance)."""
    for n, r in enumerate(records, 1):
        if r["machine"] == "agent_job" and (n > first or r["instance"].startswith("other-")):
            return n, r
    raise AssertionError("no second job")


def test_replay_replays_each_of_two_jobs_one_after_the_other(
    tmp_path: Path, job: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "two.jsonl", one_after_the_other(job))
    assert main(["replay", str(trace)]) == 0
    out = capsys.readouterr().out
    decisions = 2 * sum(r["kind"] in ("transition", "ignore", "reject") for r in job)
    assert f"{trace}: {decisions} decisions replayed" in out
    assert f"from {2 * len(job)} records in 2 jobs" in out and "agent_job x2" in out
    assert "Every decision agrees with the machines." in out

    assert main(["replay", str(trace), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["ok"], report["jobs"], report["decisions"]) == (True, 2, decisions)


def test_replay_finds_a_divergence_in_the_second_job(
    tmp_path: Path, job: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    records = one_after_the_other(job)
    # the job machine's last decision, past where replay went wrong before
    n = max(
        i for i, r in enumerate(records, 1) if r["machine"] == "job" and r["kind"] == "transition"
    )
    records[n - 1]["dest"] = "serving"  # an edited decision, in the second job
    trace = write(tmp_path / "two.jsonl", records)
    assert main(["replay", str(trace)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{trace}:{n}: job[{records[n - 1]['instance']}] on event ")
    assert "destination differs" in out


def test_two_jobs_at_once_are_refused_by_every_reader(
    tmp_path: Path, job: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    records = at_once(job)
    trace = write(tmp_path / "both.jsonl", records)
    n, rec = second_start(records, len(records))
    said = (
        f"{trace}:{n}: the trace holds more than one job: another agent_job machine starts "
        f"here (t = {rec['t']!r}, in {rec['instance']!r}) while the job before it is still "
        "running, and the records of jobs at once cannot be told apart; write each job to "
        'its own file (trace_path="traces/{job_id}.jsonl")'
    )
    page = tmp_path / "page.html"
    for command, extra in [("replay", []), ("record", []), ("timeline", ["-o", str(page)])]:
        assert main([command, str(trace), *extra]) == 2, command
        captured = capsys.readouterr()
        assert captured.err == f"agent-runtime {command}: {said}\n", command
    assert not page.exists()


@pytest.mark.parametrize("command", ["record", "timeline"])
def test_record_and_timeline_refuse_two_jobs_naming_where_the_second_starts(
    tmp_path: Path,
    job: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    # timeline drew the second job's states on the first job's lanes, as one job
    records = one_after_the_other(job)
    trace = write(tmp_path / "two.jsonl", records)
    n, rec = second_start(records, len(job))
    out = tmp_path / "out"
    assert main([command, str(trace), "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {trace}:{n}: the trace holds more than one job: the "
        f"agent_job machine starts again here (t = {rec['t']!r}, in {rec['instance']!r}) "
        "after the job before it ended; write each job to its own file "
        '(trace_path="traces/{job_id}.jsonl")\n'
    )
    assert not out.exists()


def test_watch_starts_the_view_over_where_the_second_job_starts(
    tmp_path: Path, job: list[dict[str, Any]]
) -> None:
    # the second job's records were drawn on the first job's lanes: a machine the second
    # job had not touched yet showed the first job's last state
    records = one_after_the_other(job)
    n, rec = second_start(records, len(job))
    trace = write(tmp_path / "two.jsonl", records[:n])  # the second job's first record
    watch = Watch(str(trace))
    _, problems, restarted = watch.poll()
    assert not restarted
    assert problems == [
        f"{trace}:{n}: the trace holds more than one job: the agent_job machine starts again "
        f"here (t = {rec['t']!r}, in {rec['instance']!r}) after the job before it ended; "
        'write each job to its own file (trace_path="traces/{job_id}.jsonl"); the view '
        "starts over from this line"
    ]
    assert watch.lanes.records == 1
    assert [(lane.machine, lane.state) for lane in watch.lanes.lanes()] == [("agent_job", "new")]
