"""The fuzzer on an agent that declines a room: its entrypoint returns without an
``AgentJob`` when no user is there (a stray dispatch), with or without ``ctx.shutdown()``.
That is the agent's choice, not its failure; an agent that builds no job even with a user
there is still refused as a usage error.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room (``InMemoryRoom``) and the session
transport's byte stream.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.entrypoint import NoAgentJob
from agent_runtime.testing.fuzz import FuzzOptions, fuzz, replay
from tests.support import lingering


def declining_server(*, shutdown: bool) -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        users = [
            p
            for p in ctx.room.remote_participants.values()
            if ATTRIBUTE_SIMULATOR not in p.attributes
        ]
        if not users:  # nobody to serve: leave the room to whoever comes next
            if shutdown:
                ctx.shutdown("empty room")
            return
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


# the room with the simulator alone, as the fuzzer draws it
EMPTY_ROOM = {
    "name": "a room with no user",
    "config": {"simulation": True},
    "participants": [{"identity": "simulator", "attributes": {ATTRIBUTE_SIMULATOR: "true"}}],
    "steps": [{"at": 0, "event": "session.start"}, {"at": 0, "event": "end"}],
}


@pytest.mark.parametrize("shutdown", [True, False], ids=["ctx.shutdown", "returns"])
def test_an_agent_that_declines_an_empty_room_fuzzes_clean(shutdown: bool) -> None:
    """It was "user code: the agent's entrypoint raised NoAgentJob", with the kit's own
    traceback, from the first run drawn with no user in the room."""
    report = fuzz(declining_server(shutdown=shutdown), FuzzOptions(seed=1, examples=40))
    assert report.ok, report.summary()
    assert report.examples == 40


@pytest.mark.parametrize("shutdown", [True, False], ids=["ctx.shutdown", "returns"])
def test_the_empty_room_replays_clean(tmp_path: Path, shutdown: bool) -> None:
    """--replay of the file such a run wrote was a usage error (exit 2, "built no
    AgentJob"), not the run it recorded."""
    path = tmp_path / "empty.yaml"
    path.write_text(yaml.safe_dump(EMPTY_ROOM))
    report = replay(declining_server(shutdown=shutdown), path)
    assert report.ok, report.summary()


def test_an_agent_that_builds_no_job_with_a_user_there_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "user.yaml"
    with_a_user = [{"identity": "user"}, *EMPTY_ROOM["participants"]]  # type: ignore[misc]
    path.write_text(yaml.safe_dump({**EMPTY_ROOM, "participants": with_a_user}))
    with pytest.raises(NoAgentJob, match=r"AgentJob.from_job_context\(ctx"):
        replay(lingering.NO_JOB, path)
    with pytest.raises(NoAgentJob, match=r"AgentJob.from_job_context\(ctx"):
        fuzz(lingering.NO_JOB, FuzzOptions(seed=1, examples=5))
