"""Scenario files: the black-box contract of ``agent-runtime simulate``.

A scenario is YAML: ``name``, optional ``config``, ``participants`` present at t=0, and
``steps`` (``{at: seconds, event: NAME, ...fields}``), plus an optional ``expect`` block.
Loading validates everything up front; an invalid file raises ``ScenarioError`` naming the
file, the step and what is wrong, before anything runs.
"""

from __future__ import annotations

import difflib
import unicodedata
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent_runtime.observe import files
from agent_runtime.settings import (
    PARTICIPANT_KINDS,
    AvatarRetry,
    Flag,
    HoldSeconds,
    Identity,
    JobSettings,
    PlayoutOptions,
    RoomIdentity,
    WaitSeconds,
    playout_flag,
)
from agent_runtime.testing._scenario_errors import dotted, first_error, unknown_key
from agent_runtime.testing.safe_yaml import YamlRefused, load_yaml, yaml_problem
from agent_runtime.testing.scenario_expect import FACT_KINDS, FACTS, Expect, InvariantNumber
from agent_runtime.testing.scenario_steps import (
    CLOSE_REASONS,
    DISCONNECT_REASONS,
    HELD_CALLS,
    MAX_SCENARIO_SECONDS,
    STEP_ADAPTER,
    STEP_EVENTS,
    STEP_KEYS,
    STEP_MODELS,
    AgentSay,
    AttributesChanged,
    AvatarClose,
    AvatarStart,
    AvatarStartError,
    CtxShutdown,
    End,
    HeldCall,
    HeldEnd,
    Instant,
    JobAclose,
    JobRequestRoomDeletion,
    JobShutdown,
    Kind,
    ParticipantConnected,
    ParticipantDisconnected,
    Reason,
    RoomConnected,
    RoomDisconnected,
    Rpc,
    RpcOutcome,
    SessionAttach,
    SessionClose,
    SessionInterrupt,
    SessionRequest,
    SessionStart,
    SpeechSeconds,
    Step,
    Strict,
    TrackMuted,
    TrackPublished,
    UserSpeech,
    UserState,
)

# the steps and the expect block have modules of their own; every name stays here too
__all__ = [
    "CLOSE_REASONS",
    "DISCONNECT_REASONS",
    "FACTS",
    "FACT_KINDS",
    "HELD_CALLS",
    "MAX_SCENARIO_SECONDS",
    "PARTICIPANT_KINDS",
    "STEP_EVENTS",
    "AgentSay",
    "AgentVerdict",
    "AttributesChanged",
    "AvatarClose",
    "AvatarStart",
    "AvatarStartError",
    "Config",
    "CtxShutdown",
    "End",
    "Expect",
    "HeldCall",
    "HeldEnd",
    "Instant",
    "InvariantNumber",
    "JobAclose",
    "JobRequestRoomDeletion",
    "JobShutdown",
    "Kind",
    "Participant",
    "ParticipantConnected",
    "ParticipantDisconnected",
    "Reason",
    "RoomConnected",
    "RoomDisconnected",
    "Rpc",
    "RpcOutcome",
    "Scenario",
    "ScenarioError",
    "SessionAttach",
    "SessionClose",
    "SessionInterrupt",
    "SessionRequest",
    "SessionStart",
    "SpeechSeconds",
    "Step",
    "TrackMuted",
    "TrackPublished",
    "UserSpeech",
    "UserState",
    "load_scenario",
    "name_problem",
    "parse_scenario",
]


class ScenarioError(Exception):
    """The scenario file is invalid; the message names the file, the step and the problem."""


class AgentVerdict(Strict):
    success: bool = True
    reason: str = ""


_DEFAULT = {name: f.default for name, f in JobSettings.model_fields.items()}


