"""Virtual time, the testing kit's stand-in for ``agent_runtime.clock.AsyncioClock``: a
``VirtualClock`` only moves when told to (``advance``, ``run_until``), so tests and scenarios
run on virtual seconds and never sleep for real. ``settle()`` lets the loop run what is
ready between two timers; it reads asyncio's ready queue, which is why it lives here and
not in the runtime (the runtime orders its own work with its scheduler)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agent_runtime.clock import TimerHandle

T = TypeVar("T")


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A clock that stands still until ``advance``/``run_until``; timers fire in time order,
    and the loop is let run between them so every consequence of one timer settles first."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, _VirtualTimer]] = []

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
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
        await self.run_until(self._now + seconds)

    async def run_until(self, when: float) -> None:
        """Fire every timer due up to ``when`` in order, settling the loop after each."""
        await settle()
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > when:
                break
            _, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, timer.when)
            timer.callback()
            await settle()
        self._now = max(self._now, when)
        await settle()


async def settle(max_rounds: int = 200) -> None:
    """Let the event loop run every ready callback, and what those schedule in turn.

    Stops once the ready queue has stayed empty for a few rounds, or after ``max_rounds``.
    """
    loop = asyncio.get_running_loop()
    quiet = 0
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        ready = getattr(loop, "_ready", None)
        if ready is not None and len(ready) == 0:
            quiet += 1
            if quiet >= 3:
                return
        else:
            quiet = 0
