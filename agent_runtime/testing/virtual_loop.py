"""The virtual-time event loop: ``VirtualTimeLoop`` (``run`` is ``asyncio.run`` on one),
on which the SDK's own timers (livekit's interruption bound, a sink's clear bound, its
user-away timer) are virtual too: the loop's time moves with a ``VirtualClock`` as it
advances, and otherwise only when nothing at all can run (then straight to the loop's next
timer), so when they fire does not depend on how fast the machine is. What the SDK reads
from the wall clock (``time.time()``) stays real. The loop's time starts at ``UPTIME``, not
0: a real loop's reads the machine's uptime, and code takes 0 for "never".

``settle()`` lets a loop run what is ready; it reads asyncio's ready queue (through
``sdk/asyncio_compat``), which is why it lives in the kit and not in the runtime (the
runtime orders its own work with its scheduler).
"""

from __future__ import annotations

import _thread
import asyncio
import math
import selectors
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from types import FrameType
from typing import Any, TypeVar, TypeVarTuple, Unpack

from agent_runtime.sdk.asyncio_compat import handle_callback, ready_handles, scheduled_timers

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# the resolution asyncio reads the monotonic clock at (a due timer runs within it)
_RESOLUTION = time.get_clock_info("monotonic").resolution
# where a VirtualTimeLoop's time starts. A real loop's reads the machine's uptime, never 0,
# and code takes 0 for "never": livekit's utils.aio.interval waited for nothing after a
# first tick at 0, so a plugin's keep-alive on it (liveavatar's) looped for ever without
# once yielding to the loop
UPTIME = 1000.0


async def settle(max_rounds: int = 200) -> None:
    """Let the event loop run every ready callback, and what those schedule in turn.

    Stops once the ready queue has stayed empty for a few rounds, or after ``max_rounds``.
    """
    loop = asyncio.get_running_loop()
    quiet = 0
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        ready = ready_handles(loop)
        if ready is not None and len(ready) == 0:
            quiet += 1
            if quiet >= 3:
                return
        else:
            quiet = 0