class Config(Strict):
    """Runtime settings for one scenario: the runtime's own definitions (``settings.py``),
    so a value a scenario accepts is one the runtime runs with, and its own defaults."""

    avatar_identity: Identity | None = None  # set: the job runs an avatar with this identity
    join_timeout: WaitSeconds = _DEFAULT["join_timeout"]
    # true/false (a late join routes again, or not) or the policy's fields (AvatarRetry)
    retry_avatar: AvatarRetry = AvatarRetry()
    session_end_timeout: HoldSeconds = _DEFAULT["session_end_timeout"]
    close_timeout: WaitSeconds = _DEFAULT["close_timeout"]
    grace_period: HoldSeconds = _DEFAULT["grace_period"]
    session_close_timeout: WaitSeconds = _DEFAULT["session_close_timeout"]
    close_on_disconnect: Flag = _DEFAULT["close_on_disconnect"]
    participant_identity: Identity | None = _DEFAULT["participant_identity"]
    delete_room_on_close: Flag = _DEFAULT["delete_room_on_close"]
    # the playout machine: true (its defaults), false (None) or PlayoutOptions' fields;
    # unsaid (not in model_fields_set), AgentJob's default: on with an avatar, else off
    playout: PlayoutOptions | None = None
    # the scripted re-prompt (standing in for the LLM's reply): seconds of audio it says
    reprompt_speech: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False, strict=True)] = 1.0
    simulation: Flag = False
    room_connected: Flag = True  # whether the room is connected at t=0
    agent_verdict: AgentVerdict = AgentVerdict()  # what on_simulation_end decides
    # the outside calls that wait for a held.end step instead of ending at once
    hold: tuple[HeldCall, ...] = ()

    @field_validator("hold")
    @classmethod
    def _hold_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({c for c in v if v.count(c) > 1})
        if twice:
            raise PydanticCustomError("hold", "{call} is held twice", {"call": twice[0]})
        return v

    @field_validator("retry_avatar", mode="before")
    @classmethod
    def _retry(cls, v: Any) -> Any:
        return AvatarRetry(rejoin=v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _retry_needs_an_avatar(self) -> Config:
        # AgentJob refuses it too, but only once the run began: earlier files had run
        if self.avatar_identity is None and self.retry_avatar != AvatarRetry():
            raise PydanticCustomError(
                "retry_without_avatar", "retry_avatar is given without an avatar_identity", {}
            )
        return self

    @model_validator(mode="after")
    def _link_never_follows_the_avatar(self) -> Config:
        # AgentJob refuses it too, once the run began; the participant stayed waiting
        who = self.participant_identity
        if who is not None and who == self.avatar_identity:
            raise PydanticCustomError(
                "participant_is_avatar",
                "participant_identity '{who}' is the avatar's identity (avatar_identity "
                "'{who}'): the link never follows the avatar, which publishes on the "
                "agent's behalf",
                {"who": who},
            )
        return self

    @field_validator("playout", mode="before")
    @classmethod
    def _playout(cls, v: Any) -> Any:
        return playout_flag(v)


class Participant(Strict):
    identity: RoomIdentity
    kind: Kind = "standard"
    attributes: dict[str, str] = Field(default_factory=dict)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a scenario, if it cannot: reports, traces and recorded files
    name the scenario by it, on one line."""
    if not name.strip():
        return "the scenario's name is empty"
    # a control character, or a line or paragraph separator (what splits a line)
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        why = f"a control character or a line break ({bad!r})"
        return f"the scenario's name holds {why}: it is one line"
    return None


class Scenario(Strict):
    name: str
    description: str = ""
    config: Config = Config()
    participants: tuple[Participant, ...] = ()
    steps: tuple[Step, ...]
    expect: Expect | None = None

    @field_validator("name")
    @classmethod
    def _named(cls, v: str) -> str:
        problem = name_problem(v)
        if problem is not None:
            raise PydanticCustomError("bad_name", problem, {})
        return v

    @field_validator("participants")
    @classmethod
    def _each_once(cls, v: tuple[Participant, ...]) -> tuple[Participant, ...]:
        ids = [p.identity for p in v]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise PydanticCustomError("twice", "{who} is listed twice", {"who": twice[0]})
        return v


def load_scenario(path: str | Path, *, source: str | None = None) -> Scenario:
    """Parse and validate a scenario file, or raise ``ScenarioError`` saying what is wrong.
    Messages name the file as ``source`` (default: ``path`` as given)."""
    path = Path(path)
    name = str(path) if source is None else source
    try:
        data = files.read_input(path, limit=files.MAX_SCENARIO_BYTES, what="a scenario file")
        raw = load_yaml(data.decode("utf-8"))
    except files.InputFileError as e:
        raise ScenarioError(f"{name}: cannot read: {e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{name}: not a UTF-8 text file ({e.reason})") from None
    except YamlRefused as e:
        raise ScenarioError(f"{name}: {e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{name}: not valid YAML: {yaml_problem(e)}") from None
    return parse_scenario(raw, source=name)


def parse_scenario(raw: Any, *, source: str = "<scenario>") -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping with name and steps")
    steps_raw = raw.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise ScenarioError(f"{source}: 'steps' must be a non-empty list")
    steps: list[Step] = []
    last_at = 0.0
    for i, s in enumerate(steps_raw):
        label = f"step {i + 1}"
        if isinstance(s, dict) and "event" in s:
            label += f" ({s['event']})"
        if not isinstance(s, dict):
            raise ScenarioError(f"{source}: {label}: a step is a mapping with 'at' and 'event'")
        unknown = [str(k) for k in s if k not in STEP_KEYS]
        for key in ("event", "at"):
            near = difflib.get_close_matches(key, unknown, n=1)
            if key not in s and near:
                raise ScenarioError(
                    f"{source}: {label}: field {near[0]}: {unknown_key(near[0], s, [key])}"
                )
        if "event" not in s:
            raise ScenarioError(f"{source}: {label}: missing 'event'")
        if s["event"] not in STEP_EVENTS:
            raise ScenarioError(
                f"{source}: {label}: unknown event {s['event']!r}; "
                f"known events: {', '.join(STEP_EVENTS)}"
            )
        if "at" not in s:
            raise ScenarioError(f"{source}: {label}: missing 'at' (seconds)")
        try:
            step = STEP_ADAPTER.validate_python(s)
        except ValidationError as e:
            errors = [{**err, "loc": err["loc"][1:]} for err in e.errors()]  # the event's tag
            # any field of a step names the value given, as config's do
            where, said = first_error(errors, STEP_MODELS[s["event"]], s)
            raise ScenarioError(f"{source}: {label}: field {dotted(where)}: {said}") from None
        if step.at < last_at:
            raise ScenarioError(
                f"{source}: {label}: time goes backwards ({step.at} after {last_at})"
            )
        if isinstance(step, End) and i != len(steps_raw) - 1:
            raise ScenarioError(f"{source}: {label}: 'end' must be the last step")
        last_at = step.at
        steps.append(step)
    try:
        scenario = Scenario.model_validate({**raw, "steps": steps})
    except ValidationError as e:
        # a config error names the value given, as AgentJob's error for the same setting;
        # a participant's too, as a step's
        where, said = first_error(e.errors(), Scenario, raw, valued=("config", "participants"))
        raise ScenarioError(f"{source}: {dotted(where)}: {said}") from None
    for i, step in enumerate(scenario.steps):
        if isinstance(step, HeldEnd) and step.call not in scenario.config.hold:
            raise ScenarioError(
                f"{source}: step {i + 1} (held.end): {step.call} is not held "
                "(list it in config.hold)"
            )
    return scenario
