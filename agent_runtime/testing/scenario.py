"""Scenario files: the black-box contract of ``agent-runtime simulate``.

A scenario is YAML: ``name``, optional ``config``, ``participants`` present at t=0, and
``steps`` (``{at: seconds, event: NAME, ...fields}``), plus an optional ``expect`` block.
Loading validates everything up front; an invalid file raises ``ScenarioError`` naming the
file, the step and what is wrong, before anything runs.
"""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from agent_runtime.observe import files
from agent_runtime.runtimes.avatar import Route
from agent_runtime.settings import (
    PARTICIPANT_KINDS,
    AvatarRetry,
    CloseReasonName,
    Flag,
    HoldSeconds,
    Identity,
    JobSettings,
    PlayoutOptions,
    RoomIdentity,
    WaitSeconds,
    playout_flag,
    shown,
)
from agent_runtime.testing.held import RESULTS
from agent_runtime.testing.invariants.checks import BY_NUMBER
from agent_runtime.testing.safe_yaml import YamlRefused, load_yaml, yaml_problem
from agent_runtime.testing.wire import REQUEST_KINDS, build_request
from statemachines.machines import MACHINES

# every rtc.ParticipantKind the SDK knows (settings derives the names from the enum): a
# Literal built from them, so a wrong kind is refused naming them all
if TYPE_CHECKING:
    Kind = str
else:
    Kind = Literal[PARTICIPANT_KINDS]
Reason = Literal[
    "UNKNOWN_REASON",
    "CLIENT_INITIATED",
    "DUPLICATE_IDENTITY",
    "SERVER_SHUTDOWN",
    "PARTICIPANT_REMOVED",
    "ROOM_DELETED",
    "STATE_MISMATCH",
    "JOIN_FAILURE",
    "MIGRATION",
    "SIGNAL_CLOSE",
    "ROOM_CLOSED",
    "USER_UNAVAILABLE",
    "USER_REJECTED",
    "SIP_TRUNK_FAILURE",
    "CONNECTION_TIMEOUT",
    "MEDIA_FAILURE",
    "AGENT_ERROR",
]

# the names a scenario may use, for messages and for tools that list them
DISCONNECT_REASONS: tuple[str, ...] = get_args(Reason)
CLOSE_REASONS: tuple[str, ...] = get_args(CloseReasonName)
HeldCall = Literal[
    "session_close", "simulation_end", "room_deletion", "shutdown_callback", "avatar_start"
]
HELD_CALLS: tuple[str, ...] = get_args(HeldCall)

# a scenario's instants (``at``) and the user's speech are bounded too, at a week of
# virtual time: far past any setting (an hour at most) and any job a trace is recorded from,
# near enough that a float still tells a millisecond timer's instant from the next (1e-10 s
# apart there; 1.0e+300 s is finite, yet a timer there fires at the instant it was armed,
# and 1.0e+300 + 15 is 1.0e+300)
MAX_SCENARIO_SECONDS = 604_800
Instant = Annotated[float, Field(ge=0, le=MAX_SCENARIO_SECONDS, allow_inf_nan=False, strict=True)]
SpeechSeconds = Annotated[
    float, Field(gt=0, le=MAX_SCENARIO_SECONDS, allow_inf_nan=False, strict=True)
]


class ScenarioError(Exception):
    """The scenario file is invalid; the message names the file, the step and the problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentVerdict(_Strict):
    success: bool = True
    reason: str = ""


_DEFAULT = {name: f.default for name, f in JobSettings.model_fields.items()}


class Config(_Strict):
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


class Participant(_Strict):
    identity: RoomIdentity
    kind: Kind = "standard"
    attributes: dict[str, str] = Field(default_factory=dict)


class _Step(_Strict):
    at: Instant  # virtual seconds from the start: finite, at most a week, never a bool


class SessionStart(_Step):
    event: Literal["session.start"]


class SessionClose(_Step):
    event: Literal["session.close"]
    reason: CloseReasonName = "user_initiated"


class SessionInterrupt(_Step):
    event: Literal["session.interrupt"]


class SessionAttach(_Step):
    event: Literal["session.attach"]
    session: str = Field(min_length=1)


class AgentSay(_Step):
    """The agent says ``duration`` seconds of audio: ``session.say(text, audio=...)`` with
    real frames, through the session's real audio chain (to the avatar's sink, or to the
    room's audio output, which plays in real time)."""

    event: Literal["agent.say"]
    duration: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False, strict=True)]
    text: str = "..."


