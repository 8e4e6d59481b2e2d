"""A scenario's steps: one model per event (``{at: seconds, event: NAME, ...fields}``),
the names a step may use (disconnect reasons, participant kinds, held calls) and the bounds
of its instants."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from agent_runtime.settings import PARTICIPANT_KINDS, CloseReasonName, Flag, RoomIdentity
from agent_runtime.testing.held import RESULTS
from agent_runtime.testing.wire import REQUEST_KINDS, build_request

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


class Strict(BaseModel):
    """A part of a scenario file: frozen, and a key it does not have is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Step(Strict):
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
STEP_ADAPTER: TypeAdapter[Step] = TypeAdapter(Step)
STEP_MODELS: dict[str, type[_Step]] = dict(
    zip(STEP_EVENTS, get_args(get_args(Step)[0]), strict=True)
)
STEP_KEYS = {key for m in STEP_MODELS.values() for key in m.model_fields}
