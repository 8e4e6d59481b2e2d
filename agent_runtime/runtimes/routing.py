"""How one job's machines hear the room and each other, exactly as declared.

Room facts reach a machine through ``follow``, which reads ``statemachines.routing.ROUTES``
and evaluates each route's named conditions with their one definition
(``statemachines.glue.ROOM_CONDITIONS``) on what the machine's runtime knows of the room
just before the fact; ``after`` then updates that knowledge.

An effect that tells another machine something goes through ``Wiring``: the runtime that
runs the effect fires it, and every link ``statemachines.links.LINKS`` declares for it posts
its event to the target machine's runtime (each runtime connects its own poster). A report
of a runtime about the livekit part it drives (``statemachines.system.REPORTS``) reaches
another machine through ``hear_reports``. Nothing else turns one machine's work into
another machine's event.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from agent_runtime.actor import Actor, Event
from agent_runtime.emitter import Emitter
from agent_runtime.runtimes.room_events import (
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
from statemachines.delivery import (
    LinkKey,
    follow_rank,
    index_links,
    links_fired,
    routes_by_fact,
    routes_fired,
)
from statemachines.glue import GUARDS, RoomFacts
from statemachines.links import LINKS, Link
from statemachines.routing import Route
from statemachines.system import REPORTS, Report

logger = logging.getLogger("agent_runtime.routing")

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


def plain_fact(fact: RoomFact) -> dict[str, Any]:
    """The fact as the shared conditions read it: its name and every field."""
    fields = {f.name: getattr(fact, f.name) for f in dataclasses.fields(fact)}
    return {"fact": FACT_NAMES[type(fact)], **fields}


@functools.cache
def guard_table(machine: str) -> Mapping[str, Callable[[Any, Event], bool]]:
    """``machine``'s guards as a shared handler table (``actor.Handlers`` binds it to a
    runtime's facts view): each is its one definition (``statemachines.glue.GUARDS``)
    evaluated on the facts and the event's data. Built once, shared by every job; the
    handler of guard ``g`` is named ``_guard_g``, as every runtime names its handlers."""

    def on_event(name: str, fn: Callable[[Any, Mapping[str, Any]], bool]) -> Callable[..., bool]:
        def guard(facts: Any, ev: Event) -> bool:
            return fn(facts, ev.data)

        guard.__name__ = guard.__qualname__ = f"_guard_{name}"
        return guard

    return MappingProxyType({name: on_event(name, fn) for name, fn in GUARDS[machine].items()})


class NoRoom:
    """The room facts of a runtime that knows nothing of the room (no route of it needs)."""

    avatar_identity: str | None = None
    simulators: frozenset[str] = frozenset()


def follow(
    adapter: RoomEventAdapter,
    machine: str,
    post: Callable[[Event], None],
    *,
    facts: RoomFacts | None = None,
    after: Callable[[RoomFact], None] | None = None,
) -> Callable[[], None]:
    """Subscribe ``machine`` to the room facts its routes name; returns the unsubscriber.

    The machines of a job hear each fact in ``statemachines.system.FOLLOW_ORDER``, whatever
    order they were started in. Each route's conditions are evaluated on ``facts`` (what the
    runtime knows of the room) just before ``after`` updates it."""
    # the delivery is statemachines.delivery's, declared once
    follower = _Follower(routes_by_fact(machine), facts or NoRoom(), post, after)
    return adapter.subscribe(follower, rank=follow_rank(machine))


class _Follower:
    """One machine's subscription: turns each fact into the events its routes name."""

    __slots__ = ("after", "by_fact", "known", "post")

    def __init__(
        self,
        by_fact: Mapping[str, tuple[Route, ...]],
        known: RoomFacts,
        post: Callable[[Event], None],
        after: Callable[[RoomFact], None] | None,
    ) -> None:
        self.by_fact, self.known, self.post, self.after = by_fact, known, post, after

    def __call__(self, fact: RoomFact) -> None:
        matching = self.by_fact.get(FACT_NAMES[type(fact)], ())
        fired = routes_fired(matching, self.known, plain_fact(fact)) if matching else []
        if self.after is not None:
            self.after(fact)
        for r in fired:
            self.post(Event(r.event, fact_data(fact)))


@functools.lru_cache(maxsize=64)
def _frozen_flags(items: frozenset[tuple[str, bool]]) -> Mapping[str, bool]:
    """One read-only mapping per set of flags, shared by the jobs that have it."""
    return MappingProxyType(dict(items))


