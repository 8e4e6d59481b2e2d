"""Room facts to machine events, exactly as ``statemachines.routing.ROUTES`` declares.

Each machine's runtime follows the room through ``follow``: it names its machine, how an
event reaches its actor, and how each condition its routes use is evaluated; the table
decides the rest. Conditions see the fact and what the runtime knew just before it;
``after`` then updates that knowledge (which participants carry the simulator attribute).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from statemachines.routing import Route, routes_for

from .actor import Event
from .room_events import (
    AttributesChanged,
    ParticipantJoined,
    ParticipantLeft,
    Reconnected,
    Reconnecting,
    RoomConnected,
    RoomDisconnected,
    RoomEventAdapter,
    RoomFact,
    TrackMuted,
    TrackPublished,
)

Condition = Callable[[RoomFact], bool]

FACT_NAMES: dict[type[Any], str] = {
    ParticipantJoined: "participant_joined",
    ParticipantLeft: "participant_left",
    TrackPublished: "track_published",
    TrackMuted: "track_muted",
    AttributesChanged: "attributes_changed",
    RoomConnected: "room_connected",
    RoomDisconnected: "room_disconnected",
    Reconnecting: "reconnecting",
    Reconnected: "reconnected",
}


def fact_data(fact: RoomFact) -> dict[str, Any]:
    """The event data a fact carries to every machine it is routed to."""
    if isinstance(fact, ParticipantJoined):
        return {"identity": fact.identity, "kind": fact.kind, "attributes": dict(fact.attributes)}
    if isinstance(fact, ParticipantLeft):
        return {"identity": fact.identity, "kind": fact.kind, "reason": fact.reason}
    if isinstance(fact, TrackPublished):
        return {"identity": fact.identity, "kind": fact.kind}
    if isinstance(fact, TrackMuted):
        return {"identity": fact.identity, "kind": fact.kind, "muted": fact.muted}
    if isinstance(fact, AttributesChanged):
        return {"identity": fact.identity, "changed": dict(fact.changed)}
    if isinstance(fact, RoomDisconnected):
        return {"reason": fact.reason}
    return {}


@functools.cache
def _routes_by_fact(machine: str) -> dict[str, tuple[Route, ...]]:
    """The machine's routes grouped by fact name: built once, shared by every job."""
    by_fact: dict[str, list[Route]] = {}
    for r in routes_for(machine):
        by_fact.setdefault(r.fact, []).append(r)
    return {fact: tuple(rs) for fact, rs in by_fact.items()}


class _Follower:
    """One machine's subscription: turns each fact into the events its routes name."""

    __slots__ = ("after", "by_fact", "conds", "post")

    def __init__(
        self,
        by_fact: dict[str, tuple[Route, ...]],
        conds: Mapping[str, Condition],
        post: Callable[[Event], None],
        after: Callable[[RoomFact], None] | None,
    ) -> None:
        self.by_fact, self.conds, self.post, self.after = by_fact, conds, post, after

    def __call__(self, fact: RoomFact) -> None:
        matching = self.by_fact.get(FACT_NAMES[type(fact)], ())
        conds = self.conds
        fired = [r for r in matching if all(conds[c](fact) for c in r.when)]
        if self.after is not None:
            self.after(fact)
        for r in fired:
            self.post(Event(r.event, fact_data(fact)))


def follow(
    adapter: RoomEventAdapter,
    machine: str,
    post: Callable[[Event], None],
    *,
    conditions: Mapping[str, Condition] | None = None,
    after: Callable[[RoomFact], None] | None = None,
) -> Callable[[], None]:
    """Subscribe ``machine`` to the room facts its routes name; returns the unsubscriber.

    Raises ``ValueError`` when a route's condition has no definition here.
    """
    conds: Mapping[str, Condition] = conditions or {}
    by_fact = _routes_by_fact(machine)
    missing = sorted({c for rs in by_fact.values() for r in rs for c in r.when} - set(conds))
    if missing:
        raise ValueError(f"machine {machine!r}: no definition of condition {', '.join(missing)}")
    return adapter.subscribe(_Follower(by_fact, conds, post, after))