class UserSpeech(_Step):
    """The user speaks for ``duration`` seconds: the session's user state is ``speaking``,
    then ``listening`` (set as the session's voice activity sets it)."""

    event: Literal["user.speech"]
    duration: SpeechSeconds


class UserState(_Step):
    event: Literal["user.state"]
    state: Literal["speaking", "listening", "away"]


class AvatarStart(_Step):
    event: Literal["avatar.start"]


class AvatarStartError(_Step):
    """The avatar is started and the plugin's ``start()`` raises: on every attempt, or on
    the first ``times`` (a retry after them starts as ``avatar.start`` would)."""

    event: Literal["avatar.start_error"]
    times: Annotated[int, Field(ge=1, le=100, strict=True)] | None = None


class AvatarClose(_Step):
    event: Literal["avatar.close"]


class JobShutdown(_Step):
    """The agent's ``job.shutdown(reason)`` (what an end-call tool calls)."""

    event: Literal["job.shutdown"]
    reason: str = ""


class JobRequestRoomDeletion(_Step):
    """The agent's ``job.request_room_deletion()`` (an end-call tool's, before its
    ``job.shutdown``): the room is deleted once the hold and the close are over."""

    event: Literal["job.request_room_deletion"]


class CtxShutdown(_Step):
    """livekit's ``ctx.shutdown(reason)``: the primary session closes, then the job is told
    (``on_session_end``, the hold)."""

    event: Literal["ctx.shutdown"]
    reason: str = ""


class JobAclose(_Step):
    """The user's ``await job.aclose()`` (``graceful: false``: ``aclose(graceful=False)``),
    begun at ``at``; the scenario goes on while it runs (a graceful close holds for the
    simulator)."""

    event: Literal["job.aclose"]
    graceful: Flag = True  # true or false, never "no", "off" or 0


class RoomConnected(_Step):
    event: Literal["room.connected"]


class RoomDisconnected(_Step):
    event: Literal["room.disconnected"]
    reason: Reason = "UNKNOWN_REASON"


class ParticipantConnected(_Step):
    event: Literal["participant_connected"]
    identity: RoomIdentity
    kind: Kind = "standard"
    attributes: dict[str, str] = Field(default_factory=dict)


class ParticipantDisconnected(_Step):
    event: Literal["participant_disconnected"]
    identity: RoomIdentity
    reason: Reason = "CLIENT_INITIATED"


class TrackPublished(_Step):
    event: Literal["track_published"]
    identity: RoomIdentity
    kind: Literal["audio", "video"] = "audio"


class TrackMuted(_Step):
    event: Literal["track_muted"]
    identity: RoomIdentity


class AttributesChanged(_Step):
    event: Literal["attributes_changed"]
    identity: RoomIdentity
    attributes: dict[str, str]


class Rpc(_Step):
    event: Literal["rpc"]
    method: str = Field(min_length=1)
    caller: RoomIdentity
    payload: Any = ""


