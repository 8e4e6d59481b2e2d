"""The base of the per-machine runtimes: what each of them did by hand, once.

A runtime (``JobRuntime``, ``JobSessionHost``, ``FinalizeAnswer``, ``RoomDeletion``,
``ParticipantLink``, ``PlayoutTracker``) runs one machine instance: ``_run_machine`` builds
its ``actor`` from the spec with the class's effect handlers (``_fx_<effect>``, bound once
per class by ``effect_table`` at import, so a missing one fails there) and the machine's
guards (their one definition, ``routing.guard_table``), arms its state timeouts from
``_timeouts()``, and forwards its state changes as the runtime's own ``state_changed``.

A runtime's lifecycle is its machine's: what it asks is the actor's state (or
``actor.started``, and ``_finished``: the final state, or let go before it), not a flag
or a ``None`` kept beside the machine; a handle it holds (a task) is what it releases. A
start asks its machine whether it already ran (the session host's ``new`` state; the
participant link's machine, which nothing but its start and its close reach before it
follows the room). A runtime's owner (the system that composes it, which forwards every
change) is given when it is built, never set after: ``owner=``. A listener that fails is
the ``Emitter``'s to log and remove; an owner that fails is logged and dropped the same
way (``OwnedEmitter._emit_state``, which forwards a change).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from livekit import rtc

from agent_runtime._messages import EMPTY, Event, Handlers, StateChanged
from agent_runtime.actor import Actor
from agent_runtime.clock import Clock
from agent_runtime.emitter import OwnedEmitter
from agent_runtime.observe.trace import Tracer
from agent_runtime.parts import check_part
from agent_runtime.runtimes.room_events import RoomEventAdapter
from agent_runtime.runtimes.routing import Wiring, guard_table
from agent_runtime.scheduler import Scheduler, after
from agent_runtime.settings import SettingTypeError
from statemachines import MachineSpec

E = TypeVar("E")
# who hears a machine's changes first: a runtime's owner (the system composing it)
Hear = Callable[[StateChanged], None]


class MachineRuntime(OwnedEmitter[E]):
    """One machine instance's runtime. Emits ``state_changed`` (a ``StateChanged``) for
    every change of its machine (a part its owner forwards: on ``actor``); ``state`` is
    the machine's."""

    actor: Actor
    wiring: Wiring  # the links its effects fire and that reach it (``_run_machine``)
    # what ``on`` takes (a typo is refused, not a listener that never runs); a runtime that
    # emits more events names them all
    _EVENT_NAMES: frozenset[str] | None = frozenset({"state_changed"})
    _room_labels: Mapping[str, str] = EMPTY  # the room it runs over (``_label_room``)

    def _run_machine(
        self,
        spec: MachineSpec,
        effects: Mapping[str, Callable[..., Any]],
        *,
        facts: object = None,
        instance: str = "",
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        effect_timeout: float = 5.0,
        hear: Hear | None = None,
        wiring: Wiring | None = None,
        post: Callable[[Event], None] | None = None,
    ) -> Actor:
        """Build ``self.actor`` and ``self.wiring``: ``effects`` is the class's table
        (``effect_table``), the guards read ``facts`` (this runtime when not given). The
        links (``wiring``: the job's, or used alone links of its own) fire those of its
        effects as they succeed, and reach it by ``post``.
        ``hear``: who hears the actor's changes first (a part that only forwards them lets
        its owner hear the actor itself); by default this runtime's ``_on_state``. The
        parts are checked first (``check_part``): a clock, tracer or scheduler of the wrong
        type is refused naming it, before the actor exists."""
        check_parts(clock=clock, tracer=tracer, scheduler=scheduler)
        actor = Actor(
            spec,
            instance=instance,
            effects=Handlers(self, effects),
            guards=Handlers(self if facts is None else facts, guard_table(spec.name))
            if spec.guards
            else None,
            settings=self._timeouts(),
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            effect_timeout=effect_timeout,
            owner=hear if hear is not None else self._on_state,
        )
        self.wiring = wiring or Wiring()
        self.wiring.bind(actor)
        if post is not None:
            self.wiring.connect(spec.name, post)
        self.actor = actor
        return actor

    @property
    def state(self) -> str:
        return self.actor.state

    @property
    def _finished(self) -> bool:
        """Whether the machine is over: in its final state, or let go before it got there
        (``release_now()``; a tracker stopped with its session still open). What a call
        refused once the runtime closed asks: one answer, where two could disagree."""
        actor = self.actor
        return actor.closed or actor.states[actor.state].final

    @property
    def _log_labels(self) -> Mapping[str, str]:
        """What a failing listener's log line names (``Emitter._listener_failed``): the
        job's labels when composed (its actor's), else the room it runs over, if known."""
        return self.actor.labels or self._room_labels

    def _label_room(self, room: rtc.Room) -> None:
        """Its listeners' failures name ``room`` when no job labels it."""
        self._room_labels = RoomLabels(room)

    def _timeouts(self) -> Mapping[str, float | None]:
        """The machine's state timeouts by setting name (a state's ``timeout.setting``),
        from this runtime's settings; a setting left out keeps the spec's default, ``None``
        arms no timer. Read when the actor is built; a mapping of its own may compute a
        value when its state is entered."""
        return EMPTY

    def _close_now(
        self, release: Callable[[], asyncio.Future[Any] | None]
    ) -> asyncio.Future[Any] | None:
        """Step the machine's ``close`` at once (its state is ``closed`` when this returns,
        unless it is asked inside a step: then the close is queued, stepped in this run),
        then ``release()`` once its effects ended: what is left to wait for, or None. A
        second call waits for the first one's close the same way."""
        actor = self.actor
        if actor.closed:
            return release()
        if actor.state != "closed":
            actor.post_now(Event("close"))
        return after(actor.when_settled(), release)

    def release_now(self) -> asyncio.Future[Any] | None:
        """Let the machine go now, whatever its close is still doing (that work is
        cancelled): the owner's last word once the close had its bound. What is left to
        wait for (the cancelled work), or None."""
        return self.actor.release()

    def _post(self, event: Event) -> None:
        """An event for the machine, unless it is released (then nobody hears it)."""
        if not self.actor.closed:
            self.actor.post(event)

    def _on_state(self, change: StateChanged) -> None:
        """What the runtime does on its machine's change: forward it (a runtime that acts
        on its own changes extends this)."""
        self._emit_state(change)


