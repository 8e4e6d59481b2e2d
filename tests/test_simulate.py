"""``agent-runtime simulate``: the bundled scenarios through the real runtime, the JSON
contract, exit codes, traces that replay, and bad input inside a scenario."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_runtime.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "scenarios"


def simulate_json(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(["simulate", str(path), "--json", *extra])
    out = capsys.readouterr().out
    result: dict[str, Any] = json.loads(out)
    result["_code"] = code
    return result


def write(tmp_path: Path, doc: dict[str, Any], name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


# Every bundled scenario holding is checked by the kit's pytest plugin: each file of
# examples/scenarios is a test item of this suite (agent_runtime_scenarios in pyproject.toml).


def test_with_no_file_the_bundled_directory_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_runtime.tools.commands import simulate

    assert str(simulate.DEFAULT_DIR) == "examples/scenarios"
    (tmp_path / "one.yaml").write_text((SCENARIOS / "user_leaves.yaml").read_text())
    monkeypatch.setattr(simulate, "DEFAULT_DIR", tmp_path)
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert "[one.yaml]  ok" in out
    assert "1 scenario(s) run, 1 with expectations: all held" in out


def installed_as(
    monkeypatch: pytest.MonkeyPatch, root: Path, *, clone: bool, scenario: bool
) -> None:
    """The simulate command as if its package were under ``root`` (a site-packages, or a
    clone with its pyproject.toml), run from an empty directory elsewhere."""
    from agent_runtime.tools.commands import simulate

    if clone:
        (root / "pyproject.toml").parent.mkdir(parents=True, exist_ok=True)
        (root / "pyproject.toml").write_text("[project]\n")
    if scenario:
        (root / "examples" / "scenarios").mkdir(parents=True)
        (root / "examples" / "scenarios" / "one.yaml").write_text(
            (SCENARIOS / "user_leaves.yaml").read_text()
        )
    module = root / "agent_runtime" / "tools" / "commands" / "simulate.py"
    monkeypatch.setattr(simulate, "__file__", str(module))
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("stray", [False, True], ids=["nothing-there", "another-projects"])
def test_with_no_file_and_no_scenarios_directory_it_says_so(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    as_json: bool,
    stray: bool,
) -> None:
    """Installed (no clone) and run outside a clone, it said "invalid scenario:
    .../site-packages/examples/scenarios: cannot read: No such file or directory"; an
    examples/scenarios/ some other package left in site-packages is not run either."""
    installed_as(monkeypatch, tmp_path / "site-packages", clone=False, scenario=stray)
    assert main(["simulate", *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    line = (
        "no scenario given, and no examples/scenarios/ directory here to run by default: "
        "name a scenario file, or a directory of them"
    )
    assert captured.err == f"agent-runtime simulate: {line}\n"
    if as_json:
        assert json.loads(captured.out) == {"ok": False, "file": None, "error": line}
    else:
        assert captured.out == ""


def test_with_no_file_the_clone_the_package_runs_from_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    installed_as(monkeypatch, tmp_path / "clone", clone=True, scenario=True)
    assert main(["simulate"]) == 0
    assert "[one.yaml]  ok" in capsys.readouterr().out


SAMPLE = re.compile(r"<!-- sample: agent-runtime simulate -->\n```\n(.*?)```\n", re.S)


@pytest.mark.parametrize("page", ["README.md", "docs/guide/cli.md"])
def test_the_sample_output_in_the_docs_is_what_simulate_prints(
    capsys: pytest.CaptureFixture[str], page: str
) -> None:
    """The sample listed three or four machines under `final:` where a run lists every
    machine of the job: it is what simulate prints for the scenarios it names."""
    (sample,) = SAMPLE.findall((ROOT / page).read_text(encoding="utf-8"))
    files = re.findall(r"  \[(\w+\.yaml)\]  ", sample)
    assert len(files) >= 2
    assert main(["simulate", *(str(SCENARIOS / f) for f in files)]) == 0
    assert capsys.readouterr().out == sample


def test_json_follows_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    r = simulate_json(SCENARIOS / "sim_hangup_then_finalize.yaml", capsys)
    assert r["_code"] == 0
    assert r["final_states"] == {
        "job": "closed",
        "session_host": "closed",
        "participant": "closed",
        "finalize": "closed",
        "room_deletion": "deleted",
        "session": "closed",
        "agent_job": "closed",
    }
    facts = r["facts"]
    for key in (
        "audio_output",
        "rpcs_sent",
        "finalize_answered",
        "verdict",
        "room_deleted_at",
        "job_closed_at",
        "session_closed_at",
    ):
        assert key in facts
    assert facts["verdict"] == {"success": False, "reason": "the agent vetoes this run"}
    # the room is deleted only once the verdict is out, never during the hold
    assert facts["room_deleted_at"] == facts["job_closed_at"] == 14.0
    hold = [t for t in r["transitions"] if t["machine"] == "job"]
    assert [(t["source"], t["dest"], t["t"]) for t in hold] == [
        ("serving", "awaiting_finalize", 10.0),
        ("awaiting_finalize", "closing", 14.0),
        ("closing", "closed", 14.0),
    ]
    assert all({"t", "machine", "effect", "outcome"} <= set(e) for e in r["effects"])


def test_the_same_scenario_gives_the_same_result(capsys: pytest.CaptureFixture[str]) -> None:
    path = SCENARIOS / "avatar_joins_then_drops.yaml"
    first = simulate_json(path, capsys)
    second = simulate_json(path, capsys)
    assert first == second
    assert first["final_states"]["avatar"] == "restored"
    assert first["facts"]["audio_output"] == "room"


def test_a_failed_expectation_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((SCENARIOS / "user_leaves.yaml").read_text())
    doc["expect"] = {"final_states": {"job": "serving"}, "facts": {"session_closed_at": 11}}
    path = write(tmp_path, doc)
    assert main(["simulate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "expect failed: final state of job: expected 'serving', got 'closed'" in out
    assert "expect failed: fact session_closed_at: expected 11, got 10.0" in out


def test_times_are_plain_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary wrote times as %g and JSON do: session_closed_at=1e-07, t=1e-07,
    t=600000 (a time cut to 6 digits)."""
    nothing_waits = {"event": "held.end", "call": "room_deletion", "result": "ok"}
    steps = [
        {"at": 0, "event": "session.start"},
        {"at": 0.0000001, **nothing_waits},
        {"at": 0.0000002, "event": "session.close"},
        {"at": 600000.25, **nothing_waits},
        {"at": 600001, "event": "end"},
    ]
    doc = {"name": "t", "config": {"hold": ["room_deletion"]}, "steps": steps}
    assert main(["simulate", str(write(tmp_path, doc))]) == 0
    out = capsys.readouterr().out
    assert "session_closed_at=0.0000002, " in out and "job_closed_at=0.0000002\n" in out
    assert "  step refused: t=0.0000001 held.end: RuntimeError: " in out
    assert "  step refused: t=600000.25 held.end: RuntimeError: " in out
    assert "e-0" not in out and "e+0" not in out


