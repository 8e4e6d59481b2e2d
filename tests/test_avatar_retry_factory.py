"""A retry's attempt runs on a fresh plugin when the job was given the plugin's factory.

A new user's trial with the published runway plugin and ``retry_avatar``: the first
attempt never joined, the retry's did, and at the job's close the second provider
session was never ended (no DELETE, no END_CALL): runway keeps its first ``aclose()``'s
end-of-session task and, started again on the same object, reuses it, finished. Giving
``AgentJob`` a factory (``avatar=functools.partial(runway.AvatarSession, ...)``) did not
help: it was called once. Now each retry builds its attempt's plugin from the factory, and
each plugin is closed once; a plugin given as an object is restarted as before.

Real: ``AgentSession``, ``AgentJob`` and its retry, on an ``InMemoryRoom`` (a real
``rtc.Room`` with no connection). Faked: the provider (``ScriptedAvatar``), and the server
API's participant removal (it needs a network).
"""

from __future__ import annotations

from typing import Any

import pytest
from livekit.agents import Agent, AgentSession

from agent_runtime import AgentJob, AvatarRetry, Backoff
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

AV = "av"
JOIN_TIMEOUT = 3.0
RETRY = AvatarRetry(attempts=2, backoff=Backoff(initial=1.0))


class _Session(ScriptedAvatar):
    """One provider session per plugin object, ended by its first ``aclose()`` only (as
    runway's end-of-session task, kept once made)."""

    built: list[_Session] = []

    def __init__(self) -> None:
        super().__init__(avatar_identity=AV)
        self.name = f"s-{len(_Session.built) + 1}"
        self.sessions: list[str] = []  # the provider sessions this object started
        self.ended: list[str] = []
        self._end_once: list[str] | None = None
        _Session.built.append(self)

    async def start(self, agent_session: Any, room: Any) -> None:
        self.sessions.append(f"{self.name}.{len(self.sessions) + 1}")
        await super().start(agent_session, room)

    async def aclose(self) -> None:
        if self._end_once is None:  # made once, reused by every later close
            self._end_once = list(self.sessions)
            self.ended.extend(self._end_once)
        await super().aclose()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    _Session.built.clear()


async def _run(room: InMemoryRoom, clock: VirtualClock, avatar: Any) -> AgentJob:
    async def remove(identity: str) -> None:
        room.remove_participant(identity) if identity in room.remote_participants else None

    room.add_participant("user")
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=avatar,
        clock=clock,
        otel=False,
        join_timeout=JOIN_TIMEOUT,
        retry_avatar=RETRY,
        remove_avatar_participant=remove,
    )
    await job.start(Agent(instructions="agent"))
    await clock.advance(JOIN_TIMEOUT + 0.1)  # the first attempt never joins
    await clock.advance(2)  # the backoff, the release, the retry's start
    room.add_participant(AV, kind="agent")
    room.publish_track(AV, "video")
    await settle()
    assert job.states["avatar"] == "joined"
    await job.aclose()
    return job


async def test_a_factory_gives_each_attempt_its_own_plugin_each_closed(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = await _run(room, clock, _Session)
    first, second = _Session.built  # one per attempt
    assert (first.sessions, first.ended) == (["s-1.1"], ["s-1.1"])
    assert (second.sessions, second.ended) == (["s-2.1"], ["s-2.1"])  # it was never ended
    assert job.avatar is not None and job.avatar.avatar is second


async def test_a_plugin_given_as_an_object_is_restarted_as_before(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = _Session()
    await _run(room, clock, plugin)
    assert _Session.built == [plugin] and plugin.sessions == ["s-1.1", "s-1.2"]
