"""Scenario files: every bundled one loads; each class of invalid input is refused with a
message naming the file, the step and what is wrong."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml
from livekit import rtc

from agent_runtime.settings import JobSettings, SettingError, check_setting
from agent_runtime.testing.expect import check_expect
from agent_runtime.testing.scenario import (
    Config,
    Expect,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from agent_runtime.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(Path(__file__).parent.parent.joinpath("examples/scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_bundled_scenarios_load(path: Path) -> None:
    s = load_scenario(path)
    assert s.steps and s.expect is not None


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([{"at": 0, "event": "session.explode"}], r"step 1 \(session.explode\): unknown event"),
        ([{"event": "session.start"}], r"step 1 \(session.start\): missing 'at'"),
        ([{"at": 0}], r"step 1: missing 'event'"),
        ([{"at": 0, "event": "participant_disconnected"}], r"field identity: Field required"),
        (
            [{"at": 0, "event": "participant_disconnected", "identity": "u", "reason": "BORED"}],
            r"step 1 \(participant_disconnected\): field reason: Input should be",
        ),
        (
            [{"at": 0, "event": "participant_connected", "identity": "u", "kind": "robot"}],
            r"field kind: Input should be",
        ),
        (
            [{"at": 5, "event": "session.start"}, {"at": 2, "event": "end"}],
            r"step 2 \(end\): time goes backwards \(2.0 after 5.0\)",
        ),
        (
            [{"at": 0, "event": "end"}, {"at": 1, "event": "session.start"}],
            r"'end' must be the last step",
        ),
        ([{"at": -1, "event": "session.start"}], r"field at: Input should be greater"),
        ([{"at": "soon", "event": "session.start"}], r"field at: Input should be a valid number"),
        ([{"at": 0, "event": "session.start", "colour": "red"}], r"field colour: Extra inputs"),
        # a misspelt key: it said "missing 'event'" and "field identity: Field required"
        (
            [{"at": 1, "evnet": "end"}],
            r"step 1: field evnet: Extra inputs are not permitted \(did you mean 'event'\?\)$",
        ),
        ([{"att": 1, "event": "end"}], r"step 1 \(end\): field att: .* \(did you mean 'at'\?\)$"),
        (
            [{"at": 0, "event": "participant_connected", "identiy": "alice"}],
            r"step 1 \(participant_connected\): field identiy: Extra inputs are not permitted "
            r"\(did you mean 'identity'\?\)$",
        ),
        (
            [{"at": 0, "event": "rpc_outcome", "method": "lk.clear_buffer", "result": "maybe"}],
            r"field result: Input should be",
        ),
        ([{"at": 0, "event": "agent.say"}], r"step 1 \(agent.say\): field duration: Field"),
        ([{"at": 0, "event": "agent.say", "duration": 0}], r"field duration: Input should be"),
        ([{"at": 0, "event": "agent.say", "duration": 60}], r"field duration: Input should be"),
        ([{"at": 0, "event": "user.speech", "duration": -1}], r"field duration: Input should"),
        # a week at most: at 1.0e+300 a timer fired at the instant it was armed
        (
            [{"at": 1.0e300, "event": "session.start"}],
            r"step 1 \(session.start\): field at: Input should be less than or equal to 604800 "
            r"\(got 1e\+300\)$",
        ),
        ([{"at": 604800.001, "event": "end"}], r"field at: Input should be less than or equal"),
        (
            [{"at": 0, "event": "user.speech", "duration": 1.0e300}],
            r"field duration: Input should be less than or equal to 604800 \(got 1e\+300\)$",
        ),
        ([{"at": 0, "event": "user.state", "state": "bored"}], r"field state: Input should be"),
        # a misspelt request kind with its payload: it ran, refused as a step, exit 0
        (
            [
                {
                    "at": 0,
                    "event": "session_request",
                    "caller": "simulator",
                    "request": "finalise_simulation",
                    "payload": {"provisional_success": True},
                }
            ],
            r"step 1 \(session_request\): field payload: unknown request kind "
            r"'finalise_simulation' cannot carry a payload "
            r"\(did you mean 'finalize_simulation'\?\)$",
        ),
        (
            [
                {
                    "at": 0,
                    "event": "session_request",
                    "caller": "simulator",
                    "request": "finalize_simulation",
                    "payload": {"provisional_sucess": True},
                }
            ],
            r"step 1 \(session_request\): field payload: finalize_simulation has no field "
            r"'provisional_sucess' \(fields: provisional_success, provisional_reason\)$",
        ),
        # "no", "off" and 0 ran as an abort; every other flag is true or false too
        *(
            (
                [{"at": 0, "event": "job.aclose", "graceful": word}],
                r"step 1 \(job.aclose\): field graceful: Input should be a valid boolean "
                rf"\(got {re.escape(repr(word))}\)$",
            )
            for word in ("no", "off", 0, "false")
        ),
    ],
)
def test_invalid_steps_are_named(steps: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as err:
        parse_scenario({"name": "x", "steps": steps}, source="bad.yaml")
    assert str(err.value).startswith("bad.yaml: step ")


def test_a_day_of_steps_runs_with_its_timers_to_the_millisecond(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The cap is a week of virtual time (scenarios.md says so): a grace period begun at the
    last instant still ends its 15 s later, not at the instant it began."""
    assert "from 0 to 604800 (a week of virtual time" in " ".join(
        (ROOT / "docs/guide/scenarios.md").read_text().split()
    )
    last = 604800 - 20.0
    doc = {
        "name": "late",
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {
                "at": last,
                "event": "participant_disconnected",
                "identity": "user",
                "reason": "SIGNAL_CLOSE",
            },
            {"at": last + 14.999, "event": "end"},
        ],
        "expect": {"final_states": {"participant": "grace"}},
    }
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["simulate", str(path)]) == 0, capsys.readouterr().out


