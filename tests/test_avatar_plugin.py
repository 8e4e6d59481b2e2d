"""A real plugin from PyPI (livekit-plugins-bey) driven through AvatarLifecycle, unchanged.

Only its network call is faked: ``_start_agent``, the POST that asks Beyond Presence to
send an avatar into the room. Everything else is the plugin's own ``start()``: the base
class's start, the access token it mints for the avatar, and the
``replace_audio_tail(DataStreamAudioOutput(...))`` that points the agent's audio at it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from livekit import api
from livekit.agents.testing import fake_job_context
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.plugins import bey

from agent_runtime.clock import settle
from tests.support.avatar_rig import Rig

KEY, SECRET = "test-key", "test-secret-" + "x" * 32


@pytest.fixture
def bey_avatar(monkeypatch: pytest.MonkeyPatch) -> tuple[bey.AvatarSession, list[str]]:
    monkeypatch.setenv("LIVEKIT_URL", "wss://example.invalid")
    monkeypatch.setenv("LIVEKIT_API_KEY", KEY)
    monkeypatch.setenv("LIVEKIT_API_SECRET", SECRET)
    avatar = bey.AvatarSession(api_key="bey-test-key")
    tokens: list[str] = []

    async def start_agent(livekit_url: str, livekit_token: str) -> None:
        tokens.append(livekit_token)  # the provider would now send its avatar in

    monkeypatch.setattr(avatar, "_start_agent", start_agent)
    return avatar, tokens


@contextlib.contextmanager
def job_of(rig: Rig) -> Iterator[Any]:
    """The plugin needs a job (upstream's fake one); it reads the agent's identity from
    the job's token."""
    with fake_job_context(room=rig.room) as job:
        job._info.token = api.AccessToken(KEY, SECRET).with_identity("agent").to_jwt()
        yield job


@pytest.mark.parametrize("session_first", [True, False])
async def test_bey_avatar_that_never_joins_ends_on_room_audio(
    bey_avatar: tuple[bey.AvatarSession, list[str]], session_first: bool
) -> None:
    avatar, tokens = bey_avatar
    rig = Rig(avatar=avatar, join_timeout=10.0)
    with job_of(rig):
        if session_first:
            await rig.start_session()
        await rig.start_avatar()
        if not session_first:
            await rig.start_session()
        assert len(tokens) == 1
        claims = api.TokenVerifier(KEY, SECRET).verify(tokens[0])
        assert claims.identity == "bey-avatar-agent"
        sink = rig.lifecycle.installed_sink
        assert isinstance(sink, DataStreamAudioOutput)  # the plugin's own route
        assert sink.sample_rate == bey.avatar.SAMPLE_RATE
        assert rig.lifecycle.audio_route() == "avatar"
        await rig.clock.advance(10)
        assert rig.lifecycle.state == "restored"
        assert rig.lifecycle.audio_route() == "room"
        await rig.aclose()


async def test_bey_avatar_joins_then_leaves(
    bey_avatar: tuple[bey.AvatarSession, list[str]],
) -> None:
    avatar, _ = bey_avatar
    rig = Rig(avatar=avatar)
    original_clear = DataStreamAudioOutput.clear_buffer
    with job_of(rig):
        await rig.start_session()
        await rig.start_avatar()
        rig.join()
        await settle()
        assert rig.lifecycle.state == "joined"
        assert rig.lifecycle.audio_route() == "avatar"
        rig.room.local_participant.rpc_script["lk.clear_buffer"].append("disconnected")
        rig.lifecycle.interrupt()
        await rig.clock.advance(1)
        assert rig.lifecycle.state == "restored"  # the clear found the avatar gone
        assert rig.lifecycle.audio_route() == "room"
        assert [c.destination for c in rig.rpcs()] == ["bey-avatar-agent"]
        sink = rig.lifecycle.installed_sink
        await rig.aclose()
    # no plugin or SDK class was changed; the one sink instance is its own again
    assert DataStreamAudioOutput.clear_buffer is original_clear
    assert sink is not None and "clear_buffer" not in vars(sink)
