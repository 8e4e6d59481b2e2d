"""The end of a session's close, held by the outside world (the testing kit's and the
explorer's stand-in at the SDK boundary), and how a close ended: it reads livekit's private
close path, as ``livekit_compat`` does its other private names."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from livekit.agents import AgentSession

from agent_runtime.sdk.livekit_compat import session_closing_task


def hold_session_close(session: AgentSession[Any], before: Callable[[], Awaitable[object]]) -> None:
    """The session's close, however it is asked, does its work only once ``before()`` has
    returned (``before`` may never return: a close that hangs). When ``before()`` raises,
    the close fails as livekit's does when a plugin raises in its teardown: the activity is
    torn down, the session stops, the error propagates, and ``close`` is never emitted (nor
    are its session host and RoomIO closed)."""
    close = session._aclose_impl

    async def held(**kwargs: Any) -> None:
        try:
            await before()
        except Exception as error:
            await _close_failing(session, close, error, kwargs)
        else:
            await close(**kwargs)

    session._aclose_impl = held  # type: ignore[method-assign]


async def _close_failing(
    session: AgentSession[Any],
    close: Callable[..., Awaitable[None]],
    error: Exception,
    kwargs: dict[str, Any],
) -> None:
    teardown = session._teardown_activity

    async def failing(**kw: Any) -> None:
        await teardown(**kw)
        raise error

    session._teardown_activity = failing  # type: ignore[method-assign]
    try:
        await close(**kwargs)
    finally:
        del session._teardown_activity  # the class's own again


def session_close_failed(session: AgentSession[Any]) -> bool:
    """The session's close ended without closing it: it raised (livekit emitted no
    ``close``) or was cancelled."""
    task = session_closing_task(session)
    if task is None or not task.done():
        return False
    return task.cancelled() or task.exception() is not None
