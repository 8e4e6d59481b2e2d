"""One actor per machine instance: a mailbox handled one event at a time, to completion.

The decision is the pure ``statemachines.step``; the actor performs what it names, after
the state has changed: effects (bounded, their failure becomes an event), state timeouts
and state-scoped tasks (started on entry, cancelled on exit). This module holds the
mailbox and the step; ``_perform`` what a step makes the actor do, ``_messages`` the
vocabulary (all of it importable from here).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from agent_runtime._messages import (
    EMPTY,
    NO_NAMES,
    ActorClosed,
    EffectHandler,
    EffectResult,
    Event,
    EventRejected,
    GuardFn,
    Handlers,
    Output,
    OutputFn,
    StateChanged,
    effect_table,
)
from agent_runtime._perform import Entry, Life, Performer
from agent_runtime.clock import AsyncioClock, Clock, TimerHandle
from agent_runtime.observe.trace import Tracer, TraceRecord, describe
from agent_runtime.scheduler import Scheduler
from statemachines import MachineSpec, State, Step
from statemachines.step import table_of

__all__ = [
    "Actor",
    "ActorClosed",
    "EffectHandler",
    "EffectResult",
    "Event",
    "EventRejected",
    "GuardFn",
    "Handlers",
    "Output",
    "OutputFn",
    "StateChanged",
    "effect_table",
]

logger = logging.getLogger("agent_runtime.actor")


def _any_state(_state: str) -> bool:
    return True


class _Pending:
    """A step waiting on one of its effects: the scheduler's work, and its bound."""

    __slots__ = ("bound", "event", "expired", "fut", "index", "st", "tracing", "work")

    def __init__(
        self,
        event: Event,
        fut: asyncio.Future[Step] | None,
        st: Step,
        tracing: bool,
        index: int,
    ) -> None:
        self.event, self.fut, self.st, self.tracing, self.index = event, fut, st, tracing, index
        self.work: asyncio.Future[Any] | None = None
        self.bound: TimerHandle | None = None
        self.expired = False

    def expire(self) -> None:
        if self.work is not None and not self.work.done():
            self.expired = True
            self.work.cancel()


