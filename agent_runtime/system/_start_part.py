"""A part of a job's start, run in the task that called ``start()``: no task of its own,
and still cut by the job's teardown (the ``starts`` step of ``RELEASE``)."""

from __future__ import annotations

import asyncio


class StartPart:
    """A part of the start running in its caller's task. The teardown's cut cancels that
    task once; as the part ends it takes that cancellation back (``uncancel``, as
    ``asyncio.timeout`` does), so a ``CancelledError`` is the cut's only when nobody else
    (a timeout around ``start()``) cancelled the caller too."""

    __slots__ = ("_asked", "_base", "_ended", "_outcome", "_task")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._base = self._task.cancelling() if self._task is not None else 0
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._asked = False
        self._outcome: str | None = None

    def cancel(self) -> asyncio.Future[None]:
        """Cut the part; what is done once it has ended."""
        if not self._asked and self._outcome is None and self._task is not None:
            self._asked = True
            self._task.cancel()
        return self._ended

    def end(self) -> str:
        """The part has ended (once; later calls repeat the answer): ``none`` if it was not
        cut, ``alone`` if it was and nobody else cancelled its caller, ``also`` if
        somebody did too."""
        if self._outcome is None:
            self._outcome = "none"
            if self._asked and self._task is not None:
                self._outcome = "alone" if self._task.uncancel() <= self._base else "also"
            self._ended.set_result(None)
        return self._outcome
