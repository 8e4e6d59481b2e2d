"""``Emitter``: livekit's ``rtc.EventEmitter`` with a cheap ``emit``.

The runtime's classes emit as livekit's objects do (``on``, ``once``, ``off``, ``emit``; a
listener gets as many of the arguments as it takes positionally), with one difference: a
listener is observation, so whatever it raises (livekit lets a ``TypeError`` through; here
that too, and ``CancelledError`` or any other ``BaseException``) never reaches the machine
that emitted: it is logged once and the listener removed. livekit's ``emit`` builds
``inspect.signature`` of every
listener on every call, which made up most of what a state change cost; here the arity of a
plain function or bound method is read from its code object, a callable object that states
its ``__signature__`` has it read as it is, and only other callables (a
``functools.partial``, a decorated function, a callable object with none) go through
``inspect``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from types import FunctionType, MethodType
from typing import Any, TypeVar, get_args

from livekit import rtc

from agent_runtime.observe.trace import describe, job_place
from agent_runtime.sdk.asyncio_compat import marked_coroutine

logger = logging.getLogger("agent_runtime.emitter")

T = TypeVar("T")


def positional_arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` takes, as ``inspect.signature`` reads them
    (``None``: any number, it has ``*args``)."""
    t = type(fn)
    func: Any = fn.__func__ if t is MethodType else fn  # type: ignore[attr-defined]
    # a plain function with no attributes of its own (no __wrapped__, no __signature__)
    if type(func) is FunctionType and not func.__dict__:
        code = func.__code__
        if code.co_flags & inspect.CO_VARARGS:
            return None
        return code.co_argcount - (1 if t is MethodType else 0)
    # a callable object that states its signature (a slotted listener): read as it is, as
    # inspect would (from the object: a pydantic model's class-only one is its constructor's)
    sig = getattr(fn, "__signature__", None)
    if not isinstance(sig, inspect.Signature):
        sig = inspect.signature(fn)
    params = sig.parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


class Listener:
    """``fn`` as a listener on one of livekit's emitters. livekit's ``emit`` builds each
    listener's ``inspect.signature`` on every event (a bound method's or a closure's from
    scratch, tens of microseconds); this one's is read as it is. ``fn`` gets as many
    positional arguments as it takes, as livekit's ``emit`` gives them. Keep the instance:
    it is what ``off`` takes back."""

    __slots__ = ("_n", "fn")
    __signature__ = inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._n = positional_arity(fn)

    def __call__(self, *args: Any) -> None:
        self.fn(*(args if self._n is None else args[: self._n]))


