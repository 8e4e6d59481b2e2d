"""The runtime an agent imports: actors, clocks, traces, the room-event adapter and the
runtimes of the machines.

The testing kit (in-memory room, scripted avatar, scenarios) is ``agent_runtime.testing``;
the tools (CLI, renderers, replay, record, watch) are ``agent_runtime.tools``. Neither is
imported from here.

Every name loads on first use: ``livekit.agents`` takes about a second to import, and
commands such as ``agent-runtime diagrams`` never pay for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_runtime._messages import AlreadyStarted
    from agent_runtime.actor import (
        Actor,
        ActorClosed,
        Event,
        EventRejected,
        Output,
        StateChanged,
    )
    from agent_runtime.clock import AsyncioClock, Clock
    from agent_runtime.observe.otel import OtelSink
    from agent_runtime.observe.reading import read_trace
    from agent_runtime.observe.snapshot import JobSnapshot
    from agent_runtime.observe.trace import JsonlSink, LoggingSink, MemorySink, Tracer, TraceRecord
    from agent_runtime.runtimes.avatar import AvatarLifecycle, AvatarPluginError
    from agent_runtime.runtimes.job import JobRuntime
    from agent_runtime.runtimes.participant import ParticipantLink, SessionCloseTimedOut
    from agent_runtime.runtimes.playout import PlayoutTracker
    from agent_runtime.runtimes.room_events import RoomEventAdapter
    from agent_runtime.runtimes.session_host import JobSessionHost
    from agent_runtime.scheduler import Scheduler
    from agent_runtime.sdk.session_transport import RoomRequestTransport
    from agent_runtime.settings import (
        AvatarRetry,
        Backoff,
        JobSettings,
        PlayoutOptions,
        SettingError,
        SettingTypeError,
    )
    from agent_runtime.system.agent_job import AgentJob, injected, on_session_end, session_end_hook

# the one version source: pyproject.toml reads it (setuptools' dynamic version, by AST)
__version__ = "0.1.0"

# every name loads on first use: importing the package (as the CLI does before its Ctrl-C
# handler is in place) costs nothing of livekit's or the machines'
_LAZY = {
    "Actor": "actor",
    "ActorClosed": "actor",
    "Event": "actor",
    "EventRejected": "actor",
    "Output": "actor",
    "StateChanged": "actor",
    "AlreadyStarted": "_messages",
    "AsyncioClock": "clock",
    "Clock": "clock",
    "read_trace": "observe.reading",
    "JsonlSink": "observe.trace",
    "LoggingSink": "observe.trace",
    "MemorySink": "observe.trace",
    "Tracer": "observe.trace",
    "TraceRecord": "observe.trace",
    "Scheduler": "scheduler",
    "AvatarLifecycle": "runtimes.avatar",
    "AvatarPluginError": "runtimes.avatar",
    "JobRuntime": "runtimes.job",
    "JobSessionHost": "runtimes.session_host",
    "ParticipantLink": "runtimes.participant",
    "PlayoutOptions": "settings",
    "AvatarRetry": "settings",
    "Backoff": "settings",
    "PlayoutTracker": "runtimes.playout",
    "RoomEventAdapter": "runtimes.room_events",
    "RoomRequestTransport": "sdk.session_transport",
    "SessionCloseTimedOut": "runtimes.participant",
    "on_session_end": "system.agent_job",
    "session_end_hook": "system.agent_job",
    "AgentJob": "system.agent_job",
    "injected": "system.agent_job",
    "JobSettings": "settings",
    "JobSnapshot": "observe.snapshot",
    "OtelSink": "observe.otel",
    "SettingError": "settings",
    "SettingTypeError": "settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "Actor",
    "ActorClosed",
    "AgentJob",
    "AlreadyStarted",
    "AsyncioClock",
    "AvatarLifecycle",
    "AvatarPluginError",
    "AvatarRetry",
    "Backoff",
    "Clock",
    "Event",
    "EventRejected",
    "JobRuntime",
    "JobSessionHost",
    "JobSettings",
    "JobSnapshot",
    "JsonlSink",
    "LoggingSink",
    "MemorySink",
    "OtelSink",
    "Output",
    "ParticipantLink",
    "PlayoutOptions",
    "PlayoutTracker",
    "RoomEventAdapter",
    "RoomRequestTransport",
    "Scheduler",
    "SessionCloseTimedOut",
    "SettingError",
    "SettingTypeError",
    "StateChanged",
    "TraceRecord",
    "Tracer",
    "injected",
    "on_session_end",
    "read_trace",
    "session_end_hook",
]
