"""A published plugin's provider session is ended once, even when the job closes while the
runtime closes a failed attempt of it.

protoface's ``aclose()`` forgets its session id, then asks its provider to end that
session. The runtime closes a failed attempt before a retry (``releasing``) or once given
up (``retiring``); the job closed (or the user left) in the middle of that close used to
cut it there, and the job's own close called ``aclose()`` again, which had no id left to
end: the provider session stayed open, billed. Now the job's close waits for the close
under way (within its own bound): the end-session call is sent once and answered.

The control runs the plugin on its own, as upstream runs it: the app closes the avatar it
gave up on while the job shuts down, and livekit's shutdown calls the ``aclose()`` that the
plugin's ``start()`` registered: the session is ended once there too.

Real: the published plugin, livekit's fake ``JobContext``, ``AgentSession``, the runtime.
Faked: the provider's network (``aiohttp.ClientSession._request``, as in
``tests/test_avatar_plugins.py``: its end-session call takes 1 s of the virtual clock), the
room (in memory).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from livekit.agents import Agent, get_job_context
from livekit.plugins import protoface

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import AvatarRetry
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from tests.test_avatar_plugins import Provider, plugin_rig, start

JOIN_TIMEOUT = 3.0
END_TAKES = 1.0  # the provider's answer to the end-session call


class _Ends:
    """The provider's end-session calls: the sessions asked to end, and those it answered
    (a call cut before its answer may never have reached it)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.answered: list[str] = []


def _slow_end(monkeypatch: pytest.MonkeyPatch, clock: VirtualClock, provider: Provider) -> _Ends:
    """protoface's ``POST /v1/sessions/ID/end`` answered after ``END_TAKES`` seconds; every
    other call as the fake provider answers it."""
    ends = _Ends()

    async def request(_s: Any, method: str, url: Any, **kw: Any) -> Any:
        path = str(url)
        if path.endswith("/end"):
            session = path.rsplit("/", 2)[-2]
            ends.sent.append(session)
            await clock.sleep(END_TAKES)
            ends.answered.append(session)
        return await provider.request(method, url, **kw)

    monkeypatch.setattr(aiohttp.ClientSession, "_request", request)
    return ends


@pytest.mark.parametrize("state", ["retiring", "releasing"])
async def test_a_job_closed_while_a_failed_protoface_attempt_is_closed_ends_its_session_once(
    state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with plugin_rig("protoface", monkeypatch) as (rig, provider):
        ends = _slow_end(monkeypatch, rig.clock, provider)
        retry = {"retry_avatar": AvatarRetry(attempts=1)} if state == "releasing" else {}
        job = AgentJob(
            room=rig.room,
            session=rig.session,
            avatar=rig.avatar,
            clock=rig.clock,
            join_timeout=JOIN_TIMEOUT,
            **retry,  # type: ignore[arg-type]
        )
        await job.start_runtime()
        await job.start(Agent(instructions="test"))
        assert job.states["avatar"] == "routing"  # its avatar never joins
        backoff = 1.0 if state == "releasing" else 0.0
        await rig.clock.advance(JOIN_TIMEOUT + backoff + END_TAKES / 2)
        assert job.states["avatar"] == state and ends.sent == ["s-1"] and ends.answered == []
        closing = asyncio.ensure_future(job.aclose())
        await rig.clock.advance(10)
        assert closing.done() and closing.exception() is None
        assert job.states["avatar"] == "closed"
        assert ends.sent == ["s-1"] and ends.answered == ["s-1"]  # ended, once
        assert isinstance(rig.avatar, protoface.AvatarSession)
        assert rig.avatar.session_id is None


async def test_the_plugin_on_its_own_ends_its_session_once_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the app closes the avatar it gave up on, and the job shuts down while
    that close runs (livekit's shutdown runs the plugin's own ``aclose()`` again, which
    finds no session left to end). The first close runs to its end: ended once."""
    async with plugin_rig("protoface", monkeypatch, wrapped=False) as (rig, provider):
        ends = _slow_end(monkeypatch, rig.clock, provider)
        await start(rig)
        assert isinstance(rig.avatar, protoface.AvatarSession)
        assert rig.avatar.session_id == "s-1"
        await rig.clock.advance(JOIN_TIMEOUT)  # its avatar never joins: the app gives up
        given_up = asyncio.ensure_future(rig.avatar.aclose())
        await rig.clock.advance(END_TAKES / 2)
        assert ends.sent == ["s-1"] and ends.answered == []
        callbacks = lk.job_shutdown_callbacks(get_job_context())
        assert callbacks  # the aclose() the plugin's start() registered
        shutdown = asyncio.gather(*(callback("job closed") for callback in callbacks))
        await rig.clock.advance(10)
        await settle()
        assert shutdown.done() and given_up.done() and given_up.exception() is None
        assert ends.sent == ["s-1"] and ends.answered == ["s-1"]  # ended, once
