"""The benchmarks keep working: each section at a tiny size produces well-formed rows.

No timing is asserted (figures from a tiny run on a CI machine mean nothing); what is
asserted is what a reader of the table relies on: every contender and every target has
its row, figures are positive numbers in the stated unit, every contender ends in the
state the table says, and the command writes JSON that reads back as the printed table.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pytest import approx

from benchmarks import dispatch, footprint, imports, jobs, reactions
from benchmarks.config import Config
from benchmarks.run import SECTIONS, main
from benchmarks.table import Row, Target, render_markdown

TINY = Config.tiny()


def _well_formed(rows: list[Row], section: str) -> None:
    assert rows
    for r in rows:
        assert r.section == section
        assert r.value is not None and math.isfinite(r.value) and r.value > 0, r
        assert r.unit and r.figure and r.how
        json.dumps(r.to_dict())  # serialisable as is


@pytest.mark.snapshot  # a hand-written dispatch of the tables as written
def test_dispatch_has_every_contender_and_both_targets() -> None:
    rows = dispatch.run(TINY)
    _well_formed(rows, "dispatch")
    cases = {r.case: r for r in rows}
    for label, _ in dispatch.CONTENDERS.values():
        assert cases[label].unit == "events/s"
        assert len(cases[label].samples) == TINY.repeats
    vs_async = cases["Actor (trace off) throughput / AsyncMachine"]
    vs_sync = cases["Actor (trace off) per-event cost / Machine"]
    assert vs_async.target == Target(">=", 5.0) and vs_async.met is not None
    assert vs_sync.target == Target("<=", 1.0) and vs_sync.met is not None
    vs_otel = cases["Actor (trace on, OtelSink without an SDK) per-event cost / Machine"]
    assert vs_otel.target == Target("<=", 1.0)


@pytest.mark.snapshot  # a hand-written dispatch of the tables as written
@pytest.mark.parametrize("name", sorted(dispatch.WORKLOADS))
async def test_every_contender_ends_where_the_table_says(name: str) -> None:
    w = dispatch.WORKLOADS[name]
    # measure raises when any contender's final state differs from the pure step's
    seconds = await dispatch.measure(w, 37, 1)
    assert set(seconds) == set(dispatch.CONTENDERS)


def test_a_workload_that_stops_transitioning_is_refused() -> None:
    w = dispatch.WORKLOADS["participant"]
    # in `waiting`, a disconnect is an ignore cell: timing it would not measure transitions
    bad = dispatch.Workload(w.spec, (), ("participant_disconnected",), w.guards, w.settings)
    with pytest.raises(ValueError, match="'participant_disconnected' in 'waiting' is ignore"):
        bad.check(3)


def test_footprint_rows_for_each_size_and_the_growth() -> None:
    rows = footprint.run(TINY)
    _well_formed(rows, "footprint")
    small, big = TINY.jobs
    cases = {r.case: r for r in rows}
    for n in (small, big):
        assert cases[f"{n:,} jobs: build time"].unit == "us/job"
        assert cases[f"{n:,} jobs: memory"].unit == "KiB/job"
    growth = cases[f"{big:,} / {small:,} jobs: time"]
    assert growth.target == Target("<=", big / small * 1.1)


def test_import_probes_run_in_fresh_interpreters() -> None:
    probes = (
        imports.PROBES[0],
        imports.Probe("json after statemachines", "import json", before="import statemachines"),
    )
    rows = imports.rows_from(imports.measure(1, probes, warm_up=False), probes)
    _well_formed(rows, "imports")
    assert rows[0].case == "import statemachines" and rows[0].target == Target("<", 100.0)
    assert "after `import statemachines`" in rows[1].how


@pytest.fixture
def quick_fallback(monkeypatch: pytest.MonkeyPatch) -> float:
    """Upstream's 5 s interruption fallback and 2 s clear fallback, and how long the
    reproductions watch for what upstream never does, shortened so they run fast here."""
    from livekit.agents.voice import speech_handle

    monkeypatch.setattr(speech_handle, "INTERRUPTION_TIMEOUT", 0.05)
    monkeypatch.setattr(reactions, "CLEAR_BUFFER_TIMEOUT", 0.05)
    monkeypatch.setattr(reactions, "UPSTREAM_WATCH", 0.05)
    monkeypatch.setattr(reactions, "CONFIRM_AFTER", 0.01)
    return 0.05


@pytest.fixture
def quick_upstream(monkeypatch: pytest.MonkeyPatch) -> float:
    """``quick_fallback`` for upstream's reproductions only: the bundled scenarios run on
    virtual time, where a shortened SDK fallback would fire before their avatar answers."""
    from livekit.agents.voice import speech_handle

    upstream = reactions.measure_upstream

    async def quick() -> Any:
        with monkeypatch.context() as m:
            m.setattr(speech_handle, "INTERRUPTION_TIMEOUT", 0.05)
            return await upstream()

    monkeypatch.setattr(reactions, "measure_upstream", quick)
    monkeypatch.setattr(reactions, "CLEAR_BUFFER_TIMEOUT", 0.05)
    monkeypatch.setattr(reactions, "UPSTREAM_WATCH", 0.05)
    monkeypatch.setattr(reactions, "CONFIRM_AFTER", 0.01)
    return 0.05


def test_the_command_prints_the_table_and_writes_it_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quick_upstream: float
) -> None:
    out = tmp_path / "latest.json"
    code = main(
        ["--only", "dispatch,reactions", "--events", "30", "--repeats", "1", "--out", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["sections"] == ["dispatch", "reactions"]
    assert doc["config"]["events"] == 30
    assert doc["environment"]["python"]
    rows = [r for r in doc["rows"] if r["section"] == "dispatch"]
    assert len(rows) == len(dispatch.CONTENDERS) + 5
    assert [r["section"] for r in doc["rows"][len(rows) :]] == ["reactions"] * (
        len(doc["rows"]) - len(rows)
    )
    for r in doc["rows"]:  # every JSON row is a line of the printed table
        assert f"| {r['section']} | {r['case']}" in printed and r["figure"] in printed


def test_reactions_every_situation_beside_upstream(quick_upstream: float) -> None:
    assert SECTIONS["reactions"] is reactions.run
    rows = reactions.run(TINY)
    cases = {r.case: r for r in rows}
    assert len(cases) == len(rows)
    for r in rows:
        assert r.section == "reactions" and r.how and r.figure
        json.dumps(r.to_dict())
    ours = {c.removesuffix(": this runtime"): r for c, r in cases.items() if "this runtime" in c}
    theirs = {c.removesuffix(": livekit-agents 1.8.9") for c in cases if "1.8.9" in c}
    # virtual seconds from the cause to the reaction: deterministic, set by the scenario files
    assert {c: r.value for c, r in ours.items() if not c.startswith("processing")} == approx(
        {
            "avatar never joins (started before the session) -> room audio": 0,
            "avatar never joins (started after the session) -> room audio": 0,
            "avatar leaves mid-session -> room audio": 0,
            "avatar plugin start() raises -> room audio": 0,
            "simulator leaves, SIP leg stays -> job closed": 0,
            "user leaves (CLIENT_INITIATED) -> session closed": 0,
            "user drops (CONNECTION_TIMEOUT), no rejoin -> session closed": 15,
            "interrupt after the avatar left -> playout released": 0,
            "avatar never reports its playback -> playout done": 5,
            "avatar leaves mid-utterance -> playout done": 0,
            "interruption, the avatar confirms the cut -> playout done": 0.3,
            "user silent after the agent spoke -> re-prompt, from the remote playout": 6,
        }
    )
    assert theirs == {
        "avatar failure -> room audio",
        "simulator leaves -> job closed",
        "user leaves (CLIENT_INITIATED) -> session closed",
        "user drops (CONNECTION_TIMEOUT), no rejoin -> session closed",
        "interrupt after the avatar left -> playout released",
        "avatar never reports its playback -> playout done",
        "avatar leaves mid-utterance -> playout done",
        "interruption, the avatar confirms the cut -> playout done",
        "user silent after the agent spoke -> re-prompt, from the remote playout",
    }
    bundled = len(list((Path(__file__).parent.parent / "examples" / "scenarios").glob("*.yaml")))
    per_step = ours[f"processing per scenario step, all {bundled} bundled scenarios"]
    assert per_step.unit == "ms/step" and per_step.value is not None and per_step.value > 0
    assert "ms wall/step" in ours["avatar leaves mid-session -> room audio"].figure


async def test_upstream_reproductions_show_what_the_table_says(quick_fallback: float) -> None:
    with reactions.captured_sdk_logs() as logs:
        routes = await reactions.upstream_avatar_routes()
        users = await reactions.upstream_user_leaves()
        stall = await reactions.upstream_interrupt_after_avatar_left(logs)
    # never restored: after every failure the chain still ends in the avatar's data stream
    assert set(routes) == {"never joins, avatar first", "never joins, session first", "leaves"}
    assert all(chain.endswith("-> DataStreamAudioOutput") for chain in routes.values())
    assert users["CLIENT_INITIATED"]["closed"]
    assert users["CLIENT_INITIATED"]["close_reason"] == "participant_disconnected"
    assert users["CONNECTION_TIMEOUT"] == {"closed": False, "close_pending": False}
    # the stall is the fallback's: it fired (and logged), never earlier than its timeout
    assert stall["fallback_logged"] and stall["interruption_timeout"] == quick_fallback
    assert stall["seconds"] >= quick_fallback and stall["clear_buffer_in_flight"]


async def test_upstream_playout_reproductions_show_what_the_table_says(
    quick_fallback: float,
) -> None:
    with reactions.captured_sdk_logs():
        playout = await reactions.upstream_playout()
    # never reported, or the avatar gone: still speaking, the away timer never armed
    for case in ("silent", "left"):
        assert playout[case] == {
            "state": "speaking",
            "done": False,
            "away_timer": False,
            "watched": quick_fallback,
        }
    # an unconfirmed clear is ended by the sink's own fallback, never before it
    cut = playout["interrupt"]
    assert cut["clear_sent"] and cut["confirmed"] >= 0.01
    assert cut["unconfirmed"] >= quick_fallback
    # user_away_timeout starts at the avatar's report, not at the hand-off
    assert playout["away"] == {"before_report": False, "after_report": True, "timeout": 15.0}


def test_bad_arguments_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "latest.json"
    with pytest.raises(SystemExit) as e:
        main(["--only", "dispatch,latency", "--out", str(out)])
    assert e.value.code == 2
    assert "unknown section(s) ['latency']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--events", "0", "--out", str(out)])
    assert not out.exists()


def test_rows_refuse_figures_that_cannot_be_printed() -> None:
    with pytest.raises(ValueError, match="give a value or a text"):
        Row("dispatch", "nothing", None, "")
    with pytest.raises(ValueError, match="not finite"):
        Row("dispatch", "inf", math.inf, "x")
    upstream = Row("reactions", "livekit-agents", None, "", text="never restored")
    assert upstream.met is None
    table = render_markdown([upstream, Row("dispatch", "a", 3.0, "x", Target("<=", 2.0))])
    assert "never restored" in table and "**MISSED**" in table


@pytest.mark.parametrize(
    ("variant", "mode"), [("runtime", "time"), ("bare", "memory"), ("runtime", "tasks")]
)
def test_a_composed_job_run_checks_its_jobs_and_measures(variant: str, mode: str) -> None:
    # in a fresh interpreter, as `python -m benchmarks` runs it (each job checked live and
    # closed there): run inside a long pytest process, livekit's native library once died
    # with a segfault in one of its own threads, never seen in a fresh process
    out = jobs._spawn(variant, 2, mode)
    assert out["variant"] == variant and out["jobs"] == 2
    if mode == "time":
        assert out["start"]["seconds"] > 0 and out["close"]["seconds"] > 0
    elif mode == "memory":
        assert out["bytes"] > 0
    else:
        per_phase = out["tasks"]
        assert set(per_phase) == set(jobs.PHASES)
        assert all(len(counts) == 2 for counts in per_phase.values())
        # a session's start and its close each make tasks: a count of none is a blind counter
        assert min(per_phase["start"]) > 0 and min(per_phase["close"]) > 0
        # every task counted is named by its coroutine, in the phase it was made in
        for phase in jobs.PHASES:
            by_name = out["by_coroutine"][phase]
            assert sum(by_name.values()) == approx(sum(per_phase[phase]) / 2)
    if variant == "runtime":
        # the job AgentJob's defaults build: with an avatar, the playout machine runs in it,
        # from its first state to its last
        assert out["machines"]["live"]["playout"] == "idle"
        assert out["machines"]["closed"]["playout"] == "closed"
    else:
        assert out["machines"] == {"live": {}, "closed": {}}


def _children(monkeypatch: pytest.MonkeyPatch, *returncodes: int) -> list[list[str]]:
    """``subprocess.run`` answering with these exit codes in turn (a negative one: killed by
    that signal), the last with the figures a child prints."""
    calls: list[list[str]] = []

    def fake(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        rc = returncodes[len(calls)]
        calls.append(args)
        return subprocess.CompletedProcess(args, rc, '{"jobs": 2}\n', "panicked in a worker")

    monkeypatch.setattr(subprocess, "run", fake)
    return calls


def test_a_child_killed_by_a_signal_is_run_once_more_and_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _children(monkeypatch, -6, 0)
    assert jobs._spawn("runtime", 2, "time") == {"jobs": 2}
    assert len(calls) == 2
    assert "killed by signal 6; running it once more" in capsys.readouterr().err


@pytest.mark.parametrize("returncodes", [(1,), (-6, -6)], ids=["failed", "killed-twice"])
def test_a_child_that_fails_or_is_killed_twice_stops_the_benchmark(
    monkeypatch: pytest.MonkeyPatch, returncodes: tuple[int, ...]
) -> None:
    calls = _children(monkeypatch, *returncodes)
    with pytest.raises(RuntimeError, match=r"child \(runtime, 2, time\) failed"):
        jobs._spawn("runtime", 2, "time")
    assert len(calls) == len(returncodes)


async def test_the_task_counter_counts_every_task_the_loop_makes() -> None:
    async def work() -> None:
        await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    counter = jobs.TaskCounter()
    previous = loop.get_task_factory()
    loop.set_task_factory(counter)  # type: ignore[arg-type]
    try:
        counter.phase = "here"
        await loop.create_task(work())
        await asyncio.create_task(work(), context=contextvars.copy_context())
        await asyncio.ensure_future(work())
        await asyncio.gather(work(), work())
        await asyncio.wait_for(work(), timeout=5)
        made = counter.take()
        await work()  # awaited in place: no task
    finally:
        loop.set_task_factory(previous)
    # wait_for wraps its coroutine in a task up to Python 3.11, runs it in place from 3.12
    wait_for_tasks = 1 if sys.version_info < (3, 12) else 0
    assert made == 5 + wait_for_tasks
    assert counter.take() == 0
    name = work.__qualname__
    assert counter.by_coroutine == {("here", name): 5 + wait_for_tasks}


def test_a_runtime_job_without_its_playout_machine_is_not_the_benchmarked_job() -> None:
    jobs.REFERENCE_STATES["closed"] = {"job": "closed", "playout": "closed"}
    try:
        j = jobs.RuntimeJob(job=None, closed_states={"job": "closed"})
        with pytest.raises(RuntimeError, match="'playout': None"):
            jobs._check([j], "closed")
    finally:
        jobs.REFERENCE_STATES.clear()


def test_a_composed_job_that_misses_the_reference_states_stops_the_benchmark() -> None:
    jobs.REFERENCE_STATES["closed"] = {"job": "closed", "avatar": "nowhere"}
    try:
        j = jobs.RuntimeJob(job=None, closed_states={"job": "closed", "avatar": "closed"})
        with pytest.raises(RuntimeError, match="not closed: states"):
            jobs._check([j], "closed")
    finally:
        jobs.REFERENCE_STATES.clear()


def test_composed_job_rows_carry_the_ratios_and_targets() -> None:
    def timed(start: float, close: float) -> dict[str, object]:
        return {
            "start": {
                "seconds": start,
                "wall_seconds": start,
                "gc_seconds": 0.0,
                "gc_collections": [0, 0, 0],
            },
            "close": {
                "seconds": close,
                "wall_seconds": close,
                "gc_seconds": 0.0,
                "gc_collections": [0, 0, 0],
            },
            "rss_bytes": 1000,
        }

    def counted(start: list[int], close: list[int]) -> dict[str, object]:
        return {
            "tasks": {"start": start, "live": [0] * len(start), "close": close},
            "by_coroutine": {},
        }

    results = {
        "tasks": {
            "bare": counted([22, 22, 22], [11, 11, 11]),
            "runtime": counted([26, 25, 26], [13, 30, 12]),
        },
        "sizes": (10, 100),
        "time": {
            ("bare", 10): [timed(1.0, 0.5)],
            ("runtime", 10): [timed(1.05, 1.0)],
            ("bare", 100): [timed(10.0, 5.0)],
            ("runtime", 100): [timed(11.0, 10.0)],
        },
        "memory": {
            ("bare", 10): 1000,
            ("runtime", 10): 1050,
            ("bare", 100): 10_000,
            ("runtime", 100): 10_600,
        },
    }
    cases = {r.case: r for r in jobs.rows_from(results)}
    start = cases["10 jobs: runtime / bare, CPU to start"]
    assert start.value == approx(1.05) and start.target == Target("<=", 1.1) and start.met
    close = cases["10 jobs: runtime / bare, CPU to close"]
    assert close.value == approx(2.0) and close.met is False
    assert cases["10 jobs: runtime / bare, memory per live job"].value == approx(1.05)
    growth = cases["100 / 10 jobs, runtime: CPU to start"]
    assert growth.value == approx(11.0 / 1.05) and growth.target == Target("<=", 10.5)
    assert cases["100 / 10 jobs, bare: memory"].target is None  # the bare job is the reference
    # tasks: each job's whole life (its phases summed), the median over the jobs
    bare = cases["bare livekit-agents: asyncio tasks over a job's life"]
    assert bare.value == 33 and bare.samples == (33, 33, 33) and bare.target is None
    assert bare.figure == "33 tasks/job (start 22, live 0, close 11)"
    runtime = cases["runtime (AgentJob): asyncio tasks over a job's life"]
    assert runtime.value == 39 and runtime.samples == (39, 55, 38)
    extra = cases["runtime - bare: asyncio tasks over a job's life"]
    assert extra.value == 6 and extra.target == Target("<=", 4) and extra.met is False
    assert extra.figure == "+6 tasks/job (39 against 33)"
    assert "| <= 4 tasks/job | **MISSED** |" in render_markdown([extra])
