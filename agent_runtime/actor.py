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
from collections.abc import Awaitable, Callable, Mapping
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
from agent_runtime._perform import Entry, Performer, current_task_cancelling
from agent_runtime.clock import AsyncioClock, Clock, TimerHandle
from agent_runtime.observe.trace import Tracer, TraceRecord, describe
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

# a step whose effect has to be awaited: (event, its future, the step, traced, effect index)
_Unfinished = tuple[Event, "asyncio.Future[Step] | None", Step, bool, int]


class Actor(Performer):
    """Runs one instance of ``spec``. Emits ``state_changed`` (a ``StateChanged``) and,
    once, ``closed``."""

    # six per job: slots keep each one small
    __slots__ = (
        "_awaited",
        "_closed",
        "_effects",
        "_entered",
        "_entered_at",
        "_gen",
        "_guards",
        "_linked",
        "_mailbox",
        "_outputs",
        "_runner",
        "_settings",
        "_state",
        "_table",
        "_tasks",
        "_timer",
        "_timer_deadline",
        "clock",
        "effect_timeout",
        "instance",
        "labels",
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
    ) -> None:
        super().__init__()
        self.spec = spec
        self._table = table_of(spec)  # the spec's prebuilt answers, shared by every actor
        self.instance = instance
        self._effects: Mapping[str, EffectHandler] = effects or {}
        self._guards: Mapping[str, GuardFn] = guards or {}
        if self._table.effect_names.difference(self._effects) or (
            self._table.guard_names.difference(self._guards)
        ):
            missing = [e.name for e in spec.effects if e.name not in self._effects]
            missing += [g for g in spec.guards if g not in self._guards]
            raise ValueError(f"machine {spec.name!r}: no handler for {', '.join(missing)}")
        self._settings: Mapping[str, float | None] = settings or {}
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
        # the mailbox's drain: a callback while every effect returns at once, a task from
        # the first effect that has to be awaited (see _drain_now)
        self._runner: asyncio.Task[None] | asyncio.Handle | None = None
        self._awaited: Awaitable[Any] | None = None  # that effect, until it is awaited
        self._timer: TimerHandle | None = None
        self._timer_deadline = 0.0  # when the armed timer fires, on this actor's clock
        self._entered_at: float | None = None
        self._tasks: set[asyncio.Task[Any]] | None = None
        self._closed = False
        self._entered = False
        # the effects whose success the system passes on (their declared links), and how
        self._linked: frozenset[str] = NO_NAMES
        self._outputs: OutputFn | None = None

    # -- public --------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._state

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def started(self) -> bool:
        """Whether the initial state was entered (by ``start`` or a first event)."""
        return self._entered

    @property
    def states(self) -> Mapping[str, State]:
        """The machine's states by name."""
        return self._table.states

    @property
    def idle(self) -> bool:
        return not self._mailbox and self._runner is None

    @property
    def live_tasks(self) -> int:
        """State-scoped tasks still running (for tests: none outlive their state)."""
        return sum(1 for t in self._tasks or () if not t.done())

    @property
    def timer_armed(self) -> bool:
        return self._timer is not None

    @property
    def timer_deadline(self) -> float | None:
        """When the state's timeout fires (this actor's clock), while it is armed."""
        return self._timer_deadline if self._timer is not None else None

    @property
    def entered_at(self) -> float | None:
        """When the current state was entered (this actor's clock); None before ``start``."""
        return self._entered_at

    def pass_outputs(self, effects: frozenset[str], to: OutputFn) -> None:
        """Hand the success of each of ``effects`` to ``to`` (the system's links): an effect
        never posts to another machine itself."""
        self._linked, self._outputs = effects, to

    def start(self) -> None:
        """Enter the initial state: arm its timeout and start its tasks. Idempotent; the
        first event starts the actor too."""
        if not self._entered and not self._closed:
            self._entered = True
            self._enter_state()

    def post(self, event: Event) -> None:
        """Queue an event, fire and forget. A rejected event is logged and traced."""
        self._check(event)
        if self._closed:
            logger.info("%s: dropped %r after close", self._who(), event.name)
            return
        self._enqueue((event, None, None))

    async def send(self, event: Event) -> Step:
        """Queue an event and wait for its step; raises ``EventRejected`` on a reject cell."""
        self._check(event)
        if self._closed:
            raise ActorClosed(f"{self._who()} is closed; {event.name!r} was not handled")
        fut: asyncio.Future[Step] = asyncio.get_running_loop().create_future()
        self._enqueue((event, fut, None))
        return await fut

    async def join(self) -> None:
        """Wait until the mailbox is empty (effects included)."""
        while self._runner is not None:
            runner = self._runner
            if isinstance(runner, asyncio.Task):
                await asyncio.shield(runner)
            else:
                await asyncio.sleep(0)  # a drain scheduled before this wakes up runs first

    async def until(self, done: Callable[[str], bool]) -> None:
        """Wait until the mailbox is empty and ``done(state)`` holds, or the actor closed.
        Unbounded: the caller's state bounds it (a timeout that ends the awaited state)."""
        await self.join()
        if done(self._state) or self._closed:
            return  # the usual case: nothing to listen for
        changed = asyncio.Event()

        def wake(*_: Any) -> None:
            changed.set()

        self.on("state_changed", wake)
        self.on("closed", wake)
        try:
            await self.join()
            while not done(self._state) and not self._closed:
                changed.clear()
                await changed.wait()
                await self.join()
        finally:
            self.off("state_changed", wake)
            self.off("closed", wake)

    async def aclose(self) -> None:
        """Stop taking events, cancel the state's timer and tasks, drain nothing further."""
        if self._closed:
            return
        self._closed = True
        self._leave_state()
        self.emit("closed", self)  # a failing listener is logged and removed there
        runner, self._runner = self._runner, None
        if self._mailbox:
            for _, fut, _ in self._mailbox:
                if fut is not None and not fut.done():
                    fut.set_exception(ActorClosed(f"{self._who()} closed before handling it"))
            self._mailbox.clear()
        if isinstance(runner, asyncio.Handle):
            runner.cancel()
        elif runner is not None and runner is not asyncio.current_task():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
        awaited, self._awaited = self._awaited, None
        # an effect whose drain was cancelled before it could await it
        if asyncio.iscoroutine(awaited):
            awaited.close()  # never begun
        elif isinstance(awaited, asyncio.Future) and not awaited.done():
            awaited.cancel()
            await asyncio.gather(awaited, return_exceptions=True)
        tasks = [t for t in self._tasks or () if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- mailbox -------------------------------------------------------------------------
    def _mail(self) -> deque[Entry]:
        if self._mailbox is None:
            self._mailbox = deque()
        return self._mailbox

    def _enqueue(self, entry: Entry) -> None:
        self._mail().append(entry)
        if self._runner is None:
            self._runner = asyncio.get_running_loop().call_soon(self._drain_now)

    def _drain_now(self) -> None:
        """The mailbox, handled in this callback while every effect returns at once (no
        task, no coroutine per step). From the first effect that returns an awaitable a task
        takes over: it awaits that effect, runs the rest of its step, then the rest of the
        mailbox (``_drain``)."""
        try:
            self.start()
            mailbox = self._mail()
            while mailbox and not self._closed:
                event, fut, gen = mailbox.popleft()
                if gen is not None and gen != self._gen:
                    self._record_stale(event)
                    continue
                try:
                    st, tracing = self._step(event)
                    pending = self._run_effects_now(st, event, tracing)
                except (Exception, asyncio.CancelledError) as e:
                    # a callback nobody cancels: a CancelledError here was raised, not sent
                    self._failed(event, fut, e)
                    continue
                if pending is not None:
                    # the task awaits the effect itself (no task of its own): its first
                    # step runs it, as a task's first step would have
                    index, self._awaited = pending
                    self._runner = asyncio.get_running_loop().create_task(
                        self._drain((event, fut, st, tracing, index)),
                        name=f"actor:{self._who()}",
                    )
                    return
                self._done(event, fut, st)
        finally:
            if not isinstance(self._runner, asyncio.Task):
                self._runner = None
                if not self._mailbox:
                    self._mailbox = None  # an idle actor holds no mailbox

    async def _drain(self, step: _Unfinished | None = None) -> None:
        try:
            if step is not None:
                await self._finish_step(*step)
            self.start()
            mailbox = self._mail()
            while mailbox and not self._closed:
                event, fut, gen = mailbox.popleft()
                if gen is not None and gen != self._gen:
                    self._record_stale(event)
                    continue
                try:
                    result = await self._handle(event)
                except asyncio.CancelledError as e:
                    if self._closed or current_task_cancelling():
                        raise
                    self._failed(event, fut, e)  # raised inside the step, not sent to it
                    continue
                except Exception as e:
                    self._failed(event, fut, e)
                    continue
                self._done(event, fut, result)
        finally:
            if self._runner is asyncio.current_task():
                self._runner = None
                if not self._mailbox:
                    self._mailbox = None  # an idle actor holds no mailbox

    async def _finish_step(
        self,
        event: Event,
        fut: asyncio.Future[Step] | None,
        st: Step,
        tracing: bool,
        index: int,
    ) -> None:
        """The step ``_drain_now`` handed over: its awaited effect, then the effects after it."""
        awaited, self._awaited = self._awaited, None
        assert awaited is not None
        try:
            await self._await_effect(st.effects[index], event, tracing, awaited)
            if not self._closed:
                for name in st.effects[index + 1 :]:
                    await self._run_effect(name, event, tracing)
                    if self._closed:
                        break
        except Exception as e:
            self._failed(event, fut, e)
            return
        self._done(event, fut, st)

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

    async def _handle(self, event: Event) -> Step:
        st, tracing = self._step(event)
        for name in st.effects:
            await self._run_effect(name, event, tracing)
            if self._closed:
                break
        return st

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
            logger.info("%s rejects %r in state %r", self._who(), event.name, st.source)
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