class Actor(Performer):
    """Runs one instance of ``spec``. Emits ``state_changed`` (a ``StateChanged``) and,
    once, ``closed``."""

    # six per job: slots keep each one small
    __slots__ = (
        "_effects",
        "_entered_at",
        "_gen",
        "_guards",
        "_life",
        "_linked",
        "_mailbox",
        "_outputs",
        "_pending",
        "_settings",
        "_state",
        "_table",
        "_tasks",
        "_timer",
        "_timer_deadline",
        "_waiters",
        "clock",
        "effect_timeout",
        "instance",
        "labels",
        "scheduler",
        "spec",
        "tracer",
    )

    def __init__(
        self,
        spec: MachineSpec,
        *,
        instance: str = "",
        effects: Mapping[str, EffectHandler] | None = None,
        guards: Mapping[str, GuardFn] | None = None,
        settings: Mapping[str, float | None] | None = None,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        effect_timeout: float = 5.0,
        scheduler: Scheduler | None = None,
        owner: Callable[[StateChanged], None] | None = None,
    ) -> None:
        super().__init__(owner)
        self.spec = spec
        self._table = table_of(spec)  # the spec's prebuilt answers, shared by every actor
        self.instance = instance
        # the one shared empty mapping where none is given: a dict per actor is memory per job
        self._effects: Mapping[str, EffectHandler] = effects or EMPTY
        self._guards: Mapping[str, GuardFn] = guards or EMPTY
        if self._table.effect_names.difference(self._effects) or (
            self._table.guard_names.difference(self._guards)
        ):
            missing = [e.name for e in spec.effects if e.name not in self._effects]
            missing += [g for g in spec.guards if g not in self._guards]
            raise ValueError(f"machine {spec.name!r}: no handler for {', '.join(missing)}")
        self._settings: Mapping[str, float | None] = settings or EMPTY
        self.clock: Clock = clock or AsyncioClock()
        self.tracer = tracer
        self.effect_timeout = effect_timeout
        # the job's log fields (job_id, room), set by whoever composes the job
        self.labels: Mapping[str, str] = EMPTY
        self._state = spec.initial
        self._gen = 0
        # the mailbox and the task set are made on first use: most actors of a job sit idle,
        # and every container an idle actor holds is memory and collector work per job
        self._mailbox: deque[Entry] | None = None
        # who steps it: its job's scheduler, or its own alone (shared with the parts it builds)
        self.scheduler = scheduler if scheduler is not None else Scheduler()
        self._pending: _Pending | None = None  # the step waiting on an effect's work
        self._timer: TimerHandle | None = None
        self._timer_deadline = 0.0  # when the armed timer fires, on this actor's clock
        self._entered_at: float | None = None
        self._tasks: set[asyncio.Future[Any]] | None = None
        # new (not yet entered its initial state), running, or closed: one value, so no
        # pair of flags can disagree
        self._life: Life = "new"
        # who waits for the mailbox to be empty in a state they name (when_settled)
        self._waiters: list[tuple[asyncio.Future[None], Callable[[str], bool]]] | None = None
        # the effects whose success the system passes on (their declared links), and how
        self._linked: frozenset[str] = NO_NAMES
        self._outputs: OutputFn | None = None

    # -- public --------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    @property
    def closed(self) -> bool:
        return self._life == "closed"

    @property
    def started(self) -> bool:
        """Whether the actor left ``new``: its initial state entered (by ``start`` or a
        first event), or closed before that."""
        return self._life != "new"

    @property
    def states(self) -> Mapping[str, State]:
        """The machine's states by name."""
        return self._table.states

    @property
    def idle(self) -> bool:
        return not self._mailbox and self._pending is None

    def pass_outputs(self, effects: frozenset[str], to: OutputFn) -> None:
        """Hand the success of each of ``effects`` to ``to`` (the system's links): an effect
        never posts to another machine itself."""
        self._linked, self._outputs = effects, to

    def start(self) -> None:
        """Enter the initial state: arm its timeout and start its tasks. Idempotent; the
        first event starts the actor too."""
        if self._life == "new":
            self._life = "running"
            self._enter_state()

    def post(self, event: Event) -> None:
        """Queue an event, fire and forget. A rejected event is logged and traced."""
        self._check(event)
        if self._life == "closed":
            self.report(logger, logging.INFO, "dropped %r after close", event.name)
            return
        if self._ignores(event) is None:
            self._enqueue((event, None, None))

    def post_now(self, event: Event) -> None:
        """``post``, then step what is ready now instead of in the scheduler's next call (the
        same steps in the same order, sooner): for a caller outside any step, such as a
        user's ``aclose()``, that must see the machine's new state when this returns. An
        effect still awaited holds the actor's mailbox as ever."""
        self.post(event)
        self.scheduler.run()

    async def send(self, event: Event) -> Step:
        """Queue an event and wait for its step; raises ``EventRejected`` on a reject cell.
        The step comes now, as ``post_now``'s: the sender waits and posts nothing else."""
        self._check(event)
        if self._life == "closed":
            raise ActorClosed(f"{self._who()} is closed; {event.name!r} was not handled")
        if (st := self._ignores(event)) is not None:
            return st
        fut: asyncio.Future[Step] = asyncio.get_running_loop().create_future()
        self._enqueue((event, fut, None))
        self.scheduler.run()
        return await fut

    def _ignores(self, event: Event) -> Step | None:
        """``event``'s step, when it would be the next one, in this state, and an ignore
        cell with nobody recording: it changes nothing, so it needs no step. Else None."""
        if self._mailbox is not None or self._pending is not None or self._life != "running":
            return None
        entry = self._table.cells.get((self._state, event.name))
        if isinstance(entry, Step) and entry.outcome == "ignore" and not self._tracing():
            return entry
        return None

    async def join(self) -> None:
        """Wait until the mailbox is empty (effects included): for the scheduler's next run
        (an event posted from outside a step is handled there), and for an awaited effect's
        work to end."""
        await self.until(_any_state)

    async def until(self, done: Callable[[str], bool]) -> None:
        """Wait until the mailbox is empty and ``done(state)`` holds, or the actor closed.
        Unbounded: the caller's state bounds it (a timeout that ends the awaited state)."""
        if (waiting := self.when_settled(done)) is not None:
            await waiting

    def when_settled(
        self, done: Callable[[str], bool] | None = None
    ) -> asyncio.Future[None] | None:
        """None when the mailbox is empty, no effect is awaited and ``done(state)`` holds
        (any state when ``done`` is None), or the actor is closed; else a future done at the
        first step's end where that is so, or at the close. Waiting costs no task."""
        if self._life == "closed" or (self.idle and (done is None or done(self._state))):
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append((fut, done or _any_state))
        return fut

    def _settled(self) -> None:
        """The mailbox is empty and nothing is awaited: wake who waits for this state."""
        left = []
        for fut, done in self._waiters or ():
            if not fut.done() and (self._life == "closed" or done(self._state)):
                fut.set_result(None)
            elif not fut.done():
                left.append((fut, done))
        self._waiters = left or None

    async def aclose(self) -> None:
        """Stop taking events, cancel the state's timer and tasks, drain nothing further."""
        ending = self.release()
        if ending is not None:
            await ending

    def release(self) -> asyncio.Future[Any] | None:
        """``aclose()`` without its wait: stop taking events, cancel the state's timer, its
        tasks and an awaited effect's work. Returns what is still ending (the cancelled
        work), or None when nothing is: a closer with nothing to wait for needs no task."""
        if self._life == "closed":
            return None
        self._life = "closed"
        self._leave_state()
        self.emit("closed", self)  # a failing listener is logged and removed there
        if self._waiters is not None:
            self._settled()
        if self._mailbox:
            for _, fut, _ in self._mailbox:
                if fut is not None and not fut.done():
                    fut.set_exception(ActorClosed(f"{self._who()} closed before handling it"))
            self._mailbox.clear()
        p, self._pending = self._pending, None
        me = asyncio.current_task()
        ending: list[asyncio.Future[Any]] = []
        if p is not None:
            if p.bound is not None:
                p.bound.cancel()
            if p.fut is not None and not p.fut.done():
                p.fut.set_exception(ActorClosed(f"{self._who()} closed while handling it"))
            work = p.work
            if work is not None and work is not me and not work.done():
                work.cancel()
                ending.append(work)
        for t in self._tasks or ():
            if t is not me and not t.done():
                t.cancel()
                ending.append(t)
        return asyncio.gather(*ending, return_exceptions=True) if ending else None

    # -- mailbox -------------------------------------------------------------------------
    def _mail(self) -> deque[Entry]:
        if self._mailbox is None:
            self._mailbox = deque()
        return self._mailbox

    def _enqueue(self, entry: Entry) -> None:
        mail = self._mail()
        mail.append(entry)
        # an actor with mail already is ready already; one waiting on an effect is stepped
        # when that ends
        if len(mail) == 1 and self._pending is None:
            self.scheduler.ready(self)

    def step_mailbox(self) -> None:
        """Handle the mailbox until it is empty, or until an effect has to be awaited: the
        scheduler then owns that work, and the rest of the step and of the mailbox waits for
        its end (``_work_ended``). Called by the scheduler only."""
        if self._pending is not None or self.closed:
            return
        self.start()
        mailbox = self._mailbox
        while mailbox and self._life != "closed":
            event, fut, gen = mailbox.popleft()
            if gen is not None and gen != self._gen:
                self._record_stale(event)
                continue
            try:
                st, tracing = self._step(event)
                if st.effects and self._effects_from(st, event, fut, tracing, 0):
                    return  # waiting on an effect: the rest when it ends
            except (Exception, asyncio.CancelledError) as e:
                # a CancelledError here was raised by a handler, nobody sent it
                self._failed(event, fut, e)
                continue
            if fut is not None:
                self._done(event, fut, st)
        if not self._mailbox:
            self._mailbox = None  # an idle actor holds no mailbox
            if self._waiters is not None and self._pending is None:
                self._settled()

    def _effects_from(
        self,
        st: Step,
        event: Event,
        fut: asyncio.Future[Step] | None,
        tracing: bool,
        index: int,
    ) -> bool:
        """Run ``st``'s effects from ``index``; True when one has to be awaited (it is then
        the scheduler's work, bounded by ``effect_timeout``, and the step pending)."""
        pending = self._run_effects_now(st, event, tracing, index)
        if pending is None:
            return False
        at, awaitable = pending
        p = _Pending(event, fut, st, tracing, at)
        self._pending = p
        name = st.effects[at]
        p.work = self.scheduler.own(awaitable, self._work_ended, name=f"{self._who()}:{name}")
        if not p.work.done():
            p.bound = self.clock.call_later(self.effect_timeout, p.expire)
        return True

    def _work_ended(self, work: asyncio.Future[Any]) -> None:
        p = self._pending
        if p is None or p.work is not work:
            return  # the actor closed meanwhile
        self._pending = None
        if p.bound is not None:
            p.bound.cancel()
        name = p.st.effects[p.index]
        outcome, detail, follow, logged = "ok", "", None, False
        if work.cancelled():
            if p.expired:
                outcome, detail = "timeout", f"exceeded {self.effect_timeout}s"
            else:
                outcome, detail = "error", "cancelled"
        elif (error := work.exception()) is not None:
            outcome, detail, logged = self._work_failed(name, error)
        else:
            follow = work.result()
        try:
            self._effect_done(name, p.event, p.tracing, outcome, detail, follow, logged=logged)
            if self._life != "closed" and self._effects_from(
                p.st, p.event, p.fut, p.tracing, p.index + 1
            ):
                return
        except Exception as e:
            self._failed(p.event, p.fut, e)
        else:
            self._done(p.event, p.fut, p.st)
        if self._mailbox and self._life != "closed":
            self.scheduler.ready(self)
        elif self._waiters is not None:
            self._settled()

    def _failed(self, event: Event, fut: asyncio.Future[Step] | None, e: BaseException) -> None:
        if not isinstance(e, Exception):
            # a sender awaiting a CancelledError would take it for its own cancellation
            error = RuntimeError(f"{self._who()}: handling {event.name!r} raised {describe(e)}")
            error.__cause__ = e
            e = error
        if fut is not None and not fut.done():
            fut.set_exception(e)
        else:
            self.report(
                logger, logging.ERROR, "error handling %r", event.name, event=event.name, exc_info=e
            )

    def _done(self, event: Event, fut: asyncio.Future[Step] | None, result: Step) -> None:
        if fut is not None and not fut.done():
            if result.outcome == "reject":
                fut.set_exception(
                    EventRejected(self.spec.name, self.instance, result.source, event.name)
                )
            else:
                fut.set_result(result)

    def _step(self, event: Event) -> tuple[Step, bool]:
        """Decide, change state (timers, tasks, listeners): everything before the effects.
        Returns the step and whether it is traced."""
        entry = self._table.cell(self._state, event.name)
        consulted: dict[str, bool] | None = None
        if isinstance(entry, Step):
            st = entry  # no guard to consult: the answer was built with the table
        else:
            consulted = {}
            st = entry.decide(self._guard_check(event, consulted))
        tracing = self._tracing()
        moved = st.outcome == "transition"
        if moved:
            if st.changed:
                self._leave_state()
            self._state = st.dest
        elif st.outcome == "reject":
            self.report(logger, logging.INFO, "rejects %r in state %r", event.name, st.source)
        if tracing:
            self._record(
                TraceRecord(
                    self.clock.now(),
                    st.outcome,
                    self.spec.name,
                    self.instance,
                    event=event.name,
                    source=st.source,
                    dest=st.dest,
                    effects=list(st.effects) if moved else [],
                    guards=consulted or {},
                    data=dict(event.data),
                )
            )
        if not moved:
            return st, tracing
        if st.changed:
            self._enter_state(event.name)
            if self._owner is not None or self._events.get("state_changed"):
                change = StateChanged(self.spec.name, self.instance, st.source, st.dest, event.name)
                self._emit_state(change)  # its owner, then its listeners (OwnedEmitter)
        return st, tracing

    def _guard_check(self, event: Event, consulted: dict[str, bool]) -> Callable[[str], bool]:
        guards = self._guards

        def check(name: str) -> bool:
            value = bool(guards[name](event))
            consulted[name] = value
            return value

        return check
