"""Bad input, one table: what each malformed input gets, word for word, and that nothing
changed because of it.

Rows by where the input comes in:

- ``rpc``: ``lk.playback_finished`` payloads and callers, into a job whose avatar is joined
  and playing a segment: the ``rtc.RpcError`` code and message; the segment still pending,
  the speech still playing, the avatar still ``joined``, no event reached its machine.
- ``request``: session requests from the simulator over the job's transport: the error
  reply; job and host states and the one-time finalize untouched (a good finalize after it
  still gets the agent's verdict).
- ``wire``: bytes that are no message at all: the warning; the next request is answered.
- ``room``: room events with the wrong argument types: the adapter's warning; no room fact,
  no job transition, nothing raised to the emitter.
- ``step``: scenario steps the runtime refuses while a scenario runs: the step error; the
  scenario ends as it would have without that step.
- ``scenario`` / ``trace``: files ``agent-runtime simulate`` / ``replay`` refuse (malformed,
  out of range, too deep, too large, not a regular file): exit 2 and the one line on stderr,
  no trace written, no report printed; with ``--json`` the same line as JSON on stdout.

Looser versions of some rows live next to their features (``test_avatar_lifecycle``,
``test_session_host``, ``test_scenario_files``, ``test_replay``, ``test_room_events``); this
table is the one place that pins the exact text. Same stand-ins as the property tests
(``test_properties_world``): only the network is faked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc

from agent_runtime.runtimes.session_host import NO_ACTIVE_SESSION, NOT_THE_SIMULATOR
from agent_runtime.settings import PARTICIPANT_KINDS
from agent_runtime.testing.inmemory import quiet_sdk_logs
from agent_runtime.testing.runner import run_scenario
from agent_runtime.testing.scenario import FACTS, STEP_EVENTS, parse_scenario
from agent_runtime.tools.cli import main
from statemachines.machines import MACHINES
from tests.support.world import AVATAR, SIMULATOR, USER, VETO, Config, World, frames

APP = rtc.RpcError.ErrorCode.APPLICATION_ERROR
UNSUPPORTED = rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD
MALFORMED = "malformed lk.playback_finished payload: "
GOOD_TRACE_LINE = {
    "t": 0,
    "kind": "transition",
    "machine": "job",
    "instance": "j",
    "event": "shutdown",
    "source": "serving",
    "dest": "closing",
    "guards": {"hold_needed": False},
}
REASONS = (
    "'UNKNOWN_REASON', 'CLIENT_INITIATED', 'DUPLICATE_IDENTITY', 'SERVER_SHUTDOWN', "
    "'PARTICIPANT_REMOVED', 'ROOM_DELETED', 'STATE_MISMATCH', 'JOIN_FAILURE', 'MIGRATION', "
    "'SIGNAL_CLOSE', 'ROOM_CLOSED', 'USER_UNAVAILABLE', 'USER_REJECTED', 'SIP_TRUNK_FAILURE', "
    "'CONNECTION_TIMEOUT', 'MEDIA_FAILURE' or 'AGENT_ERROR'"
)


@dataclass(frozen=True)
class Bad:
    where: str  # rpc | request | wire | room | step | scenario | trace
    name: str
    given: Any
    error: Any  # the exact message; (code, message) for an RPC
    options: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.where}-{self.name}"


def rpc(name: str, payload: str, error: tuple[int, str], **options: Any) -> Bad:
    return Bad("rpc", name, payload, error, options)


def request(name: str, kind: str, payload: dict[str, Any], error: str, **options: Any) -> Bad:
    return Bad("request", name, (kind, payload), error, options)


def room(name: str, event: str, args: tuple[Any, ...], error: str) -> Bad:
    return Bad("room", name, (event, args), error)


def step(name: str, steps: list[dict[str, Any]], error: str, **config: Any) -> Bad:
    return Bad("step", name, steps, error, config)


def scenario(name: str, text: str | bytes | MakePath, error: str, **options: Any) -> Bad:
    return Bad("scenario", name, text, error, options)


def trace(name: str, line: str | bytes | MakePath, error: str, **options: Any) -> Bad:
    return Bad("trace", name, line, error, options)


# a file that is not written but made (a FIFO, a directory) or found (/dev/zero)
MakePath = Callable[[Path], Path]


def fifo(tmp: Path) -> Path:
    path = tmp / "bad.fifo"
    os.mkfifo(path)
    return path


def dev_zero(_: Path) -> Path:
    return Path("/dev/zero")


def empty_dir(tmp: Path) -> Path:
    path = tmp / "scenarios"
    path.mkdir()
    return path


def yml_only_dir(tmp: Path) -> Path:
    path = empty_dir(tmp)
    (path / "a.yml").write_text("name: x\nsteps: [{at: 0, event: end}]\n")
    return path


def step_file(step: str, config: str = "") -> str:
    """A scenario whose first step (or config) is the bad part."""
    return f"name: x\n{config}steps: [{step}, {{at: 9, event: end}}]\n"


# lists of 10 lists of 10 ... of "lol": 5 anchors, 341 bytes, 10^5 "lol" once expanded
# (the had 9, 10^9: its expansion into the trace and the JSON ran out of memory)
ALIAS_BOMB = step_file(
    "{at: 0, event: rpc, method: m, caller: c, payload: {a: &a ["
    + ", ".join(["lol"] * 10)
    + "], "
    + ", ".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]" for a, b in zip("abcd", "bcde", strict=True)
    )
    + "}}"
)


def record(**changes: Any) -> str:
    return json.dumps({**GOOD_TRACE_LINE, **changes})


TABLE: list[Bad] = [
    # -- lk.playback_finished (avatar -> agent) ---------------------------------------------
    rpc("empty", "", (APP, MALFORMED + "payload is not JSON")),
    rpc("not-json", "not json", (APP, MALFORMED + "payload is not JSON")),
    rpc("not-an-object", "[0.5, false]", (APP, MALFORMED + "payload is not a JSON object")),
    rpc(
        "position-missing",
        '{"interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(
        "position-a-string",
        '{"playback_position": "1", "interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(
        "position-a-bool",
        '{"playback_position": true, "interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(
        "position-infinite",
        '{"playback_position": 1e999, "interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(
        "position-nan",
        '{"playback_position": NaN, "interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(  # issue 13 item 9: float() of it overflowed out of the handler into the SDK
        "position-a-330-digit-integer",
        '{"playback_position": 1' + "0" * 330 + ', "interrupted": false}',
        (APP, MALFORMED + "playback_position must be a finite number"),
    ),
    rpc(  # past Python's int-to-string limit: json refuses to parse it
        "position-a-5000-digit-integer",
        '{"playback_position": 1' + "0" * 5000 + ', "interrupted": false}',
        (APP, MALFORMED + "payload is not JSON"),
    ),
    rpc(  # the runtime's own bound, not json's recursion limit (which differs by interpreter)
        "nested-2000-deep",
        "[" * 2000 + "]" * 2000,
        (APP, MALFORMED + "payload nests deeper than 32 levels"),
    ),
    rpc(  # one past the bound; brackets inside a string do not count
        "nested-33-deep",
        '{"interrupted": false, "playback_position": 1, "x": "[[[[", "y": '
        + "[" * 32
        + "]" * 32
        + "}",
        (APP, MALFORMED + "payload nests deeper than 32 levels"),
    ),
    rpc(  # at the bound: parsed, and judged on its fields
        "nested-32-deep",
        '{"interrupted": 1, "playback_position": 1, "x": "[[[[", "y": ' + "[" * 31 + "]" * 31 + "}",
        (APP, MALFORMED + "interrupted must be true or false"),
    ),
    rpc(
        "position-negative",
        '{"playback_position": -1, "interrupted": false}',
        (APP, MALFORMED + "playback_position must be >= 0"),
    ),
    rpc(
        "interrupted-missing",
        '{"playback_position": 1.0}',
        (APP, MALFORMED + "interrupted must be true or false"),
    ),
    rpc(
        "interrupted-a-string",
        '{"playback_position": 1.0, "interrupted": "no"}',
        (APP, MALFORMED + "interrupted must be true or false"),
    ),
    rpc(
        "from-the-user",
        '{"playback_position": 1.0, "interrupted": false}',
        (APP, "lk.playback_finished is accepted only from the avatar"),
        caller=USER,
    ),
    rpc(
        "no-avatar-route",
        '{"playback_position": 1.0, "interrupted": false}',
        (UNSUPPORTED, "Method not supported"),  # nobody registered it: the SDK's own answer
        avatar=False,
    ),
    # -- session requests (simulator -> agent) ------------------------------------------------
    request(
        "finalize-success-a-string",
        "finalize_simulation",
        {"provisional_success": "yes"},
        "malformed finalize_simulation: provisional_success has the wrong type",
    ),
    request(
        "finalize-success-a-float",
        "finalize_simulation",
        {"provisional_success": 1.5},
        "malformed finalize_simulation: provisional_success has the wrong type",
    ),
    request(
        "finalize-reason-a-number",
        "finalize_simulation",
        {"provisional_reason": 7},
        "malformed finalize_simulation: provisional_reason has the wrong type",
    ),
    request(
        "finalize-both-wrong",
        "finalize_simulation",
        {"provisional_success": "yes", "provisional_reason": 7},
        "malformed finalize_simulation: provisional_reason, provisional_success has the wrong type",
    ),
    request(
        "finalize-not-a-simulation",
        "finalize_simulation",
        {"provisional_success": True},
        "this job is not a simulation",
        simulation=False,
    ),
    request(
        "finalize-from-someone-else",
        "finalize_simulation",
        {"provisional_success": True},
        NOT_THE_SIMULATOR,
        caller=USER,  # in the room, without the lk.simulator attribute
    ),
    request("unknown-kind", "launch_rockets", {}, "unknown request kind"),
    request(
        "run-input-text-a-number",
        "run_input",
        {"text": 5},
        "malformed run_input: text has the wrong type",
    ),
    request("no-session-attached", "get_chat_history", {}, NO_ACTIVE_SESSION, session=False),
    Bad("wire", "not-a-message", b"\xff\xff\xff", "unreadable session message"),
    # -- room events with the wrong argument types ----------------------------------------------
    room(
        "joined-a-string",
        "participant_connected",
        ("garbage",),
        "expected a participant, got str",
    ),
    room(
        "joined-nothing",
        "participant_connected",
        (),
        "not enough values to unpack (expected 1, got 0)",
    ),
    room("left-a-number", "participant_disconnected", (42,), "expected a participant, got int"),
    room(
        "track-two-strings",
        "track_published",
        ("a", "b"),
        "expected a publication and a participant, got str, str",
    ),
    room("muted-one-argument", "track_muted", (None,), "expected 2 arguments, got 1"),
    room(
        "attributes-a-list",
        "participant_attributes_changed",
        (["lk.simulator"], None),
        "expected (changed attributes, participant)",
    ),
    room(
        "connection-state-nothing",
        "connection_state_changed",
        (),
        "not enough values to unpack (expected 1, got 0)",
    ),
    # -- steps a running scenario refuses -----------------------------------------------------
    step(
        "joins-twice",
        [{"event": "participant_connected", "identity": USER}],
        "ValueError: participant 'user' is already in the room",
    ),
    step(
        "attributes-of-a-stranger",
        [{"event": "attributes_changed", "identity": "ghost", "attributes": {"a": "1"}}],
        "ValueError: participant 'ghost' is not in the room",
    ),
    step(
        "session-started-twice",
        [{"event": "session.start"}],
        "RuntimeError: session 'a' is already started",
    ),
    step(
        "attach-under-a-taken-name",
        [{"event": "session.attach", "session": "a"}],
        "ValueError: a session named 'a' already exists",
    ),
    step(
        "avatar-without-one-configured",
        [{"event": "avatar.start"}],
        "RuntimeError: no avatar configured (config.avatar_identity)",
        avatar_identity=None,
    ),
    # -- scenario files (agent-runtime simulate) ------------------------------------------------
    scenario("not-utf8", b"\xff\xfename: x\n", "not a UTF-8 text file (invalid start byte)"),
    # a payload no simulator could send is the file's mistake, named before anything runs
    scenario(
        "finalize-payload-unknown-field",
        step_file(
            "{at: 0, event: session_request, caller: simulator, "
            "request: finalize_simulation, payload: {colour: red}}"
        ),
        "step 1 (session_request): field payload: finalize_simulation has no field 'colour' "
        "(fields: provisional_success, provisional_reason)",
    ),
    scenario(
        "unknown-kind-with-payload",
        step_file(
            "{at: 0, event: session_request, caller: simulator, "
            "request: launch_rockets, payload: {count: 3}}"
        ),
        "step 1 (session_request): field payload: unknown request kind 'launch_rockets' "
        "cannot carry a payload",
    ),
    scenario(
        "finalize-payload-without-a-wire-form",
        step_file(
            "{at: 0, event: session_request, caller: simulator, "
            "request: finalize_simulation, payload: {provisional_success: [true]}}"
        ),
        "step 1 (session_request): field payload: finalize_simulation.provisional_success: "
        "cannot put a list on the wire",
    ),
    scenario("a-list", "- 1\n", "a scenario is a mapping with name and steps"),
    scenario("no-steps", "name: x\n", "'steps' must be a non-empty list"),
    scenario(
        "step-a-string",
        "name: x\nsteps: [go]\n",
        "step 1: a step is a mapping with 'at' and 'event'",
    ),
    scenario(
        "unknown-event",
        "name: x\nsteps: [{at: 0, event: session.explode}]\n",
        "step 1 (session.explode): unknown event 'session.explode'; known events: "
        + ", ".join(STEP_EVENTS),
    ),
    scenario(
        "no-at",
        "name: x\nsteps: [{event: session.start}]\n",
        "step 1 (session.start): missing 'at' (seconds)",
    ),
    scenario(
        "at-a-word",
        "name: x\nsteps: [{at: soon, event: session.start}]\n",
        "step 1 (session.start): field at: Input should be a valid number (got 'soon')",
    ),
    scenario(
        "at-in-an-exponent-yaml-reads-as-text",
        "name: x\nsteps: [{at: 1e5, event: session.start}]\n",
        "step 1 (session.start): field at: Input should be a valid number ('1e5' is text to "
        "YAML: a number with an exponent needs a dot and a sign, as 1.0e+5)",
    ),
    scenario(
        "at-quoted-is-text-with-no-exponent-hint",
        "name: x\nsteps: [{at: '5', event: session.start}]\n",
        "step 1 (session.start): field at: Input should be a valid number (got '5')",
    ),
    scenario(
        "unknown-reason",
        "name: x\nsteps: [{at: 0, event: participant_disconnected, identity: u, reason: BORED}]\n",
        f"step 1 (participant_disconnected): field reason: Input should be {REASONS} (got 'BORED')",
    ),
    scenario(
        "reason-in-lower-case",  # reasons are livekit's upper-case names: no hint said so
        "name: x\nsteps: [{at: 0, event: participant_disconnected, identity: u, "
        "reason: client_initiated}]\n",
        f"step 1 (participant_disconnected): field reason: Input should be {REASONS} "
        "(got 'client_initiated') (did you mean 'CLIENT_INITIATED'?)",
    ),
    scenario(
        "kind-in-upper-case",
        "name: x\nparticipants: [{identity: u, kind: SIP}]\nsteps: [{at: 0, event: end}]\n",
        "participants.0.kind: Input should be "
        + ", ".join(repr(k) for k in PARTICIPANT_KINDS[:-1])
        + f" or {PARTICIPANT_KINDS[-1]!r} (got 'SIP') (did you mean 'sip'?)",
    ),
    scenario(
        "attribute-not-a-string",
        "name: x\nsteps:\n- {at: 0, event: participant_connected, identity: u, attributes: {a: 1}}",
        "step 1 (participant_connected): field attributes.a: Input should be a valid string "
        "(got 1)",
    ),
    scenario(
        "time-goes-backwards",
        "name: x\nsteps: [{at: 5, event: session.start}, {at: 2, event: end}]\n",
        "step 2 (end): time goes backwards (2.0 after 5.0)",
    ),
    scenario(
        "end-not-last",
        "name: x\nsteps: [{at: 0, event: end}, {at: 1, event: session.start}]\n",
        "step 1 (end): 'end' must be the last step",
    ),
    scenario("no-name", "steps: [{at: 0, event: end}]\n", "name: Field required"),
    # a misspelt key is named (it said "missing 'event'", "field identity: Field required")
    scenario(
        "misspelt-event-key",
        "name: x\nsteps: [{at: 0, event: session.start}, {at: 1, evnet: end}]\n",
        "step 2: field evnet: Extra inputs are not permitted (did you mean 'event'?)",
    ),
    scenario(
        "misspelt-field-key",
        "name: x\nsteps: [{at: 0, event: participant_connected, identiy: alice}]\n",
        "step 1 (participant_connected): field identiy: Extra inputs are not permitted "
        "(did you mean 'identity'?)",
    ),
    # a misspelt machine or state in expect is the file's error (it read as a failed
    # expectation, "expected 'serving', got None")
    scenario(
        "expect-unknown-machine",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {final_states: {jobb: serving}}\n",
        "expect.final_states: no machine 'jobb' (machines: " + ", ".join(MACHINES) + ")",
    ),
    scenario(
        "expect-unknown-state",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {final_states: {job: servng}}\n",
        "expect.final_states: job has no state 'servng' (states: serving, "
        "awaiting_finalize, closing, closed)",
    ),
    # a misspelt fact too (it ran the whole scenario, then failed it: exit 1, not 2)
    scenario(
        "expect-unknown-fact",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {facts: {verdit: null}}\n",
        "expect.facts: no fact 'verdit' (facts: " + ", ".join(FACTS) + ")",
    ),
    # a fact's value of the wrong kind too (it ran, then failed: "expected 'soon', got None")
    scenario(
        "expect-fact-of-the-wrong-kind",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {facts: {job_closed_at: soon}}\n",
        "expect.facts: job_closed_at is seconds or null, not 'soon'",
    ),
    scenario(
        "expect-fact-list-of-the-wrong-kind",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {facts: {reprompts: [1, true]}}\n",
        "expect.facts: reprompts is a list of seconds, not [1, True]",
    ),
    # an audio route there is not (it ran, then failed: exit 1)
    scenario(
        "expect-audio-output-no-route",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {facts: {audio_output: loud}}\n",
        "expect.facts: audio_output is avatar or room or none, not 'loud'",
    ),
    # AgentJob refuses it only as the run begins (a trial: earlier files ran first)
    scenario(
        "retry-without-an-avatar",
        "name: x\nconfig: {retry_avatar: {attempts: 1}}\nsteps: [{at: 0, event: end}]\n",
        "config: retry_avatar is given without an avatar_identity",
    ),
    # AgentJob refuses it too; the participant link waited forever for the avatar
    scenario(
        "participant-is-the-avatar",
        "name: x\nconfig: {avatar_identity: av, participant_identity: av}\n"
        "steps: [{at: 0, event: end}]\n",
        "config: participant_identity 'av' is the avatar's identity (avatar_identity 'av'): "
        "the link never follows the avatar, which publishes on the agent's behalf",
    ),
    scenario(
        "expect-violations-unchecked",
        "name: x\nsteps: [{at: 0, event: end}]\nexpect: {facts: {invariant_violations: []}}\n",
        "expect: fact invariant_violations is only there with an 'invariants' entry",
    ),
    scenario(
        "negative-timeout",
        "name: x\nconfig: {join_timeout: -1}\nsteps: [{at: 0, event: end}]\n",
        "config.join_timeout: Input should be greater than 0 (got -1)",
    ),
    # issue 13 item 6: values the loader took and the runtime refused (a traceback, a step
    # error); the scenario model now checks them through the runtime's own definitions
    scenario(
        "join-timeout-zero",
        step_file("{at: 0, event: session.start}", "config: {join_timeout: 0}\n"),
        "config.join_timeout: Input should be greater than 0 (got 0)",
    ),
    scenario(
        "join-timeout-infinite",
        step_file("{at: 0, event: session.start}", "config: {join_timeout: .inf}\n"),
        "config.join_timeout: Input should be a finite number (got inf)",
    ),
    scenario(
        "retry-backoff-infinite",
        step_file(
            "{at: 0, event: session.start}",
            "config: {retry_avatar: {attempts: 2, backoff: {initial: .inf}}}\n",
        ),
        "config.retry_avatar.backoff.initial: Input should be a finite number (got inf)",
    ),
    scenario(
        "grace-period-infinite",
        step_file("{at: 0, event: session.start}", "config: {grace_period: .inf}\n"),
        "config.grace_period: Input should be a finite number (got inf)",
    ),
    # a trial: the scenario file's error did not say the value, where AgentJob's does
    scenario(
        "grace-period-negative",
        step_file("{at: 0, event: session.start}", "config: {grace_period: -1}\n"),
        "config.grace_period: Input should be greater than or equal to 0 (got -1)",
    ),
    scenario(  # a long value is cut: the message stays one short line
        "reprompt-instructions-too-long",
        step_file(
            "{at: 0, event: session.start}",
            "config: {playout: {reprompt_instructions: " + "x" * 2001 + "}}\n",
        ),
        "config.playout.reprompt_instructions: String should have at most 2000 characters "
        "(got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...)",
    ),
    scenario(
        "avatar-identity-empty",
        step_file("{at: 0, event: session.start}", "config: {avatar_identity: ''}\n"),
        "config.avatar_identity: String should have at least 1 character (got '')",
    ),
    scenario(
        "avatar-identity-whitespace",
        step_file("{at: 0, event: session.start}", "config: {avatar_identity: '  '}\n"),
        "config.avatar_identity: String should have at least 1 character other than "
        "whitespace (got '  ')",
    ),
    scenario(
        "participant-identity-empty",
        step_file("{at: 0, event: session.start}", "config: {participant_identity: ''}\n"),
        "config.participant_identity: String should have at least 1 character (got '')",
    ),
    scenario(  # a trial: it ran, the link waiting for a participant nobody is
        "participant-identity-blank",
        step_file("{at: 0, event: session.start}", "config: {participant_identity: '  '}\n"),
        "config.participant_identity: String should have at least 1 character other than "
        "whitespace (got '  ')",
    ),
    scenario(
        "simulation-a-string",
        step_file("{at: 0, event: session.start}", "config: {simulation: 'yes'}\n"),
        "config.simulation: Input should be a valid boolean (got 'yes')",
    ),
    scenario(
        "at-true",
        step_file("{at: true, event: session.start}"),
        "step 1 (session.start): field at: Input should be a valid number (got True)",
    ),
    scenario(  # issue 13 item 7: it ran, and --json printed Infinity (not JSON)
        "at-infinite",
        step_file("{at: .inf, event: session.start}"),
        "step 1 (session.start): field at: Input should be a finite number (got inf)",
    ),
    scenario(
        "duplicate-key",
        "name: x\nname: y\nsteps: [{at: 0, event: end}]\n",
        "not valid YAML: duplicate key 'name' (line 2, column 1)",
    ),
    scenario(
        "duplicate-key-in-a-step",
        "name: x\nsteps: [{at: 0, event: end, at: 3}]\n",
        "not valid YAML: duplicate key 'at' (line 2, column 29)",
    ),
    scenario(  # a merge key may override: that is not a duplicate
        "merge-then-unknown-field",
        "name: x\nbase: &b {at: 0, event: end}\nsteps: [{<<: *b, at: 1}]\n",
        "base: Extra inputs are not permitted",
    ),
    scenario(
        "not-valid-yaml",
        "name: [unclosed\n",
        "not valid YAML: while parsing a flow sequence, did not find expected ',' or ']' "
        "(line 2, column 1)",
    ),
    # issue 13 item 5: a RecursionError, an alias bomb expanded into the output, a hang on
    # a FIFO, /dev/zero read until memory ran out
    scenario(
        "nested-500-deep",
        step_file(
            "{at: 0, event: rpc, method: m, caller: c, payload: " + "[" * 500 + "]" * 500 + "}"
        ),
        "nested deeper than 32 levels (line 2, column 89)",
    ),
    scenario(
        "nested-100000-deep",
        step_file(
            "{at: 0, event: rpc, method: m, caller: c, payload: "
            + "[" * 100_000
            + "]" * 100_000
            + "}"
        ),
        "nested deeper than 32 levels (line 2, column 1057)",  # libyaml stops at 1,000
    ),
    scenario(
        "alias-bomb",
        ALIAS_BOMB,
        "its aliases would expand it by more than 10,000 nodes",
    ),
    scenario(
        "alias-inside-itself",
        step_file("{at: 0, event: rpc, method: m, caller: c, payload: &p [1, *p]}"),
        "an alias refers to a collection that contains it (line 2, column 60)",
    ),
    # a new user's tries: Python's own ValueError or KeyError, a traceback and exit 1
    scenario(
        "integer-of-5000-digits",
        step_file("{at: 0, event: end}", config="config: {grace_period: 1" + "0" * 5000 + "}\n"),
        "not valid YAML: a number of more than 4300 digits (line 2, column 24)",
    ),
    scenario(
        "int-tag-on-a-word",
        step_file("{at: !!int soon, event: end}"),
        "not valid YAML: not a valid int: 'soon' (line 2, column 14)",
    ),
    scenario(
        "bool-tag-on-a-word",
        step_file("{at: 0, event: end}", config="config: {delete_room_on_close: !!bool maybe}\n"),
        "not valid YAML: not a valid bool: 'maybe' (line 2, column 32)",
    ),
    scenario("a-fifo", fifo, "cannot read: a FIFO, not a regular file"),
    scenario("dev-zero", dev_zero, "cannot read: a character device, not a regular file"),
    scenario(
        "too-large",
        "name: x\nsteps: [{at: 0, event: end}]\n" + "#" * 2000 + "\n",
        "cannot read: larger than 1,000 bytes, the limit for a scenario file",
        limits={"MAX_SCENARIO_BYTES": 1000},
    ),
    # issue 13 item 11: a directory runs its *.yaml; one with none is an error naming it
    scenario("empty-directory", empty_dir, "a directory with no *.yaml file in it"),
    # ... not even a.yml, which it did not mention
    scenario(
        "yml-only-directory",
        yml_only_dir,
        "a directory with no *.yaml file in it (a.yml: a directory runs its *.yaml only; "
        "name a .yml file to run it)",
    ),
    scenario(
        "unknown-setting",
        "name: x\nconfig: {colour: 1}\nsteps: [{at: 0, event: end}]\n",
        "config.colour: Extra inputs are not permitted",
    ),
    scenario(
        "empty-identity",
        "name: x\nparticipants: [{identity: ''}]\nsteps: [{at: 0, event: end}]\n",
        "participants.0.identity: String should have at least 1 character (got '')",
    ),
    # a trial: a step's error did not say the value given, where config's did
    scenario(
        "say-too-long",
        step_file("{at: 0, event: agent.say, duration: 11}"),
        "step 1 (agent.say): field duration: Input should be less than or equal to 10 (got 11)",
    ),
    scenario(  # a long value is cut, as config's: the message stays one short line
        "reason-too-long",
        step_file(
            "{at: 0, event: participant_disconnected, identity: u, reason: " + "X" * 80 + "}"
        ),
        f"step 1 (participant_disconnected): field reason: Input should be {REASONS} "
        "(got 'XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX...)",
    ),
    scenario(
        "participant-kind-unknown",
        "name: x\nparticipants: [{identity: u, kind: robot}]\nsteps: [{at: 0, event: end}]\n",
        "participants.0.kind: Input should be "
        + ", ".join(repr(k) for k in PARTICIPANT_KINDS[:-1])
        + f" or {PARTICIPANT_KINDS[-1]!r} (got 'robot')",
    ),
    scenario(
        "empty-name",  # a report, trace or recorded file named by nothing
        "name: '  '\nsteps: [{at: 0, event: end}]\n",
        "name: the scenario's name is empty",
    ),
    scenario(
        "name-of-two-lines",  # a report's one line per scenario became two
        'name: "two\\nlines"\nsteps: [{at: 0, event: end}]\n',
        "name: the scenario's name holds a control character or a line break ('\\n'): "
        "it is one line",
    ),
    scenario(
        "name-with-a-line-separator",  # U+2028: a line break to every reader of the report
        'name: "two\\u2028lines"\nsteps: [{at: 0, event: end}]\n',
        "name: the scenario's name holds a control character or a line break ('\\u2028'): "
        "it is one line",
    ),
    scenario(
        "participant-twice",
        "name: x\nparticipants: [{identity: u}, {identity: u, kind: sip}]\n"
        "steps: [{at: 0, event: end}]\n",
        "participants: u is listed twice",
    ),
    # -- trace files (agent-runtime replay) ---------------------------------------------------
    trace("not-utf8", b"\xff\xfe", "1: not a UTF-8 text file (invalid start byte)"),
    trace(
        "not-json",
        "{not json",
        "1: not JSON (Expecting property name enclosed in double quotes at column 2)",
    ),
    trace("a-list", "[1, 2]", "1: a record is a JSON object, not list"),
    trace(
        "unknown-field",
        record(colour="red"),
        "1: field 'colour': not a field of this version's records (a trace of another version?)",
    ),
    trace("fields-missing", json.dumps({"kind": "transition"}), "1: field 't': Field required"),
    trace(
        "unknown-kind",
        record(kind="teleport"),
        "1: field 'kind': Input should be 'transition', 'ignore', 'reject', 'effect', 'stale' "
        "or 'input'",
    ),
    trace(
        "machine-a-number", record(machine=5), "1: field 'machine': Input should be a valid string"
    ),
    trace(
        "machine-empty", record(machine=""), "1: a transition record needs a non-empty 'machine'"
    ),
    trace(
        "effects-a-string",
        record(effects="run_close"),
        "1: field 'effects': Input should be a valid list",
    ),
    trace(
        "guard-not-a-bool",
        record(guards={"hold_needed": 1}),
        "1: field 'guards.hold_needed': Input should be a valid boolean",
    ),
    trace(
        "unknown-machine",
        record(machine="robot"),
        "1: unknown machine 'robot'; machines: avatar, job, session_host, participant, "
        "room_deletion, finalize, playout, session, agent_job",
    ),
    # issue 13 item 8: tracebacks, and traces that said nothing passing as agreement
    trace(
        "integer-of-5000-digits",
        record().replace('"t": 0', '"t": 1' + "0" * 5000),
        "1: not JSON (a number of more than 4300 digits)",
    ),
    trace("nested-100000-deep", "[" * 100_000 + "]" * 100_000, "1: not JSON (nested too deep)"),
    trace("t-a-word", record(t="yesterday"), "1: field 't': Input should be a valid number"),
    trace(
        "t-nan",
        record().replace('"t": 0', '"t": NaN'),
        "1: field 't': Input should be a finite number",
    ),
    trace("t-negative", record(t=-1), "1: field 't': Input should be greater than or equal to 0"),
    trace(
        "unknown-guard",
        record(guards={"hold_needed": False, "colour": True}),
        "1: machine 'job' has no guard 'colour'",
    ),
    trace("empty", "", "nothing to replay: the trace is empty"),
    trace(
        "effects-only",
        json.dumps(
            {"t": 0, "kind": "effect", "machine": "job", "instance": "j", "effect": "run_close"}
        ),
        "nothing to replay: 1 record, none of them a decision (transition, ignore, reject)",
    ),
    trace("a-fifo", fifo, "cannot read the trace: a FIFO, not a regular file"),
    trace("dev-zero", dev_zero, "cannot read the trace: a character device, not a regular file"),
    trace(
        "too-large",
        record() + "\n" + " " * 2000,
        "cannot read the trace: larger than 1,000 bytes, the limit for a trace file",
        limits={"MAX_TRACE_BYTES": 1000},
    ),
]


@pytest.mark.parametrize("bad", TABLE, ids=str)
async def test_bad_input_gets_a_clear_error_and_changes_nothing(
    bad: Bad, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with quiet_sdk_logs():
        await CHECKS[bad.where](bad, tmp_path, capsys, caplog)


def test_every_kind_of_bad_input_has_rows() -> None:
    assert {b.where for b in TABLE} == set(CHECKS)
    assert len({str(b) for b in TABLE}) == len(TABLE), "row names repeat"


# -- the checks, one per way in ------------------------------------------------------------------


async def check_rpc(bad: Bad, *_: Any) -> None:
    w = World(Config(simulation=False, avatar=bad.options.get("avatar", True)))
    w.room.add_participant(USER)
    await w.start()
    await w.start_session()
    if w.avatar is not None:
        await w.start_avatar()
        w.room.add_participant(AVATAR, kind="agent")
        w.room.publish_track(AVATAR, "video")
    speech = w.primary.say("hello", audio=frames(5), add_to_chat_ctx=False)
    await w.quiesce()

    def snapshot() -> tuple[Any, ...]:
        sink = w.avatar.installed_sink if w.avatar is not None else None
        return (
            w.avatar_state,
            sink._pending_playback_count if sink is not None else None,
            speech.done(),
            len(w.trace.records),
        )

    before = snapshot()
    if w.avatar is not None:
        assert before[:3] == ("joined", 1, False)  # a segment is playing on the avatar
    with pytest.raises(rtc.RpcError) as err:
        await w.room.invoke_rpc(
            "lk.playback_finished", bad.options.get("caller", AVATAR), bad.given
        )
    assert (err.value.code, err.value.message) == bad.error
    await w.quiesce()
    assert snapshot() == before
    await w.aclose()


async def check_request(bad: Bad, *_: Any) -> None:
    simulation = bad.options.get("simulation", True)
    w = World(Config(simulation=simulation, avatar=False))
    w.room.add_participant(SIMULATOR, attributes={"lk.simulator": "1"})
    w.room.add_participant(USER)
    await w.start()
    if bad.options.get("session", True):
        await w.start_session()
    await w.quiesce()

    def snapshot() -> tuple[Any, ...]:
        moved = [r for r in w.trace.records if r.kind == "transition" and r.source != r.dest]
        return (w.job.state, w.job.host_state, w.job.finalize_answered, len(moved))

    before = snapshot()
    kind, payload = bad.given
    rid = await w.request(kind, payload, caller=bad.options.get("caller", SIMULATOR))
    await w.quiesce()
    (reply,) = w.replies[rid]
    assert reply.error == bad.error
    assert snapshot() == before
    if simulation:
        # the one-time finalize was not spent on it: a good one gets the agent's verdict
        good = await w.request("finalize_simulation", {"provisional_success": True})
        await w.quiesce()
        (answer,) = w.replies[good]
        assert not answer.HasField("error")
        assert answer.finalize_simulation.user_verdict.reason == VETO
    await w.aclose()


async def check_wire(bad: Bad, _: Path, __: Any, caplog: pytest.LogCaptureFixture) -> None:
    w = World(Config(simulation=False, avatar=False))
    await w.start()
    await w.start_session()
    await w.quiesce()
    before = (w.job.state, w.job.host_state, len(w.trace.records))
    with caplog.at_level(logging.WARNING, logger="agent_runtime.session_host"):
        w.agent_end._inbox.put_nowait(bad.given)  # straight onto the agent's end of the wire
        await w.quiesce()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("agent_runtime")] == [
        bad.error
    ]
    assert (w.job.state, w.job.host_state, len(w.trace.records)) == before
    rid = await w.request("ping")  # the host still reads and answers
    await w.quiesce()
    assert [r.HasField("error") for r in w.replies[rid]] == [False]
    await w.aclose()


async def check_room(bad: Bad, _: Path, __: Any, caplog: pytest.LogCaptureFixture) -> None:
    # the job alone listens: the SDK's own listeners (RoomIO) would choke on these first
    w = World(Config(simulation=True, avatar=False))
    w.room.add_participant(SIMULATOR, attributes={"lk.simulator": "1"})
    await w.start()
    await w.quiesce()
    facts: list[Any] = []
    w.events.subscribe(facts.append)
    before = (w.job.state, w.job.simulators, len(w.trace.records), w.room.listener_count())
    event, args = bad.given
    with caplog.at_level(logging.WARNING, logger="agent_runtime.room_events"):
        w.room.emit(event, *args)  # the World records anything raised to the emitter
        await w.quiesce()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("agent_runtime")] == [
        f"ignored {event} with unexpected arguments: {bad.error}"
    ]
    assert w.problems.escaped_callbacks == []
    assert facts == []
    assert (w.job.state, w.job.simulators, len(w.trace.records), w.room.listener_count()) == before
    await w.aclose()


async def check_step(bad: Bad, *_: Any) -> None:
    def scenario_with(extra: list[dict[str, Any]]) -> Any:
        config = {"avatar_identity": AVATAR, "simulation": True, **bad.options}
        return parse_scenario(
            {
                "name": "bad step",
                "config": config,
                "participants": [{"identity": USER}, {"identity": SIMULATOR}],
                "steps": [
                    {"at": 0, "event": "session.start"},
                    *({"at": 1, **s} for s in extra),
                    {"at": 2, "event": "end"},
                ],
            }
        )

    refused = await run_scenario(scenario_with(bad.given))
    control = await run_scenario(scenario_with([]))
    assert refused["facts"]["step_errors"] == [f"t=1 {bad.given[0]['event']}: {bad.error}"]
    for key in ("final_states", "transitions", "effects"):
        assert refused[key] == control[key], key
    assert refused["facts"]["session_replies"] == []


async def check_scenario(
    bad: Bad, tmp_path: Path, capsys: pytest.CaptureFixture[str], _: Any
) -> None:
    path = given_path(bad, tmp_path, "bad.yaml")
    out = tmp_path / "out.jsonl"
    line = f"{path}: {bad.error}"
    with limits(bad):
        assert main(["simulate", str(path), "--trace", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"invalid scenario: {line}\n"
        assert captured.out == "" and not out.exists()  # nothing ran
        # --json answers in JSON on stdout (issue 13 item 7)
        assert main(["simulate", str(path), "--json"]) == 2
        captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ok": False, "file": str(path), "error": line}
    assert captured.err == f"invalid scenario: {line}\n"


async def check_trace(bad: Bad, tmp_path: Path, capsys: pytest.CaptureFixture[str], _: Any) -> None:
    path = given_path(bad, tmp_path, "bad.jsonl")
    before = path.read_bytes() if path.is_file() else None
    sep = ":" if bad.error[0].isdigit() else ": "
    line = f"{path}{sep}{bad.error}"
    with limits(bad):
        assert main(["replay", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"agent-runtime replay: {line}\n"
        assert captured.out == ""  # no report
        assert main(["replay", str(path), "--json"]) == 2
        captured = capsys.readouterr()
    assert json.loads(captured.out) == {"ok": False, "file": str(path), "error": line}
    assert captured.err == f"agent-runtime replay: {line}\n"
    if before is not None:
        assert path.read_bytes() == before  # the file untouched


def given_path(bad: Bad, tmp: Path, name: str) -> Path:
    if callable(bad.given):
        made: Path = bad.given(tmp)
        return made
    path = tmp / name
    write(path, bad.given)
    return path


@contextlib.contextmanager
def limits(bad: Bad) -> Iterator[None]:
    """The size bounds a row lowers (so a test need not write megabytes)."""
    from agent_runtime.observe import files

    with pytest.MonkeyPatch.context() as mp:
        for name, value in bad.options.get("limits", {}).items():
            mp.setattr(files, name, value)
        yield


def write(path: Path, content: str | bytes) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if content.endswith("\n") else content + "\n")


CHECKS: dict[str, Callable[..., Any]] = {
    "rpc": check_rpc,
    "request": check_request,
    "wire": check_wire,
    "room": check_room,
    "step": check_step,
    "scenario": check_scenario,
    "trace": check_trace,
}


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["replay", "--bogus", "x.jsonl"], "agent-runtime replay: unrecognized arguments: --bogus"),
        (["replay"], "agent-runtime replay: the following arguments are required: TRACE.jsonl"),
        (["fuzz"], "agent-runtime fuzz: the following arguments are required: MODULE:SERVER"),
        (["nope"], "agent-runtime: argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_command(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    # argparse printed the usage too, and the top level's for a command's unknown option
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(line), err
    assert err.rstrip().endswith("--help)")
