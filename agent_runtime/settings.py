"""The runtime's settings, each defined once with its valid range.

``AgentJob``, the runtimes of the machines and the scenario files all validate through
these definitions, so a value one of them accepts is a value every one of them runs with.
A bad value raises ``SettingError`` (a ``ValueError``) naming the setting, what is wrong and
the value given, before anything is built (the errors, and how they quote a value, are in
``setting_errors``; every name can still be imported from here).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from livekit import rtc
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from agent_runtime.observe.trace import JsonlSink, LoggingSink, TraceFileBusy, Tracer

# exported from here too, where users and the runtime's modules import them
from agent_runtime.setting_errors import GOT_MAX as GOT_MAX
from agent_runtime.setting_errors import REASON_MAX as REASON_MAX
from agent_runtime.setting_errors import SettingError as SettingError
from agent_runtime.setting_errors import SettingTypeError as SettingTypeError
from agent_runtime.setting_errors import cut as cut
from agent_runtime.setting_errors import one_line as one_line
from agent_runtime.setting_errors import setting_error as setting_error
from agent_runtime.setting_errors import shown as shown
from statemachines import glue

if TYPE_CHECKING:
    from opentelemetry import context as otel_context

    from agent_runtime.observe.otel import OtelSink

# durations in seconds: finite numbers (never a bool, never a string)
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
# a job's settings are also bounded above: 1e308 s is finite yet means "never", which the
# runtime refuses as it refuses inf. The bounds are what a user would still call a wait:
# an hour for what waits on people (a user coming back, a simulator's verdict), ten minutes
# for what waits on a service (a plugin's start, a close, a backoff)
MAX_HOLD = 3600
MAX_WAIT = 600
HoldSeconds = Annotated[float, Field(ge=0, le=MAX_HOLD, allow_inf_nan=False, strict=True)]
WaitSeconds = Annotated[float, Field(gt=0, le=MAX_WAIT, allow_inf_nan=False, strict=True)]


def _not_blank(identity: str) -> str:
    if not identity.strip():
        # worded as pydantic words the empty one ("should have at least 1 character")
        raise PydanticCustomError(
            "blank_identity", "String should have at least 1 character other than whitespace"
        )
    return identity


# an identity a participant has in a room: livekit's server refuses only the empty one, so
# "  " is an identity someone can join with (a trace may hold one; a scenario says it)
RoomIdentity = Annotated[str, Field(min_length=1, strict=True)]
# an identity a setting names (who is linked, the avatar's): one of only whitespace ("  ",
# a blank from a template or an environment variable) is a mistake, as livekit's own
# synthesia plugin says of its avatar's: the link would wait for no one
Identity = Annotated[RoomIdentity, AfterValidator(_not_blank)]
Flag = Annotated[bool, Field(strict=True)]

# rtc.ParticipantKind names in lowercase, without the prefix: standard, sip, agent, ...
PARTICIPANT_KINDS: tuple[str, ...] = tuple(
    n.removeprefix("PARTICIPANT_KIND_").lower()
    for n in rtc.ParticipantKind.keys()  # noqa: SIM118 - a protobuf enum wrapper
    if n != "PARTICIPANT_KIND_UNKNOWN"
)
DISCONNECT_REASONS: tuple[str, ...] = tuple(rtc.DisconnectReason.keys())
# livekit-agents' defaults, declared with the glue the explorer reads too
DEFAULT_PARTICIPANT_KINDS = glue.DEFAULT_PARTICIPANT_KINDS
DEFAULT_CLOSING_REASONS = glue.DEFAULT_CLOSING_REASONS


def kind_names(kinds: Iterable[str | int]) -> tuple[str, ...]:
    """``rtc.ParticipantKind`` values or names (``sip``, ``PARTICIPANT_KIND_SIP``) -> names."""
    if isinstance(kinds, str | int | bytes):
        raise SettingTypeError("participant_kinds must be a collection of kinds, not a single kind")
    if not isinstance(kinds, Iterable):
        raise SettingTypeError(f"participant_kinds must be a collection of kinds, not {kinds!r}")
    if isinstance(kinds, Mapping):
        # read as its keys, its values would be dropped unread ({"sip": False} links SIP)
        raise SettingTypeError(
            f"participant_kinds must be a collection of kinds, not a mapping ({shown(kinds)})"
        )
    out: list[str] = []
    for k in kinds:
        if isinstance(k, bool):
            raise SettingError(f"participant_kinds: unknown participant kind {k!r}")
        if isinstance(k, int):
            try:
                name = rtc.ParticipantKind.Name(k)  # type: ignore[arg-type]
            except ValueError:
                name = repr(k)
        else:
            name = str(k)
        name = name.lower().removeprefix("participant_kind_")
        if name not in PARTICIPANT_KINDS:
            raise SettingError(
                f"participant_kinds: unknown participant kind {k!r}; "
                f"one of {', '.join(PARTICIPANT_KINDS)}"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise SettingError("participant_kinds is empty: nobody could ever be linked")
    return tuple(out)


def reason_names(reasons: Iterable[str | int]) -> tuple[str, ...]:
    """``rtc.DisconnectReason`` values or names -> names (``CLIENT_INITIATED``, ...)."""
    if isinstance(reasons, str | int | bytes):
        raise SettingTypeError("closing_reasons must be a collection of reasons, not a single one")
    if not isinstance(reasons, Iterable):
        raise SettingTypeError(f"closing_reasons must be a collection of reasons, not {reasons!r}")
    if isinstance(reasons, Mapping):
        raise SettingTypeError(
            f"closing_reasons must be a collection of reasons, not a mapping ({shown(reasons)})"
        )
    out: list[str] = []
    for r in reasons:
        if isinstance(r, bool):
            raise SettingError(f"closing_reasons: unknown disconnect reason {r!r}")
        if isinstance(r, int):
            try:
                name = rtc.DisconnectReason.Name(r)  # type: ignore[arg-type]
            except ValueError:
                name = repr(r)
        else:
            name = str(r).upper()
        if name not in DISCONNECT_REASONS:
            raise SettingError(
                f"closing_reasons: unknown disconnect reason {r!r}; "
                f"one of {', '.join(DISCONNECT_REASONS)}"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


# the sets of names every job of a worker builds from the same options, one object for all
_SHARED_NAMES: dict[tuple[str, ...], frozenset[str]] = {}


def shared_names(names: tuple[str, ...]) -> frozenset[str]:
    """``frozenset(names)``, the same object for the same names (a set per job is memory
    per job)."""
    found = _SHARED_NAMES.get(names)
    if found is None:
        if len(_SHARED_NAMES) >= _VALIDATED_MAX:
            _SHARED_NAMES.clear()
        found = _SHARED_NAMES[names] = frozenset(names)
    return found


# what can end an avatar attempt (statemachines.avatar.CAUSES): the retry policy names the
# transient ones
AvatarCause = Literal["start_error", "start_timeout", "no_route", "join_timeout", "avatar_left"]
ALL_CAUSES: frozenset[AvatarCause] = frozenset(
    ("start_error", "start_timeout", "no_route", "join_timeout", "avatar_left")
)


class SettingModel(BaseModel):
    """A setting made of fields (``PlayoutOptions``, ``AvatarRetry``). Built directly, a bad
    field is a ``SettingError`` (``SettingTypeError`` for a type) naming it as the setting's
    (``playout.margin``), as when the same value is given to ``AgentJob``: not pydantic's
    ``ValidationError``. Validated as a part of a job's settings, pydantic names it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    setting: ClassVar[str]  # what the setting is called where a job is given it

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise setting_error(e, self.setting) from None

    # pydantic's own mark of its __init__: nested in other settings (a job's, a scenario's),
    # the value is validated by pydantic as before, its errors located by the outer model
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class Backoff(SettingModel):
    """The wait before restart ``n`` (0-based): ``min(max, initial * multiplier ** n)``."""

    setting = "retry_avatar.backoff"

    initial: WaitSeconds = 1.0
    multiplier: Annotated[float, Field(ge=1, le=10, allow_inf_nan=False, strict=True)] = 2.0
    max: WaitSeconds = 30.0

    @model_validator(mode="after")
    def _initial_within_max(self) -> Backoff:
        if self.initial > self.max:
            # every wait would be max: the initial asked for would never be waited
            raise ValueError(
                f"initial ({self.initial:g} s) is above max ({self.max:g} s): raise max "
                f"or lower initial"
            )
        return self

    def delay(self, n: int) -> float:
        # the exponent is capped: past it the cap has long been reached
        return float(min(self.max, self.initial * self.multiplier ** min(n, 64)))


