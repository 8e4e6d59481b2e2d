"""Paths through the real job, input by input, and what a user sees after each: the
regressions the explorer's runs found, and the order of the job's close. A real
``AgentJob`` (the explorer's harness: in-memory room, stand-ins for the avatar's provider,
the simulator and the server calls, on virtual time)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.invariants.view import JobView
from statemachines.system import bound_of
from verification.explore.config import CONFIGS, SETTINGS
from verification.explore.harness import Harness
from verification.explore.real import apply
from verification.explore.real_inputs import TIME


def _views(config: str, path: Sequence[str]) -> tuple[list[JobView], list[float]]:
    """The job's view at the start and after each input, and the clock then."""

    async def go() -> tuple[list[JobView], list[float]]:
        h = Harness(CONFIGS[config])
        try:
            await h.start()
            views, times = [h.view()], [h.clock.now()]
            for token in path:
                await apply(h, token)
                views.append(h.view())
                times.append(h.clock.now())
            return views, times
        finally:
            await h.aclose()

    return on_virtual_time(go())


def test_a_retry_keeps_the_new_attempts_route() -> None:
    # a failed attempt's release that ran after the next attempt's start had begun forgot
    # that attempt's route and left the audio on a failed avatar
    path = ["avatar_start", "plugin_fails", TIME, "plugin_routed", "plugin_fails_late"]
    views, _ = _views("identity", path)
    assert [v.states["avatar"] for v in views[1:]] == [
        "starting",
        "backoff",
        "starting",
        "starting",
        "restored",
    ]
    assert views[-1].audio_route == "room"


def test_the_avatar_leaves_after_the_session_or_its_share_of_the_bound() -> None:
    # the close in livekit's order: the session's close first (its speech ends on the route
    # it has), the avatar's step once the session closed or its share of the bound passed
    path = [
        "avatar_start",
        "plugin_routed",
        "plugin_returns",
        "avatar_joins",
        "avatar_video",
        "ctx_shutdown",
        TIME,
    ]
    views, times = _views("plain", path)
    closing, after = views[6], views[7]
    assert (closing.states["avatar"], closing.session, closing.audio_route) == (
        "joined",
        "closing",
        "avatar",
    )
    assert times[7] - times[6] == pytest.approx(bound_of("session", SETTINGS["close_timeout"]))
    assert (after.states["avatar"], after.audio_route) == ("closed", "room")


def test_the_users_closes_hold_then_abort_then_release() -> None:
    # aclose() holds for the simulator; aclose(graceful=False) ends the hold; the lifecycle
    # closes once the job machine did and its release ended (both calls then return)
    views, _ = _views("aclose", ["aclose", "abort", "a_closed", "callbacks_return"])
    assert [v.states["agent_job"] for v in views] == [
        "running",
        "closing",
        "closing",
        "closing",
        "closed",
    ]
    assert [v.states["job"] for v in views[:3]] == ["serving", "awaiting_finalize", "closing"]
    assert views[4].states["room_deletion"] == "closed"  # aclose() released it on return