class SessionRequest(_Step):
    event: Literal["session_request"]
    caller: RoomIdentity
    request: str = Field(min_length=1)
    payload: dict[str, Any] = Field(default_factory=dict)

    @field_validator("payload")
    @classmethod
    def _encodable(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """A payload no simulator could send is the file's mistake (a misspelt request kind
        or field), not a step the runtime refuses. An unknown kind without a payload stays:
        it is how a newer simulator's request reaches this agent."""
        kind = info.data.get("request")
        if not isinstance(kind, str) or not v:
            return v
        try:
            build_request(kind, v, request_id="check")
        except ValueError as e:
            near = difflib.get_close_matches(kind, sorted(REQUEST_KINDS), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near and kind not in REQUEST_KINDS else ""
            raise PydanticCustomError("payload", "{problem}", {"problem": f"{e}{hint}"}) from e
        return v


class RpcOutcome(_Step):
    event: Literal["rpc_outcome"]
    method: str = Field(min_length=1)
    # ok | timeout | error as in the contract; disconnected / not_found name the
    # RECIPIENT_DISCONNECTED / RECIPIENT_NOT_FOUND errors
    result: Literal["ok", "timeout", "error", "disconnected", "not_found"]


class HeldEnd(_Step):
    """The world ends a held outside call (``config.hold``) that waits now: ``ok`` (it
    returns), ``error`` (it raises), ``hang`` (it never ends); the avatar's start takes
    ``routed`` / ``no_route`` / ``error`` before its route, ``ok`` / ``error`` after.
    ``session``: whose close (an attached session's name; unsaid, the primary's)."""

    event: Literal["held.end"]
    call: HeldCall
    result: Literal["ok", "error", "hang", "routed", "no_route"]
    session: str | None = Field(default=None, min_length=1)

    @field_validator("result")
    @classmethod
    def _fits(cls, v: str, info: ValidationInfo) -> str:
        call = info.data.get("call")
        if call is not None and v not in RESULTS[call]:
            known = ", ".join(RESULTS[call])
            raise PydanticCustomError(
                "held", "{call} ends with {known}", {"call": call, "known": known}
            )
        return v

    @field_validator("session")
    @classmethod
    def _close_only(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("call", "session_close") != "session_close":
            raise PydanticCustomError("held", "only a session_close names a session", {})
        return v


class End(_Step):
    event: Literal["end"]


Step = Annotated[
    SessionStart
    | SessionClose
    | SessionInterrupt
    | SessionAttach
    | AgentSay
    | UserSpeech
    | UserState
    | AvatarStart
    | AvatarStartError
    | AvatarClose
    | JobShutdown
    | JobRequestRoomDeletion
    | CtxShutdown
    | JobAclose
    | RoomConnected
    | RoomDisconnected
    | ParticipantConnected
    | ParticipantDisconnected
    | TrackPublished
    | TrackMuted
    | AttributesChanged
    | Rpc
    | SessionRequest
    | RpcOutcome
    | HeldEnd
    | End,
    Field(discriminator="event"),
]
# each step's event name, in the order above
STEP_EVENTS: tuple[str, ...] = tuple(
    get_args(m.model_fields["event"].annotation)[0] for m in get_args(get_args(Step)[0])
)
_step_adapter: TypeAdapter[Step] = TypeAdapter(Step)
_STEP_MODELS: dict[str, type[_Step]] = dict(
    zip(STEP_EVENTS, get_args(get_args(Step)[0]), strict=True)
)
_STEP_KEYS = {key for m in _STEP_MODELS.values() for key in m.model_fields}


InvariantNumber = Annotated[int, Field(strict=True)]


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _or_null(kind: tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]]:
    return f"{kind[0]} or null", lambda v: v is None or kind[1](v)


def _list_of(kind: tuple[str, Callable[[Any], bool]]) -> tuple[str, Callable[[Any], bool]]:
    return f"a list of {kind[0]}", lambda v: isinstance(v, list) and all(map(kind[1], v))


def _one_of(*values: str) -> tuple[str, Callable[[Any], bool]]:
    return " or ".join(values), lambda v: v in values


_TEXT, _SECONDS, _OBJECT = ("text", _text), ("seconds", _seconds), ("an object", _object)
_OBJECTS = _list_of(("objects", _object))
# the facts a run's result holds (``testing.result``): an ``expect`` block may name these
# only, each with a value of the fact's kind (what the check compares it with)
FACT_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "audio_output": _one_of(*get_args(Route)),  # where the agent's audio goes
    "rpcs_sent": _OBJECTS,
    "finalize_answered": ("true or false", lambda v: isinstance(v, bool)),
    "verdict": _or_null(_OBJECT),
    "room_deleted_at": _or_null(_SECONDS),
    "job_closed_at": _or_null(_SECONDS),
    "session_closed_at": _or_null(_SECONDS),
    "session_close_reason": _or_null(_TEXT),
    "attached_session": _or_null(_TEXT),
    "linked_participant": _or_null(_TEXT),
    "session_replies": _OBJECTS,
    "rpc_replies": _OBJECTS,
    "step_errors": _list_of(_TEXT),
    "agent_state": _TEXT,
    "agent_listening_at": _list_of(_SECONDS),
    "playout_done": _OBJECTS,
    "reprompts": _list_of(_SECONDS),
    "invariant_violations": _OBJECTS,  # only with an ``invariants`` entry
}
FACTS = tuple(FACT_KINDS)


class Expect(_Strict):
    final_states: dict[str, str] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)
    # the job's invariants (the ones the explorer checks, by number), checked after the
    # start, every step and every deadline, and at the end once no timer is left: "all",
    # or a list of their numbers
    invariants: Literal["all"] | tuple[InvariantNumber, ...] | None = None

    @field_validator("invariants", mode="before")
    @classmethod
    def _known_invariants(cls, v: Any) -> Any:
        if v is None or v == "all":
            return v
        if not isinstance(v, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in v
        ):
            raise PydanticCustomError(
                "invariants", "'all' or a list of invariant numbers, got {v}", {"v": repr(v)}
            )
        for number in v:
            if number not in BY_NUMBER:
                raise PydanticCustomError(
                    "unknown_invariant",
                    "no invariant {number} (invariants: {known})",
                    {"number": number, "known": ", ".join(map(str, sorted(BY_NUMBER)))},
                )
        return v

    def checks_invariant(self, number: int) -> bool:
        return self.invariants == "all" or (
            self.invariants is not None and number in self.invariants
        )

    @field_validator("facts")
    @classmethod
    def _known_facts(cls, v: dict[str, Any]) -> dict[str, Any]:
        # a misspelt fact is the file's error too, found before the run
        for name in v:
            if name not in FACTS:
                raise PydanticCustomError(
                    "unknown_fact",
                    "no fact {name} (facts: {known})",
                    {"name": repr(name), "known": ", ".join(FACTS)},
                )
        # a value of the wrong kind too: it ran, then failed ("expected 'soon', got None")
        for name, want in v.items():
            kind, fits = FACT_KINDS[name]
            if not fits(want):
                raise PydanticCustomError(
                    "fact_kind",
                    "{name} is {kind}, not {value}",
                    {"name": name, "kind": kind, "value": repr(want)},
                )
        return v

    @model_validator(mode="after")
    def _violations_checked(self) -> Expect:
        if "invariant_violations" in self.facts and self.invariants is None:
            raise PydanticCustomError(
                "unchecked",
                "fact invariant_violations is only there with an 'invariants' entry",
                {},
            )
        return self

    @field_validator("final_states")
    @classmethod
    def _known_states(cls, v: dict[str, str]) -> dict[str, str]:
        # a misspelt machine or state is the file's error, not an expectation that fails
        for machine, state in v.items():
            spec = MACHINES.get(machine)
            if spec is None:
                raise PydanticCustomError(
                    "unknown_machine",
                    "no machine {machine} (machines: {known})",
                    {"machine": repr(machine), "known": ", ".join(MACHINES)},
                )
            states = [st.name for st in spec.states]
            if state not in states:
                raise PydanticCustomError(
                    "unknown_state",
                    "{machine} has no state {state} (states: {known})",
                    {"machine": machine, "state": repr(state), "known": ", ".join(states)},
                )
        return v


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