def test_with_no_expect_block_nothing_is_said_to_have_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no expect block anywhere the summary said "0 with expectations: all held"."""
    doc = yaml.safe_load((SCENARIOS / "user_leaves.yaml").read_text())
    del doc["expect"]
    assert main(["simulate", str(write(tmp_path, doc))]) == 0
    out = capsys.readouterr().out
    assert "[s.yaml]  ran (no expect block)" in out
    assert out.endswith("\n\n1 scenario(s) run, no expectations to check\n")


def test_an_invalid_file_exits_2_naming_file_and_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        {
            "name": "x",
            "steps": [{"at": 0, "event": "session.start"}, {"at": 1, "event": "avatar.dance"}],
        },
    )
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: step 2 (avatar.dance): unknown event 'avatar.dance'" in err


def test_trace_replays_and_an_edited_transition_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "run.jsonl"
    simulate_json(SCENARIOS / "user_drops_no_rejoin.yaml", capsys, "--trace", str(trace))
    assert main(["replay", str(trace)]) == 0
    assert "Every decision agrees" in capsys.readouterr().out
    lines = trace.read_text().splitlines()
    n = next(
        i for i, line in enumerate(lines) if '"grace_timeout"' in line and '"transition"' in line
    )
    rec = json.loads(lines[n])
    rec["dest"] = "linked"
    lines[n] = json.dumps(rec)
    trace.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(trace)]) == 1
    out = capsys.readouterr().out
    assert f"run.jsonl:{n + 1}: participant[" in out and "grace_timeout" in out


def test_bad_input_inside_a_scenario_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "name": "strangers and garbage",
        "config": {"avatar_identity": "avatar-1"},
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "participant_disconnected", "identity": "ghost"},
            {"at": 2, "event": "track_published", "identity": "ghost", "kind": "video"},
            {"at": 3, "event": "track_muted", "identity": "ghost"},
            {
                "at": 4,
                "event": "rpc",
                "method": "lk.playback_finished",
                "caller": "user",
                "payload": {"playback_position": 1.0, "interrupted": False},
            },
            {
                "at": 5,
                "event": "rpc",
                "method": "lk.playback_finished",
                "caller": "avatar-1",
                "payload": "not json",
            },
            {"at": 6, "event": "session_request", "caller": "user", "request": "no_such_kind"},
            {"at": 7, "event": "participant_connected", "identity": "user"},
            {"at": 8, "event": "end"},
        ],
    }
    r = simulate_json(write(tmp_path, doc), capsys)
    assert r["_code"] == 0
    assert r["final_states"]["participant"] == "linked"
    assert r["final_states"]["job"] == "serving"
    assert r["final_states"]["avatar"] == "idle"
    replies = r["facts"]["rpc_replies"]
    assert len(replies) == 2 and all("error" in x for x in replies)
    assert r["facts"]["session_replies"][0]["request"] == "no_such_kind"
    assert "error" in r["facts"]["session_replies"][0]
    # a participant who is already in the room joining again is refused, not applied
    assert r["facts"]["step_errors"] == [
        "t=7 participant_connected: ValueError: participant 'user' is already in the room"
    ]
    # the summary says so too: a refused step is never silent
    assert main(["simulate", str(write(tmp_path, doc))]) == 0
    out = capsys.readouterr().out
    assert (
        "  step refused: t=7 participant_connected: ValueError: participant 'user' is already "
        "in the room" in out
    )


def test_json_and_trace_take_exactly_one_file(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in sorted(SCENARIOS.glob("*.yaml"))[:2]]
    assert main(["simulate", *files, "--json"]) == 2
    assert "exactly one FILE" in capsys.readouterr().err


# -- issue 13: the command line never answers with a traceback or a hang -----------------


def test_a_directory_runs_its_yaml_files_in_name_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 11: ``simulate DIR`` said "Is a directory"; it runs the DIR's *.yaml, sorted."""
    for name in ("b.yaml", "a.yaml"):
        (tmp_path / name).write_text((SCENARIOS / "user_leaves.yaml").read_text())
    (tmp_path / "notes.txt").write_text("not a scenario")
    assert main(["simulate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert [line.split("[")[1].split("]")[0] for line in out.splitlines() if "  [" in line] == [
        "a.yaml",
        "b.yaml",
    ]
    assert "2 scenario(s) run, 2 with expectations: all held" in out


FULL_DISK = Path("/dev/full")


@pytest.mark.skipif(not FULL_DISK.exists(), reason="no /dev/full here")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_trace_on_a_full_disk_runs_and_says_the_trace_is_incomplete(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Item 1: ``--trace /dev/full`` ended in an OSError traceback. The scenario runs as it
    would without a trace (tracing is observation), its result is printed, and one line
    says the trace could not be written: exit 2."""
    path = SCENARIOS / "sim_hangup_then_finalize.yaml"
    assert main(["simulate", str(path), "--json"]) == 0
    untraced = json.loads(capsys.readouterr().out)
    code = main(
        ["simulate", str(path), "--trace", str(FULL_DISK), *(["--json"] if as_json else [])]
    )
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == (
        f"agent-runtime simulate: {FULL_DISK}: the trace could not be written "
        "(OSError: [Errno 28] No space left on device); it stops before the failed record\n"
    )
    if as_json:
        traced = json.loads(captured.out)
        assert traced.pop("trace_error") == "OSError: [Errno 28] No space left on device"
        assert traced == untraced
    else:
        assert "ok" in captured.out.splitlines()[0]  # the expectations held all the same


@pytest.mark.skipif(not FULL_DISK.exists(), reason="no /dev/full here")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_page_on_a_full_disk_is_one_line_and_the_json_says_so(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """``--json --html /dev/full`` exited 2 with the plain success object on stdout: the
    page's failure is in the result, as a trace's is."""
    path = SCENARIOS / "sim_hangup_then_finalize.yaml"
    assert main(["simulate", str(path), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    code = main(["simulate", str(path), "--html", str(FULL_DISK), *(["--json"] if as_json else [])])
    captured = capsys.readouterr()
    line = f"{FULL_DISK}: cannot write the page (No space left on device)"
    assert (code, captured.err) == (2, f"agent-runtime simulate: {line}\n")
    if as_json:
        drawn = json.loads(captured.out)
        assert drawn.pop("html_error") == line
        assert drawn == plain
    else:
        assert "ok" in captured.out.splitlines()[0]  # the run is reported all the same


def test_a_trace_into_missing_directories_makes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--trace nodir/x.jsonl`` was refused (no such directory) while
    ``AgentJob(trace_path=...)`` makes a trace's missing directories: the CLI makes them too."""
    trace = tmp_path / "traces" / "today" / "run.jsonl"
    result = simulate_json(SCENARIOS / "user_leaves.yaml", capsys, "--trace", str(trace))
    assert result["_code"] == 0
    assert main(["replay", str(trace)]) == 0
    assert "Every decision agrees" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["under-a-file", "fifo-without-reader", "a-directory"])
def test_a_trace_that_cannot_be_opened_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    import os

    if kind == "under-a-file":  # no directory can be made there: nothing is made, nothing runs
        (tmp_path / "f").write_text("mine")
        out, why = tmp_path / "f" / "sub" / "t.jsonl", "Not a directory"
    elif kind == "fifo-without-reader":  # opening it for writing would wait for a reader
        out, why = tmp_path / "t.fifo", "No such device or address"
        os.mkfifo(out)
    else:
        out, why = tmp_path, "Is a directory"
    code = main(["simulate", str(SCENARIOS / "user_leaves.yaml"), "--trace", str(out), "--json"])
    captured = capsys.readouterr()
    line = f"{out}: cannot write the trace: {why}"
    assert (code, captured.err) == (2, f"agent-runtime simulate: {line}\n")
    assert json.loads(captured.out) == {"ok": False, "file": str(out), "error": line}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("kind", ["a-directory", "under-a-file"])
def test_a_page_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, as_json: bool
) -> None:
    """``--html`` where no page can be written ran the scenario, printed its summary and
    only then failed; it is refused before anything runs, as ``--trace`` is."""
    if kind == "a-directory":
        page, why = tmp_path, "Is a directory"
    else:
        (tmp_path / "f").write_text("mine")
        page, why = tmp_path / "f" / "p.html", "Not a directory"
    args = ["simulate", str(SCENARIOS / "user_leaves.yaml"), "--html", str(page)]
    code = main([*args, *(["--json"] if as_json else [])])
    captured = capsys.readouterr()
    line = f"{page}: cannot write the page ({why})"
    assert (code, captured.err) == (2, f"agent-runtime simulate: {line}\n")
    if as_json:
        assert json.loads(captured.out) == {"ok": False, "file": str(page), "error": line}
    else:
        assert captured.out == ""  # no run summary: nothing ran


def test_json_is_strict_json_even_for_a_non_finite_number() -> None:
    """Item 7: ``at: .inf`` printed ``Infinity`` (not JSON); the scenario model refuses it
    now (see the bad-input table), and the printer never writes a non-finite number."""
    import math

    from agent_runtime.tools.commands.simulate import _json

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    text = _json({"t": math.inf, "xs": [math.nan, 1.5]})
    assert json.loads(text, parse_constant=refuse) == {"t": "inf", "xs": ["nan", 1.5]}


def test_usage_errors_answer_in_json_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in sorted(SCENARIOS.glob("*.yaml"))[:2]]
    assert main(["simulate", *files, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "ok": False,
        "file": None,
        "error": "--json prints the result object of exactly one FILE",
    }


@pytest.mark.parametrize("times", [None, 1])
def test_a_start_error_on_the_first_starts_lets_a_retry_join(
    times: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``avatar.start_error {times}``: the plugin's start raises that many times, and the
    retry policy's next attempt joins; without ``times`` every attempt raises."""
    fails: dict[str, Any] = {"at": 0.5, "event": "avatar.start_error"}
    if times is not None:
        fails["times"] = times
    doc = {
        "name": "the first start fails",
        "config": {
            "avatar_identity": "avatar-1",
            "retry_avatar": {"attempts": 1, "backoff": {"initial": 2}},
        },
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            fails,
            {"at": 3, "event": "participant_connected", "identity": "avatar-1", "kind": "agent"},
            {"at": 3.5, "event": "track_published", "identity": "avatar-1", "kind": "video"},
            {"at": 6, "event": "end"},
        ],
    }
    r = simulate_json(write(tmp_path, doc), capsys)
    assert r["_code"] == 0
    avatar = [(t["source"], t["dest"]) for t in r["transitions"] if t["machine"] == "avatar"]
    assert avatar[:3] == [("idle", "starting"), ("starting", "failed"), ("failed", "backoff")]
    if times is None:
        assert (r["final_states"]["avatar"], r["facts"]["audio_output"]) == ("restored", "room")
    else:
        assert (r["final_states"]["avatar"], r["facts"]["audio_output"]) == ("joined", "avatar")


@pytest.mark.parametrize("start", ["avatar.start", "avatar.start_error"])
def test_rejoin_routes_a_late_avatar_only_when_a_start_installed_a_route(
    start: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What embedding.md says of ``rejoin=True``: the avatar that joins after the job gave
    up (``restored``) gets the audio when its start had installed a route (it never joined
    in time); after a start that raised there is no route to put back: room audio."""
    doc = {
        "name": "a late avatar",
        "config": {"avatar_identity": "av", "retry_avatar": True, "join_timeout": 3},
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 0.1, "event": start},
            {"at": 5, "event": "participant_connected", "identity": "av", "kind": "agent"},
            {"at": 5.1, "event": "track_published", "identity": "av", "kind": "video"},
            {"at": 8, "event": "end"},
        ],
    }
    r = simulate_json(write(tmp_path, doc), capsys)
    gave_up = [
        t["t"] for t in r["transitions"] if t["machine"] == "avatar" and t["dest"] == "restored"
    ]
    assert gave_up and gave_up[0] < 5
    routed = (r["final_states"]["avatar"], r["facts"]["audio_output"])
    assert routed == (("joined", "avatar") if start == "avatar.start" else ("restored", "room"))
    page = " ".join((ROOT / "docs/guide/embedding.md").read_text().split())
    assert "when the last start installed none" in page
    assert "an avatar that joins after that is removed" in page


def test_a_start_error_on_no_start_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {
        "name": "x",
        "config": {"avatar_identity": "avatar-1"},
        "steps": [{"at": 0, "event": "avatar.start_error", "times": 0}],
    }
    assert main(["simulate", str(write(tmp_path, doc))]) == 2
    assert (
        "step 1 (avatar.start_error): field times: Input should be greater than or equal to 1"
        in (capsys.readouterr().err)
    )


def test_a_refused_start_error_leaves_the_plugin_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``avatar.start_error`` after the avatar started is refused, and changes nothing: the
    avatar's retry after it left starts as the plugin would have (it raised the scripted
    error: the refused step had armed the plugin anyway)."""
    doc = yaml.safe_load(REFUSED_START_ERROR)
    r = simulate_json(write(tmp_path, doc), capsys)
    assert r["facts"]["step_errors"] == [
        "t=1 avatar.start_error: AlreadyStarted: this AvatarLifecycle is already started "
        "(state 'routing')"
    ]
    assert (r["final_states"]["avatar"], r["facts"]["audio_output"]) == ("joined", "avatar")


REFUSED_START_ERROR = """
name: a refused start_error
config: {avatar_identity: avatar-1, retry_avatar: {attempts: 1, backoff: {initial: 1}}}
participants: [{identity: user}]
steps:
  - {at: 0, event: session.start}
  - {at: 0.5, event: avatar.start}
  - {at: 1, event: avatar.start_error}
  - {at: 2, event: participant_connected, identity: avatar-1, kind: agent}
  - {at: 2.5, event: track_published, identity: avatar-1, kind: video}
  - {at: 3, event: participant_disconnected, identity: avatar-1}
  - {at: 5, event: participant_connected, identity: avatar-1, kind: agent}
  - {at: 5.5, event: track_published, identity: avatar-1, kind: video}
  - {at: 8, event: end}
"""
