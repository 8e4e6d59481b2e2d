"""Replay of traces written by real actors (job, participant, session host) on a virtual
clock: an untouched trace agrees; an edited transition is reported at its line.

Effect handlers are stubs (no room, no session): the actors, the tracer and the JSONL sink
are the real ones, which is what a trace from production is written by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import Actor, Event, JsonlSink, Tracer
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.tools.cli import main
from agent_runtime.tools.replay import TraceError, load_trace, replay_file
from statemachines.machines import MACHINES


def _guards_from_data(machine: str) -> dict[str, Any]:
    # a guard holds when the event says so: the test chooses every decision explicitly
    return {g: (lambda ev, g=g: bool(ev.data.get(g))) for g in MACHINES[machine].guards}


async def record_trace(path: Path) -> None:
    """One job's worth of decisions: transitions (guarded, internal, timed out), ignores,
    rejects, effects that return events, an invoke task, across three machines."""
    clock = VirtualClock()
    sink = JsonlSink(path)
    tracer = Tracer(sink)
    job = Actor(
        MACHINES["job"],
        instance="job-1",
        effects={"run_close": lambda ev: Event("close_done"), "report_cut": lambda ev: None},
        guards=_guards_from_data("job"),
        settings={"session_end_timeout": 5.0},
        clock=clock,
        tracer=tracer,
    )
    user = Actor(
        MACHINES["participant"],
        instance="user-1",
        effects={
            "link": lambda ev: None,
            "relink": lambda ev: None,
            "close_session": lambda ev: Event("session_closed"),
            "report_close_timed_out": lambda ev: None,
        },
        guards=_guards_from_data("participant"),
        settings={"grace_period": 10.0},
        clock=clock,
        tracer=tracer,
    )
    host = Actor(
        MACHINES["session_host"],
        instance="host",
        effects={
            **{e.name: (lambda ev: None) for e in MACHINES["session_host"].effects},
            "drain": lambda ev: Event("drained"),  # closing's task: nothing in flight
        },
        guards=_guards_from_data("session_host"),
        clock=clock,
        tracer=tracer,
    )
    user.post(Event("participant_connected", {"eligible": False}))  # internal: not eligible
    user.post(Event("participant_connected", {"eligible": True}))
    host.post(Event("attach"))
    host.post(Event("request"))
    user.post(Event("participant_disconnected", {"is_linked": True, "grace_enabled": True}))
    await clock.advance(2.0)
    user.post(Event("participant_connected", {"same_identity": True}))  # relinks
    user.post(Event("participant_disconnected", {"is_linked": True, "closing_reason": True}))
    job.post(Event("finalize_answered"))  # ignored while serving
    job.post(Event("shutdown", {"hold_needed": True}))
    await clock.advance(1.0)
    host.post(Event("finalize"))
    await clock.advance(5.0)  # hold_timeout -> closing -> run_close -> close_done -> closed
    host.post(Event("close"))
    host.post(Event("attach"))  # rejected: closing
    await clock.advance(0)  # closing's drain reports
    for a in (job, user, host):
        await a.join()
    assert (job.state, user.state, host.state) == ("closed", "closed", "closed")
    for a in (job, user, host):
        await a.aclose()
    sink.close()


@pytest.fixture
async def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    await record_trace(path)
    return path


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _line_of(records: list[dict[str, Any]], **match: Any) -> int:
    for i, r in enumerate(records):
        if all(r.get(k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no record with {match}")


def test_an_untouched_trace_agrees(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = replay_file(trace)
    assert report.ok
    kinds = [r["kind"] for r in _lines(trace)]
    assert report.decisions == sum(k in ("transition", "ignore", "reject") for k in kinds)
    assert report.outcomes["reject"] == 1 and report.outcomes["ignore"] >= 1
    assert report.instances == {"participant": 1, "session_host": 1, "job": 1}
    assert main(["replay", str(trace)]) == 0
    out = capsys.readouterr().out
    assert f"{report.decisions} decisions replayed" in out
    assert "agrees with the machines" in out


async def test_an_edited_destination_is_reported_at_its_line(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = _lines(trace)
    i = _line_of(records, machine="job", kind="transition", event="hold_timeout")
    assert records[i]["dest"] == "closing"
    records[i]["dest"] = "closed"
    edited = tmp_path / "edited.jsonl"
    _write(edited, records)

    assert main(["replay", str(edited)]) == 1
    out = capsys.readouterr().out
    assert f"{edited}:{i + 1}: job[job-1] on event 'hold_timeout'" in out
    assert "expected (spec): transition awaiting_finalize -> closing" in out
    assert "recorded:        transition awaiting_finalize -> closed" in out

    assert main(["replay", str(edited), "--json"]) == 1
    d = json.loads(capsys.readouterr().out)["divergence"]
    assert (d["line"], d["machine"], d["instance"], d["event"]) == (
        i + 1,
        "job",
        "job-1",
        "hold_timeout",
    )
    assert d["expected"]["dest"] == "closing" and d["recorded"]["dest"] == "closed"


def test_a_flipped_guard_value_changes_the_decision(trace: Path, tmp_path: Path) -> None:
    records = _lines(trace)
    i = _line_of(records, machine="job", event="shutdown")
    assert records[i]["guards"] == {"hold_needed": True}
    records[i]["guards"] = {"hold_needed": False}
    _write(tmp_path / "t.jsonl", records)
    d = replay_file(tmp_path / "t.jsonl").divergence
    assert d is not None and d.line == i + 1
    assert (d.expected.dest, d.recorded.dest) == ("closing", "awaiting_finalize")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("source", "linked", "recorded source 'linked', replay is in 'grace'"),
        ("effects", [], "effects differ"),
        ("kind", "ignore", "outcome differs: transition replayed, ignore recorded"),
        ("guards", {}, "the spec consults guard 'same_identity', which the recording did not"),
    ],
)
def test_each_kind_of_edit_is_named(
    trace: Path, tmp_path: Path, field: str, value: Any, reason: str
) -> None:
    records = _lines(trace)
    i = _line_of(records, machine="participant", kind="transition", source="grace")
    records[i][field] = value
    _write(tmp_path / "t.jsonl", records)
    d = replay_file(tmp_path / "t.jsonl").divergence
    assert d is not None and (d.line, d.reason) == (i + 1, reason)


def test_a_dropped_record_shows_as_a_source_mismatch(trace: Path, tmp_path: Path) -> None:
    records = _lines(trace)
    i = _line_of(records, machine="participant", kind="transition", dest="grace")
    del records[i]
    _write(tmp_path / "t.jsonl", records)
    following = _line_of(records[i:], machine="participant", kind="transition") + i
    d = replay_file(tmp_path / "t.jsonl").divergence
    assert d is not None and d.line == following + 1  # the next participant decision
    assert d.machine == "participant" and "replay is in 'linked'" in d.reason


def test_a_reused_instance_name_starts_from_the_initial_state(trace: Path, tmp_path: Path) -> None:
    records = _lines(trace)
    # a second participant of the same name, later in the same job (its clock goes on)
    end = records[-1]["t"]
    again = [{**r, "t": end + r["t"]} for r in records if r["machine"] == "participant"]
    _write(tmp_path / "t.jsonl", records + again)
    report = replay_file(tmp_path / "t.jsonl")
    assert report.ok and report.instances["participant"] == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", ":2: not JSON"),
        ("[1, 2]", ":2: a record is a JSON object, not list"),
        ('{"t": 0, "kind": "transition"}', ":2: field 'machine': Field required"),
        ('{"t": 0, "kind": "transition", "machine": "job", "instance": "j", "bogus": 1}', ":2:"),
        ('{"t": 0, "kind": "leap", "machine": "job", "instance": "j"}', ":2: field 'kind': Input"),
        (
            '{"t": 0, "kind": "ignore", "machine": "job", "instance": "j", "event": "x"}',
            "needs a non-empty 'source'",
        ),
        (
            '{"t": 0, "kind": "transition", "machine": "job", "instance": "j", "event": '
            '"shutdown", "source": "serving", "dest": "closing", "guards": {"g": "yes"}}',
            ":2: field 'guards.g': Input should be a valid boolean",
        ),
        (
            '{"t": 0, "kind": "transition", "machine": "robot", "instance": "r", "event": '
            '"go", "source": "a", "dest": "b"}',
            ":2: unknown machine 'robot'; machines: avatar, job, session_host, participant, "
            "room_deletion, finalize",
        ),
    ],
)
def test_a_trace_that_cannot_be_replayed_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    first = {
        "t": 0,
        "kind": "transition",
        "machine": "job",
        "instance": "j",
        "event": "shutdown",
        "source": "serving",
        "dest": "closing",
        "guards": {"hold_needed": False},
    }
    path.write_text(json.dumps(first) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message.replace("[", r"\[")):
        replay_file(path)
    assert main(["replay", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert main(["replay", str(path), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_a_missing_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read the trace" in capsys.readouterr().err


def test_an_event_the_spec_no_longer_declares_is_a_divergence(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rec = {
        "t": 0,
        "kind": "ignore",
        "machine": "job",
        "instance": "j",
        "event": "teleport",
        "source": "serving",
        "dest": "serving",
    }
    path.write_text(json.dumps(rec) + "\n")
    d = replay_file(path).divergence
    assert d is not None and d.line == 1 and "declares no event 'teleport'" in d.reason


def test_blank_lines_keep_line_numbers(trace: Path, tmp_path: Path) -> None:
    text = trace.read_text().replace("\n", "\n\n")
    (tmp_path / "t.jsonl").write_text(text)
    numbered = load_trace(tmp_path / "t.jsonl")
    assert [n for n, _ in numbered][:3] == [1, 3, 5]
    assert replay_file(tmp_path / "t.jsonl").ok
