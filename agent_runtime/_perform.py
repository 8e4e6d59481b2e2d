"""What an actor does once a step has decided, apart from deciding: its effects (bounded,
their failure or their returned event queued), entering and leaving a state (the state's
timeout and its tasks), and what it reports (the log policy, the trace records).

``Performer`` is the base of ``actor.Actor``, which owns the mailbox, the step and every
attribute named here; the split keeps each half one idea.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from agent_runtime._messages import (
    EMPTY,
    EffectHandler,
    Event,
    GuardFn,
    Output,
    OutputFn,
    Reported,
    StateChanged,
)
from agent_runtime.clock import Clock, TimerHandle
from agent_runtime.emitter import OwnedEmitter
from agent_runtime.observe.trace import Tracer, TraceRecord, describe, job_place
from agent_runtime.scheduler import Scheduler
from statemachines import MachineSpec, Step, UnknownEvent
from statemachines.step import Table

logger = logging.getLogger("agent_runtime.actor")

# a mailbox entry: the event, who waits for its step, and for timer/task events the
# generation of the state they belong to (stale ones are dropped: they died with it)
Entry = tuple[Event, "asyncio.Future[Step] | None", int | None]
# an actor's own life, apart from its machine's state: a machine stopped early (a tracker
# stopped with its session still open) is closed in a state that is not final
Life = Literal["new", "running", "closed"]


class Performer(OwnedEmitter[str]):
    """The actor's effects, state entry and exit, and reports (see ``actor.Actor``)."""

    __slots__ = ()

    # owned by Actor (its __slots__ and __init__)
    spec: MachineSpec
    instance: str
    clock: Clock
    tracer: Tracer | None
    effect_timeout: float
    labels: Mapping[str, str]
    _table: Table
    _effects: Mapping[str, EffectHandler]
    _guards: Mapping[str, GuardFn]
    _linked: frozenset[str]
    _outputs: OutputFn | None
    _settings: Mapping[str, float | None]
    _state: str
    _gen: int
    _life: Life
    _timer: TimerHandle | None
    _timer_deadline: float
    _entered_at: float | None
    _tasks: set[asyncio.Future[Any]] | None
    scheduler: Scheduler

    # -- the state entered: its timeout and its tasks ---------------------------------------
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

    def _mail(self) -> deque[Entry]:
        """The mailbox (``Actor``)."""
        raise NotImplementedError

    def _enqueue(self, entry: Entry) -> None:
        """Queue ``entry`` and see that the mailbox is drained (``Actor``)."""
        raise NotImplementedError

    # -- the log policy ---------------------------------------------------------------------
    def log_fields(self, event: str = "") -> dict[str, Any]:
        """The structured fields of a log line about this machine: the job's labels
        (``job_id``, ``room``), ``machine``, ``instance``, ``state`` and ``event``."""
        return {
            "job_id": self.labels.get("job_id", ""),
            "room": self.labels.get("room", ""),
            "machine": self.spec.name,
            "instance": self.instance,
            "state": self._state,
            "event": event,
        }

    def where(self) -> str:
        """The job, room and machine, for a log line: ``job J (room R), avatar[a]``."""
        place = job_place(self.labels)
        return f"{place}, {self._who()}" if place else self._who()

    def report(
        self,
        log: logging.Logger,
        level: int,
        msg: str,
        *args: Any,
        event: str = "",
        exc_info: BaseException | None = None,
    ) -> None:
        """Log ``msg % args`` about this machine as the log policy asks: the line names the
        job and the machine, its ``extra`` carries ``log_fields``."""
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s: " + msg,
                self.where(),
                *args,
                extra=self.log_fields(event),
                exc_info=exc_info,
            )

    def _listener_failed(
        self, event: str, callback: Callable[..., Any], error: BaseException, args: tuple[Any, ...]
    ) -> None:
        change = args[0] if args and isinstance(args[0], StateChanged) else None
        self.report(
            logger,
            logging.ERROR,
            "a %s listener failed (%s); it is removed, the machine goes on",
            event,
            describe(error),
            event=change.event if change is not None else "",
            exc_info=error,
        )

    # -- the table ---------------------------------------------------------------------------
    def _who(self) -> str:
        return f"{self.spec.name}[{self.instance}]" if self.instance else self.spec.name

    def _check(self, event: Event) -> None:
        if event.name not in self._table.events:
            raise UnknownEvent(f"machine {self.spec.name!r} has no event {event.name!r}")

    def _record_stale(self, event: Event) -> None:
        if self._tracing():
            self._record(
                TraceRecord(
                    self.clock.now(),
                    "stale",
                    self.spec.name,
                    self.instance,
                    event=event.name,
                    source=self._state,
                )
            )

    def _run_effects_now(
        self, st: Step, event: Event, tracing: bool, start: int = 0
    ) -> tuple[int, Awaitable[Any]] | None:
        """Run the step's effects from ``start`` in order until one returns an awaitable:
        returns its index and the awaitable (the rest waits for it), or None when all of
        them are done."""
        if st.outcome != "transition":
            return None
        effects = st.effects
        for index in range(start, len(effects)):
            name = effects[index]
            try:
                res = self._effects[name](event)
            except asyncio.CancelledError:
                self._effect_done(name, event, tracing, "error", "cancelled")
            except Exception as e:
                self.report(
                    logger, logging.DEBUG, "effect %r failed", name, event=event.name, exc_info=e
                )
                self._effect_done(name, event, tracing, "error", f"{type(e).__name__}: {e}")
            else:
                if res is None:
                    # the common case, kept cheap: nothing to queue, record or pass on
                    if tracing or name in self._linked:
                        self._effect_done(name, event, tracing, "ok", "")
                elif inspect.isawaitable(res):
                    return index, res
                else:
                    self._effect_done(name, event, tracing, "ok", "", res)
            if self._life == "closed":
                break
        return None

    # -- effects ---------------------------------------------------------------------------
    def _effect_done(
        self,
        name: str,
        event: Event,
        tracing: bool,
        outcome: str,
        detail: str,
        follow: object = None,
        *,
        logged: bool = False,
    ) -> None:
        """Record an effect's outcome; queue its error event, or the event it returned; pass
        a success on to the effect's declared links. ``logged``: the effect logged its own
        failure (``Reported``)."""
        if outcome != "ok":
            # the log policy: an effect that failed is seen by an operator, once, here
            self.report(
                logger,
                logging.DEBUG if logged else logging.WARNING,
                "effect %r %s: %s",
                name,
                "timed out" if outcome == "timeout" else "failed",
                detail,
                event=event.name,
            )
        if tracing or (outcome != "ok" and self._tracing()):
            self._record(
                TraceRecord(
                    self.clock.now(),
                    "effect",
                    self.spec.name,
                    self.instance,
                    event=event.name,
                    source=self._state,
                    effect=name,
                    outcome=outcome,
                    detail=detail,
                )
            )
        if outcome != "ok":
            err = self.spec.effect(name).error_event
            if err is not None:
                self._mail().append(
                    (Event(err, {"effect": name, "outcome": outcome, "detail": detail}), None, None)
                )
            return
        if isinstance(follow, Event):
            self._check(follow)
            self._mail().append((follow, None, None))
        if name in self._linked and self._outputs is not None:
            self._outputs.fire(
                self.spec.name, name, follow.data if isinstance(follow, Output) else EMPTY
            )

    def _work_failed(self, name: str, error: BaseException) -> tuple[str, str, bool]:
        """An awaited effect's failure: its outcome, its detail, and whether the effect
        logged it already (``Reported``: that line is the operator's, once)."""
        if isinstance(error, TimeoutError):
            return "timeout", f"exceeded {self.effect_timeout}s", False
        logged = False
        if isinstance(error, Reported):
            error, logged = error.error, True
        self.report(logger, logging.DEBUG, "effect %r failed", name, exc_info=error)
        return "error", f"{type(error).__name__}: {error}", logged

    # -- state entry and exit ----------------------------------------------------------------
    def _enter_state(self, by: str = "") -> None:
        self._gen += 1
        gen = self._gen
        self._entered_at = self.clock.now()
        st = self._table.states[self._state]
        if st.timeout is not None:
            seconds = self._settings.get(st.timeout.setting, st.timeout.default)
            if seconds is not None:
                ev = Event(st.timeout.event, {"after": seconds})
                self._timer = self.clock.call_later(seconds, lambda: self._fire(ev, gen))
                self._timer_deadline = self._entered_at + max(0.0, seconds)
        for name in st.invoke:
            self._start_task(name, gen, by)

    def _leave_state(self) -> None:
        self._gen += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._tasks:
            for t in list(self._tasks):
                t.cancel()

    def _fire(self, event: Event, gen: int) -> None:
        if gen == self._gen and self._life != "closed":
            self._timer = None
            self._enqueue((event, None, gen))

    def _start_task(self, name: str, gen: int, by: str = "") -> None:
        """Start the state's invoked work ``name``: the scheduler's, cancelled when the
        state is left; how it ends comes back as an event (``_task_ended``)."""
        try:
            res = self._effects[name](Event(f"enter:{self._state}"))
        except (Exception, asyncio.CancelledError) as e:
            self._task_failed(name, gen, by, e)
            return
        if not inspect.isawaitable(res):
            self._task_succeeded(name, gen, res)
            return
        task = self.scheduler.own(
            res,
            lambda t: self._task_ended(name, gen, by, t),
            name=f"{self._who()}:{name}",
        )
        if self._tasks is None:
            self._tasks = set()
        self._tasks.add(task)

    def _task_ended(self, name: str, gen: int, by: str, task: asyncio.Future[Any]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
            if not self._tasks:
                self._tasks = None  # an empty set held by a live job is memory per job
        if task.cancelled():
            if gen != self._gen or self._life == "closed" or _cancel_asked(task):
                return  # cancelled: its state was left, or the loop is closing
            error: BaseException = asyncio.CancelledError()
        else:
            found = task.exception()
            if found is None:
                self._task_succeeded(name, gen, task.result())
                return
            error = found
        self._task_failed(name, gen, by, error)

    def _task_failed(self, name: str, gen: int, by: str, e: BaseException) -> None:
        # a CancelledError nothing sent (a plugin raising it) is a failure like any other,
        # reported now rather than when the state's timeout runs out
        level = logging.WARNING
        if isinstance(e, Reported):
            level, e = logging.DEBUG, e.error  # its effect's line is the operator's
        detail = describe(e)
        if isinstance(e, asyncio.CancelledError):
            detail += " (raised by the task itself; nothing cancelled it)"
        self._record_task(name, "error", detail)
        self.report(logger, level, "state task %r failed: %s", name, detail, event=by)
        self.report(logger, logging.DEBUG, "state task %r failed", name, event=by, exc_info=e)
        err = self.spec.effect(name).error_event
        if err is not None and gen == self._gen and self._life != "closed":
            # the cause with its type, as an effect's error event carries it
            self._enqueue((Event(err, {"effect": name, "detail": describe(e)}), None, gen))

    def _task_succeeded(self, name: str, gen: int, res: object) -> None:
        self._record_task(name, "ok")
        if gen == self._gen and self._life != "closed":
            if name in self._linked and self._outputs is not None:
                self._outputs.fire(
                    self.spec.name, name, res.data if isinstance(res, Output) else EMPTY
                )
            if isinstance(res, Event):
                self._enqueue((res, None, gen))

    def _record_task(self, name: str, outcome: str, detail: str = "") -> None:
        if not self._tracing():
            return
        self._record(
            TraceRecord(
                self.clock.now(),
                "effect",
                self.spec.name,
                self.instance,
                effect=name,
                outcome=outcome,
                detail=detail,
            )
        )

    def _tracing(self) -> bool:
        """Whether a record made now would be kept: records are only built then."""
        tracer = self.tracer
        if tracer is None:
            return False
        try:
            return bool(tracer.active)
        except (Exception, asyncio.CancelledError) as e:
            self._drop_tracer(e)
            return False

    def _record(self, record: TraceRecord) -> None:
        if self.tracer is None:
            return
        try:
            self.tracer.write(record)
        except (Exception, asyncio.CancelledError) as e:
            self._drop_tracer(e)

    def _drop_tracer(self, error: BaseException) -> None:
        # recording is observation: a tracer that raises, whatever it raises (a Tracer
        # guards its sinks; a tracer of another make may not), is dropped, the step goes on
        self.tracer = None
        self.report(
            logger,
            logging.WARNING,
            "the tracer failed (%s); this machine records nothing more",
            describe(error),
            exc_info=error,
        )


def _cancel_asked(fut: asyncio.Future[Any]) -> bool:
    """Whether somebody cancelled ``fut`` (a task that raised CancelledError on its own was
    not: ``cancelling()`` counts the requests)."""
    return not isinstance(fut, asyncio.Task) or fut.cancelling() > 0
