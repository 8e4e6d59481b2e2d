"""Under the testing kit, ``ctx.api`` reaches no LiveKit server.

livekit's ``JobContext.api`` builds a server client from ``LIVEKIT_URL`` and the keys in
the environment, and livekit's ``AvatarSession.aclose()`` removes the avatar participant
through it. A test of an agent whose real avatar plugin failed to start (the job retires
the attempt, closing the plugin) sent an authenticated ``RemoveParticipant`` to the server
a developer's environment named, or, with none set, logged "url must be set" with a
traceback. The kit answers the job's own room's calls on the test's room, as it does
``ctx.delete_room()``.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime.
Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

import pytest
from livekit import api, rtc
from livekit.agents import get_job_context

from agent_runtime import on_session_end
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from tests.support import planted

pytestmark = pytest.mark.virtual_time


async def _calls_the_server(calls: list[str]) -> None:
    ctx = get_job_context()
    # what livekit's AvatarSession.aclose() does for the avatar it started
    await ctx.api.room.remove_participant(
        api.RoomParticipantIdentity(room=ctx.room.name, identity="avatar")
    )
    calls.append("removed")
    try:
        await ctx.api.room.list_participants(api.ListParticipantsRequest(room=ctx.room.name))
    except AttributeError as e:
        calls.append(str(e))


async def test_ctx_api_answers_on_the_tests_room_and_reaches_no_server(
    monkeypatch: pytest.MonkeyPatch, agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    sent: list[object] = []

    async def no_server(*args: object, **kwargs: object) -> None:
        sent.append(args[1:3])  # (method, url): a request would have left the test
        raise AssertionError("a request to the LiveKit server")

    monkeypatch.setenv("LIVEKIT_URL", "http://livekit.invalid:7880")
    monkeypatch.setenv("LIVEKIT_API_KEY", "a developer's key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "a developer's secret, long enough for HS256")
    monkeypatch.setattr("aiohttp.ClientSession._request", no_server)
    agent_room.add_participant("user")
    agent_room.add_participant("avatar", kind="agent")
    await run_entrypoint(planted.session_end_server(on_session_end))

    calls: list[str] = []
    await run_entrypoint.in_job(_calls_the_server, calls)
    assert sent == []
    assert "avatar" not in agent_room.remote_participants
    assert calls[0] == "removed"
    assert "list_participants" in calls[1] and "no LiveKit server" in calls[1]
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
