"""``agent-runtime record``: the scenario that reproduces a trace.

Round trips through the command line: every bundled scenario simulated with ``--trace``,
recorded from that trace (its scenario inputs are not used: the steps are rebuilt from the
machines' events, as from a production trace), and the recorded file simulated again gives
the same final states and the same transitions, at the same times. Production traces of
the example agent's own entrypoint are in ``test_record_production.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end
from agent_runtime.observe.trace import TraceRecord
from agent_runtime.runtimes.room_events import (
    AttributesChanged,
    ParticipantJoined,
    ParticipantLeft,
    Reconnected,
    Reconnecting,
    RoomConnected,
    RoomDisconnected,
    TrackMuted,
    TrackPublished,
)
from agent_runtime.runtimes.routing import FACT_NAMES, fact_data
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.result import seconds_text
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.tools.cli import main
from agent_runtime.tools.record import FACT_KEYS, USES, RecordError, record
from statemachines.machines import MACHINES

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))


def simulate(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code = main(["simulate", str(path), "--json", *extra])
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    result["_code"] = code
    return result


def comments(path: Path) -> str:
    """The file's comment lines as one line of text."""
    lines = path.read_text().splitlines()
    return " ".join(line.lstrip("# ") for line in lines if line.startswith("#"))


def by_machine(transitions: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each machine's transitions in order (machines run side by side: their interleaving
    within one instant is not part of what a trace pins)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for t in transitions:
        out.setdefault(t["machine"], []).append((t["t"], t["event"], t["source"], t["dest"]))
    return out


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_bundled_scenario_round_trips_through_its_trace(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, recorded = tmp_path / "run.jsonl", tmp_path / "recorded.yaml"
    original = simulate(path, capsys, "--trace", str(trace))
    assert original["_code"] == 0

    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    steps = yaml.safe_load(recorded.read_text())["steps"]
    first, last = (seconds_text(float(steps[i]["at"])) for i in (0, -1))
    # the span of its steps (it said "t = 0 .." whatever time the first one had)
    assert f"wrote {recorded} ({len(steps)} steps, t = {first} .. {last})" in (
        capsys.readouterr().err
    )
    again = simulate(recorded, capsys)

    assert again["_code"] == 0, again["expect"]  # its own expect block holds
    assert again["final_states"] == original["final_states"]
    assert by_machine(again["transitions"]) == by_machine(original["transitions"])
    assert "they are not used: the steps are rebuilt from the machines' events" in comments(
        recorded
    )


def test_the_recorded_file_says_what_it_rebuilt_and_what_it_could_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, recorded = tmp_path / "run.jsonl", tmp_path / "recorded.yaml"
    simulate(
        ROOT / "examples/scenarios/sim_hangup_then_finalize.yaml", capsys, "--trace", str(trace)
    )
    assert main(["record", str(trace), "-o", str(recorded), "--name", "hang-up"]) == 0
    body = [line for line in recorded.read_text().splitlines() if not line.startswith("#")]
    assert body == [
        "name: hang-up",
        "config: {simulation: true, agent_verdict: {success: false, reason: the agent vetoes "
        "this run}, delete_room_on_close: true}",
        "participants:",
        "  - {identity: simulator, attributes: {lk.simulator: 'true'}}",
        "steps:",
        "  - {at: 0.0, event: session.start}",
        "  - {at: 10.0, event: session.close, reason: user_initiated}",
        "  - {at: 14.0, event: session_request, caller: simulator, request: "
        "finalize_simulation, payload: {provisional_success: true, provisional_reason: "
        "transcript looks fine}}",
        "  - {at: 14.0, event: end}",
        "expect:",
        "  final_states: {agent_job: closed, finalize: closed, job: closed, "
        "participant: closed, room_deletion: deleted, session: closed, session_host: closed}",
        "  facts: {job_closed_at: 14.0, session_closed_at: 10.0, room_deleted_at: 14.0, "
        "finalize_answered: true, verdict: {reason: the agent vetoes this run, success: false}}",
    ]
    # what no trace holds is said; what this one shows is not left as a doubt
    notes = comments(recorded)
    assert "what the session said or heard" in notes
    assert "no scenario step does that" not in notes  # every deletion request is explained


@pytest.mark.parametrize("result", ["ok", "error"])
def test_an_on_simulation_end_that_returned_is_not_said_to_have_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], result: str
) -> None:
    """``compute_verdict``'s error event is ``verdict_ready``, its outcome too: every
    answered finalize was written up as "compute_verdict failed", the bundled hang-up's
    included. Only the one whose trace says it failed is."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    scenario.write_text(
        json.dumps(
            {
                "name": f"on_simulation_end ends {result}",
                "config": {"simulation": True, "hold": ["simulation_end"]},
                "participants": [{"identity": "sim", "attributes": {"lk.simulator": "true"}}],
                "steps": [
                    {"at": 0, "event": "session.start"},
                    {
                        "at": 1,
                        "event": "session_request",
                        "caller": "sim",
                        "request": "finalize_simulation",
                    },
                    {"at": 4, "event": "held.end", "call": "simulation_end", "result": result},
                    {"at": 10, "event": "end"},
                ],
            }
        )
    )
    simulate(scenario, capsys, "--trace", str(trace))
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    notes = comments(recorded)
    said = "t=4: finalize got verdict_ready (compute_verdict failed)" in notes
    assert said == (result == "error"), notes
    if result == "ok":  # what it does say: the call took its time
        assert "finalize left answering on verdict_ready after 3s" in notes


@pytest.mark.parametrize(
    "policy",
    [
        # grows by 3 and is capped at 5: 1, 3, 5 between the four starts
        {"attempts": 3, "backoff": {"initial": 1.0, "multiplier": 3.0, "max": 5.0}},
        # one restart: only the first delay is seen (the growth and cap stay the defaults)
        {"attempts": 1, "backoff": {"initial": 2.5, "multiplier": 2.0, "max": 30.0}},
    ],
)
def test_a_retry_policy_is_rebuilt_from_the_restarts_and_waits_it_caused(
    policy: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    config = {"avatar_identity": "avatar-1", "join_timeout": 2, "retry_avatar": policy}
    scenario.write_text(
        json.dumps(
            {
                "name": "retried",
                "config": config,
                "participants": [{"identity": "user"}],
                "steps": [
                    {"at": 0, "event": "avatar.start"},
                    {"at": 0.5, "event": "session.start"},
                    {"at": 40, "event": "end"},
                ],
            }
        )
    )
    original = simulate(scenario, capsys, "--trace", str(trace))
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    capsys.readouterr()
    rebuilt = load_scenario(recorded).config.retry_avatar
    assert rebuilt.model_dump(mode="json", exclude={"transient"}) == {
        "rejoin": False,
        **policy,
    }
    again = simulate(recorded, capsys)
    assert by_machine(again["transitions"]) == by_machine(original["transitions"])


def test_a_backoff_started_again_while_the_agent_spoke_is_rebuilt_with_its_delay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The retry's 1 s backoff ended twice while a reply played in the room and started
    again each time (backoff -> backoff), and the trace ends during the third wait. That
    wait is 0.5 s old, not the 2.5 s since the avatar went back to room audio: the rebuilt
    backoff is the 1 s the trace shows (it said 3 s, and the rebuilt run restarted nothing)."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    policy = {"attempts": 1, "backoff": {"initial": 1.0, "multiplier": 2.0, "max": 30.0}}
    scenario.write_text(
        json.dumps(
            {
                "name": "retry waits for the reply",
                "config": {
                    "avatar_identity": "avatar-1",
                    "join_timeout": 2,
                    "retry_avatar": policy,
                },
                "participants": [{"identity": "user"}],
                "steps": [
                    {"at": 0, "event": "avatar.start"},
                    {"at": 0.5, "event": "session.start"},
                    {"at": 2.5, "event": "agent.say", "duration": 3, "text": "a reply"},
                    {"at": 4.5, "event": "end"},
                ],
            }
        )
    )
    original = simulate(scenario, capsys, "--trace", str(trace))
    assert [t["event"] for t in original["transitions"] if t["machine"] == "avatar"][-2:] == [
        "backoff_elapsed",
        "backoff_elapsed",
    ]
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    capsys.readouterr()
    rebuilt = load_scenario(recorded).config.retry_avatar
    assert rebuilt.model_dump(mode="json", exclude={"transient", "rejoin"}) == policy
    again = simulate(recorded, capsys)
    assert by_machine(again["transitions"]) == by_machine(original["transitions"])


def test_a_backoff_started_again_for_speech_no_record_holds_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the playout machine off, the reply that made the backoff start again is in no
    record: the rebuilt run starts the retry at once, and the file says why."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    config = {
        "avatar_identity": "avatar-1",
        "join_timeout": 2,
        "playout": False,
        "retry_avatar": {"attempts": 1, "backoff": {"initial": 1.0}},
    }
    steps = [
        {"at": 0, "event": "avatar.start"},
        {"at": 0.5, "event": "session.start"},
        {"at": 2.5, "event": "agent.say", "duration": 2, "text": "a reply"},
        {"at": 12, "event": "end"},
    ]
    scenario.write_text(
        json.dumps({"name": "unheard", "config": config, "participants": [], "steps": steps})
    )
    simulate(scenario, capsys, "--trace", str(trace))
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    capsys.readouterr()
    assert (
        "t=3, 4: the avatar's backoff started again while the agent was speaking in the room; "
        "with the playout machine off the trace holds no speech" in comments(recorded)
    )


@pytest.mark.parametrize("times", [1, 2, None])
def test_a_failed_start_whose_retry_joins_is_rebuilt_with_its_failures(
    times: int | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plugin's start raised ``times`` times, then a retry started it and the avatar
    joined: the rebuilt step raises that many times (None: every attempt raised)."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    fails: dict[str, Any] = {"at": 0.5, "event": "avatar.start_error"}
    if times is not None:
        fails["times"] = times
    policy = {"attempts": 2, "backoff": {"initial": 1}}
    scenario.write_text(
        json.dumps(
            {
                "name": "failed, then retried",
                "config": {"avatar_identity": "avatar-1", "retry_avatar": policy},
                "participants": [{"identity": "user"}],
                "steps": [
                    {"at": 0, "event": "session.start"},
                    fails,
                    {
                        "at": 5,
                        "event": "participant_connected",
                        "identity": "avatar-1",
                        "kind": "agent",
                    },
                    {
                        "at": 5.5,
                        "event": "track_published",
                        "identity": "avatar-1",
                        "kind": "video",
                    },
                    {"at": 8, "event": "end"},
                ],
            }
        )
    )
    original = simulate(scenario, capsys, "--trace", str(trace))
    assert original["final_states"]["avatar"] == ("restored" if times is None else "joined")
    assert main(["record", str(trace), "-o", str(recorded), "--check"]) == 0
    capsys.readouterr()
    (step,) = [s for s in load_scenario(recorded).steps if s.event == "avatar.start_error"]
    assert step.model_dump(exclude={"at"}) == {"event": "avatar.start_error", "times": times}


def test_a_shutdown_while_the_avatar_plugin_still_starts_is_rebuilt_with_the_start_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plugin's start never ended before the job closed: the rebuilt start is held, or
    it would start at once and route (the incident the trace shows would not replay)."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    scenario.write_text(
        json.dumps(
            {
                "name": "a shutdown during a slow avatar start",
                "config": {"avatar_identity": "avatar-1", "hold": ["avatar_start"]},
                "participants": [{"identity": "user"}],
                "steps": [
                    {"at": 0, "event": "avatar.start"},
                    {"at": 0, "event": "session.start"},
                    {"at": 1, "event": "job.shutdown", "reason": "bye"},
                    {"at": 30, "event": "end"},
                ],
            }
        )
    )
    original = simulate(scenario, capsys, "--trace", str(trace))
    assert original["final_states"]["avatar"] == "closed"
    assert main(["record", str(trace), "-o", str(recorded), "--check"]) == 0
    capsys.readouterr()
    assert load_scenario(recorded).config.hold == ("avatar_start",)


# the session started, then the avatar, which joined with its video by t=1.5
AVATAR_JOINED: list[dict[str, object]] = [
    {"at": 0, "event": "session.start"},
    {"at": 0.5, "event": "avatar.start"},
    {"at": 1, "event": "participant_connected", "identity": "avatar-1", "kind": "agent"},
    {"at": 1.5, "event": "track_published", "identity": "avatar-1", "kind": "video"},
]


def test_a_clear_the_trace_says_nothing_of_is_not_rebuilt_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job aborted while the agent spoke through the joined avatar: the session's close
    interrupted the speech and the plugin's own clear settled (its RPC answered ok). The
    trace holds no outcome of that RPC, so the rebuilt file scripts none (it wrote an
    ``rpc_outcome`` of ``error``)."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    scenario.write_text(
        json.dumps(
            {
                "name": "aborted while speaking",
                "config": {"avatar_identity": "avatar-1"},
                "participants": [{"identity": "user"}],
                "steps": [
                    *AVATAR_JOINED,
                    {"at": 2, "event": "agent.say", "duration": 10},
                    {"at": 5, "event": "job.aclose", "graceful": False},
                    {"at": 10, "event": "end"},
                ],
            }
        )
    )
    original = simulate(scenario, capsys, "--trace", str(trace))
    assert [(r["method"], r["outcome"]) for r in original["facts"]["rpcs_sent"]] == [
        ("lk.clear_buffer", "ok")
    ]
    assert main(["record", str(trace), "-o", str(recorded), "--check"]) == 0
    capsys.readouterr()
    assert [s.event for s in load_scenario(recorded).steps if s.event == "rpc_outcome"] == []


async def test_a_retry_that_raised_after_a_start_that_did_not_is_said_not_scripted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The avatar joined, dropped; its first retry's plugin start raised, the second
    rejoined. A scenario scripts only the first starts' failures: the file starts the
    avatar as it started and says the retry's failure is not replayed (it wrote a step
    ``times: 0`` the file refused: exit 2 on a valid trace)."""
    clock = VirtualClock()
    room = InMemoryRoom(name="retry-room", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    plugin = ScriptedAvatar(avatar_identity="a", clock=clock)
    trace = tmp_path / "run.jsonl"
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=plugin,
        clock=clock,
        otel=False,
        playout=False,
        trace_path=trace,
        retry_avatar={"attempts": 2, "backoff": {"initial": 1}},
    )
    await job.start(Agent(instructions="agent"))
    room.add_participant("a", kind="agent")
    room.publish_track("a", "video")
    await settle()
    assert job.states["avatar"] == "joined"
    plugin.start_error, plugin.start_errors = RuntimeError("the provider is down"), 1
    room.remove_participant("a")
    await clock.advance(1.0)  # the first retry: its start raises
    await clock.advance(2.0)  # the second: it starts
    room.add_participant("a", kind="agent")
    room.publish_track("a", "video")
    await settle()
    assert job.states["avatar"] == "joined" and plugin.start_calls == 3
    await job.aclose()

    recorded = tmp_path / "r.yaml"
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    capsys.readouterr()
    starts = [s.event for s in load_scenario(recorded).steps if s.event.startswith("avatar.")]
    assert starts[0] == "avatar.start"
    assert "a retry's plugin start raised after an earlier one did not" in comments(recorded)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no machine event to rebuild a scenario from"),
        ('{"t": 0, "kind": "input", "machine": "scenario", "instance": "x"}\n', "holds no"),
        ("not json\n", ":1: not JSON"),
    ],
    ids=["empty", "inputs-only", "not-json"],
)
def test_a_trace_with_nothing_to_rebuild_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(content)
    out = tmp_path / "out.yaml"
    assert main(["record", str(trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-runtime record: ") and message in err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_dash_writes_the_scenario_to_stdout_and_no_file_named_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "run.jsonl"
    assert simulate(SCENARIOS[0], capsys, "--trace", str(trace))["_code"] == 0
    monkeypatch.chdir(tmp_path)
    assert main(["record", str(trace)]) == 0
    plain = capsys.readouterr().out
    assert main(["record", str(trace), "-o", "-"]) == 0  # it wrote a file named "-"
    out, err = capsys.readouterr()
    assert out == plain and yaml.safe_load(out)["steps"] and err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]


def test_the_recorder_knows_the_data_every_room_fact_carries() -> None:
    """Facts are told from the runtime's own events by their data: the recorder's table
    must be the routing's ``fact_data``, fact for fact."""
    samples = [
        ParticipantJoined("u", "standard", {}),
        ParticipantLeft("u", "standard", "CLIENT_INITIATED", {}),
        TrackPublished("u", "video"),
        TrackMuted("u", "audio", True),
        AttributesChanged("u", {}, {}),
        RoomConnected(),
        RoomDisconnected("CLIENT_INITIATED"),
        Reconnecting(),
        Reconnected(),
    ]
    assert {FACT_NAMES[type(f)]: frozenset(fact_data(f)) for f in samples} == FACT_KEYS


def test_the_recorder_reads_only_events_and_guards_the_specs_declare() -> None:
    """What the recorder reads by name exists in the machines' specs: a renamed event,
    guard or effect fails here rather than silently rebuilding nothing from it."""
    for machine, names in USES.items():
        spec = MACHINES[machine]
        assert set(names["events"]) <= set(spec.events), machine
        assert set(names["guards"]) <= set(spec.guards), machine
        assert set(names.get("effects", ())) <= {e.name for e in spec.effects}, machine


def test_queued_speeches_each_keep_their_own_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replies queued through the avatar. In a deployed job the SDK creates the second
    speech before the first one's audio reaches the sink (an LLM takes its time); a
    scenario pushes the first at once, so the trace is put in the deployed order here.
    Each hand-off belongs to the oldest speech still open: each rebuilt ``agent.say``
    keeps its own length (the second took the first's, the first became room audio)."""
    scenario, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    scenario.write_text(
        json.dumps(
            {
                "name": "two replies queued",
                "config": {"avatar_identity": "avatar-1"},
                "participants": [{"identity": "user"}],
                "steps": [
                    *AVATAR_JOINED,
                    {"at": 2, "event": "agent.say", "duration": 3},
                    {"at": 2, "event": "agent.say", "duration": 5},
                    {"at": 30, "event": "end"},
                ],
            }
        )
    )
    assert simulate(scenario, capsys, "--trace", str(trace))["_code"] == 0
    lines = trace.read_text().splitlines()

    def playout(event: str) -> list[int]:
        return [
            i
            for i, line in enumerate(lines)
            if (r := json.loads(line))["machine"] == "playout"
            and r["event"] == event
            and r["kind"] != "effect"
        ]

    first_handoff, second = playout("handed_off")[0], playout("speech_created")[1]
    assert first_handoff < second  # as a scenario runs it
    lines.insert(first_handoff, lines.pop(second))  # as a deployed job records it
    trace.write_text("\n".join(lines) + "\n")
    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    capsys.readouterr()
    says = [s for s in load_scenario(recorded).steps if s.event == "agent.say"]
    assert [(s.at, s.duration) for s in says] == [(2, 3), (2, 5)]
    assert "room's audio output" not in comments(recorded)


def test_a_trace_of_two_jobs_is_refused_not_merged_into_one_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two jobs on one clock (their times never go back): record wrote one scenario of both
    trace = tmp_path / "run.jsonl"
    simulate(ROOT / "examples" / "scenarios" / "user_leaves.yaml", capsys, "--trace", str(trace))
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    later = [{**r, "t": r["t"] + 100} for r in records]
    two = tmp_path / "two.jsonl"
    two.write_text("".join(json.dumps(r) + "\n" for r in records + later))
    n, second = next(
        (len(records) + i, r) for i, r in enumerate(later, 1) if r["machine"] == "agent_job"
    )
    out = tmp_path / "keep.yaml"
    said = (
        f"the trace holds more than one job: the agent_job machine starts again here "
        f"(t = {second['t']!r}, in {second['instance']!r}) after the job before it ended; "
        'write each job to its own file (trace_path="traces/{job_id}.jsonl")'
    )
    assert main(["record", str(two), "-o", str(out)]) == 2
    # named by the one trace reader, as replay, timeline and watch name it
    assert capsys.readouterr().err == f"agent-runtime record: {two}:{n}: {said}\n"
    # and by record() itself, given the records
    with pytest.raises(RecordError) as refused:
        record([TraceRecord(**r) for r in records + later], name="two")
    assert str(refused.value) == said
    assert not out.exists()


def test_two_joined_traces_are_blamed_on_the_trace_and_an_empty_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the error named the -o file, which it had not written, then blamed the scenario
    # rebuilt from the trace, not the trace's line; --name '' took the default
    trace = tmp_path / "run.jsonl"
    simulate(ROOT / "examples" / "scenarios" / "user_leaves.yaml", capsys, "--trace", str(trace))
    joined = tmp_path / "joined.jsonl"
    joined.write_text(trace.read_text() * 2)
    n = len(trace.read_text().splitlines())
    last = json.loads(trace.read_text().splitlines()[-1])["t"]
    out = tmp_path / "keep.yaml"
    assert main(["record", str(joined), "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime record: {joined}:{n + 1}: time goes backwards (0.0 after {last!r} on "
        f"line {n}): not one clock's trace (two joined, an edited one, "
        "or runtimes with clocks of their own writing to one tracer?)\n"
    )
    assert not out.exists()
    assert main(["record", str(trace), "-o", str(out), "--name", " "]) == 2
    assert "--name: the scenario's name is empty" in capsys.readouterr().err
    assert not out.exists()
    # a name of two lines: the recorded scenario's report would be two lines
    assert main(["record", str(trace), "-o", str(out), "--name", "two\nlines"]) == 2
    assert capsys.readouterr().err == (
        "agent-runtime record: --name: the scenario's name holds a control character or a "
        "line break ('\\n'): it is one line\n"
    )
    assert not out.exists()


def _traced_server(
    trace: Path, agent: Callable[[], Agent] = lambda: Agent(instructions="test"), **options: Any
) -> AgentServer:
    """A server whose ``rtc_session`` entrypoint runs an ``AgentJob`` tracing to ``trace``
    (``options``: the job's own, its avatar among them) and starts ``agent()`` in it."""
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(), trace_path=trace, **options)
        await job.start(agent())

    return server


async def _record_check(trace: Path, tmp_path: Path) -> tuple[int, Path]:
    """``record TRACE -o r.yaml --check``: the exit code and the file (the check runs the
    rebuilt scenario on a loop of its own: from a thread)."""
    recorded = tmp_path / "r.yaml"
    code = await asyncio.to_thread(main, ["record", str(trace), "-o", str(recorded), "--check"])
    return code, recorded


async def test_a_production_trace_whose_user_is_a_connector_is_recorded_and_reproduced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """connector is a kind AgentJob links by default: record refused the scenario it rebuilt
    from such a trace ("field kind"), exit 2, while replay took the trace."""
    clock = VirtualClock()
    room = InMemoryRoom(name="phone-room", clock=clock)
    room.connect_locally()
    room.add_participant("phone", kind="connector")
    room.add_participant("bridge-1", kind="bridge")
    trace = tmp_path / "run.jsonl"
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False, trace_path=trace)
    await job.start(Agent(instructions="agent"))
    room.remove_participant("phone", rtc.DisconnectReason.SIGNAL_CLOSE)
    await clock.advance(2.0)
    room.add_participant("phone", kind="connector")
    await clock.advance(1.0)
    room.remove_participant("phone", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    await job.aclose()

    code, recorded = await _record_check(trace, tmp_path)
    assert code == 0, capsys.readouterr().err
    assert "the rebuilt scenario reproduces the trace" in capsys.readouterr().err
    scenario = load_scenario(recorded)
    assert [(p.identity, p.kind) for p in scenario.participants] == [
        ("phone", "connector"),
        ("bridge-1", "bridge"),
    ]
    rejoined = [s for s in scenario.steps if s.event == "participant_connected"]
    assert [getattr(s, "kind", None) for s in rejoined] == ["connector"]


@pytest.mark.virtual_time
async def test_a_greeting_that_waited_for_an_avatar_that_never_came_is_recorded_and_reproduced(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """The greeting said in on_enter waits at the avatar's sink, goes to the room at the
    join timeout and plays there, the retry waiting for it: record rebuilt it as 14 s of
    speech (from its creation, its wait included) where it played 4, and the playout
    machine's turn as ended at the session's start; the scenario did not reproduce it."""
    trace = tmp_path / "run.jsonl"

    async def greeting() -> AsyncIterator[rtc.AudioFrame]:
        for _ in range(400):  # 4 s
            yield rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)

    class Greeter(Agent):
        async def on_enter(self) -> None:
            self.session.say("welcome", audio=greeting())

    server = _traced_server(
        trace,
        agent=lambda: Greeter(instructions="test"),
        avatar=ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock),
        join_timeout=10,
        retry_avatar={"attempts": 1},
    )

    agent_room.add_participant("user")
    await run_entrypoint(server)
    await virtual_clock.advance(30)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()

    code, recorded = await _record_check(trace, tmp_path)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the rebuilt scenario reproduces the trace" in err
    said = [s for s in load_scenario(recorded).steps if s.event == "agent.say"]
    assert [(s.at, getattr(s, "duration", None)) for s in said] == [(0.0, 4.0)]


@pytest.mark.virtual_time
async def test_an_avatar_that_joined_while_its_plugin_started_is_recorded_and_reproduced(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """The plugin's start() takes 2 s (its provider's call) and the avatar joins with its
    video meanwhile, as a real one does: the machine sees it when the start ends
    (``routing -> joined`` on the presence check). The start was rebuilt as instant, so the
    replay's avatar joined during ``routing`` without its video: ``--check`` failed."""
    trace = tmp_path / "run.jsonl"
    avatar = ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock, start_delay=2.0)
    server = _traced_server(trace, avatar=avatar)

    agent_room.add_participant("user")
    started = asyncio.ensure_future(run_entrypoint(server, start_timeout=60))
    await virtual_clock.advance(1.0)
    agent_room.add_participant("avatar", kind="agent")
    agent_room.publish_track("avatar", "video")
    await virtual_clock.advance(2.0)
    job = await started
    assert job.states["avatar"] == "joined"
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()

    code, recorded = await _record_check(trace, tmp_path)
    err = capsys.readouterr().err
    assert code == 0, err
    scenario = load_scenario(recorded)
    ends = [(s.at, getattr(s, "result", None)) for s in scenario.steps if s.event == "held.end"]
    assert ends == [(2.0, "routed"), (2.0, "ok")]  # the start ended where the trace says


def test_speech_on_room_audio_is_rebuilt_with_the_seconds_it_played_and_its_interruption(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario's speech on the room's audio output takes its length in virtual seconds:
    the recorder rebuilds that length from the trace (it wrote 0.1 s, "played at one
    instant") and an interruption there as a session.interrupt (it was "not cut")."""
    doc = {
        "name": "room audio",
        "config": {"playout": True},
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 1, "event": "agent.say", "duration": 4},
            {"at": 8, "event": "agent.say", "duration": 3},
            {"at": 9.5, "event": "session.interrupt"},
            {"at": 12, "event": "end"},
        ],
    }
    path, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    original = simulate(path, capsys, "--trace", str(trace))
    assert original["facts"]["agent_listening_at"] == pytest.approx([5.0, 9.5])

    assert main(["record", str(trace), "-o", str(recorded)]) == 0
    steps = yaml.safe_load(recorded.read_text())["steps"]
    assert [s for s in steps if s["event"] in ("agent.say", "session.interrupt")] == [
        {"at": 1.0, "event": "agent.say", "duration": 4.0},
        {"at": 8.0, "event": "agent.say", "duration": 10.0},
        {"at": 9.5, "event": "session.interrupt"},
    ]
    assert "t=8: how long the agent's speech on the room's audio output would have played" in (
        comments(recorded)
    )
    again = simulate(recorded, capsys)
    assert again["_code"] == 0, again["expect"]
    assert by_machine(again["transitions"]) == by_machine(original["transitions"])


async def _frames(seconds: float) -> AsyncIterator[rtc.AudioFrame]:
    for _ in range(round(seconds * 100)):  # 10 ms of silence each
        yield rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)


@pytest.mark.virtual_time
async def test_a_reply_queued_behind_another_through_the_avatar_keeps_the_default_margin(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """The agent says 3 s then 2 s back to back through its avatar; the avatar reports the
    first at t=5 and never the second, so the bound (2 s pushed at t=5, the default 2 s
    margin) fires at t=9. record took the second speech's audio as pushed when it was
    said (t=1), not when the queue reached it, and rebuilt a 4 s margin: the replay's
    bound fired at t=11, which --check did not see (it compares transitions, not times)."""
    trace = tmp_path / "run.jsonl"
    server = _traced_server(
        trace, avatar=ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock)
    )

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    agent_room.add_participant("avatar", kind="agent")
    await virtual_clock.advance(0.5)
    agent_room.publish_track("avatar", "video")
    await virtual_clock.advance(0.5)
    job.session.say("one", audio=_frames(3))
    job.session.say("two", audio=_frames(2))
    await virtual_clock.advance(4)
    finished = '{"playback_position": 3.0, "interrupted": false}'
    await agent_room.invoke_rpc("lk.playback_finished", "avatar", finished)
    await virtual_clock.advance(6)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    records = run_entrypoint.records
    fired = [r.t for r in records if (r.event, r.kind) == ("playout_timeout", "transition")]
    assert fired == [9.0]

    code, recorded = await _record_check(trace, tmp_path)
    assert code == 0, capsys.readouterr().err
    assert yaml.safe_load(recorded.read_text())["config"]["playout"] is True  # no margin


def test_check_names_a_transition_the_run_makes_at_another_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check compared each machine's transitions as (event, source, dest) only: a run
    whose playout bound fired 2 s late (a margin rebuilt too long) was said to reproduce
    the trace with nothing more. The first transition of a machine that the run makes at
    another time than the trace is now named (not failed: a deployed job's answers take
    time a scenario's stand-ins do not)."""
    from agent_runtime import read_trace
    from agent_runtime.tools.record import timing

    path = ROOT / "examples" / "scenarios" / "avatar_interrupt_while_joined.yaml"
    trace = tmp_path / "run.jsonl"
    result = simulate(path, capsys, "--trace", str(trace))
    records = read_trace(trace)
    assert timing(records, result) == []
    moved = next(t for t in result["transitions"] if t["machine"] == "avatar" and t["t"] > 0)
    row = f"{moved['source']} -> {moved['dest']} on {moved['event']}"
    was = moved["t"]
    moved["t"] = was + 2
    n = [t for t in result["transitions"] if t["machine"] == "avatar"].index(moved) + 1
    assert timing(records, result) == [
        f"avatar: transition {n} ({row}) is at t={seconds_text(was)} in the trace, "
        f"t={seconds_text(was + 2)} in the run"
    ]


@pytest.mark.virtual_time
async def test_an_interruption_whose_clear_rpc_went_unanswered_is_rebuilt_with_its_timeout(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """The user interrupts the agent speaking through its avatar, whose lk.clear_buffer
    goes unanswered: the plugin's own clear waits the SDK's round trip (7 s) and the
    avatar stays ``clearing`` until t=11. That RPC is not in the trace; record rebuilt it
    as answered at once, so the replay's clear ended at t=6 (what --check now names)."""
    trace = tmp_path / "run.jsonl"
    server = _traced_server(
        trace, avatar=ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock)
    )

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    agent_room.add_participant("avatar", kind="agent")
    await virtual_clock.advance(0.5)
    agent_room.publish_track("avatar", "video")
    await virtual_clock.advance(0.5)
    agent_room.local_participant.rpc_script["lk.clear_buffer"].append("timeout")
    job.session.say("long", audio=_frames(8))
    await virtual_clock.advance(3)
    job.session.interrupt()
    await virtual_clock.advance(10)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    done = [r.t for r in run_entrypoint.records if r.event == "clear_buffer_done"]
    assert done == [11.0]

    code, recorded = await _record_check(trace, tmp_path)
    err = capsys.readouterr().err
    assert code == 0, err
    assert "not every one at the trace's time" not in err
    outcomes = [s for s in load_scenario(recorded).steps if s.event == "rpc_outcome"]
    assert [(s.at, getattr(s, "result", None)) for s in outcomes] == [(4.0, "timeout")]
    assert "t=4: the avatar plugin's own clear took 7 s, the SDK's round-trip budget" in (
        comments(recorded)
    )


@pytest.mark.virtual_time
async def test_a_retry_whose_second_attempt_joined_says_its_attempts_are_a_floor(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """retry_avatar={"attempts": 2}: the first attempt times out, the restart joins. The
    trace shows one restart and no refusal, so the rebuilt policy allows 1 (which
    reproduces the trace); the header did not say the job's own may have been larger."""
    trace = tmp_path / "run.jsonl"
    server = _traced_server(
        trace,
        avatar=ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock),
        join_timeout=10,
        retry_avatar={"attempts": 2},
    )

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    await virtual_clock.advance(12)
    agent_room.add_participant("avatar", kind="agent")
    await virtual_clock.advance(0.5)
    agent_room.publish_track("avatar", "video")
    await virtual_clock.advance(1)
    assert job.states["avatar"] == "joined"
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()

    code, recorded = await _record_check(trace, tmp_path)
    assert code == 0, capsys.readouterr().err
    assert load_scenario(recorded).config.retry_avatar.attempts == 1
    assert (
        "retry_avatar.attempts is 1, the restarts the trace shows: the avatar never ran out "
        "of them, so the job may have allowed more"
    ) in comments(recorded)


@pytest.mark.virtual_time
async def test_a_session_shut_down_while_its_avatar_spoke_says_when_the_ask_is_unknown(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    agent_room: InMemoryRoom,
    virtual_clock: VirtualClock,
    run_entrypoint: Any,
) -> None:
    """The agent hangs up (``session.shutdown()``) at t=3 while it speaks 6 s through its
    avatar: the session waits for the speech (the playout bound ends it at t=9) and closes
    then. The trace shows only the close at t=9, rebuilt as a close there (which
    reproduces it); the header did not say the shutdown may have been asked earlier."""
    trace = tmp_path / "run.jsonl"
    server = _traced_server(
        trace, avatar=ScriptedAvatar(avatar_identity="avatar", clock=virtual_clock)
    )

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    agent_room.add_participant("avatar", kind="agent")
    await virtual_clock.advance(0.5)
    agent_room.publish_track("avatar", "video")
    await virtual_clock.advance(0.5)
    job.session.say("bye", audio=_frames(6))
    await virtual_clock.advance(2)
    job.session.shutdown()
    await virtual_clock.advance(8)
    await run_entrypoint.wait_ended()

    code, recorded = await _record_check(trace, tmp_path)
    assert code == 0, capsys.readouterr().err
    closes = [s.at for s in load_scenario(recorded).steps if s.event == "session.close"]
    assert closes == [9.0]
    assert (
        "t=9: the session closed (user_initiated) as the agent's speech ended: a session's "
        "shutdown lets the speech in progress end first, and the trace does not show when "
        "it was asked"
    ) in comments(recorded)


async def test_a_session_that_could_not_be_asked_to_close_is_said_not_rebuilt_as_a_shutdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user leaves and asking livekit to close the session raises (fault injected): the
    link gives up on the close (``close_failed``) and the job shuts down on its own, as it
    does for a close that hung. The recorder wrote that shutdown as a ``job.shutdown`` step
    the world took, and the file did not say the close could not be asked."""
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    trace = tmp_path / "run.jsonl"
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, otel=False, trace_path=trace)
    await job.start(Agent(instructions="agent"))
    await settle()

    def broken(**_: Any) -> None:
        raise RuntimeError("no loop to close on")  # fault injection

    session._close_soon = broken  # type: ignore[method-assign]
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    await clock.advance(60)
    await job.aclose()
    assert job.states["participant"] == "closed" and job.states["job"] == "closed"

    recorded = tmp_path / "r.yaml"
    assert main(["record", str(trace), "-o", str(recorded)]) == 0, capsys.readouterr().err
    steps = [s.event for s in load_scenario(recorded).steps]
    assert "job.shutdown" not in steps
    assert (
        "t=0: the session could not be asked to close (RuntimeError: no loop to close on): "
        "the link gave up on it and the job shut down; no scenario step does that"
    ) in comments(recorded)
