"""One adapter from ``rtc.Room`` callbacks to plain, typed room facts.

Every machine's runtime subscribes to the facts instead of to the room, so the SDK's
surprises are handled once: ``track_muted`` arrives as ``(participant, publication)`` in
Python and the reverse elsewhere (both accepted), reasons and kinds become names, and a
callback with unexpected arguments is logged and dropped. Nothing raises inside a room
callback. ``aclose()`` unhooks every listener it added.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from livekit import rtc
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime._messages import NO_NAMES
from agent_runtime.parts import check_part

logger = logging.getLogger("agent_runtime.room_events")


@dataclass(frozen=True, slots=True)
class ParticipantJoined:
    identity: str
    kind: str  # standard | agent | sip | ingress | egress | ...
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ParticipantLeft:
    identity: str
    kind: str
    reason: str  # an rtc.DisconnectReason name, e.g. CLIENT_INITIATED
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TrackPublished:
    identity: str
    kind: str  # audio | video


@dataclass(frozen=True, slots=True)
class TrackMuted:
    identity: str
    kind: str
    muted: bool


@dataclass(frozen=True, slots=True)
class AttributesChanged:
    identity: str
    changed: Mapping[str, str]
    attributes: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class RoomConnected:
    pass


@dataclass(frozen=True, slots=True)
class RoomDisconnected:
    reason: str


@dataclass(frozen=True, slots=True)
class Reconnecting:
    pass


@dataclass(frozen=True, slots=True)
class Reconnected:
    pass


RoomFact = (
    ParticipantJoined
    | ParticipantLeft
    | TrackPublished
    | TrackMuted
    | AttributesChanged
    | RoomConnected
    | RoomDisconnected
    | Reconnecting
    | Reconnected
)
Subscriber = Callable[[RoomFact], None]


def kind_name(kind: Any) -> str:
    """``PARTICIPANT_KIND_SIP`` (or its number) -> ``sip``."""
    try:
        name = rtc.ParticipantKind.Name(kind)
    except (ValueError, TypeError):
        return "unknown"
    return name.removeprefix("PARTICIPANT_KIND_").lower()


def reason_name(reason: Any) -> str:
    if reason is None:
        return "UNKNOWN_REASON"
    try:
        return str(rtc.DisconnectReason.Name(reason))
    except (ValueError, TypeError):
        return "UNKNOWN_REASON"


def track_kind_name(kind: Any) -> str:
    if kind == rtc.TrackKind.KIND_AUDIO:
        return "audio"
    if kind == rtc.TrackKind.KIND_VIDEO:
        return "video"
    return "unknown"


def _is_participant(obj: Any) -> bool:
    return isinstance(obj, rtc.Participant) or (
        isinstance(getattr(obj, "identity", None), str) and hasattr(obj, "track_publications")
    )


def _is_publication(obj: Any) -> bool:
    return isinstance(obj, rtc.TrackPublication) or (
        hasattr(obj, "sid") and hasattr(obj, "kind") and not hasattr(obj, "identity")
    )


def simulators_in(room: rtc.Room) -> frozenset[str]:
    """Who in ``room`` carries the ``lk.simulator`` attribute now (the one shared empty set
    when nobody does: a set per job is memory per job)."""
    found = frozenset(
        p.identity for p in room.remote_participants.values() if ATTRIBUTE_SIMULATOR in p.attributes
    )
    return found or NO_NAMES


_LAST = 1 << 30  # the rank of a subscriber given none


class RoomEventAdapter:
    """Hooks one room, fans facts out to subscribers in subscription order."""

    def __init__(self, room: rtc.Room) -> None:
        check_part("room", room, required=True)  # not an AttributeError at start()
        self.room = room
        self._subscribers: list[Subscriber] = []
        self._ranks: list[int] = []  # each subscriber's rank, in the same order
        # the listeners on the room while it is followed
        # (one per _HOOKS entry, in its order: the names are the table's, not held per job)
        self._hooks_on: tuple[_Hook, ...] | None = None
        # its job's labels, as its machines carry them (the job sets them): its lines name it
        self.labels: Mapping[str, str] = {}

    @property
    def started(self) -> bool:
        return self._hooks_on is not None

    def subscribe(self, fn: Subscriber, *, rank: int | None = None) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it. Subscribers hear each
        fact by ``rank`` (lowest first), then in the order they subscribed; one given no
        rank hears it after every ranked one."""
        key = _LAST if rank is None else rank
        at = len(self._subscribers)
        while at > 0 and self._ranks[at - 1] > key:
            at -= 1
        self._subscribers.insert(at, fn)
        self._ranks.insert(at, key)
        return _Unsubscribe(self, fn)

    def _unsubscribe(self, fn: Subscriber) -> None:
        if fn in self._subscribers:
            at = self._subscribers.index(fn)
            del self._subscribers[at], self._ranks[at]

    def _hooks(self) -> tuple[_Hook, ...]:
        return tuple(_Hook(self, fn) for _, fn in _HOOKS)

    def start(self) -> None:
        if self._hooks_on is not None:
            return
        self._hooks_on = self._hooks()
        for (name, _), hook in zip(_HOOKS, self._hooks_on, strict=True):
            self.room.on(name, hook)  # type: ignore[arg-type]

    def aclose(self) -> None:
        """Unhook every room listener this adapter added and drop all subscribers."""
        hooks, self._hooks_on = self._hooks_on, None
        for (name, _), hook in zip(_HOOKS, hooks or (), strict=False):
            self.room.off(name, hook)  # type: ignore[arg-type]
        self._subscribers.clear()
        self._ranks.clear()

    # -- delivery -------------------------------------------------------------------------
    def publish(self, fact: RoomFact) -> None:
        for fn in list(self._subscribers):
            try:
                fn(fact)
            except Exception:
                logger.exception("room fact subscriber failed on %r", fact, extra=self._fields())

    def _fields(self) -> dict[str, str]:
        return {"job_id": self.labels.get("job_id", ""), "room": self.labels.get("room", "")}

    def _guarded(self, what: str, build: Callable[[], RoomFact | None]) -> None:
        try:
            fact = build()
        except Exception as e:
            logger.warning(
                "ignored %s with unexpected arguments: %s", what, e, extra=self._fields()
            )
            return
        if fact is not None:
            self.publish(fact)

    # -- rtc.Room callbacks (never raise) ---------------------------------------------------
    def _on_participant_connected(self, *args: Any) -> None:
        def build() -> RoomFact:
            (p,) = args
            if not _is_participant(p):
                raise TypeError(f"expected a participant, got {type(p).__name__}")
            return ParticipantJoined(p.identity, kind_name(p.kind), dict(p.attributes))

        self._guarded("participant_connected", build)

    def _on_participant_disconnected(self, *args: Any) -> None:
        def build() -> RoomFact:
            (p,) = args
            if not _is_participant(p):
                raise TypeError(f"expected a participant, got {type(p).__name__}")
            return ParticipantLeft(
                p.identity,
                kind_name(p.kind),
                reason_name(p.disconnect_reason),
                dict(p.attributes),
            )

        self._guarded("participant_disconnected", build)

    def _on_track_published(self, *args: Any) -> None:
        def build() -> RoomFact:
            pub, p = _order(args)
            return TrackPublished(p.identity, track_kind_name(pub.kind))

        self._guarded("track_published", build)

    def _on_track_muted(self, *args: Any) -> None:
        def build() -> RoomFact:
            pub, p = _order(args)
            return TrackMuted(p.identity, track_kind_name(pub.kind), True)

        self._guarded("track_muted", build)

    def _on_track_unmuted(self, *args: Any) -> None:
        def build() -> RoomFact:
            pub, p = _order(args)
            return TrackMuted(p.identity, track_kind_name(pub.kind), False)

        self._guarded("track_unmuted", build)

    def _on_attributes_changed(self, *args: Any) -> None:
        def build() -> RoomFact:
            changed, p = args
            if not isinstance(changed, Mapping) or not _is_participant(p):
                raise TypeError("expected (changed attributes, participant)")
            return AttributesChanged(p.identity, dict(changed), dict(p.attributes))

        self._guarded("participant_attributes_changed", build)

    def _on_connection_state_changed(self, *args: Any) -> None:
        def build() -> RoomFact | None:
            (state,) = args
            if state == rtc.ConnectionState.CONN_CONNECTED:
                return RoomConnected()
            return None  # disconnects arrive with their reason on `disconnected`

        self._guarded("connection_state_changed", build)

    def _on_disconnected(self, *args: Any) -> None:
        self._guarded(
            "disconnected", lambda: RoomDisconnected(reason_name(args[0] if args else None))
        )

    def _on_reconnecting(self, *args: Any) -> None:
        self._guarded("reconnecting", Reconnecting)

    def _on_reconnected(self, *args: Any) -> None:
        self._guarded("reconnected", Reconnected)


