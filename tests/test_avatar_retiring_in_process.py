"""An in-process avatar (bithuman's local mode: the avatar is the agent's own participant)
whose start fails, given up for good: retiring it must not take the agent out of the room,
neither by the runtime's removal nor by the plugin's own close (livekit's ``aclose()`` asks
the server to remove the avatar's identity, here the agent's). Its close waits for the
job's. Real plugin; its ``AsyncBithuman`` runtime and the server API stood in (they need a
model file and a server)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from livekit.agents import get_job_context
from livekit.plugins import bithuman

from agent_runtime.testing.clock import settle
from tests.test_avatar_plugins import BITHUMAN_LOCAL, PLUGINS, StandInRuntime, plugin_rig, start


class _TokenRefused(StandInRuntime):
    async def _initialize_token(self) -> None:
        raise RuntimeError("bithuman token refused")


async def test_a_failed_in_process_avatar_retired_leaves_the_agent_in_the_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failing = replace(
        BITHUMAN_LOCAL,
        build=lambda: bithuman.AvatarSession(
            model_path="m.imx", api_secret="s", runtime=_TokenRefused()
        ),
    )
    monkeypatch.setitem(PLUGINS, "bithuman", failing)
    async with plugin_rig("bithuman", monkeypatch, join_timeout=5.0) as (rig, _provider):
        asked: list[str] = []

        async def server_removal(req: Any) -> None:
            asked.append(req.identity)

        monkeypatch.setattr(get_job_context().api.room, "remove_participant", server_removal)
        closes: list[str] = []
        plugin_aclose = rig.avatar.aclose

        async def aclose() -> None:
            closes.append(rig.lifecycle.state)
            await plugin_aclose()

        monkeypatch.setattr(rig.avatar, "aclose", aclose)
        states: list[str] = []
        rig.lifecycle.on("state_changed", lambda sc: states.append(sc.dest))
        await start(rig)
        await rig.clock.advance(6)
        await settle()
        agent = rig.room.local_participant.identity
        assert "retiring" in states and rig.lifecycle.state == "restored"
        assert agent not in rig.removed  # the runtime's removal
        assert agent not in asked  # the plugin's own close, through the server API
        assert closes == []  # its close waits for the job's
        await rig.lifecycle.aclose()
        assert closes == ["closed"]  # the job's, once