class AvatarRetry(SettingModel):
    """What the avatar lifecycle does after a transient loss. The default retries nothing.

    ``attempts``: how many times the plugin is started again after a failure whose cause is
    in ``transient`` (over the lifecycle's whole life), each after ``backoff`` on room
    audio. ``rejoin``: an avatar that joins late (while waiting, or after giving up) gets
    the audio again, through the route its plugin's start installed (after a start that
    installed none, one that raised, the attempt is retired and a late avatar removed).
    ``True``/``False`` stand for ``AvatarRetry(rejoin=True)`` and the default, the spelling
    ``retry_avatar`` had when it was a flag.
    """

    setting = "retry_avatar"

    attempts: Annotated[int, Field(ge=0, le=100, strict=True)] = 0
    backoff: Backoff = Backoff()
    transient: frozenset[AvatarCause] = ALL_CAUSES
    rejoin: Flag = False

    def retries(self, cause: str, done: int) -> bool:
        """Whether a failure of ``cause`` after ``done`` restarts is started again."""
        return cause in self.transient and done < self.attempts


def avatar_retry(value: Any) -> AvatarRetry:
    """``retry_avatar``'s value as a policy: a policy, a mapping of its fields, or a flag;
    ``SettingError`` naming the field otherwise."""
    return check_setting("retry_avatar", value)  # type: ignore[no-any-return]


