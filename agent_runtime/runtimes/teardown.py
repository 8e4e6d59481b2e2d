"""The one runner of a declared teardown (``statemachines.system.TEARDOWN`` and ``RELEASE``).

A teardown is data: steps, what each comes after, and its share of ``close_timeout``. The
runner gives each step its work (what the owner of the step does) and runs them:

* a step begins once every step it comes after has ended, whether it finished, failed or
  was cut at its bound: a cut step never keeps the ones after it from running;
* steps that can begin together run at once;
* as a step begins, ``begin(step)`` says so (the owner fires that step's declared links);
* a step's work runs within its share, unless a machine's own timers bound it
  (``timed_by``); a step with no work only begins and ends.

An abort runs the same steps in the same order (it only skips what comes before them: the
simulator's hold).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agent_runtime.clock import Clock, TimerHandle
from agent_runtime.scheduler import Cuttable
from statemachines.system import TeardownStep

T = TypeVar("T")

# a step's work: what it has to wait for, or None when there is nothing left to do
Work = Callable[[], Awaitable[Any] | None]


def waves(steps: tuple[TeardownStep, ...]) -> tuple[tuple[TeardownStep, ...], ...]:
    """The steps grouped by when they can begin: each wave once every step of the earlier
    waves they come after has ended (computed once per declared teardown: looked up by the
    tuple's identity, since hashing its models on every close costs more than the run)."""
    known = _WAVES.get(id(steps))
    if known is not None and known[0] is steps:
        return known[1]
    found = _waves(steps)
    _WAVES[id(steps)] = (steps, found)  # holds the tuple: its id is never reused
    return found


_WAVES: dict[int, tuple[tuple[TeardownStep, ...], tuple[tuple[TeardownStep, ...], ...]]] = {}


def _waves(steps: tuple[TeardownStep, ...]) -> tuple[tuple[TeardownStep, ...], ...]:
    ended: set[str] = set()
    left = list(steps)
    out: list[tuple[TeardownStep, ...]] = []
    while left:
        ready = tuple(s for s in left if all(a in ended for a in s.after))
        if not ready:
            raise ValueError(f"teardown steps {[s.name for s in left]} wait on no step")
        names = {s.name for s in ready}
        left = [s for s in left if s.name not in names]
        ended |= names
        out.append(ready)
    return tuple(out)


class Teardown:
    """Runs ``steps`` with the works given to ``run``; ``running`` names the steps begun
    and not ended (after a cut of the whole: the ones it cut), ``ended`` the ones done
    with (what a cut of the whole says it cut)."""

    def __init__(
        self,
        steps: tuple[TeardownStep, ...],
        *,
        close_timeout: float,
        clock: Clock,
        log: logging.Logger,
        who: str,
        fields: Mapping[str, Any] | None = None,
        begin: Callable[[str], None] | None = None,
        waiting_for: Callable[[str], str] | None = None,
    ) -> None:
        self.steps = steps
        self.running: list[str] = []
        self.ended: set[str] = set()
        self._close_timeout = close_timeout
        self._clock = clock
        self._log = log
        self._who = who
        self._fields = dict(fields or {})  # a log line's structured fields (the log policy)
        self._begin = begin
        self._waiting_for = waiting_for

    def run(self, works: Mapping[str, Work], result: T) -> asyncio.Future[T]:
        """Every step, in waves: the steps whose predecessors have all ended run at once.
        Returns what is done with ``result`` once the last step has ended; cancelling it
        cuts the whole (its state's bound): no step begins after it, and the works the
        teardown runs itself are cancelled.

        The runner is callbacks on the works' ends, not a task: a work that is a future
        is followed as it is (never cancelled here: it has its own owner), one that is a
        coroutine gets a task of its own, the step's, cancelled when the step is cut. A
        teardown whose machines are already closed costs no task and no timer."""
        unknown = set(works) - {s.name for s in self.steps}
        if unknown:
            raise KeyError(f"no teardown step {sorted(unknown)}")
        run = _Run(self, works, result)
        run.next_wave()
        return run.done

    def _begin_step(self, step: TeardownStep, work: Work | None) -> Awaitable[Any] | None:
        """Begin ``step``; what its work has to wait for, or None (it has ended)."""
        self.running.append(step.name)
        aw: Awaitable[Any] | None = None
        try:
            if self._begin is not None:
                self._begin(step.name)
            if work is not None:
                aw = work()
        except Exception as e:
            self._failed(step, e)
        if aw is None:
            self._end(step)
        return aw

    def _end(self, step: TeardownStep) -> None:
        self.running.remove(step.name)
        self.ended.add(step.name)

    def _cut(self, step: TeardownStep) -> None:
        why = self._waiting_for(step.name) if self._waiting_for is not None else step.what
        self._log.warning(
            "%s: closing %s took longer than %gs; cut off, the close goes on (%s)",
            self._who,
            step.name,
            step.bound * self._close_timeout,
            why,
            extra=self._fields,
        )

    def _failed(self, step: TeardownStep, e: BaseException) -> None:
        if isinstance(e, ServiceFailed):  # a fault of the run, as a hang is: no traceback
            self._log.warning(
                "%s: closing %s failed (%s); the close goes on",
                self._who,
                step.name,
                e,
                extra=self._fields,
            )
            return
        self._log.error(
            "%s: closing %s failed", self._who, step.name, exc_info=e, extra=self._fields
        )


class ServiceFailed(Exception):
    """A step's call to a service failed on the service's side (the room's own
    ``disconnect()``): logged as a WARNING naming the cause, where a step that raised is a
    bug's ERROR with its traceback."""


async def service_call(call: Awaitable[T]) -> T:
    """``call``, its failure a ``ServiceFailed`` saying what it was."""
    try:
        return await call
    except Exception as e:
        raise ServiceFailed(f"{type(e).__name__}: {e}") from e


class _Live:
    """A step whose work runs: what it waits on, whether the step owns it, its bound."""

    __slots__ = ("bound", "fut", "owned")

    def __init__(self, fut: asyncio.Future[Any], owned: bool, bound: TimerHandle | None) -> None:
        self.fut, self.owned, self.bound = fut, owned, bound


class _Run:
    """One run of a teardown: the waves left, the steps of the current wave still live."""

    __slots__ = ("done", "live", "result", "stuck", "td", "waves", "works")

    def __init__(self, td: Teardown, works: Mapping[str, Work], result: Any) -> None:
        self.td, self.works, self.result = td, works, result
        # cutting it cuts the whole (its state's bound)
        self.done: asyncio.Future[Any] = Cuttable(self._whole_ended)
        self.waves = iter(waves(td.steps))
        self.live: dict[str, _Live] = {}  # by step name (a model's hash is slow)
        # works of the steps cut at their bound that swallowed the cancellation
        self.stuck: list[asyncio.Future[Any]] = []

    def next_wave(self) -> None:
        """Begin waves until one has work to wait for (or none is left: done)."""
        while not self.done.done():
            wave = next(self.waves, None)
            if wave is None:
                self._whole_ended()
                self.done.set_result(self.result)
                return
            for step in wave:
                aw = self.td._begin_step(step, self.works.get(step.name))
                if self.done.done():
                    _drop(aw)  # the whole was cut as the step began: nothing runs on
                    return
                if aw is not None:
                    self._follow(step, aw)
            if self.live:
                return  # the last of them to end begins the next wave

    def _follow(self, step: TeardownStep, aw: Awaitable[Any]) -> None:
        owned = not isinstance(aw, asyncio.Future)
        fut: asyncio.Future[Any] = asyncio.ensure_future(aw)
        bound = None
        if not step.timed_by:  # else that machine's own timers bound it
            seconds = step.bound * self.td._close_timeout
            bound = self.td._clock.call_later(seconds, lambda: self._cut(step))
        self.live[step.name] = _Live(fut, owned, bound)
        fut.add_done_callback(lambda f: self._ended(step, f))

    def _ended(self, step: TeardownStep, fut: asyncio.Future[Any]) -> None:
        failure = None if fut.cancelled() else fut.exception()  # retrieved, whoever ran it
        live = self.live.get(step.name)
        if live is None or live.fut is not fut or self.done.done():
            return  # cut before, or the whole was cut
        if live.bound is not None:
            live.bound.cancel()
        if fut.cancelled():
            # a work cancelled with nobody cutting it (a close task it followed was
            # cancelled) failed like any other: the next steps still run
            self.td._failed(step, asyncio.CancelledError())
        elif failure is not None:
            self.td._failed(step, failure)
        self._close(step)

    def _cut(self, step: TeardownStep) -> None:
        live = self.live.get(step.name)
        if live is None or self.done.done():
            return
        self.td._cut(step)
        if live.owned:
            live.fut.cancel()
            self.stuck.append(live.fut)
        self._close(step)

    def _close(self, step: TeardownStep) -> None:
        del self.live[step.name]
        self.td._end(step)
        if not self.live:
            self.next_wave()

    def _whole_ended(self) -> None:
        """Ended, or cut as a whole: nothing more begins, and no work the steps own outlives
        the teardown (one cut at its bound that swallowed that cancellation gets another).
        The steps cut with the whole stay ``running``: what the cut says it cut."""
        for work in self.stuck:
            work.cancel()
        live, self.live = self.live, {}
        for each in live.values():
            if each.bound is not None:
                each.bound.cancel()
            if each.owned:
                each.fut.cancel()


def _drop(aw: Awaitable[Any] | None) -> None:
    """A step's work begun after its teardown was cut: a coroutine is never run, a future
    is left to its owner."""
    if asyncio.iscoroutine(aw):
        aw.close()
