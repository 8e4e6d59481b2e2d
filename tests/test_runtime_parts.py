"""The single-machine runtimes a user can build alone (``AvatarLifecycle``,
``ParticipantLink``, ``PlayoutTracker``, ``JobRuntime``, ``JobSessionHost``,
``RoomEventAdapter``): a failing listener's log line names the room, and never an empty
job id."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from livekit.agents import AgentSession

from agent_runtime import AgentJob, ParticipantLink, RoomEventAdapter
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom

ROOM = "parts-room"


# -- a failing listener's log line -------------------------------------------------------------


def _boom(*_: Any) -> None:
    raise ValueError("boom")


def _listener_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage().split(":")[0]
        for r in caplog.records
        if r.name == "agent_runtime.emitter" and "listener failed" in r.getMessage()
    ]


async def test_a_failing_listener_of_a_job_built_directly_names_its_room_not_an_empty_id(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.on("state_changed", _boom)
    job.link.on("state_changed", _boom)
    with caplog.at_level(logging.ERROR):
        await job.aclose()
    # it was "job  (room parts-room), AgentJob" (no job id, a double space); the link's
    # line named neither job nor room
    assert sorted(_listener_lines(caplog)) == [
        f"room {ROOM}, AgentJob",
        f"room {ROOM}, ParticipantLink",
    ]


async def test_a_failing_listener_of_a_lone_participant_link_names_its_room(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    link = ParticipantLink(AgentSession(), room_events=RoomEventAdapter(room), clock=clock)
    link.on("state_changed", _boom)
    with caplog.at_level(logging.ERROR):
        await link.aclose()
    assert link.state == "closed"
    assert _listener_lines(caplog) == [f"room {ROOM}, ParticipantLink"]