class _Unsubscribe:
    """What ``subscribe`` returns: removes one subscriber (smaller than a partial of a
    bound method, and every job holds a few)."""

    __slots__ = ("adapter", "fn")

    def __init__(self, adapter: RoomEventAdapter, fn: Subscriber) -> None:
        self.adapter = adapter
        self.fn = fn

    def __call__(self) -> None:
        self.adapter._unsubscribe(self.fn)


class _Hook:
    """One listener on the room: calls ``fn(adapter, *args)``. livekit's emit builds each
    listener's ``inspect.signature`` on every event; a bound method's is built from its
    function every time, this one's is read as it is."""

    __slots__ = ("adapter", "fn")
    __signature__ = inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])

    def __init__(self, adapter: RoomEventAdapter, fn: Callable[..., None]) -> None:
        self.adapter = adapter
        self.fn = fn

    def __call__(self, *args: Any) -> None:
        self.fn(self.adapter, *args)


_HOOKS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("participant_connected", RoomEventAdapter._on_participant_connected),
    ("participant_disconnected", RoomEventAdapter._on_participant_disconnected),
    ("track_published", RoomEventAdapter._on_track_published),
    ("track_muted", RoomEventAdapter._on_track_muted),
    ("track_unmuted", RoomEventAdapter._on_track_unmuted),
    ("participant_attributes_changed", RoomEventAdapter._on_attributes_changed),
    ("connection_state_changed", RoomEventAdapter._on_connection_state_changed),
    ("disconnected", RoomEventAdapter._on_disconnected),
    ("reconnecting", RoomEventAdapter._on_reconnecting),
    ("reconnected", RoomEventAdapter._on_reconnected),
)


def _order(args: tuple[Any, ...]) -> tuple[Any, Any]:
    """(publication, participant) from either argument order."""
    if len(args) != 2:
        raise TypeError(f"expected 2 arguments, got {len(args)}")
    a, b = args
    if _is_publication(a) and _is_participant(b):
        return a, b
    if _is_participant(a) and _is_publication(b):
        return b, a
    raise TypeError(
        f"expected a publication and a participant, got {type(a).__name__}, {type(b).__name__}"
    )
