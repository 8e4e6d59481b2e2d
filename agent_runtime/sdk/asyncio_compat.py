"""asyncio's private state of a future, read here and only here (CPython 3.11 to 3.13, the
C ``_asyncio`` futures and the pure-Python ones alike), and what a loop's handle calls.

A done future's exception, and whether anyone has taken it, without taking it:
``Future.exception()`` marks it retrieved, which silences asyncio's "exception was never
retrieved" report for good. The testing kit asks before it takes one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


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
