"""``AsyncioClock`` (production time), on an event loop whose time jumps to the next timer
instead of sleeping: bounds and timers of a second or more share the loop's timers, rounded
up to the next ``GRAIN``; shorter ones are exact; a bound's expiry is ``TimeoutError``, any
other cancellation passes through."""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from agent_runtime.clock import COALESCE_FROM, GRAIN, AsyncioClock


class _JumpingSelector(selectors.DefaultSelector):
    """Never blocks: when the loop would wait for its next timer, time jumps to it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if not ready and timeout is not None and timeout > 0:
            self.now += timeout
        return ready


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)
        self.timers_armed = 0

    def time(self) -> float:
        return self._jumping.now

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:  # type: ignore[override]
        self.timers_armed += 1
        return super().call_at(when, callback, *args, context=context)


def run(main: Callable[[_VirtualTimeLoop], Coroutine[Any, Any, None]]) -> None:
    loop = _VirtualTimeLoop()
    try:
        loop.run_until_complete(main(loop))
    finally:
        loop.close()


@pytest.mark.parametrize("bound", [0.3, COALESCE_FROM, 2.5, 30.0])
def test_a_bound_cuts_what_it_waits_for_no_earlier_and_at_most_a_grain_later(
    bound: float,
) -> None:
    async def main(loop: _VirtualTimeLoop) -> None:
        clock = AsyncioClock()
        never: asyncio.Future[None] = loop.create_future()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await clock.wait_for(never, bound)
        waited = loop.time() - t0
        assert never.cancelled()
        late = GRAIN if bound >= COALESCE_FROM else 1e-9
        assert bound - 1e-9 <= waited <= bound + late + 1e-9

    run(main)


def test_what_ends_in_time_is_returned_and_an_outside_cancel_is_not_a_timeout() -> None:
    async def main(loop: _VirtualTimeLoop) -> None:
        clock = AsyncioClock()
        assert await clock.wait_for(asyncio.sleep(0.5, "done"), 5.0) == "done"

        async def waiter() -> None:
            await clock.wait_for(asyncio.sleep(60), 5.0)

        task = loop.create_task(waiter())
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()  # a CancelledError, never turned into TimeoutError
        # the bound's slot still fires later: it finds nothing to cut
        await asyncio.sleep(10)

    run(main)


def test_bounds_and_timers_ending_in_the_same_grain_share_one_loop_timer() -> None:
    async def main(loop: _VirtualTimeLoop) -> None:
        clock = AsyncioClock()
        fired: list[int] = []
        before = loop.timers_armed
        timers = [clock.call_later(2.0, functools.partial(fired.append, i)) for i in range(50)]
        waits = [
            loop.create_task(clock.wait_for(asyncio.sleep(0.1), 2.0 + i * GRAIN / 100))
            for i in range(50)
        ]
        await asyncio.gather(*waits)
        # a hundred timers of about 2 s, armed within the same grain: at most two loop timers
        assert loop.timers_armed - before <= 2 + 50  # (+ the sleeps' own timers)
        timers[0].cancel()
        await asyncio.sleep(3.0)
        assert sorted(fired) == list(range(1, 50))  # each fired once; the cancelled one never

    run(main)


def test_a_short_timer_is_exact_and_a_failing_callback_leaves_the_others() -> None:
    async def main(loop: _VirtualTimeLoop) -> None:
        clock = AsyncioClock()
        at: dict[str, float] = {}
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        t0 = loop.time()

        def seen(name: str) -> Callable[[], None]:
            return lambda: at.__setitem__(name, loop.time() - t0)

        clock.call_later(0.25, seen("short"))

        def boom() -> None:
            raise RuntimeError("a callback that fails")

        clock.call_later(1.5, boom)
        clock.call_later(1.5, seen("long"))
        await asyncio.sleep(2.0)
        assert at["short"] == pytest.approx(0.25)
        assert 1.5 <= at["long"] <= 1.5 + GRAIN
        assert [str(e["exception"]) for e in errors] == ["a callback that fails"]

    run(main)
