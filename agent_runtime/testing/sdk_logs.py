"""The SDK's own logs in a scenario: its chatter about an unconnected room silenced, and its
background tasks' failures once a scenario disconnects the room sent to debug."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any


@contextlib.contextmanager
def quiet_sdk_logs(level: int = logging.ERROR) -> Any:
    """Silence the SDK's own chatter about an unconnected room (scenario output stays clean)."""
    names = ("livekit", "livekit.agents")
    old = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(level)
    try:
        yield
    finally:
        for n, lvl in zip(names, old, strict=True):
            logging.getLogger(n).setLevel(lvl)


def sdk_task_failures_at_debug(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The SDK's own background tasks (an avatar join watcher, a data stream waiting for its
    participant) fail once a scenario disconnects the room; in a scenario that is expected,
    so those go to debug. Anything else is reported as usual."""
    task = context.get("future") or context.get("task")
    get_coro = getattr(task, "get_coro", None)
    code = getattr(get_coro(), "cr_code", None) if get_coro is not None else None
    filename = getattr(code, "co_filename", "")
    if "/livekit/" in filename.replace("\\", "/"):
        logging.getLogger("agent_runtime.testing.runner").debug(
            "SDK background task ended: %s", context.get("exception")
        )
        return
    loop.default_exception_handler(context)
