"""The tasks a runner's jobs start: noted as they are made (a task factory on the loop), so
that one still running after the job's end is named as left running, one that refuses its
cancellation at the end is stopped as the worker's kill stops it, and one whose failure in
the agent's code nobody took is the run's failure."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from agent_runtime.sdk import asyncio_compat as aio
from agent_runtime.testing.clock import settle
from agent_runtime.testing.user_code import (
    JOB_SIDE,
    UserFailures,
    is_agents_task,
    stop_task,
    task_name,
    user_frames,
)


class _CountingFactory:
    """A loop task factory that notes, in ``made``, the tasks made in the context whose
    ``JOB_SIDE`` is ``side`` (a runner's job's), and in ``every`` all of them, over the
    factory it found (or plain ``asyncio.Task``)."""

    def __init__(
        self,
        side: object,
        made: weakref.WeakSet[asyncio.Task[Any]],
        every: weakref.WeakSet[asyncio.Task[Any]],
        previous: Any,
    ) -> None:
        self.side = side
        self.made = made
        self.every = every
        self.previous = previous
        self.active = True

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        previous = self.previous
        task = (
            previous(loop, coro, **kwargs) if previous else asyncio.Task(coro, loop=loop, **kwargs)
        )
        if self.active and isinstance(task, asyncio.Task):
            self.every.add(task)
            context = kwargs.get("context")
            side = context.get(JOB_SIDE) if context is not None else JOB_SIDE.get()
            if side is self.side:
                self.made.add(task)
        return task

    def handing_on(self) -> Any:
        """The factory to put back: the first below this one that is not a runner's
        that was taken off already."""
        previous = self.previous
        while isinstance(previous, _CountingFactory) and not previous.active:
            previous = previous.previous
        return previous


class JobTasks:
    """The tasks made in the job's context (``JOB_SIDE`` is ``side`` there) since
    ``count()``, and those there before it (the test's own are its business)."""

    def __init__(self, side: object) -> None:
        self.side = side
        self.before: set[asyncio.Task[Any]] | None = None
        self.made: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        self.every: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        # tasks that refused their cancellation at the end, stopped as the worker's kill
        # stops them (still named as left running)
        self.stopped: list[asyncio.Task[Any]] = []
        self._factory: tuple[asyncio.AbstractEventLoop, _CountingFactory] | None = None

    def count(self) -> None:
        """From now on (once): put a task factory on the loop that notes the tasks made in
        the job's context, over the loop's own factory if it has one; ``uncount()`` takes
        it off."""
        if self.before is not None:
            return
        self.before = set(asyncio.all_tasks())
        loop = asyncio.get_running_loop()
        factory = _CountingFactory(self.side, self.made, self.every, loop.get_task_factory())
        loop.set_task_factory(factory)
        self._factory = (loop, factory)

    def uncount(self) -> bool:
        """Take the factory off; whether it was still the loop's all along. Under another
        runner's it stays, only handing on, and that one's removal skips it."""
        if self._factory is None:
            return True
        loop, factory = self._factory
        self._factory = None
        factory.active = False
        if loop.is_closed():
            return True
        ours = loop.get_task_factory() is factory
        if ours:
            loop.set_task_factory(factory.handing_on())
        return ours

    def left(self, *, callers_too: bool = False) -> list[asyncio.Task[Any]]:
        """The job's tasks still running (and those stopped at the end), by name;
        ``callers_too``: every task started since ``count()``."""
        before = self.before
        if before is None:
            return []
        me = asyncio.current_task()
        ours = set(self.made)
        left = [
            t
            for t in [*asyncio.all_tasks(), *self.stopped]
            if t is not me
            and t not in before
            and (callers_too or t in ours)
            and (not t.done() or t in self.stopped)
        ]
        return sorted(set(left), key=task_name)

    def name(self, task: asyncio.Task[Any]) -> str:
        """A task left running by its coroutine, saying so when it swallowed its
        cancellation at the end (and was stopped then, as the worker's kill stops it)."""
        if task not in self.stopped:
            return task_name(task)
        why = "which swallowed its cancellation (livekit's job end waits for it)"
        return f"{task_name(task)}, {why}"

    async def stop_refusing(self, stopping: list[asyncio.Task[Any]]) -> None:
        """A task that swallowed its cancellation past the bound would hang the loop's own
        close (``asyncio.run`` and pytest-asyncio cancel and await every task): the
        worker's kill ends it, and so does this (``stop_task``), the agent's own first (the
        tasks waiting on them then end by themselves). They are still named as left."""
        for agents in (True, False):
            for task in stopping:
                if not task.done() and is_agents_task(task) == agents:
                    stop_task(task)
                    self.stopped.append(task)
            await settle()

    def take_failed(self, failures: UserFailures) -> None:
        """Every task started since ``count()`` (in the job's context or not: one the agent
        started from a thread, or with a context of its own) that failed in the agent's
        code, its error taken by nobody: asyncio reports one only as it is collected,
        which a task the agent still holds (in a set, say) never is during the run. Each
        is added to ``failures`` and taken (never reported again as it is collected)."""
        for task in list(self.every):
            if not task.done() or task.cancelled() or aio.exception_retrieved(task):
                continue
            error = aio.peek_exception(task)
            if error is not None and user_frames(error.__traceback__):
                task.exception()
                # named: a task the test itself started and never read is reported too
                failures.add(f"task {task_name(task).removesuffix(' (agent code)')}", error)
