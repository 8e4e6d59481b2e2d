"""Traces as they are found after an incident, read by ``replay``, ``record``, ``timeline``
and ``watch --once``: a last line cut while the job wrote it is left out with one warning
(the records before it are used), a bad line in the middle is still an error naming where
in the line, and a time no float can hold is a field error, never a traceback. A time that
goes back (two traces joined, an edited one) and a machine the runtime does not have are
the same one-line error in every reader."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from agent_runtime import read_trace
from agent_runtime.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"

CUT = '{"t": 99, "machine": "job", "ins'


@pytest.fixture(scope="module")
def run_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("run") / "run.jsonl"
    assert main(["simulate", str(SCENARIO), "--trace", str(trace)]) == 0
    return trace


def _lines(trace: Path) -> list[str]:
    return trace.read_text(encoding="utf-8").splitlines(keepends=True)


def _commands(trace: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "replay": ["replay", str(trace)],
        "record": ["record", str(trace), "-o", str(tmp_path / "incident.yaml")],
        "timeline": ["timeline", str(trace), "-o", str(tmp_path / "page.html")],
    }


@pytest.mark.parametrize("command", ["replay", "record", "timeline"])
def test_a_cut_last_line_is_a_warning_and_the_records_before_it_are_used(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    lines = _lines(run_jsonl)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines) + CUT, encoding="utf-8")
    capsys.readouterr()
    assert main(_commands(cut, tmp_path)[command]) == 0
    err = capsys.readouterr().err.splitlines()
    n = len(lines) + 1
    assert err[0] == (
        f"agent-runtime {command}: {cut}:{n}: the last line is incomplete (a trace still "
        f"being written, or cut); read up to line {n - 1}"
    )
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("command", ["replay", "record", "timeline"])
def test_a_trace_whose_only_line_is_cut_is_one_error_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # not a warning and then "the trace is empty": it holds a record not yet whole
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n" + CUT, encoding="utf-8")
    assert main(_commands(cut, tmp_path)[command]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"agent-runtime {command}: {cut}:2: the last line is incomplete (a trace still "
        "being written, or cut); no whole record before it"
    ]
    with pytest.raises(ValueError, match="no whole record before it"):
        read_trace(cut)


def test_replay_of_a_cut_trace_replays_every_whole_record(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(_lines(run_jsonl)) + CUT, encoding="utf-8")
    assert main(["replay", str(run_jsonl), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main(["replay", str(cut), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["warnings"] and not whole["warnings"]  # the cut is said (below)
    assert {**got, "path": whole["path"], "warnings": []} == whole


def test_a_character_cut_in_two_is_a_cut_line_too(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(run_jsonl.read_bytes() + '{"t": 1, "detail": "caf\u00e9'.encode()[:-1])
    assert main(["replay", str(cut)]) == 0
    assert "the last line is incomplete" in capsys.readouterr().err


def test_the_library_reader_leaves_a_cut_line_out_with_a_logged_warning(
    run_jsonl: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(_lines(run_jsonl)) + CUT, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        assert read_trace(cut) == read_trace(run_jsonl)
    assert [r.getMessage() for r in caplog.records] == [
        f"{cut}:{len(_lines(run_jsonl)) + 1}: the last line is incomplete (a trace still "
        f"being written, or cut); read up to line {len(_lines(run_jsonl))}"
    ]


# a bad line in the middle: its line named (and its column, for JSON), nothing written
BAD_LINES = {
    "not-json": (
        b'{"t": 1,, "kind": "input"}\n',
        "not JSON (Expecting property name enclosed in double quotes at column 9)",
    ),
    # as ``watch`` names it: a reader of a long trace is sent to the line, not the file
    "not-text": (b"\xff\xfe\n", "not a UTF-8 text file (invalid start byte)"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
@pytest.mark.parametrize("command", ["replay", "record", "timeline"])
def test_a_bad_line_in_the_middle_is_an_error_naming_the_line(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
) -> None:
    broken, error = BAD_LINES[kind]
    lines = [line.encode() for line in _lines(run_jsonl)]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join([*lines[:5], broken, *lines[5:]]))
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == f"agent-runtime {command}: {bad}:6: {error}\n"
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()


def test_a_cut_last_line_that_is_not_text_stays_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe")  # not a character cut in two: bytes that are no text
    assert main(["replay", str(bad)]) == 2
    assert "not a UTF-8 text file (invalid start byte)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "t", ["1" + "0" * 400, "-1" + "0" * 400], ids=["401-digit-integer", "negative-401-digits"]
)
@pytest.mark.parametrize("command", ["replay", "record", "timeline", "watch"])
def test_a_time_no_float_holds_is_a_field_error(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, t: str
) -> None:
    lines = _lines(run_jsonl)
    record = json.loads(lines[10])
    record["t"] = 0
    bad = tmp_path / "big.jsonl"
    text = json.dumps(record).replace('"t": 0', f'"t": {t}')
    bad.write_text("".join([*lines[:10], text + "\n", *lines[11:]]), encoding="utf-8")
    args = {**_commands(bad, tmp_path), "watch": ["watch", "--once", str(bad)]}[command]
    assert main(args) == 2
    err = capsys.readouterr().err
    if command == "watch":
        assert err == (
            f"agent-runtime watch: {bad}:11: field 't' must be a number of seconds, 0 or more, "
            f"not {'a negative' if t.startswith('-') else 'an'} integer of 401 digits; line "
            "skipped\n"
        )
    else:
        assert err.startswith(f"agent-runtime {command}: {bad}:11: field 't': Input should be")
        assert len(err.splitlines()) == 1


def test_watch_names_a_negative_time_as_it_is_written(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _lines(run_jsonl)
    edited = json.loads(lines[10]) | {"t": -5}
    bad = tmp_path / "edited.jsonl"
    bad.write_text("".join([*lines[:10], json.dumps(edited) + "\n", *lines[11:]]), "utf-8")
    assert main(["watch", "--once", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime watch: {bad}:11: field 't' must be a number of seconds, 0 or more, "
        "not -5; line skipped\n"
    )


MACHINE_NAMES = (
    "avatar, job, session_host, participant, room_deletion, finalize, playout, session, agent_job"
)


def _backwards(run_jsonl: Path, tmp_path: Path, how: str) -> tuple[Path, int, str]:
    """The trace with its time going back, the line where it does, and the line before."""
    lines = _lines(run_jsonl)
    path = tmp_path / f"{how}.jsonl"
    if how == "joined":  # two traces in one file (cat a.jsonl b.jsonl)
        path.write_text("".join(lines * 2), encoding="utf-8")
        return path, len(lines) + 1, lines[-1]
    # an edited time: the first record at 14 s said 3 s
    n = next(i for i, line in enumerate(lines) if json.loads(line)["t"] == 14.0)
    lines[n] = lines[n].replace('"t": 14.0', '"t": 3.0')
    path.write_text("".join(lines), encoding="utf-8")
    return path, n + 1, lines[n - 1]


@pytest.mark.parametrize("how", ["joined", "edited"])
@pytest.mark.parametrize("command", ["replay", "record", "timeline"])
def test_a_time_that_goes_back_is_an_error_naming_the_line(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, how: str
) -> None:
    # replay said "Every decision agrees", timeline drew the page (exit 0), record blamed
    # the scenario it rebuilt (or, two traces joined, wrote one merged scenario, exit 0)
    bad, n, before = _backwards(run_jsonl, tmp_path, how)
    t, last = json.loads(bad.read_text().splitlines()[n - 1])["t"], json.loads(before)["t"]
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {bad}:{n}: time goes backwards ({t!r} after {last!r} on "
        f"line {n - 1}): not one clock's trace (two joined, an edited one, "
        "or runtimes with clocks of their own writing to one tracer?)\n"
    )
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()
    with pytest.raises(ValueError, match=f"{n}: time goes backwards"):
        read_trace(bad)  # the library's reader too


@pytest.mark.parametrize("how", ["joined", "edited"])
def test_watch_once_starts_the_view_over_where_the_time_goes_back_and_exits_2(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    bad, n, before = _backwards(run_jsonl, tmp_path, how)
    t, last = json.loads(bad.read_text().splitlines()[n - 1])["t"], json.loads(before)["t"]
    assert main(["watch", "--once", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"agent-runtime watch: {bad}:{n}: time goes backwards ({t!r} after {last!r} on line "
        f"{n - 1}): not one clock's trace (two joined, an edited one, "
        "or runtimes with clocks of their own writing to one tracer?); the view starts over "
        "from this line\n"
    )
    total = len(bad.read_text().splitlines())
    assert f"{total - n + 1} records, t = 30.000" in captured.out  # from that line on


def _unknown_machine(run_jsonl: Path, tmp_path: Path) -> tuple[Path, list[int]]:
    """The trace with its participant machine misspelt, and the lines that name it."""
    lines = [
        line.replace('"machine": "participant"', '"machine": "particpant"')
        for line in _lines(run_jsonl)
    ]
    path = tmp_path / "typo.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path, [i for i, line in enumerate(lines, 1) if "particpant" in line]


@pytest.mark.parametrize("command", ["replay", "record", "timeline"])
def test_a_machine_the_runtime_does_not_have_is_the_error_replay_gives(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # record wrote a scenario without the participant (exit 0); timeline drew its lane
    bad, named = _unknown_machine(run_jsonl, tmp_path)
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {bad}:{named[0]}: unknown machine 'particpant'; "
        f"machines: {MACHINE_NAMES}\n"
    )
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()


def test_watch_skips_the_records_of_a_machine_the_runtime_does_not_have(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it drew a "particpant" lane, exit 0
    bad, named = _unknown_machine(run_jsonl, tmp_path)
    assert main(["watch", "--once", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"agent-runtime watch: {bad}:{n}: unknown machine 'particpant'; line skipped" for n in named
    ]
    assert not [row for row in captured.out.splitlines() if row.startswith("particpant")]


def _unknown_event(run_jsonl: Path, tmp_path: Path) -> tuple[Path, int]:
    """The trace with its participant machine's first decision renamed ``teleported``."""
    lines = _lines(run_jsonl)
    n = next(
        i
        for i, line in enumerate(lines)
        if '"participant_connected"' in line and '"machine": "participant"' in line
    )
    lines[n] = lines[n].replace('"participant_connected"', '"teleported"')
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path, n + 1


