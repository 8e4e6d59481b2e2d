"""asyncio's private names, read here and only here (CPython 3.11 to 3.13, the C
``_asyncio`` futures and the pure-Python ones alike): a future's private state, what a
loop's handle calls, a base loop's ready queue and timer heap, and asyncio's legacy
coroutine marker (``tests/test_livekit_compat.py`` checks that no module outside ``sdk/``
reads one).

A done future's exception, and whether anyone has taken it, without taking it:
``Future.exception()`` marks it retrieved, which silences asyncio's "exception was never
retrieved" report for good. The testing kit asks before it takes one. The ready queue and
the timers are the testing kit's (virtual time: ``agent_runtime.testing.clock``); the
runtime orders its own work with its scheduler and reads neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

# asyncio's legacy marker of a coroutine function (None where asyncio no longer has it)
_COROUTINE_MARKER = getattr(asyncio.coroutines, "_is_coroutine", None)


def peek_exception(fut: asyncio.Future[Any]) -> BaseException | None:
    """The exception a done, not cancelled future ended with, leaving it unretrieved
    (``fut.exception()`` would mark it taken)."""
    found = getattr(fut, "_exception", None)
    return found if isinstance(found, BaseException) else None


def exception_retrieved(fut: asyncio.Future[Any]) -> bool:
    """Whether a done future's exception has been taken (its ``exception()`` or
    ``result()`` called): asyncio reports one left untaken when the future is collected."""
    return not getattr(fut, "_log_traceback", False)


def handle_callback(handle: asyncio.Handle) -> Callable[..., Any] | None:
    """What a loop's handle calls when it runs (a task's step is a method of the task, so
    its ``__self__`` is the task)."""
    callback = getattr(handle, "_callback", None)
    return callback if callable(callback) else None


def ready_handles(loop: asyncio.AbstractEventLoop) -> Sequence[asyncio.Handle] | None:
    """The callbacks ``loop`` runs in its next round, as its ready queue holds them (a
    CPython base loop's); None for a loop that keeps no such queue (another kind of loop)."""
    ready = getattr(loop, "_ready", None)
    return ready if isinstance(ready, Sequence) else None


def scheduled_timers(loop: asyncio.AbstractEventLoop) -> Sequence[asyncio.TimerHandle]:
    """A CPython base loop's timers, cancelled ones included, as its heap holds them (no
    order to read from it but the first); empty for a loop that keeps none."""
    timers = getattr(loop, "_scheduled", None)
    return timers if isinstance(timers, Sequence) else ()


def marked_coroutine(fn: object) -> bool:
    """Whether ``fn`` carries asyncio's legacy coroutine marker (``_is_coroutine``, set
    by ``asyncio.coroutines`` and by mocks), as livekit's emitter reads it."""
    return _COROUTINE_MARKER is not None and getattr(fn, "_is_coroutine", None) is _COROUTINE_MARKER