def test_a_step_past_a_week_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(
        "name: x\nparticipants: [{identity: user}]\nsteps:\n"
        "  - {at: 0, event: session.start}\n"
        "  - {at: 1.0e+300, event: participant_disconnected, identity: user}\n"
        "  - {at: 1.0e+300, event: end}\n"
    )
    assert main(["simulate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"invalid scenario: {path}: step 2 (participant_disconnected): field at: "
        "Input should be less than or equal to 604800 (got 1e+300)\n"
    )


def test_a_participant_whose_identity_is_whitespace_is_a_room_fact_a_trace_can_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """livekit's server refuses only an empty identity: someone can join as "  ", a trace
    holds them, and ``record`` rebuilds the scenario that says so (only a setting naming
    an identity, ``participant_identity`` or ``avatar_identity``, refuses whitespace)."""
    path = tmp_path / "blank.yaml"
    path.write_text(
        "name: blank\nparticipants: [{identity: '  '}]\nsteps:\n"
        "  - {at: 0, event: session.start}\n"
        "  - {at: 5, event: participant_disconnected, identity: '  '}\n"
        "  - {at: 20, event: end}\n"
        "expect: {facts: {session_closed_at: 5}}\n"
    )
    trace, rebuilt = tmp_path / "blank.jsonl", tmp_path / "rebuilt.yaml"
    assert main(["simulate", str(path), "--trace", str(trace)]) == 0
    assert main(["record", str(trace), "-o", str(rebuilt), "--check"]) == 0
    capsys.readouterr()
    assert [p.identity for p in load_scenario(rebuilt).participants] == ["  "]
    with pytest.raises(ScenarioError, match=r"config.avatar_identity: .* whitespace \(got ' '\)$"):
        parse_scenario(
            {"name": "x", "config": {"avatar_identity": " "}, "steps": [{"at": 0, "event": "end"}]}
        )


def test_invalid_top_level(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="'steps' must be a non-empty list"):
        parse_scenario({"name": "x"}, source="s.yaml")
    with pytest.raises(ScenarioError, match=r"config.join_timeout: Input should be"):
        parse_scenario(
            {"name": "x", "config": {"join_timeout": "long"}, "steps": [{"at": 0, "event": "end"}]},
            source="s.yaml",
        )
    with pytest.raises(ScenarioError, match=r"config.colour: Extra inputs"):
        parse_scenario(
            {"name": "x", "config": {"colour": 1}, "steps": [{"at": 0, "event": "end"}]},
            source="s.yaml",
        )
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml: not valid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nmae": "x"}, "nmae: Extra inputs are not permitted (did you mean 'name'?)"),
        (
            {"name": "x", "config": {"join_timout": 3}},
            "config.join_timout: Extra inputs are not permitted (did you mean 'join_timeout'?)",
        ),
        (
            {"name": "x", "participants": [{"identiy": "u"}]},
            "participants.0.identiy: Extra inputs are not permitted (did you mean 'identity'?)",
        ),
        (
            {"name": "x", "expect": {"final_state": {"job": "closed"}}},
            "expect.final_state: Extra inputs are not permitted (did you mean 'final_states'?)",
        ),
    ],
)
def test_a_misspelt_key_is_named(raw: dict[str, object], message: str) -> None:
    """A misspelt required key said the one meant was missing (`name: Field required`)."""
    with pytest.raises(ScenarioError) as err:
        parse_scenario({**raw, "steps": [{"at": 0, "event": "end"}]}, source="s.yaml")
    assert str(err.value) == f"s.yaml: {message}"