def check_parts(**parts: Any) -> None:
    """Each of ``parts`` (``parts.check_part``'s names, or ``room_events``) refused
    naming it, a ``SettingTypeError``, unless it is None or of its kind: at construction,
    not as an ``AttributeError`` deep in a step (or a machine that never steps)."""
    for name, value in parts.items():
        if name == "room_events":
            check_instance(name, value, RoomEventAdapter)
        else:
            check_part(name, value)


def check_instance(name: str, value: object, kind: type, *, required: bool = False) -> None:
    """``SettingTypeError`` naming ``name`` unless ``value`` is a ``kind`` (or None, unless
    ``required``): a runtime handed another runtime, or the room's adapter."""
    if not isinstance(value, kind) and (required or value is not None):
        a = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise SettingTypeError(f"{name} must be {a} {kind.__name__}, not {type(value).__name__}")


class RoomLabels(Mapping[str, str]):
    """A lone runtime's log labels: its room's name, read as a line is written (a room is
    named once it connects)."""

    __slots__ = ("_room",)

    def __init__(self, room: rtc.Room) -> None:
        self._room = room

    def __getitem__(self, key: str) -> str:
        if key != "room":
            raise KeyError(key)
        return self._room.name

    def __iter__(self) -> Iterator[str]:
        return iter(("room",))

    def __len__(self) -> int:
        return 1


def listen(emitter: rtc.EventEmitter[Any], listeners: Mapping[str, Callable[..., Any]]) -> None:
    """Register each listener on ``emitter``."""
    for name, fn in listeners.items():
        emitter.on(name, fn)


def unlisten(emitter: rtc.EventEmitter[Any], listeners: Mapping[str, Callable[..., Any]]) -> None:
    """Take back each of ``listeners`` from ``emitter``; one not registered is no error."""
    for name, fn in listeners.items():
        emitter.off(name, fn)


def is_closed(state: str) -> bool:
    """A machine's ``closed`` state (what a wait for the close asks of ``when_settled``)."""
    return state == "closed"


async def released(ending: Awaitable[Any] | None) -> None:
    """Wait for what a ``release()`` left running, if anything."""
    if ending is not None:
        await ending