class Scenario(_Strict):
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


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _model_at(model: Any, loc: tuple[int | str, ...]) -> Any:
    """The type found at ``loc`` under ``model`` (a tuple's items, an optional's model)."""
    for part in (*loc, None):
        args = [a for a in get_args(model) if a is not type(None) and a is not Ellipsis]
        if get_origin(model) in (Union, UnionType, tuple) and len(args) == 1:
            model = args[0]
        if part is None or isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        model = fields[part].annotation if part in fields else None
    return model


def _unknown(key: str, given: Any, known: Any) -> str:
    """pydantic's word for a key no model has, and the missing one it likely meant: a key
    misspelt made pydantic say first that the one meant is missing (`identity: Field
    required`), never naming the key written."""
    left = [k for k in known if not (isinstance(given, dict) and k in given)]
    near = difflib.get_close_matches(key, left, n=1)
    return "Extra inputs are not permitted" + (f" (did you mean {near[0]!r}?)" if near else "")


def _got(err: Any) -> str:
    """`` (got VALUE)``: the value given, as ``AgentJob`` names it (``(got -1)``); nothing
    for a mapping or a list of them (the error is about them as a whole: a missing key, a
    rule between fields, a participant listed twice) or a value the message already quotes
    (an exponent YAML read as text)."""
    value = err.get("input")
    whole = isinstance(value, dict) or (
        isinstance(value, list | tuple) and any(isinstance(v, dict | BaseModel) for v in value)
    )
    if err["type"] == "missing" or whole or _said(err) != err["msg"]:
        return ""
    return f" (got {shown(value)})"