def test_expect_reports_each_mismatch() -> None:
    result = {
        "final_states": {"job": "closed"},
        "facts": {
            "job_closed_at": 14.0000001,
            "verdict": {"success": False, "reason": "x"},
            "rpcs_sent": [],
        },
    }
    ok = Expect(
        final_states={"job": "closed"},
        facts={"job_closed_at": 14, "verdict": {"success": False}, "rpcs_sent": []},
    )
    assert check_expect(ok, result) == []
    bad = Expect(
        final_states={"job": "serving", "avatar": "joined"},
        facts={"job_closed_at": 15, "reprompts": [], "verdict": {"success": True}},
    )
    failures = check_expect(bad, result)
    assert failures[0] == "final state of job: expected 'serving', got 'closed'"
    assert failures[1] == "final state of avatar: expected 'joined', got None"
    assert "fact job_closed_at: expected 15, got 14.0000001" in failures
    assert any(f.startswith("fact reprompts: no such fact") for f in failures)
    assert any(f.startswith("fact verdict:") for f in failures)


# -- issue 13 item 6: one definition of each setting's range, shared with the runtime ------

SHARED = [n for n in Config.model_fields if n in JobSettings.model_fields]
ODD_VALUES = [0, -1, 0.5, 30, math.inf, -math.inf, math.nan, True, "30", "", "  ", "u", None, [1]]


def test_the_scenario_config_is_built_from_the_runtime_definitions() -> None:
    assert len(SHARED) >= 9
    for name in SHARED:
        ours, runtime = Config.model_fields[name], JobSettings.model_fields[name]
        assert (ours.annotation, ours.metadata, ours.default) == (
            runtime.annotation,
            runtime.metadata,
            runtime.default,
        ), name


@pytest.mark.parametrize("name", SHARED)
def test_a_value_is_accepted_by_the_scenario_exactly_when_the_runtime_takes_it(name: str) -> None:
    for value in ODD_VALUES:
        try:
            check_setting(name, value)
            runtime_takes_it = True
        except (SettingError, TypeError):
            runtime_takes_it = False
        config = {name: value}
        if name == "retry_avatar":  # its range, not the rule that it needs an avatar
            config["avatar_identity"] = "avatar"
        doc = {"name": "x", "config": config, "steps": [{"at": 0, "event": "end"}]}
        try:
            parse_scenario(doc, source="s.yaml")
            scenario_takes_it = True
        except ScenarioError:
            scenario_takes_it = False
        assert scenario_takes_it == runtime_takes_it, (name, value)


@pytest.mark.parametrize("name", SHARED)
def test_a_refused_value_is_named_by_the_scenario_as_by_the_runtime(name: str) -> None:
    """A trial: ``config.grace_period: Input should be greater than or equal to 0``, where
    ``AgentJob(grace_period=-1)`` says ``(got -1)``: the file's error names the value too."""
    named = 0
    for value in ODD_VALUES:
        try:
            check_setting(name, value)
            continue
        except (SettingError, TypeError) as e:
            runtime = str(e)
        config = {name: value}
        if name == "retry_avatar":
            config["avatar_identity"] = "avatar"
        doc = {"name": "x", "config": config, "steps": [{"at": 0, "event": "end"}]}
        with pytest.raises(ScenarioError) as refused:
            parse_scenario(doc, source="s.yaml")
        said = str(refused.value)
        assert "\n" not in said
        assert said.startswith(f"s.yaml: config.{name}"), said
        got = runtime[runtime.rindex(" (got ") :] if " (got " in runtime else None
        if got is not None:
            named += 1
            assert said.endswith(got), (said, runtime)
    assert named, name


def test_the_c_loader_is_used_when_pyyaml_has_it() -> None:
    """Item 5: most of the time of a large file was the pure-Python loader."""
    import yaml

    from agent_runtime.testing import safe_yaml

    if not yaml.__with_libyaml__:
        pytest.skip("this PyYAML was built without libyaml")
    assert issubclass(safe_yaml._Loader, yaml.CSafeLoader)


