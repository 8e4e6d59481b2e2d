"""Virtual time, the testing kit's stand-in for ``agent_runtime.clock.AsyncioClock``: a
``VirtualClock`` only moves when told to (``advance``, ``run_until``), so tests and scenarios
run on virtual seconds and never sleep for real. On a ``VirtualTimeLoop``
(``virtual_loop.py``, which ``settle`` and ``run`` come from too) the loop's own timers move
with it.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agent_runtime.clock import TimerHandle, check_seconds
from agent_runtime.testing.virtual_loop import (
    UPTIME,
    VirtualTimeLoop,
    VirtualTimeStalled,
    run,
    settle,
)

# the loop has a module of its own; its names stay here too, where users import them
__all__ = ["UPTIME", "VirtualClock", "VirtualTimeLoop", "VirtualTimeStalled", "run", "settle"]

T = TypeVar("T")


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "context", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        # fired in the context it was armed in, as the loop's call_later does: a job's
        # timer runs as the job's code (its job context current), not as the test's
        self.context = contextvars.copy_context()

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A clock that stands still until ``advance``/``run_until``; timers fire in time order,
    and the loop is let run between them so every consequence of one timer settles first."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = check_seconds("VirtualClock(start=...)", start)
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, _VirtualTimer]] = []

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        # as the loop's call_later: a negative delay is now; a NaN would break the order
        delay = check_seconds("call_later", delay, negative=True)
        if not callable(callback):  # else it failed at the advance() that fired it
            raise TypeError(f"call_later takes a callback to call, not {callback!r}")
        timer = _VirtualTimer(self._now + max(0.0, delay), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    @property
    def pending(self) -> int:
        """Timers still armed (cancelled ones do not count)."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_deadline(self) -> float | None:
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = self.call_later(delay, wake)
        try:
            await fut
        finally:
            handle.cancel()

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        task = asyncio.ensure_future(aw)
        if timeout is None:
            return await task
        expired = False

        def expire() -> None:
            nonlocal expired
            if not task.done():
                expired = True
                task.cancel()

        handle = self.call_later(timeout, expire)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            # the bound cut it, not a cancellation of the waiter itself (which goes on up)
            if expired and not (me is not None and me.cancelling()):
                raise TimeoutError() from None
            raise
        finally:
            handle.cancel()

    async def advance(self, seconds: float) -> None:
        """Move time on by ``seconds`` (a finite number, at least 0: time never goes back,
        and NaN would stop it for good), firing what falls due on the way."""
        await self.run_until(self._now + check_seconds("advance", seconds))

    async def run_until(self, when: float) -> None:
        """Fire every timer due up to ``when`` in order, settling the loop after each (on a
        ``VirtualTimeLoop``, the loop's own timers due meanwhile fire as its time passes
        with this clock's). A ``when`` already past only settles the loop."""
        check_seconds("run_until", when, negative=True)
        loop = asyncio.get_running_loop()
        follow = loop if isinstance(loop, VirtualTimeLoop) else None
        await settle()
        while True:
            deadline = self.next_deadline()
            due = deadline is not None and deadline <= when
            target = deadline if due and deadline is not None else when
            if not await self._move_to(target, follow):
                continue  # a loop timer on the way armed one of ours, due first
            if not due:
                break
            head = self.next_deadline()
            if head is None or head > self._now:
                continue  # a loop timer on the way cancelled the one due here
            _, _, timer = heapq.heappop(self._timers)
            timer.context.run(timer.callback)
            await settle()
        await settle()

    async def _move_to(self, when: float, follow: VirtualTimeLoop | None) -> bool:
        """Time up to ``when``; False when it stopped short, at a loop timer that armed a
        timer of this clock due before ``when`` (a speech the loop paced ending, the job
        then waiting from there)."""
        if when <= self._now:
            return True
        if follow is not None:
            # the loop's timers due before ``when`` fire first, each at its time on this
            # clock too, each settled; those due at ``when`` itself run after this clock's
            # timer there (the caller's next settle)
            while (due := follow.next_timer()) is not None and (
                due - follow.time() < when - self._now
            ):
                step = max(0.0, due - follow.time())
                self._now += step
                await follow.pass_time(step)
                mine = self.next_deadline()
                if mine is not None and mine < when:
                    return False
            follow.elapse(when - self._now)
        self._now = when
        return True
