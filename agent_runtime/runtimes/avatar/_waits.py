"""Waiting on the avatar machine's state changes (the lifecycle's ``start()`` and
``wait_for()``): resolved as the state is entered or left, even for a moment."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from agent_runtime.actor import Actor, ActorClosed, StateChanged
from agent_runtime.clock import check_seconds
from statemachines.avatar import AVATAR

if TYPE_CHECKING:
    from agent_runtime.clock import Clock


async def wait_for_state(actor: Actor, state: str, clock: Clock, timeout: float | None) -> None:
    """Until ``actor`` is in ``state`` (at once if it is). ``TimeoutError`` after
    ``timeout`` seconds of ``clock`` (None: no bound), naming the state; ``ActorClosed`` if
    it closes first."""
    if state not in actor.states:
        raise ValueError(f"unknown avatar state {state!r}: one of {list(AVATAR.state_names)}")
    if timeout is not None:  # a negative or NaN one was a TimeoutError with no message
        check_seconds("wait_for's timeout", timeout)
    if actor.state == state:
        return
    if actor.state == "closed":
        raise ActorClosed(f"the avatar lifecycle is closed; it will never be {state!r}")
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_change(ev: StateChanged) -> None:
        if fut.done():
            return
        if ev.dest == state:
            fut.set_result(None)
        elif ev.dest == "closed":
            fut.set_exception(ActorClosed(f"closed before reaching {state!r}"))

    actor.on("state_changed", on_change)
    try:
        await clock.wait_for(fut, timeout)
    except TimeoutError:
        raise TimeoutError(
            f"the avatar lifecycle was not {state!r} within {timeout:g}s (it is {actor.state!r})"
        ) from None
    finally:
        actor.off("state_changed", on_change)


def leaving(actor: Actor, state: str) -> asyncio.Future[None]:
    """Done when ``actor`` next leaves ``state``."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_change(ev: StateChanged) -> None:
        if ev.source == state and not fut.done():
            fut.set_result(None)

    actor.on("state_changed", on_change)
    fut.add_done_callback(lambda _: actor.off("state_changed", on_change))
    return fut