# livekit-agents' CloseReason values (voice/events.py), for a close the runtime asks for
CloseReasonName = Literal[
    "error", "job_shutdown", "participant_disconnected", "user_initiated", "task_completed"
]
DEFAULT_REPROMPT_INSTRUCTIONS = (
    "The user has not said anything since your last reply. Briefly ask whether they are "
    "still there, in one short sentence."
)


class PlayoutOptions(SettingModel):
    """The ``playout`` machine: how long a joined avatar may take to report that it played
    the agent's audio, and the re-prompt watchdog (off unless ``reprompt``). ``AgentJob``
    composes it with these defaults whenever an avatar is configured (``playout=False``
    turns it off), so no avatar leaves the agent "speaking" for good.

    ``margin``: added to the duration of the audio actually pushed to the avatar; past it
    the playout counts as done without the avatar's ``lk.playback_finished`` (logged).
    ``reprompt``: re-prompt a user who stays silent after the agent's audio was played:
    ``safety_window`` after playout is done the watchdog arms, ``reprompt_after`` seconds of
    silence later it re-prompts, at most ``max_reprompts`` times in a row; then
    ``when_exhausted``: ``wait`` (for the user) or ``close`` (the session, with
    ``close_reason``). ``reprompt_instructions`` go to the default re-prompt,
    ``session.generate_reply(instructions=...)``.
    """

    setting = "playout"

    margin: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False, strict=True)] = 2.0
    reprompt: Flag = False
    safety_window: Annotated[float, Field(ge=0, le=30, allow_inf_nan=False, strict=True)] = 1.0
    reprompt_after: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False, strict=True)] = 10.0
    max_reprompts: Annotated[int, Field(ge=0, le=10, strict=True)] = 2
    reprompt_instructions: Annotated[str, Field(min_length=1, max_length=2000, strict=True)] = (
        DEFAULT_REPROMPT_INSTRUCTIONS
    )
    when_exhausted: Literal["wait", "close"] = "wait"
    close_reason: CloseReasonName = "user_initiated"


def playout_flag(value: Any) -> Any:
    """``playout``'s flags read as options: ``True`` the defaults, ``False`` none."""
    if value is True:
        return PlayoutOptions()
    return None if value is False else value


