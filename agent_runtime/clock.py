"""Injectable time: ``Clock`` is what the runtime arms its timers on; ``AsyncioClock`` is
real time. The testing kit's ``VirtualClock`` (``agent_runtime.testing.clock``) only moves
when told to, so tests and scenarios run on virtual seconds and never sleep for real."""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...
    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...
    async def sleep(self, delay: float) -> None: ...
    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T: ...


def check_seconds(what: str, value: object, *, negative: bool = False) -> float:
    """``value`` as a finite number of seconds (at least 0, unless ``negative``: a time
    rather than a duration) for ``what``, named in the error: ``TypeError`` for what is no
    number (a bool included), ``ValueError`` for a NaN, an infinite or a negative one (NaN
    would stop a clock for good, a negative wait would be skipped without a word)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} takes a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or (value < 0 and not negative):
        least = "" if negative else ", at least 0"
        raise ValueError(f"{what} takes a finite number of seconds{least}, not {value!r}")
    return float(value)


class AsyncioClock:
    """Real time from the running loop; ``now()`` counts seconds since the clock was first
    used (two clocks count from different zeros: runtimes that share a tracer share one)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._origin: float | None = None
        self._shared: _Deadlines | None = None  # the loop's coalesced timers, once looked up

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._origin = self._loop.time()
        return self._loop

    def now(self) -> float:
        loop = self._get_loop()
        assert self._origin is not None
        return loop.time() - self._origin

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        if delay < COALESCE_FROM:
            return self._get_loop().call_later(max(0.0, delay), callback)
        return self._coalesced().call_later(delay, callback)

    async def sleep(self, delay: float) -> None:
        await asyncio.sleep(delay)

    async def wait_for(self, aw: Awaitable[T], timeout: float | None) -> T:
        if timeout is None or timeout < COALESCE_FROM:
            # asyncio.timeout, not asyncio.wait_for: on 3.11 the latter wraps every
            # coroutine in a task of its own
            async with asyncio.timeout(timeout):
                return await aw
        return await self._coalesced().wait_for(aw, timeout)

    def _coalesced(self) -> _Deadlines:
        if self._shared is None:
            self._shared = _deadlines(self._get_loop())
        return self._shared


# Timers of a second or more share the loop's: a deadline is rounded up to the next multiple
# of GRAIN, so every one that ends in the same 50 ms is one loop timer. A job arms such timers
# (effects' and teardown steps' bounds, state timeouts) all along and they almost never fire;
# arming and cancelling a loop timer for each, in a heap holding every live job's timers, cost
# about 10 us, sixteen times in a job's close.
COALESCE_FROM = 1.0
GRAIN = 0.05


class _Entry:
    """A timer in a slot: ``expire`` runs when the slot's time comes."""

    __slots__ = ("key", "owner")

    def __init__(self, owner: _Deadlines, key: int) -> None:
        self.owner = owner
        self.key = key

    def expire(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        slot = self.owner.slots.get(self.key)
        if slot is not None:
            slot.discard(self)


class _Later(_Entry):
    __slots__ = ("callback",)

    def __init__(self, owner: _Deadlines, key: int, callback: Callable[[], None]) -> None:
        super().__init__(owner, key)
        self.callback = callback

    def expire(self) -> None:
        self.callback()


class _Waiter(_Entry):
    __slots__ = ("expired", "task")

    def __init__(self, owner: _Deadlines, key: int, task: asyncio.Task[Any]) -> None:
        super().__init__(owner, key)
        self.task = task
        self.expired = False

    def expire(self) -> None:
        if not self.task.done():
            self.expired = True
            self.task.cancel()


class _Deadlines:
    """The coalesced timers of one event loop: entries by the GRAIN slot they end in, one
    loop timer per slot (left to fire when emptied: the slot is shared)."""

    __slots__ = ("_loop_ref", "slots")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # weakly: the loop is this object's key in _DEADLINES
        self._loop_ref = weakref.ref(loop)
        self.slots: dict[int, set[_Entry]] = {}

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        assert loop is not None  # used only from within the running loop
        return loop

    def _slot(self, delay: float) -> tuple[int, set[_Entry]]:
        key = math.ceil((self._loop.time() + delay) / GRAIN)
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = set()
            self._loop.call_at(key * GRAIN, self._expire, key)
        return key, slot

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        key, slot = self._slot(delay)
        later = _Later(self, key, callback)
        slot.add(later)
        return later

    async def wait_for(self, aw: Awaitable[T], timeout: float) -> T:
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing to cancel, so the plain bound
            async with asyncio.timeout(timeout):
                return await aw
        key, slot = self._slot(timeout)
        waiter = _Waiter(self, key, task)
        slot.add(waiter)
        cancelling = task.cancelling()
        try:
            return await aw
        except asyncio.CancelledError as e:
            # as asyncio.timeout: the bound's own cancellation becomes TimeoutError, one
            # from anyone else goes on up
            if waiter.expired and task.uncancel() <= cancelling:
                raise TimeoutError() from e
            raise
        finally:
            waiter.cancel()

    def _expire(self, key: int) -> None:
        for entry in self.slots.pop(key, ()):
            try:
                entry.expire()
            except Exception as e:  # as the loop would: reported, the other timers still fire
                self._loop.call_exception_handler(
                    {"message": "a timer's callback failed", "exception": e}
                )


_DEADLINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deadlines] = (
    weakref.WeakKeyDictionary()
)


def _deadlines(loop: asyncio.AbstractEventLoop) -> _Deadlines:
    found = _DEADLINES.get(loop)
    if found is None:
        found = _DEADLINES[loop] = _Deadlines(loop)
    return found
