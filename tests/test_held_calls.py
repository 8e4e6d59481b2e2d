"""Scenario files hold the world's outside work (``config.hold``) and end it with
``held.end`` steps: a deletion that fails, a callback or a session's close that hangs, a
verdict that comes late, an avatar provider that fails after its route or returns with
none. The stand-in is the testing kit's ``Gate``, the one the explorer's harness holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.testing import runner
from agent_runtime.testing.scenario import ScenarioError, parse_scenario
from agent_runtime.tools.cli import main as cli


def _run(config: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    scenario = parse_scenario({"name": "held", "config": config, "steps": steps})
    return asyncio.run(runner.run_scenario(scenario))


def _end(at: float, call: str, result: str) -> dict[str, Any]:
    return {"at": at, "event": "held.end", "call": call, "result": result}


START = {"at": 0, "event": "session.start"}


def test_a_held_deletion_fails_and_a_second_end_is_refused() -> None:
    steps = [START, {"at": 1, "event": "job.shutdown"}, _end(2, "room_deletion", "error"),
             _end(3, "room_deletion", "ok"), {"at": 30, "event": "end"}]  # fmt: skip
    r = _run({"delete_room_on_close": True, "hold": ["room_deletion"]}, steps)
    assert r["final_states"]["room_deletion"] == "failed"
    assert r["facts"]["room_deleted_at"] is None and r["facts"]["job_closed_at"] == 2.0
    assert r["facts"]["step_errors"] == [
        "t=3 held.end: RuntimeError: no room_deletion call waits to be ended"
    ]


def test_ending_a_held_close_of_a_session_that_has_none_names_the_one_that_waits() -> None:
    # it said "no session_close call waits to be ended" while session a's close waited
    steps = [START, {"at": 1, "event": "session.close"},
             {**_end(2, "session_close", "ok"), "session": "nope"}]  # fmt: skip
    r = _run({"hold": ["session_close"]}, steps)
    assert r["facts"]["step_errors"] == [
        "t=2 held.end: RuntimeError: no session_close call of session 'nope' waits to be "
        "ended (one of 'a' does)"
    ]
    assert r["facts"]["session_closed_at"] is None  # still held


def test_a_held_deletion_returns_when_its_step_says() -> None:
    steps = [START, {"at": 1, "event": "job.shutdown"}, _end(4, "room_deletion", "ok"),
             {"at": 30, "event": "end"}]  # fmt: skip
    r = _run({"delete_room_on_close": True, "hold": ["room_deletion"]}, steps)
    assert r["final_states"]["room_deletion"] == "deleted"
    assert r["facts"]["room_deleted_at"] == 4.0


def test_a_hung_shutdown_callback_is_cut_off_by_close_timeout() -> None:
    steps = [START, {"at": 1, "event": "job.shutdown"}, _end(2, "session_close", "ok"),
             _end(3, "shutdown_callback", "hang"), {"at": 60, "event": "end"}]  # fmt: skip
    r = _run({"hold": ["shutdown_callback", "session_close"]}, steps)
    assert r["facts"]["session_closed_at"] == 2.0  # the close waited for its step
    assert r["facts"]["job_closed_at"] == 11.0  # close_timeout (10 s) after the shutdown


def test_a_late_verdict_answers_when_on_simulation_end_returns() -> None:
    sim = {"at": 0, "event": "participant_connected", "identity": "sim",
           "attributes": {"lk.simulator": "1"}}  # fmt: skip
    ask = {"at": 1, "event": "session_request", "caller": "sim",
           "request": "finalize_simulation", "payload": {"provisional_success": True}}  # fmt: skip
    config = {"simulation": True, "hold": ["simulation_end"],
              "agent_verdict": {"success": False, "reason": "no"}}  # fmt: skip
    r = _run(config, [START, sim, ask, _end(5, "simulation_end", "ok"), {"at": 6, "event": "end"}])
    replies = [(e["t"], e["verdict"]) for e in r["facts"]["session_replies"]]
    assert replies == [(5.0, {"success": False, "reason": "no"})]


@pytest.mark.parametrize(
    ("ends", "error"),
    [
        ([("routed", 2), ("error", 3)], None),  # fails after its route
        ([("no_route", 2)], None),  # returns with no route
        ([("ok", 2)], "the avatar's start, held before its route, ends with routed, "
                      "no_route, error or hang, not 'ok'"),
        ([("routed", 2), ("routed", 3)], "the avatar's start, held after its route, ends "
                                         "with ok, error or hang, not 'routed'"),
    ],
)  # fmt: skip
def test_a_held_avatar_start_ends_as_its_steps_say(
    ends: list[tuple[str, float]], error: str | None
) -> None:
    held = [_end(at, "avatar_start", word) for word, at in ends]
    steps = [START, {"at": 1, "event": "avatar.start"}, *held, {"at": 60, "event": "end"}]
    r = _run({"avatar_identity": "avatar", "hold": ["avatar_start"]}, steps)
    errors = r["facts"]["step_errors"]
    if error is None:
        assert r["final_states"]["avatar"] == "restored" and errors == []
        assert r["facts"]["audio_output"] == "room"
    else:
        assert len(errors) == 1 and error in errors[0]


def test_a_held_avatar_start_a_shutdown_ended_is_refused_as_any_held_call() -> None:
    """It said "the avatar's start does not wait: 'routed' is not one of nothing"."""
    steps = [START, {"at": 1, "event": "avatar.start"}, {"at": 2, "event": "job.shutdown"},
             _end(3, "avatar_start", "routed"), {"at": 30, "event": "end"}]  # fmt: skip
    r = _run({"avatar_identity": "avatar", "hold": ["avatar_start"]}, steps)
    assert r["facts"]["step_errors"] == [
        "t=3 held.end: RuntimeError: no avatar_start call waits to be ended"
    ]


@pytest.mark.parametrize(
    ("config", "step", "message"),
    [
        ({"hold": ["room"]}, None, "config.hold.0: Input should be 'session_close',"),
        ({"hold": ["room_deletion", "room_deletion"]}, None, "room_deletion is held twice"),
        ({}, _end(0, "session_close", "routed"),
         "field result: session_close ends with ok, error, hang"),
        ({}, _end(0, "deletion", "ok"), "field call: Input should be 'session_close',"),
        ({}, {**_end(0, "room_deletion", "ok"), "session": "B"},
         "field session: only a session_close names a session"),
        ({}, {"at": 0, "event": "held.end", "call": "room_deletion"},
         "field result: Field required"),
        ({"hold": ["session_close"]}, _end(0, "room_deletion", "ok"),
         "step 1 (held.end): room_deletion is not held (list it in config.hold)"),
    ],
)  # fmt: skip
def test_bad_hold_keys_are_one_clear_line(
    config: dict[str, Any], step: dict[str, Any] | None, message: str
) -> None:
    steps = [*([step] if step else []), {"at": 0, "event": "end"}]
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"name": "x", "config": config, "steps": steps}, source="f.yaml")
    assert str(e.value).startswith("f.yaml: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_the_guides_held_deletion_example_fails_the_deletion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # run as a user runs it, copied into a file (it lacked the name a file needs)
    text = (Path(__file__).parents[1] / "docs/guide/scenarios.md").read_text()
    block = text.split("<!-- scenario: a held deletion that fails -->\n```yaml\n")[1]
    copied = tmp_path / "held.yaml"
    copied.write_text(block.split("```")[0], encoding="utf-8")
    assert cli(["simulate", str(copied), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["final_states"]["room_deletion"] == "failed"
