"""What passes between an actor and the code around it: the events it takes, the state
changes it emits, its two refusals, and the handler tables a runtime gives it.

Kept apart from the actor so its two halves (``actor``: the mailbox and the step;
``_perform``: what a step makes it do) and the runtimes' base share one vocabulary.
Everything here is imported from ``agent_runtime.actor``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from statemachines import MachineSpec

EMPTY: Mapping[str, Any] = MappingProxyType({})
# one empty set for every holder: since 3.10 each frozenset() is a new 216-byte object
NO_NAMES: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Event:
    name: str
    data: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True, slots=True)
class StateChanged:
    machine: str
    instance: str
    source: str
    dest: str
    event: str


@dataclass(frozen=True, slots=True)
class Output:
    """What an effect hands to its declared links (``statemachines.links.LINKS``), as
    XState's ``onDone`` output: the actor passes it on once the effect succeeded. An effect
    that returns ``None`` sends its links empty data."""

    data: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


# what an effect returns: an event for its own machine, an output for its links, or nothing
EffectResult = Event | Output | None


class OutputFn(Protocol):
    """Who hears an effect's success: ``fire(machine, effect, output data)`` (the job's
    ``Wiring``, held by reference: nothing is allocated per actor)."""

    def fire(self, source: str, on: str, data: Mapping[str, Any] | None = None) -> None: ...


EffectHandler = Callable[[Event], EffectResult | Awaitable[EffectResult]]
GuardFn = Callable[[Event], bool]
H = TypeVar("H")


class EventRejected(RuntimeError):
    """The table rejects this event in the current state; nothing changed."""

    def __init__(self, machine: str, instance: str, state: str, event: str) -> None:
        who = f"{machine}[{instance}]" if instance else machine
        super().__init__(f"{who} rejects event {event!r} in state {state!r}")
        self.machine = machine
        self.state = state
        self.event = event


class AlreadyStarted(RuntimeError):
    """A start refused because one already began (or ended); nothing changed."""


class ActorClosed(RuntimeError):
    """The actor was closed; it takes no more events."""


class Reported(Exception):
    """A state task's failure its effect has logged already (the log policy: once), raised
    in place of ``error``: recorded and answered as ``error`` is, logged again at DEBUG."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Handlers(Mapping[str, H]):
    """A class's effect (or guard) handlers for one instance's actor, bound on use.

    ``Handlers(self, TABLE)``, where ``TABLE`` maps each name to a function of the class
    (``def _fx(self, event)``) and is built once with the class: every instance shares it,
    instead of holding a dict of bound methods of its own."""

    __slots__ = ("_owner", "_table")

    def __init__(self, owner: object, table: Mapping[str, Callable[..., Any]]) -> None:
        self._owner = owner
        self._table = table

    def __getitem__(self, name: str) -> H:
        return self._table[name].__get__(self._owner)  # type: ignore[no-any-return]

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


def effect_table(cls: type, spec: MachineSpec) -> Mapping[str, Callable[..., Any]]:
    """``spec``'s effect handlers on ``cls``: effect ``x`` is the method ``_fx_x``. Built
    once, with the class (``Handlers(self, table)`` binds it per actor); a handler missing
    fails the import, naming it."""
    missing = [e.name for e in spec.effects if not callable(getattr(cls, f"_fx_{e.name}", None))]
    if missing:
        names = ", ".join(f"_fx_{m}" for m in missing)
        raise TypeError(f"{cls.__name__} runs machine {spec.name!r} but has no {names}")
    return MappingProxyType({e.name: getattr(cls, f"_fx_{e.name}") for e in spec.effects})
