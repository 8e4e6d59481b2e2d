"""An avatar's retry under the testing kit runs in the job's context, as in production.

Thirteen published avatar plugins call ``get_job_context()`` in their ``start()``. With
``retry_avatar``, the runtime starts the plugin again after its backoff, from a clock
timer. Under the kit, the virtual clock fired that timer in the test's own context, so
the retried ``start()`` found no job context ("no job context found") and every retry of
a published plugin failed under the kit, while the same job on the real clock (asyncio's
timers keep the context they were armed in) retried fine.

Real: livekit's ``AgentSession``, the fake ``JobContext`` the kit runs the entrypoint in,
the runtime and its retry. Faked: the avatar's provider (``ScriptedAvatar``: its first
start fails) and the room.
"""

from __future__ import annotations

from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext, get_job_context

from agent_runtime import AgentJob, on_session_end
from agent_runtime.settings import AvatarRetry, Backoff
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

pytestmark = pytest.mark.virtual_time

AV = "avatar-worker"


class _JobReadingAvatar(ScriptedAvatar):
    """A plugin that reads the job context in its ``start()`` (the agent's identity, the
    room's name for its provider), as the published plugins do."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(avatar_identity=AV, **kw)
        self.rooms: list[str] = []

    async def start(self, agent_session: Any, room: rtc.Room) -> None:
        self.rooms.append(get_job_context().room.name)
        await super().start(agent_session, room)


async def test_a_retried_plugin_start_finds_the_job_context(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    plugin = _JobReadingAvatar(start_error="the provider is busy")
    plugin.start_errors = 1  # the first start fails, the retry's works
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(
            ctx,
            session=AgentSession(),
            avatar=plugin,
            retry_avatar=AvatarRetry(attempts=1, backoff=Backoff(initial=1.0)),
        )
        await job.start(Agent(instructions="test"))

    agent_room.add_participant("user")
    job = await run_entrypoint(server)
    assert job.states["avatar"] == "backoff"
    await virtual_clock.advance(2)  # the backoff, then the release and the second start
    agent_room.add_participant(AV, kind="agent")
    agent_room.publish_track(AV, "video")
    await settle()
    assert plugin.rooms == [agent_room.name, agent_room.name]
    assert job.states["avatar"] == "joined" and job.audio_route() == "avatar"
    assert run_entrypoint.user_failures == []
