"""The user's shutdown callbacks of one job (``add_shutdown_callback``), as a livekit job
context runs its own: all at once at the end of the close, each with the job's reason if it
takes an argument; one that fails is logged and the others still run."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from agent_runtime.actor import Actor
from agent_runtime.emitter import positional_arity

logger = logging.getLogger("agent_runtime.job")

ShutdownCallback = Callable[..., Any]


class ShutdownCallbacks:
    """The callbacks added, and which of them are running (what a cut close names)."""

    __slots__ = ("_callbacks", "_running")

    def __init__(self) -> None:
        self._callbacks: list[ShutdownCallback] = []
        self._running: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._callbacks)

    def add(self, callback: ShutdownCallback) -> None:
        if not callable(callback):
            raise TypeError("a shutdown callback must be callable")
        _check_callable_as_run(callback)
        self._callbacks.append(callback)

    def waiting_for(self) -> str:
        """The callbacks that have not returned, for the log line of a cut close."""
        names = list(self._running.values())
        return (
            f"shutdown callback{'s' if len(names) > 1 else ''} {', '.join(names)} had not returned"
        )

    async def run(self, reason: str, actor: Actor) -> None:
        """Run every callback at once; the line of one that fails names the job and the
        machine (``actor.where()``, the log policy) and carries ``actor.log_fields()``."""
        prefix, log_fields = f"{actor.where()}: ", actor.log_fields()

        async def run(cb: ShutdownCallback) -> None:
            name = getattr(cb, "__qualname__", None) or repr(cb)
            self._running[id(cb)] = name
            try:
                res = cb(reason) if _takes_argument(cb) else cb()
                if inspect.isawaitable(res):
                    await res
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:
                # logged as it fails: a close cut at its bound (another callback hung)
                # never reaches the end of the gather
                logger.error(
                    "%sshutdown callback %s failed", prefix, name, exc_info=e, extra=log_fields
                )
            finally:
                self._running.pop(id(cb), None)

        await asyncio.gather(*(run(cb) for cb in self._callbacks), return_exceptions=True)


def _takes_argument(cb: Callable[..., Any]) -> bool:
    try:
        n = positional_arity(cb)
    except (TypeError, ValueError):
        return False
    return n is None or n > 0


def _check_callable_as_run(cb: Callable[..., Any]) -> None:
    """Refused when it is added, not at the close: ``run`` calls it with the reason when it
    takes an argument, else with none."""
    try:
        sig = inspect.signature(cb)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): called as livekit would
    try:
        sig.bind("reason") if _takes_argument(cb) else sig.bind()
    except TypeError:
        name = getattr(cb, "__qualname__", repr(cb))
        raise TypeError(
            f"shutdown callback {name}{sig} must take the job's reason or no argument"
        ) from None