class Wiring:
    """The declared links between the machines of one job (``statemachines.links.LINKS``).

    ``connect(machine, post)`` says how an event reaches ``machine``'s runtime;
    ``fire(source, effect, data)`` posts every link of that effect whose flags hold (the
    job's flags, given here). A target no runtime connected is
    skipped: a runtime used alone has nobody to tell.
    """

    __slots__ = ("_declared", "_flags", "_links", "_posts")

    def __init__(
        self, *, flags: Mapping[str, bool] | None = None, links: tuple[Link, ...] = LINKS
    ) -> None:
        self._flags: Mapping[str, bool] = _frozen_flags(frozenset((flags or {}).items()))
        self._posts: dict[str, Callable[[Event], None]] = {}
        # the declared links, indexed once per declaration (every job shares LINKS')
        self._declared = links
        self._links = _index(links)

    @property
    def flags(self) -> Mapping[str, bool]:
        return self._flags

    def connect(self, machine: str, post: Callable[[Event], None]) -> None:
        self._posts[machine] = post

    def bind(self, actor: Actor) -> None:
        """Fire the links of ``actor``'s effects as each one succeeds (its ``Output``, as
        XState's ``onDone``): no handler fires a link itself. The links of a task's steps
        (``step=``) are fired by the task as each step begins."""
        effects = _linked_effects(self._declared, actor.spec.name)
        if effects:
            actor.pass_outputs(effects, self)

    def fire(
        self,
        source: str,
        on: str,
        data: Mapping[str, Any] | None = None,
        *,
        step: str = "",
    ) -> None:
        for link in links_fired(self._links, (source, on, step), self._flags):
            post = self._posts.get(link.target)
            if post is None:
                continue
            try:
                post(Event(link.event, dict(data or {})))
            except Exception:
                # one target's failure must not keep the others from hearing
                logger.exception("link %s.%s -> %s failed", source, on, link.target)


# per declaration, by identity (hashing the links themselves would cost every job more
# than it saves): the index and, per machine, the effects whose success fires a link
_INDEXES: dict[int, tuple[tuple[Link, ...], dict[LinkKey, tuple[Link, ...]]]] = {}
_LINKED: dict[tuple[int, str], frozenset[str]] = {}


def _index(links: tuple[Link, ...]) -> dict[LinkKey, tuple[Link, ...]]:
    held = _INDEXES.get(id(links))
    if held is None or held[0] is not links:
        held = _INDEXES[id(links)] = (links, index_links(links))
    return held[1]


def _linked_effects(links: tuple[Link, ...], source: str) -> frozenset[str]:
    """The effects of ``source`` whose success fires a link (not a task's steps)."""
    _index(links)  # holds ``links``, so its id is not reused while cached
    key = (id(links), source)
    effects = _LINKED.get(key)
    if effects is None:
        effects = _LINKED[key] = frozenset(k.on for k in links if k.source == source and not k.step)
    return effects


# a runtime's handler of a report declared to its machine: the data of the event the report
# is posted as, made from what the source emitted (and what the runtime keeps of it)
ReportHandler = Callable[[Any], Mapping[str, Any]]
# how a runtime hears reports: its poster, and its handlers by (source machine, report)
Hearer = tuple[Callable[[Event], None], Mapping[tuple[str, str], ReportHandler]]


def hear_reports(
    sources: Mapping[str, Emitter[Any] | None],
    hearers: Mapping[str, Hearer],
    *,
    reports: tuple[Report, ...] = REPORTS,
) -> Callable[[], None]:
    """Connect each declared report whose two machines' runtimes are given: whenever the
    source's runtime emits ``report``, the target's handler makes the data of ``event``,
    posted to the target. A report with an end missing is skipped (a runtime used alone
    has nobody to tell); one its target has no handler for is refused before anything is
    connected. Returns what takes every connection back."""
    wired: list[tuple[Emitter[Any], Report, ReportHandler, Callable[[Event], None]]] = []
    for r in reports:
        source, hearer = sources.get(r.source), hearers.get(r.target)
        if source is None or hearer is None:
            continue
        post, handlers = hearer
        handler = handlers.get((r.source, r.report))
        if handler is None:
            raise ValueError(
                f"report {r.source}.{r.report} -> {r.target}.{r.event}: the {r.target} "
                "runtime has no handler for it"
            )
        wired.append((source, r, handler, post))
    listeners = tuple((source, r.report, _Hearing(r, h, post)) for source, r, h, post in wired)
    unhear = _Unhear(listeners)
    try:
        for source, name, listener in listeners:
            source.on(name, listener)  # a name the source never emits is refused here
    except ValueError:
        unhear()
        raise
    return unhear


class _Hearing:
    """The listener of one declared report on its source's emitter. Slotted rather than a
    closure: a job holds one per report it hears. A failure is logged naming it by its
    ``repr``: the handler's name, which says whose it was."""

    __slots__ = ("handler", "post", "report")
    __signature__ = inspect.Signature(
        [inspect.Parameter("payload", inspect.Parameter.POSITIONAL_ONLY)]
    )

    def __init__(
        self, report: Report, handler: ReportHandler, post: Callable[[Event], None]
    ) -> None:
        self.report, self.handler, self.post = report, handler, post

    def __call__(self, payload: Any) -> None:
        deliver_report(self.report, self.handler, self.post, payload)

    def __repr__(self) -> str:
        return str(getattr(self.handler, "__qualname__", None) or repr(self.handler))


class _Unhear:
    """What ``hear_reports`` returns: takes each of its listeners back from its source."""

    __slots__ = ("listeners",)

    def __init__(self, listeners: tuple[tuple[Emitter[Any], str, _Hearing], ...]) -> None:
        self.listeners = listeners

    def __call__(self) -> None:
        for source, name, listener in self.listeners:
            source.off(name, listener)


def deliver_report(
    report: Report, handler: ReportHandler, post: Callable[[Event], None], payload: Any
) -> None:
    """One report as its declared event (looked up at each report: the mutation tool
    records which reports a test reached here)."""
    post(Event(report.event, dict(handler(payload))))