class _NeverBlocks(selectors.BaseSelector):
    """The loop's selector: I/O as the real one reports it, but a wait for the loop's next
    timer is the virtual clock jumping to it (see ``VirtualTimeLoop``)."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._real = selectors.DefaultSelector()
        self._loop = loop
        self.own = 0  # what the loop itself registers (its self-pipe): set once it has

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def _world_may_answer(self) -> bool:
        """Work on a thread, a child process, a socket or a pipe open on the loop."""
        return bool(self._loop.threads) or len(self._real.get_map()) > self.own

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._loop.rounds += 1
        if timeout == 0 and not self._world_may_answer():
            self._loop._busy_round()
        else:
            self._loop._busy = 0
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._real.select(None)  # no timer at all: waiting is all there is
        if self._world_may_answer():
            # the world may still answer (work on a thread, a child process, a socket or
            # a pipe open): meanwhile time passes as it does for real
            began = time.monotonic()
            ready = self._real.select(timeout)
            self._loop.elapse(timeout if not ready else min(timeout, time.monotonic() - began))
            return ready
        self._loop.jump(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Any:
        return self._real.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: ``time()`` starts at ``start`` (by default ``UPTIME``:
    a real loop never reads 0) and moves with ``pass_time`` (a ``VirtualClock`` advancing
    calls it), or when nothing can run until the loop's next timer, which it then jumps to
    at once. ``asyncio.sleep``, ``wait_for`` and ``call_later`` in any code on the loop
    (the SDK's included) are virtual; what reads the wall clock (``time.time()``) is not.
    While the world may still answer (work the loop gave a thread with ``run_in_executor``
    or ``to_thread``, a child process, a socket or a pipe open on the loop) time passes as
    it does for real, so a timeout expires neither ahead of an answer on its way nor never.

    Made for runs whose outside is all stand-ins (scenarios, the explorer, tests); a thread
    of its own that calls the loop (``call_soon_threadsafe``, as livekit's FFI thread does)
    is not waited for."""

    def __init__(self, start: float = UPTIME) -> None:
        selector = _NeverBlocks(self)
        super().__init__(selector=selector)
        selector.own = len(selector.get_map())
        self._virtual_now = self.start = start
        self.threads = 0  # run_in_executor work and child processes not ended
        self.jumped = 0.0  # virtual seconds passed with nothing able to run
        self.rounds = 0  # the loop's rounds (its selector asked for what is ready)
        # rounds in a row at one time, something ready in each and nothing outside that
        # could answer: past max_busy_rounds the loop fails its run (VirtualTimeStalled)
        self._busy = 0
        self._busy_at = start
        self.max_busy_rounds = MAX_BUSY_ROUNDS
        self._built = True  # last: a loop cut half-built (Ctrl-C) has nothing to close

    def __del__(self) -> None:
        if self.__dict__.get("_built"):
            super().__del__()

    def time(self) -> float:
        return self._virtual_now

    def run_forever(self) -> None:
        # the runner's Ctrl-C handler (asyncio.Runner's, pytest-asyncio's through it, run's
        # below) cancels its task and wakes the loop: what a callback that never returns
        # (a loop that never awaits) never lets through. Wrapped, a Ctrl-C the loop has not
        # gone on from within INTERRUPT_GRACE real seconds is sent again, which the runner
        # raises as KeyboardInterrupt where the callback is
        handler = signal.getsignal(signal.SIGINT)
        wrapped: Callable[[int, FrameType | None], Any] | None = None
        if (
            threading.current_thread() is threading.main_thread()
            and callable(handler)
            and handler is not signal.default_int_handler
        ):
            runners = handler

            def on_interrupt(signum: int, frame: FrameType | None) -> None:
                runners(signum, frame)
                self._interrupted(self.rounds)

            try:
                signal.signal(signal.SIGINT, on_interrupt)
                wrapped = on_interrupt
            except ValueError:  # an interpreter that takes no handler: as run does
                pass
        try:
            super().run_forever()
        finally:
            if wrapped is not None and signal.getsignal(signal.SIGINT) is wrapped:
                signal.signal(signal.SIGINT, handler)

    def _interrupted(self, rounds: int) -> None:
        def again() -> None:
            time.sleep(INTERRUPT_GRACE)  # real time: the loop's thread is the one stuck
            if self.rounds == rounds and self.is_running():
                _thread.interrupt_main(signal.SIGINT)

        threading.Thread(target=again, name="VirtualTimeLoop interrupted", daemon=True).start()

    def _busy_round(self) -> None:
        """A round with something ready and nothing outside that could answer: past
        ``max_busy_rounds`` of them in a row at one time, the loop spins, and as virtual
        time passes only when nothing can run, no bound (``wait_for``, a job's timer, the
        kit's) would ever fire: ``VirtualTimeStalled``, out of the loop's run."""
        if self._virtual_now != self._busy_at:
            self._busy_at, self._busy = self._virtual_now, 0
        self._busy += 1
        if self._busy < self.max_busy_rounds:
            return
        self._busy = 0
        raise VirtualTimeStalled(
            f"virtual time stood still at {self._virtual_now - self.start:g}s for "
            f"{self.max_busy_rounds:,} rounds of the loop, something ready in each "
            f"({_spinning(self)}): a task that spins (awaits asyncio.sleep(0) in a loop, "
            "polls, re-arms a callback at once) keeps every timeout from firing, as "
            "virtual time passes only when nothing can run"
        )

    def jump(self, seconds: float) -> None:
        """Nothing can run for ``seconds``: time moves on by that much, at once."""
        self._land(self._virtual_now + seconds)
        self.jumped += seconds

    def elapse(self, seconds: float) -> None:
        """``seconds`` passed, not as a jump: with a ``VirtualClock``'s advance, or for real
        while the world could answer."""
        self._land(self._virtual_now + seconds)

    def _land(self, when: float) -> None:
        # the loop runs a timer once time() + the clock's resolution passes its due time;
        # far from 0 that sum is time() itself, so land just past it there
        self._virtual_now = when if when + _RESOLUTION > when else math.nextafter(when, math.inf)

    async def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` pass: each of the loop's timers due meanwhile fires at its time,
        what it causes settled before the next."""
        end = self._virtual_now + max(0.0, seconds)
        while True:
            due = self.next_timer()
            if due is None or due > end:
                break
            self._land(max(self._virtual_now, due))
            await settle()
        self._land(max(self._virtual_now, end))
        await settle()

    def next_timer(self) -> float | None:
        """When the loop's next timer is due, on its time (None: no timer)."""
        # the loop's own heap of timers: this loop is the one place that reads it
        live = [h.when() for h in scheduled_timers(self) if not h.cancelled()]
        return min(live) if live else None

    async def subprocess_exec(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.SubprocessProtocol], *args: Any, **kw: Any
    ) -> tuple[asyncio.SubprocessTransport, asyncio.SubprocessProtocol]:
        return await self._counted(super().subprocess_exec, protocol_factory, *args, **kw)

    async def subprocess_shell(  # type: ignore[override]
        self, protocol_factory: Callable[[], asyncio.SubprocessProtocol], *args: Any, **kw: Any
    ) -> tuple[asyncio.SubprocessTransport, asyncio.SubprocessProtocol]:
        return await self._counted(super().subprocess_shell, protocol_factory, *args, **kw)

    async def _counted(
        self,
        start: Callable[..., Awaitable[tuple[asyncio.SubprocessTransport, Any]]],
        factory: Callable[[], asyncio.SubprocessProtocol],
        *args: Any,
        **kw: Any,
    ) -> tuple[asyncio.SubprocessTransport, asyncio.SubprocessProtocol]:
        waited = _Waited(self, factory)
        try:
            transport, protocol = await start(waited.make, *args, **kw)
        except BaseException:
            waited.exited()  # it never started: nothing of it can answer
            raise
        return transport, protocol

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[Ts]], T], *args: *Ts
    ) -> asyncio.Future[T]:
        fut = super().run_in_executor(executor, func, *args)
        self.threads += 1

        def ended(_: object) -> None:
            self.threads -= 1

        fut.add_done_callback(ended)
        return fut

    async def shutdown_default_executor(self, *args: Any, **kw: Any) -> None:
        # it joins the executor's threads from a thread of its own, within a bound on this
        # loop's time: that wait is the world's, at real speed
        self.threads += 1
        try:
            await super().shutdown_default_executor(*args, **kw)
        finally:
            self.threads -= 1


class VirtualTimeStalled(RuntimeError):
    """A ``VirtualTimeLoop`` that never had nothing to do for ``max_busy_rounds`` rounds,
    its time standing still: raised out of the loop's run (the test fails with it)."""


# real seconds a VirtualTimeLoop's round may go on after a Ctrl-C before it is sent again
INTERRUPT_GRACE = 1.0
# rounds a VirtualTimeLoop may run in a row at one time, always busy (the project's own
# suite needs about 500; a task awaiting asyncio.sleep(0) in a loop runs 1,000,000 in 2 s)
MAX_BUSY_ROUNDS = 1_000_000


def _spinning(loop: asyncio.AbstractEventLoop) -> str:
    """What was ready in the loop's last round: its tasks by name and coroutine."""
    names: list[str] = []
    # the kit may read the loop's queue (the runtime never does: tests/test_layers.py)
    for handle in ready_handles(loop) or ():
        callback = handle_callback(handle)
        task = getattr(callback, "__self__", None)
        if isinstance(task, asyncio.Task):
            coro = task.get_coro()
            what = getattr(coro, "__qualname__", type(coro).__name__)
            names.append(f"task {task.get_name()!r} ({what})")
        else:
            names.append(getattr(callback, "__qualname__", repr(callback)))
    shown = ", ".join(dict.fromkeys(names[:5]))
    return f"ready: {shown}{', ...' if len(names) > 5 else ''}" if names else "nothing named"


class _Waited:
    """A child process is world that may answer until it exits (its exit comes from a
    watcher thread): counted with the loop's threads from its protocol's making."""

    def __init__(
        self, loop: VirtualTimeLoop, factory: Callable[[], asyncio.SubprocessProtocol]
    ) -> None:
        self._loop, self._factory = loop, factory
        self._counted = False

    def make(self) -> asyncio.SubprocessProtocol:
        protocol = self._factory()
        on_exit = protocol.process_exited
        self._counted = True
        self._loop.threads += 1

        def process_exited() -> None:
            self.exited()
            on_exit()

        protocol.process_exited = process_exited  # type: ignore[method-assign]
        return protocol

    def exited(self) -> None:
        if self._counted:
            self._counted = False
            self._loop.threads -= 1


def run(main: Coroutine[Any, Any, T], *, start: float = UPTIME) -> T:
    """``asyncio.run(main)`` on a ``VirtualTimeLoop``: the loop's timers, the SDK's
    included, fire on virtual time, however fast the machine is."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        loop = runner.get_loop()
        task = loop.create_task(main)
        interrupts = 0

        # Ctrl-C cancels the task, and a second one interrupts: as asyncio.Runner does, but
        # counted from before the handler is in place (the Runner's count is reset after
        # installing its own, so a Ctrl-C landing in between came out as a CancelledError)
        def on_interrupt(signum: int, frame: FrameType | None) -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts == 1 and not task.done():
                task.cancel()
                loop.call_soon_threadsafe(lambda: None)  # wake a loop waiting on a selector
                return
            raise KeyboardInterrupt

        ours = (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        try:
            if ours:
                try:
                    signal.signal(signal.SIGINT, on_interrupt)
                except ValueError:  # an interpreter that takes no handler: as asyncio does
                    ours = False
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupts and task.uncancel() == 0:
                raise KeyboardInterrupt from None
            raise
        finally:
            if ours:
                signal.signal(signal.SIGINT, signal.default_int_handler)