# -- issue 40: a scenario's job is AgentJob's, playout included ---------------------------


@pytest.mark.virtual_time  # the sink's own 2 s clear bound passes with the clock
@pytest.mark.parametrize(
    ("playout", "state", "agent_state"),
    [(None, "idle", "listening"), (False, None, "speaking")],
    ids=["unsaid: on with an avatar", "playout: false"],
)
async def test_an_avatar_that_never_reports_playback_with_the_default_playout(
    playout: bool | None, state: str | None, agent_state: str
) -> None:
    from agent_runtime.testing.runner import run_scenario
    from agent_runtime.testing.scenario import parse_scenario

    config: dict[str, object] = {"avatar_identity": "avatar-1"}
    if playout is not None:
        config["playout"] = playout
    scenario = parse_scenario(
        {
            "name": "avatar never reports",
            "config": config,
            "participants": [{"identity": "user"}],
            "steps": [
                {"at": 0, "event": "session.start"},
                {"at": 0, "event": "avatar.start"},
                {
                    "at": 1,
                    "event": "participant_connected",
                    "identity": "avatar-1",
                    "kind": "agent",
                },
                {"at": 1, "event": "track_published", "identity": "avatar-1", "kind": "video"},
                {"at": 2, "event": "agent.say", "duration": 4},
                {"at": 40, "event": "end"},
            ],
        }
    )
    result = await run_scenario(scenario)
    # AgentJob's job is listening again once the playout's bound passed; without the
    # playout machine the session waits for a report that never comes
    assert result["final_states"].get("playout") == state
    assert result["facts"]["agent_state"] == agent_state


async def test_an_expect_block_may_name_exactly_the_facts_a_run_reports() -> None:
    # the loader refuses a fact by this list before the run: a fact the run reports that the
    # list lacks would be refused, a listed one the run lacks would fail every expectation
    from agent_runtime.testing.runner import run_scenario
    from agent_runtime.testing.scenario import FACTS

    scenario = parse_scenario(
        {
            "name": "every fact",
            "participants": [{"identity": "user"}],
            "steps": [{"at": 0, "event": "session.start"}, {"at": 1, "event": "end"}],
            "expect": {"invariants": "all", "facts": {"step_errors": []}},
        }
    )
    result = await run_scenario(scenario)
    assert sorted(result["facts"]) == sorted(FACTS)
    assert check_expect(scenario.expect, result) == []


# -- every participant kind livekit's rtc knows ------------------------------------------------

SDK_KINDS = [
    n.removeprefix("PARTICIPANT_KIND_").lower()
    for n in rtc.ParticipantKind.keys()  # noqa: SIM118 - a protobuf enum wrapper
    if n != "PARTICIPANT_KIND_UNKNOWN"
]


@pytest.mark.parametrize("kind", SDK_KINDS)
def test_a_scenario_takes_every_participant_kind_the_sdk_knows(kind: str) -> None:
    """connector (a kind AgentJob links by default) and bridge were refused as a field kind."""
    s = parse_scenario(
        {
            "name": "kinds",
            "participants": [{"identity": "u", "kind": kind}],
            "steps": [
                {"at": 0, "event": "participant_connected", "identity": "v", "kind": kind},
                {"at": 1, "event": "end"},
            ],
        }
    )
    assert s.participants[0].kind == kind
    assert getattr(s.steps[0], "kind", None) == kind


@pytest.mark.virtual_time
async def test_a_connector_user_is_linked_and_a_bridge_is_not() -> None:
    from agent_runtime.testing.runner import run_scenario

    scenario = parse_scenario(
        {
            "name": "a phone user through a connector",
            "participants": [{"identity": "bridge-1", "kind": "bridge"}],
            "steps": [
                {"at": 0, "event": "session.start"},
                {
                    "at": 1,
                    "event": "participant_connected",
                    "identity": "phone",
                    "kind": "connector",
                },
                {"at": 2, "event": "participant_disconnected", "identity": "phone"},
                {"at": 3, "event": "end"},
            ],
        }
    )
    result = await run_scenario(scenario)
    assert result["facts"]["linked_participant"] == "phone"
    assert result["facts"]["session_closed_at"] == 2.0
    assert result["final_states"]["participant"] == "closed"