def _first(
    errors: list[Any], model: Any, raw: Any, *, valued: tuple[str, ...] | None = None
) -> tuple[tuple[int | str, ...], str]:
    """The error to report, where and what: a key the model does not have first (it is
    often what made the others); an error under one of the ``valued`` fields (``None``:
    any field) names the value given."""
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    if err["type"] != "extra_forbidden":
        named = valued is None or (loc[:1] and loc[0] in valued)
        return loc, _said(err) + (_got(err) if named else "") + _case_hint(err)
    given = raw
    for part in loc[:-1]:
        given = given[part] if isinstance(given, dict | list) else None
    known = getattr(_model_at(model, loc[:-1]), "model_fields", {})
    return loc, _unknown(str(loc[-1]), given, known)


# a number with an exponent YAML 1.1 reads as text (no dot, or no sign: 1e5, 1.0e5)
_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _case_hint(err: Any) -> str:
    """`` (did you mean 'X'?)`` for a choice given in another case: disconnect reasons are
    livekit's upper-case names, participant kinds lower case."""
    value = err.get("input")
    if err["type"] != "literal_error" or not isinstance(value, str):
        return ""
    choices = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
    same = [c for c in choices if c.casefold() == value.strip().casefold() and c != value]
    return f" (did you mean {same[0]!r}?)" if same else ""


def _said(err: Any) -> str:
    """pydantic's message, and why when YAML read a number as text (``1e5``, ``1.0e5``)."""
    value = err.get("input")
    if (
        isinstance(value, str)
        and err["type"] in ("float_type", "int_type", "float_parsing")
        and _EXPONENT.fullmatch(value.strip())
    ):
        return (
            f"{err['msg']} ({value!r} is text to YAML: a number with an exponent needs a "
            "dot and a sign, as 1.0e+5)"
        )
    return str(err["msg"])


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
        unknown = [str(k) for k in s if k not in _STEP_KEYS]
        for key in ("event", "at"):
            near = difflib.get_close_matches(key, unknown, n=1)
            if key not in s and near:
                raise ScenarioError(
                    f"{source}: {label}: field {near[0]}: {_unknown(near[0], s, [key])}"
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
            step = _step_adapter.validate_python(s)
        except ValidationError as e:
            errors = [{**err, "loc": err["loc"][1:]} for err in e.errors()]  # the event's tag
            # any field of a step names the value given, as config's do
            where, said = _first(errors, _STEP_MODELS[s["event"]], s)
            raise ScenarioError(f"{source}: {label}: field {_where(where)}: {said}") from None
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
        where, said = _first(e.errors(), Scenario, raw, valued=("config", "participants"))
        raise ScenarioError(f"{source}: {_where(where)}: {said}") from None
    for i, step in enumerate(scenario.steps):
        if isinstance(step, HeldEnd) and step.call not in scenario.config.hold:
            raise ScenarioError(
                f"{source}: step {i + 1} (held.end): {step.call} is not held "
                "(list it in config.hold)"
            )
    return scenario