@pytest.mark.parametrize("command", ["record", "timeline"])
def test_an_event_its_machine_does_not_declare_is_an_error_naming_the_line(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # record wrote a scenario without the join (exit 0); timeline drew it
    bad, n = _unknown_event(run_jsonl, tmp_path)
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {bad}:{n}: machine 'participant' declares no event "
        "'teleported' (an edited trace, or another version's?)\n"
    )
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()
    with pytest.raises(ValueError, match=f":{n}: machine 'participant' declares no event"):
        read_trace(bad)


def test_replay_still_reports_an_undeclared_event_as_its_divergence(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, n = _unknown_event(run_jsonl, tmp_path)
    assert main(["replay", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}:{n}: participant[") and (
        "the machine declares no event 'teleported'" in out
    )


def test_watch_skips_a_record_whose_event_its_machine_does_not_declare(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, n = _unknown_event(run_jsonl, tmp_path)
    assert main(["watch", "--once", str(bad)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"agent-runtime watch: {bad}:{n}: machine 'participant' declares no event "
        "'teleported'; line skipped"
    ]


def _unknown_state(run_jsonl: Path, tmp_path: Path) -> tuple[Path, int]:
    """The trace with the participant machine's first move to ``linked`` going to ``linkd``."""
    lines = _lines(run_jsonl)
    n = next(
        i
        for i, line in enumerate(lines)
        if '"dest": "linked"' in line and '"machine": "participant"' in line
    )
    lines[n] = lines[n].replace('"dest": "linked"', '"dest": "linkd"')
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path, n + 1


@pytest.mark.parametrize("command", ["record", "timeline"])
def test_a_state_its_machine_does_not_have_is_an_error_naming_the_line(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # timeline drew a 'linkd' bar no diagram lights; record wrote a scenario (exit 0), or,
    # for a final state, said the scenario it rebuilt was invalid without naming the line
    bad, n = _unknown_state(run_jsonl, tmp_path)
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {bad}:{n}: machine 'participant' has no state "
        "'linkd' (an edited trace, or another version's?)\n"
    )
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()
    with pytest.raises(ValueError, match=f":{n}: machine 'participant' has no state 'linkd'"):
        read_trace(bad)


def test_replay_still_reports_a_state_its_machine_does_not_have_as_its_divergence(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, n = _unknown_state(run_jsonl, tmp_path)
    assert main(["replay", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}:{n}: participant[") and (
        "destination differs: 'linked' replayed, 'linkd' recorded" in out
    )


def test_watch_skips_a_record_whose_state_its_machine_does_not_have(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # watch listed 'participant  linkd' as the machine's state, exit 0
    bad, n = _unknown_state(run_jsonl, tmp_path)
    assert main(["watch", "--once", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"agent-runtime watch: {bad}:{n}: machine 'participant' has no state 'linkd'; line skipped"
    ]
    assert not [row for row in captured.out.splitlines() if "-> linkd" in row]
    assert not [
        row for row in captured.out.splitlines() if row.split()[:2] == ["participant", "linkd"]
    ]


def _unknown_effect(run_jsonl: Path, tmp_path: Path, *, in_decision: bool) -> tuple[Path, int]:
    """The trace with the participant's ``link`` effect renamed ``lnk``: in its effect
    record, or in the transition that ran it (``in_decision``)."""
    lines = _lines(run_jsonl)
    old = '"effects": ["link"]' if in_decision else '"effect": "link"'
    n = next(i for i, line in enumerate(lines) if old in line)
    lines[n] = lines[n].replace(old, old.replace('"link"', '"lnk"'))
    path = tmp_path / "edited.jsonl"
    path.write_text("".join(lines), encoding="utf-8")
    return path, n + 1


@pytest.mark.parametrize("in_decision", [False, True], ids=["effect-record", "transition"])
@pytest.mark.parametrize("command", ["record", "timeline"])
def test_an_effect_its_machine_does_not_declare_is_an_error_naming_the_line(
    run_jsonl: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    in_decision: bool,
) -> None:
    # timeline drew a mark for an effect no machine has; record wrote its scenario, exit 0
    bad, n = _unknown_effect(run_jsonl, tmp_path, in_decision=in_decision)
    assert main(_commands(bad, tmp_path)[command]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime {command}: {bad}:{n}: machine 'participant' declares no effect "
        "'lnk' (an edited trace, or another version's?)\n"
    )
    assert not (tmp_path / "incident.yaml").exists() and not (tmp_path / "page.html").exists()
    with pytest.raises(ValueError, match=f":{n}: machine 'participant' declares no effect"):
        read_trace(bad)


def test_replay_refuses_an_effect_record_its_machine_does_not_declare(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # replay judges decisions, not effect records: it said every decision agrees, exit 0
    bad, n = _unknown_effect(run_jsonl, tmp_path, in_decision=False)
    assert main(["replay", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime replay: {bad}:{n}: machine 'participant' declares no effect 'lnk' "
        "(an edited trace, or another version's?)\n"
    )


def test_replay_still_reports_a_transition_s_undeclared_effect_as_its_divergence(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, n = _unknown_effect(run_jsonl, tmp_path, in_decision=True)
    assert main(["replay", str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}:{n}: participant[") and "effects differ" in out


def test_watch_skips_a_record_whose_effect_its_machine_does_not_declare(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, n = _unknown_effect(run_jsonl, tmp_path, in_decision=False)
    assert main(["watch", "--once", str(bad)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"agent-runtime watch: {bad}:{n}: machine 'participant' declares no effect 'lnk'; "
        "line skipped"
    ]


def test_replay_json_says_the_last_line_was_cut(
    run_jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the object said ok over the records before the cut, and nothing of the cut: only
    # stderr did, which a reader of --json does not read
    lines = _lines(run_jsonl)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines) + CUT, encoding="utf-8")
    assert main(["replay", "--json", str(cut)]) == 0
    report = json.loads(capsys.readouterr().out)
    n = len(lines) + 1
    assert report["ok"] and report["records"] == len(lines)
    assert report["warnings"] == [
        f"{cut}:{n}: the last line is incomplete (a trace still being written, or cut); "
        f"read up to line {n - 1}"
    ]


def test_replay_json_of_a_whole_trace_has_no_warnings(
    run_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--json", str(run_jsonl)]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
