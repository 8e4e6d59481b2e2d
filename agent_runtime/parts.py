"""The parts of a job: the objects a job or a runtime is handed (a clock, a tracer, a
transport, the user's callbacks), not its settings. Each is checked by its type, and a
callable by the arguments the job will call it with, before anything is built: a part of
the wrong type is a ``SettingTypeError`` naming it at construction, never an
``AttributeError`` deep in a step later. ``job_options`` checks a job's settings
(``settings``) and its parts at once.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession

from agent_runtime.observe.trace import Tracer
from agent_runtime.scheduler import Scheduler
from agent_runtime.settings import JobSettings, SettingError, SettingTypeError, job_settings

# the parts of a job (objects, not settings), checked with the settings before anything is
# built: a part of the wrong type fails at construction naming it, not deep in a step later
JOB_PARTS = (
    "trace_path",
    "tracer",
    "otel",
    "clock",
    "transport",
    "simulation",
    "on_simulation_end",
    "delete_room",
    "remove_avatar_participant",
    "on_reprompt",
)
# what each callable part must be, and how many positional arguments the job calls it with
_CALLABLE_PARTS = {
    "on_simulation_end": ("callable as on_simulation_end(simulation_context)", 1),
    "delete_room": ("an async callable taking no arguments", 0),
    "remove_avatar_participant": ("an async callable taking the avatar's identity", 1),
    # AvatarLifecycle's name for it
    "remove_participant": ("an async callable taking the avatar's identity", 1),
    "room_audio": ("callable as room_audio(), saying whether the session asked for room audio", 0),
    "on_reprompt": ("callable as on_reprompt(session, attempt)", 2),
    # session_end_hook's own callback
    "then": ("callable as then(ctx), with the livekit JobContext", 1),
}
_CLOCK_METHODS = ("now", "call_later", "sleep", "wait_for")


def job_options(values: Mapping[str, Any]) -> JobSettings:
    """Every option of a job checked at once, its settings (``JobSettings``) and its parts
    (``JOB_PARTS``: their types): returns the settings, or raises ``SettingError`` (or
    ``SettingTypeError``, also a ``TypeError``) naming the first bad option. ``AgentJob``
    calls it before it opens a file, adds a listener or starts a task, so a refusal
    changes nothing."""
    parts = {k: v for k, v in values.items() if k in JOB_PARTS}
    settings = job_settings({k: v for k, v in values.items() if k not in JOB_PARTS})
    for name, value in parts.items():
        check_part(name, value)
    return settings


def check_part(name: str, value: Any, *, required: bool = False) -> None:
    """``SettingTypeError`` naming ``name`` unless ``value`` is a part a job can run with
    (``None`` is, unless ``required``: the job's default; ``otel``, a switch, is said with a
    bool)."""
    if value is None and name != "otel" and not required:
        return
    want = _part_type(name, value)
    if want is not None:
        raise SettingTypeError(f"{name} must be {want}, not {described(value)}")
    if name == "trace_path" and not os.fspath(value):
        raise SettingError("trace_path is empty: pass a file path, or None for no trace file")
    if name == "trace_path" and "\0" in os.fspath(value):  # else the OS's "embedded null byte"
        raise SettingError(
            f"trace_path: {os.fspath(value)!r} has a NUL character: no file name can have one"
        )


def _part_type(name: str, value: Any) -> str | None:
    """What ``value`` should have been, when it is not."""
    if name == "trace_path":
        ok = isinstance(value, str | os.PathLike) and isinstance(os.fspath(value), str)
        return None if ok else "a file path (a str or an os.PathLike)"
    if name == "clock":
        ok = all(callable(getattr(value, m, None)) for m in _CLOCK_METHODS)
        return None if ok else "a Clock (with now, call_later, sleep and wait_for)"
    if name == "tracer":
        return None if isinstance(value, Tracer) else "an agent_runtime Tracer"
    if name == "scheduler":
        return None if isinstance(value, Scheduler) else "an agent_runtime Scheduler"
    if name == "session":
        return None if isinstance(value, AgentSession) else "an AgentSession"
    if name == "room":
        return None if isinstance(value, rtc.Room) else "an rtc.Room"
    if name == "otel":
        from agent_runtime.observe.otel import OtelSink

        return None if isinstance(value, bool | OtelSink) else "True, False or an OtelSink"
    if name == "transport":
        from livekit.agents.voice.remote_session import SessionTransport

        return None if isinstance(value, SessionTransport) else "a livekit SessionTransport"
    if name == "simulation":
        from livekit.agents.simulation import SimulationContext, SimulationDispatch

        ok = isinstance(value, SimulationContext | SimulationDispatch)
        return None if ok else "a livekit SimulationContext or SimulationDispatch"
    if name in _CALLABLE_PARTS:
        want, args = _CALLABLE_PARTS[name]
        return None if callable(value) and takes(value, args) else want
    raise KeyError(name)  # a part this module does not know: the caller's bug


def described(value: Any) -> str:
    """The type of what was given; for a callable, also its name and what it takes."""
    kind = type(value).__name__
    if not callable(value) or isinstance(value, type):
        return kind
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return kind
    empty = inspect.Parameter.empty
    bare = signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=inspect.Signature.empty,
    )
    return f"{kind} {getattr(value, '__name__', '')}{bare}"


def takes(fn: Callable[..., Any], args: int) -> bool:
    """Whether ``fn`` can be called with ``args`` positional arguments (a mistake found at
    construction, not at the first call deep in a step); unknown for a signature that
    cannot be read (a builtin), which passes."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*([None] * args))
    except TypeError:
        return False
    return True
