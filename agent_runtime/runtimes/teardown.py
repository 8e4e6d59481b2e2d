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
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent_runtime.clock import Clock
from statemachines.system import TeardownStep

# a step's work: what it has to wait for, or None when there is nothing left to do
Work = Callable[[], Awaitable[Any] | None]


@functools.cache
def waves(steps: tuple[TeardownStep, ...]) -> tuple[tuple[TeardownStep, ...], ...]:
    """The steps grouped by when they can begin: each wave once every step of the earlier
    waves they come after has ended (computed once per declared teardown)."""
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
    and not ended, ``ended`` the ones done with (what a cut of the whole says it cut)."""

    def __init__(
        self,
        steps: tuple[TeardownStep, ...],
        *,
        close_timeout: float,
        clock: Clock,
        log: logging.Logger,
        who: str,
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
        self._begin = begin
        self._waiting_for = waiting_for

    async def run(self, works: Mapping[str, Work]) -> None:
        """Every step, in waves: the steps whose predecessors have all ended run at once."""
        unknown = set(works) - {s.name for s in self.steps}
        if unknown:
            raise KeyError(f"no teardown step {sorted(unknown)}")
        for wave in waves(self.steps):
            # each step begins and asks its work; only the works that have something to
            # wait for run (as tasks when more than one does): a wave whose machines are
            # already closed costs no task and no timer
            pending = [(s, aw) for s in wave if (aw := self._begin_step(s, works.get(s.name)))]
            if len(pending) == 1:
                await self._step(*pending[0])
            elif pending:
                await asyncio.gather(*(self._step(s, aw) for s, aw in pending))

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
            self._log.error("%s: closing %s failed", self._who, step.name, exc_info=e)
        if aw is None:
            self._end(step)
        return aw

    def _end(self, step: TeardownStep) -> None:
        self.running.remove(step.name)
        self.ended.add(step.name)

    async def _step(self, step: TeardownStep, aw: Awaitable[Any]) -> None:
        seconds = step.bound * self._close_timeout
        try:
            if step.timed_by:
                await aw  # bounded by that machine's own timers
            else:
                await self._clock.wait_for(aw, seconds)
        except TimeoutError:
            why = self._waiting_for(step.name) if self._waiting_for is not None else step.what
            self._log.warning(
                "%s: closing %s took longer than %gs; cut off, the close goes on (%s)",
                self._who,
                step.name,
                seconds,
                why,
            )
        except (Exception, asyncio.CancelledError) as e:
            me = asyncio.current_task()
            if isinstance(e, asyncio.CancelledError) and me is not None and me.cancelling():
                raise  # the teardown itself is cut (its state's bound): nothing more runs
            # a work that raised CancelledError with nobody cancelling it (a close task
            # it waited on was cancelled) failed like any other: the next steps still run
            self._log.error("%s: closing %s failed", self._who, step.name, exc_info=e)
        finally:
            self._end(step)