def _is_async(callback: Callable[..., Any]) -> bool:
    """As livekit's check: a coroutine function, or one tagged with asyncio's legacy marker."""
    func: Any = callback.__func__ if type(callback) is MethodType else callback
    if type(func) is FunctionType and not func.__dict__:
        # a plain function (no marker, no wrapper): its code says it all
        return bool(func.__code__.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(callback) or marked_coroutine(callback)


_NO_LISTENERS: dict[Any, tuple[Callable[..., Any], ...]] = {}


class Emitter(rtc.EventEmitter[T]):
    """``rtc.EventEmitter`` whose ``emit`` does not rebuild each listener's signature, and
    whose listeners of an event are a tuple (replaced on ``on``/``off``, so ``emit`` walks
    a snapshot without copying it) rather than a dict per event."""

    __slots__ = ("_events",)
    # the events a class emits, when it names them: ``on`` refuses any other (a typo would
    # register a listener that is never called)
    _EVENT_NAMES: frozenset[str] | None = None

    def __init__(self) -> None:
        # one shared empty dict until the first listener (never written: ``on`` replaces
        # it): most of a job's emitters are never listened to, and each dict is memory
        self._events: dict[T, tuple[Callable[..., Any], ...]] = _NO_LISTENERS  # type: ignore[assignment]

    def on(self, event: T, callback: Callable[..., Any] | None = None) -> Callable[..., Any]:
        if callback is None:

            def decorator(callback: Callable[..., Any]) -> Callable[..., Any]:
                self.on(event, callback)
                return callback

            return decorator
        if not callable(callback):  # it would fail at the first emit, deep in a step
            raise TypeError(f"a listener must be callable, not {type(callback).__name__}")
        names = self._EVENT_NAMES
        if names is not None and event not in names:
            raise ValueError(
                f"{type(self).__name__} emits no {event!r} event "
                f"(it emits {', '.join(map(repr, sorted(names)))})"
            )
        if _is_async(callback):
            raise ValueError(
                "Cannot register an async callback with `.on()`. Use `asyncio.create_task` "
                "within your synchronous callback instead."
            )
        current: tuple[Callable[..., Any], ...] = self._events.get(event, ())
        if callback not in current:
            if self._events is _NO_LISTENERS:
                self._events = {}
            self._events[event] = (*current, callback)
        return callback

    def off(self, event: T, callback: Callable[..., Any]) -> None:
        current: tuple[Callable[..., Any], ...] = self._events.get(event, ())
        if callback in current:
            i = current.index(callback)
            rest = current[:i] + current[i + 1 :]
            if rest:
                self._events[event] = rest
            else:
                del self._events[event]

    def emit(self, event: T, *args: Any) -> None:
        listeners: tuple[Callable[..., Any], ...] = self._events.get(event, ())
        for callback in listeners:
            try:
                n = positional_arity(callback)
                callback(*(args if n is None else args[:n]))
            except (Exception, asyncio.CancelledError) as e:
                # removed, so it fails (and is logged) once; the other listeners still hear
                self.off(event, callback)
                self._listener_failed(event, callback, e, args)

    def _listener_failed(
        self, event: T, callback: Callable[..., Any], error: BaseException, args: tuple[Any, ...]
    ) -> None:
        """Log a listener's failure (it has been removed). ERROR: a callback the user
        registered will not run again. The line names the job and its room when the emitter
        carries their labels (``_log_labels``: ``AgentJob``'s; a runtime's: its job's, or
        the room it runs over; ``Actor`` says more), and the machine when the argument is a
        state change."""
        labels: Mapping[str, str] = getattr(self, "_log_labels", None) or {}
        change = args[0] if args else None
        fields = {
            "job_id": labels.get("job_id", ""),
            "room": labels.get("room", ""),
            "machine": str(getattr(change, "machine", "")),
            "instance": str(getattr(change, "instance", "")),
            "state": str(getattr(change, "dest", "")),
            "event": str(getattr(change, "event", "")),
            "listener": _name_of(callback),
        }
        place, who = job_place(labels), type(self).__name__
        who = f"{place}, {who}" if place else who
        logger.error(
            "%s: a %s listener failed (%s); it is removed, the machines go on",
            who,
            event,
            describe(error),
            exc_info=error,
            extra=fields,
        )


_STATE_CHANGED: Any = "state_changed"  # typed Any once: a cast per state change is a call


class OwnedEmitter(Emitter[T]):
    """An ``Emitter`` with an owner: the runtime or system that owns it (one, given when
    it is built) hears each state change before the ``state_changed`` listeners. A
    listener entry of its own would be an emitter table per object, memory per job for
    the one listener most actors and runtimes have. An owner that raises is logged and
    dropped, as a listener is."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        if owner is not None and not callable(owner):
            raise TypeError(f"owner must be callable, not {type(owner).__name__}")
        self._owner = owner

    def _emit_state(self, change: Any) -> None:
        """The owner, then the ``state_changed`` listeners: whatever one raises stays here
        (logged, that one dropped), so the effects of a transition that has already
        happened are never skipped."""
        owner = self._owner
        if owner is not None:
            try:
                owner(change)
            except (Exception, asyncio.CancelledError) as e:
                self._owner = None
                self._listener_failed(_STATE_CHANGED, owner, e, (change,))
        self.emit(_STATE_CHANGED, change)


def event_names(events: Any) -> frozenset[str]:
    """A ``Literal`` of event names as a class's ``_EVENT_NAMES`` (what its ``on`` takes)."""
    return frozenset(get_args(events))


def _name_of(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))
