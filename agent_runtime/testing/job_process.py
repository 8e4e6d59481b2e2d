"""The end of a job, run by the kit as livekit's job process runs it (1.8.9,
``ipc/job_proc_lazy_main.py``: ``_start_job``'s triggers and ``_shutdown_job``).

The job ends on the first of: ``ctx.shutdown(reason)`` (the agent's, an end-call tool's),
the room disconnecting (``room disconnected``: the job's own close disconnects it), the
simulator leaving (``simulation completed``, what ``ctx.connect()`` arms), the entrypoint
raising (``job crashed``) or the test ending (``test ended``, a worker's shutdown). Then, in
livekit's order and with its bounds, on the job's clock (virtual time in tests):

1. the entrypoint is awaited, 15 s, then cancelled;
2. the primary session closes (``aclose()``, bounded at 60 s);
3. ``on_session_end(ctx)``, bounded by the server's ``session_end_timeout``;
4. the session report;
5. ``room.disconnect()``;
6. every shutdown callback at once, each with the reason (livekit's process exits on the
   first that raises: the agent's callbacks still running then are named as cut).

What fails in the user's code on the way is kept (``UserFailures``) for the test to fail on,
where livekit would log it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_runtime.clock import Clock
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.user_code import (
    CallbackCut,
    CallbackHung,
    SessionCloseHeld,
    UserFailures,
    agents_code_waiting,
    is_user_callable,
)

if TYPE_CHECKING:
    from livekit.agents.job import JobContext

# livekit's bounds (job_proc_lazy_main.py): the entrypoint's exit, the session's close
ENTRYPOINT_EXIT = 15.0
SESSION_CLOSE = 60.0


class JobProcess:
    """One job's end, as livekit's job process runs it; ``ended`` once it is over."""

    def __init__(
        self,
        ctx: JobContext,
        *,
        clock: Clock,
        on_session_end: Callable[[JobContext], Awaitable[None]] | None,
        session_end_timeout: float,
        failures: UserFailures,
        context: Any = None,
    ) -> None:
        self.ctx = ctx
        self.clock = clock
        self.failures = failures
        self.reason: str | None = None
        self.ended_at: float | None = None  # the job's clock when its end was over
        self.steps: list[tuple[float, str]] = []  # (time, step) as each began, for tests
        self.session_end_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._on_session_end = on_session_end
        self.session_end_timeout = session_end_timeout
        self._context = context
        self._entry: asyncio.Task[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self.callbacks: list[asyncio.Task[Any]] = []  # the shutdown callbacks, once run
        self._callback_fns: list[Callable[..., Any]] = []
        self._simulator_left = lk.job_simulator_left(ctx)
        lk.set_job_shutdown_hook(ctx, self.shutdown)
        ctx.room.on("disconnected", self._on_disconnected)
        ctx.room.on("participant_disconnected", self._simulator_left)

    def watch_entrypoint(self, task: asyncio.Task[Any]) -> None:
        """The entrypoint's task: awaited first at the end; if it raises, the job ends."""
        self._entry = task

        def done(t: asyncio.Task[Any]) -> None:
            if not t.cancelled() and t.exception() is not None:
                self.shutdown("job crashed")

        task.add_done_callback(done)

    def cut_entrypoint(self) -> None:
        """The test is over: an entrypoint still running is cancelled now rather than at the
        end of its bound (the job's end then goes on as after the bound)."""
        if self._entry is not None and not self._entry.done():
            self._entry.cancel()

    @property
    def begun(self) -> bool:
        return self.reason is not None

    def shutdown(self, reason: str = "") -> None:
        """The job ends (the first reason wins, as livekit's shutdown future)."""
        if self.reason is not None:
            return
        self.reason = reason or "user requested"
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="job_shutdown", context=self._context
        )

    def _on_disconnected(self, *_: Any) -> None:
        self.shutdown("room disconnected")

    def _step(self, name: str) -> None:
        self.steps.append((self.clock.now(), name))

    async def _run(self) -> None:
        try:
            await self._shutdown()
        finally:
            self._unhook()
            if not self.session_end_done.done():
                self.session_end_done.set_result(None)
            self.ended_at = self.clock.now()
            self.ended.set_result(None)

    async def _shutdown(self) -> None:
        reason = self.reason or ""
        entry = self._entry
        if entry is not None and not entry.done():
            self._step("entrypoint")
            try:
                await self.clock.wait_for(asyncio.shield(entry), ENTRYPOINT_EXIT)
            except TimeoutError:
                entry.cancel()
                await asyncio.gather(entry, return_exceptions=True)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not entry.cancelled() or (me is not None and me.cancelling()):
                    raise
                # cut short (the test is over, ``cut_entrypoint``): the end goes on
            except Exception:
                pass  # the entrypoint's own failure is the test's already
        session = lk.job_primary_session(self.ctx)
        if session is not None:
            self._step("session")
            closing = asyncio.ensure_future(session.aclose())
            try:
                await self.clock.wait_for(asyncio.shield(closing), SESSION_CLOSE)
            except TimeoutError:
                # what of the agent's holds it, seen before livekit's cancel reaches it
                held = agents_code_waiting(self.failures.is_jobs)
                closing.cancel()
                await asyncio.gather(closing, return_exceptions=True)
                if held:
                    self.failures.add("session close", SessionCloseHeld(held, SESSION_CLOSE))
        if self._on_session_end is not None:
            self._step("on_session_end")
            try:
                await self.clock.wait_for(
                    _call(self._on_session_end, self.ctx), self.session_end_timeout
                )
            except TimeoutError:
                self.failures.add(
                    "on_session_end",
                    TimeoutError(f"on_session_end timed out after {self.session_end_timeout:g}s"),
                )
            except Exception as e:
                self.failures.add("on_session_end", e)
        self.session_end_done.set_result(None)
        self._step("report")
        with contextlib.suppress(Exception):
            await lk.job_session_report(self.ctx)
        self._step("disconnect")
        await self.ctx.room.disconnect()
        self._step("callbacks")
        loop = asyncio.get_running_loop()
        # a task each, named as livekit names its span: one that never returns is named
        self._callback_fns = list(lk.job_shutdown_callbacks(self.ctx))
        self.callbacks = [
            loop.create_task(_call(cb, reason), name=callback_name(cb)) for cb in self._callback_fns
        ]
        await self._await_callbacks()

    async def _await_callbacks(self) -> None:
        """Every callback to its end. livekit gathers them without ``return_exceptions``:
        the first to raise ends ``_shutdown_job``, and the job's process exits, so an
        agent's callback still running then is cut deployed (``CallbackCut``, named);
        here it runs on, so that what it does fails or passes on its own."""
        pending: set[asyncio.Task[Any]] = set(self.callbacks)
        first: str | None = None
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in (t for t in self.callbacks if t in done):
                error = None if task.cancelled() else task.exception()
                # a cancel is the kill's
                if error is None or isinstance(error, asyncio.CancelledError):
                    continue
                self.failures.add("shutdown callback", error)
                if first is None:
                    first = task.get_name()
                    for t, cb in zip(self.callbacks, self._callback_fns, strict=True):
                        if t in pending and is_user_callable(cb):
                            self.failures.add("shutdown callback", CallbackCut(t.get_name(), first))

    @property
    def hung_callbacks(self) -> list[str]:
        """The agent's shutdown callbacks run and not returned (livekit's own and this
        project's are not named: they wait on closes that have bounds of their own)."""
        return [
            t.get_name()
            for t, cb in zip(self.callbacks, self._callback_fns, strict=True)
            if not t.done() and is_user_callable(cb)
        ]

    def waiting_on(self) -> str:
        """What the job's end waits for now, for a stall's message: the agent's own code
        first (a shutdown callback, ``on_session_end``), then livekit's step."""
        if hung := self.hung_callbacks:
            return f"its shutdown callback {', '.join(hung)} has not returned"
        step = self.steps[-1][1] if self.steps else ""
        if step == "on_session_end" and self._on_session_end is not None:
            name = callback_name(self._on_session_end)
            whose = "its " if is_user_callable(self._on_session_end) else ""
            return (
                f"{whose}on_session_end {name} has not returned (livekit bounds it by the "
                f"server's session_end_timeout, {self.session_end_timeout:g}s)"
            )
        doing = {
            "entrypoint": "the entrypoint to return",
            "session": "the session's close",
            "report": "the session report",
            "disconnect": "the room's disconnect",
            "callbacks": "the shutdown callbacks",
        }.get(step)
        return f"ending: {self.reason}" + (f", waiting for {doing}" if doing else "")

    async def kill(self, limit: float, *, bound: float | None = None) -> None:
        """The test is over, and the job's end is not after the wait livekit's worker
        gives a job process before it kills it (``shutdown_process_timeout``): what of the
        agent's was still running is its failure (``CallbackHung``, named), and the end is
        cancelled, as the kill ends it (waited for up to ``limit`` loop seconds more: a
        callback may swallow the cancellation). ``bound``: the server's
        ``shutdown_process_timeout``, for the message."""
        if self._task is None or self._task.done():
            return
        step = self.steps[-1][1] if self.steps else ""
        session_end = self._on_session_end
        if step == "on_session_end" and session_end is not None and is_user_callable(session_end):
            self.failures.add("on_session_end", CallbackHung(callback_name(session_end), bound))
        for name in self.hung_callbacks:
            self.failures.add("shutdown callback", CallbackHung(name, bound))
        running = [t for t in self.callbacks if not t.done()] + [self._task]
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=limit)

    def _unhook(self) -> None:
        room = self.ctx.room
        room.off("disconnected", self._on_disconnected)
        room.off("participant_disconnected", self._simulator_left)

    async def aclose(self) -> None:
        """The test is over: end the job as a worker's shutdown would, if nothing has, and
        wait for the end (virtual time does not move: a hold is cut by the caller)."""
        self.shutdown("test ended")
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


async def _call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` awaited as livekit awaits it, in the caller's task (what a plain
    function raises is its failure there): a plain function's ``None`` is livekit's
    ``TypeError`` (logged by its job process; a shutdown callback's cuts the others),
    named here with what to do."""
    aw = fn(*args)
    if asyncio.iscoroutine(aw) or isinstance(aw, Awaitable):
        return await aw
    raise TypeError(
        f"{callback_name(fn)} returned {'None' if aw is None else type(aw).__name__}, not an "
        "awaitable: livekit awaits "
        "it (a TypeError in its job process), so declare it async def"
    )


def callback_name(cb: Any) -> str:
    return str(getattr(cb, "__qualname__", None) or getattr(cb, "__name__", None) or repr(cb))
