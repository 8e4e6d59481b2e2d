"""The runtime an agent imports: actors, clocks, traces, the room-event adapter and the
runtimes of the machines.

The testing kit (in-memory room, scripted avatar, scenarios) is ``agent_runtime.testing``;
the tools (CLI, renderers, replay, exploration) are ``agent_runtime.tools``. Neither is
imported from here.

The runtime classes that need ``livekit.agents`` (about a second to import) load on first
use, so commands such as ``agent-runtime diagrams`` never pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .actor import Actor, ActorClosed, Event, EventRejected, Output, StateChanged
from .clock import AsyncioClock, Clock, VirtualClock, settle
from .trace import JsonlSink, LoggingSink, MemorySink, Tracer, TraceRecord, read_trace

if TYPE_CHECKING:
    from .agent_job import AgentJob, injected, on_session_end, session_end_hook
    from .avatar import AvatarLifecycle
    from .job import JobRuntime
    from .otel import OtelSink
    from .participant import ParticipantLink, SessionCloseTimedOut
    from .playout import PlayoutTracker
    from .room_events import RoomEventAdapter
    from .session_host import JobSessionHost
    from .session_transport import RoomRequestTransport
    from .settings import JobSettings, PlayoutOptions, SettingError
    from .snapshot import JobSnapshot

# the one version source: pyproject.toml reads it (setuptools' dynamic version, by AST)
__version__ = "0.1.0"

_LAZY = {
    "AvatarLifecycle": "avatar",
    "JobRuntime": "job",
    "JobSessionHost": "session_host",
    "ParticipantLink": "participant",
    "PlayoutOptions": "settings",
    "PlayoutTracker": "playout",
    "RoomEventAdapter": "room_events",
    "RoomRequestTransport": "session_transport",
    "SessionCloseTimedOut": "participant",
    "on_session_end": "agent_job",
    "session_end_hook": "agent_job",
    "AgentJob": "agent_job",
    "injected": "agent_job",
    "JobSettings": "settings",
    "JobSnapshot": "snapshot",
    "OtelSink": "otel",
    "SettingError": "settings",
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
    "AsyncioClock",
    "AvatarLifecycle",
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
    "SessionCloseTimedOut",
    "SettingError",
    "StateChanged",
    "TraceRecord",
    "Tracer",
    "VirtualClock",
    "injected",
    "on_session_end",
    "read_trace",
    "session_end_hook",
    "settle",
]