class JobSettings(BaseModel):
    """Every setting of a composed job, with livekit-agents' defaults where it has one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # participant: who is linked, and what a departure means
    participant_identity: Identity | None = None
    participant_kinds: tuple[str, ...] = DEFAULT_PARTICIPANT_KINDS
    close_on_disconnect: Flag = True
    closing_reasons: tuple[str, ...] = DEFAULT_CLOSING_REASONS
    grace_period: HoldSeconds = 15.0
    # how long a session's close may take before the link gives up on it (livekit-agents
    # bounds AgentSession.aclose() at job shutdown by the same 60 s)
    session_close_timeout: WaitSeconds = 60.0
    # avatar
    join_timeout: WaitSeconds = 30.0
    retry_avatar: AvatarRetry = AvatarRetry()
    # job: the hold for the simulator, the bounded close, room deletion
    session_end_timeout: HoldSeconds = 300.0
    close_timeout: WaitSeconds = 10.0
    delete_room_on_close: Flag = False
    # the playout machine and its re-prompt watchdog (None: not composed)
    playout: PlayoutOptions | None = None

    @field_validator("playout", mode="before")
    @classmethod
    def _playout(cls, v: Any) -> Any:
        return playout_flag(v)

    @field_validator("participant_kinds", mode="before")
    @classmethod
    def _kinds(cls, v: Any) -> tuple[str, ...]:
        return kind_names(v)

    @field_validator("retry_avatar", mode="before")
    @classmethod
    def _retry(cls, v: Any) -> Any:
        # the flag it was: True routes a late join again, False retries nothing
        return AvatarRetry(rejoin=v) if isinstance(v, bool) else v

    @field_validator("closing_reasons", mode="before")
    @classmethod
    def _reasons(cls, v: Any) -> tuple[str, ...]:
        return reason_names(v)


# validated settings by their input: a worker builds every job from the same options, so
# they are validated once and the frozen result is shared (inputs that cannot be hashed,
# such as a list of kinds, are validated every time)
_VALIDATED: dict[tuple[tuple[str, type, Any], ...], JobSettings] = {}
_VALIDATED_MAX = 256


def job_settings(values: Mapping[str, Any] | None = None, /, **kw: Any) -> JobSettings:
    """``JobSettings`` from keyword values, or ``SettingError`` naming the first bad one."""
    data = {**(values or {}), **kw}
    try:
        # the type is part of the key: True, 1 and 1.0 are equal but not the same setting
        key: tuple[tuple[str, type, Any], ...] | None = tuple(
            sorted((k, type(v), v) for k, v in data.items())
        )
        settings = _VALIDATED.get(key)  # type: ignore[arg-type]
    except TypeError:  # an unhashable value
        key, settings = None, None
    if settings is not None:
        return settings
    unknown = sorted(set(data) - set(JobSettings.model_fields))
    if unknown:
        raise SettingError(
            f"unknown setting {unknown[0]!r}; known: {', '.join(JobSettings.model_fields)}"
        )
    try:
        settings = JobSettings.model_validate(data)
    except SettingError:
        raise
    except ValidationError as e:
        raise setting_error(e) from None
    if key is not None:
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.clear()
        _VALIDATED[key] = settings
    return settings


def check_setting(name: str, value: Any) -> Any:
    """Validate one setting alone (the runtimes of single machines use this); returns the
    value as the runtime keeps it."""
    return getattr(job_settings({name: value}), name)


def _link_loop(path: Path) -> Path | None:
    """The first of the directories ``path`` goes through, or ``path``, that is a link
    loop (of one on the way, mkdir says only "File exists")."""
    for p in (*reversed(path.parents), path):
        try:
            os.stat(p)
        except OSError as e:
            return p if e.errno == errno.ELOOP else None
    return None


def observed(
    tracer: Tracer | None,
    trace_path: str | Path | None,
    otel: bool | OtelSink,
    parent: Callable[[], otel_context.Context] | None = None,
) -> tuple[Tracer | None, JsonlSink | None, OtelSink | None]:
    """The job's tracer with its JSONL file (``trace_path``, opened here: the one place a
    trace path becomes a sink) and its OpenTelemetry sink (``parent``: whose span takes the
    machines' events when the sink has none of its own)."""
    trace_file: JsonlSink | None = None
    if trace_path is not None:
        try:
            if (loop := _link_loop(Path(trace_path))) is not None:  # no file can be there
                raise SettingError(
                    f"trace_path: cannot write the trace to {str(trace_path)!r}: "
                    f"{str(loop)!r} is a symbolic link loop"
                )
            # a directory a job's name fills in ("traces/{job_id}/...") cannot be there
            # before the job: the missing ones are made, as a log file's would be
            Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
            trace_file = JsonlSink(trace_path)
        except TraceFileBusy:
            # observation: the job runs, and the other job's trace is left whole
            logging.getLogger("agent_runtime.trace").warning(
                "trace_path: %r is being written by another job's trace: this job writes no "
                "trace file (put {job_id} in trace_path for one file a job)",
                str(trace_path),
            )
        except (NotADirectoryError, IsADirectoryError, FileNotFoundError, FileExistsError) as e:
            # no file can be there: the path is wrong, which a refusal says at once
            raise SettingError(
                f"trace_path: cannot write the trace to {str(trace_path)!r}: {e}"
            ) from None
        except OSError as e:
            # a fault of the disk or its mount (full, read-only, no permission): the job
            # serves its user all the same, as it does once a write fails mid-job
            logging.getLogger("agent_runtime.trace").warning(
                "trace_path: cannot write the trace to %r (%s): this job writes no trace file",
                str(trace_path),
                e.strerror or e,
            )
        if trace_file is not None:  # the JSONL `agent-runtime replay` reads, plus the logs
            tracer = Tracer(*(tracer.sinks if tracer else [LoggingSink()]), trace_file)
    sink: OtelSink | None = None
    if otel is not False:
        # imported here, as in _part_type: OpenTelemetry loads only for a job that uses it
        from agent_runtime.observe.otel import OtelSink

        sink = OtelSink() if otel is True else otel
        if sink.parent is None and parent is not None:
            sink.parent = parent
        tracer = Tracer(*(tracer.sinks if tracer else []), sink)
    return tracer, trace_file, sink
