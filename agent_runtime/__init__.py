"""The imperative shell around the machines: actors, effects, room adapters, the CLI."""

from .actor import Actor, ActorClosed, Event, EventRejected, StateChanged
from .clock import AsyncioClock, Clock, VirtualClock, settle
from .trace import JsonlSink, LoggingSink, MemorySink, Tracer, TraceRecord, read_trace

__all__ = [
    "Actor",
    "ActorClosed",
    "AsyncioClock",
    "Clock",
    "Event",
    "EventRejected",
    "JsonlSink",
    "LoggingSink",
    "MemorySink",
    "StateChanged",
    "TraceRecord",
    "Tracer",
    "VirtualClock",
    "read_trace",
    "settle",
]
