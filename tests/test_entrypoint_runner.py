"""``EntrypointRunner`` (the ``run_entrypoint`` fixture): an entrypoint run as livekit's job
runner would, and what it refuses.

Real: livekit's fake ``JobContext``, ``AgentSession``, the runtime. Faked, because they need
a server: the room (``InMemoryRoom``) and the session transport's byte stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession, JobContext
from livekit.agents.job import get_job_context
from livekit.agents.utils import http_context

from agent_runtime import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom


async def entrypoint(ctx: JobContext) -> None:
    job = AgentJob.from_job_context(ctx, session=AgentSession(), grace_period=5)
    await job.start(Agent(instructions="test"))


async def test_the_job_context_is_current_inside_the_entrypoint_and_the_parts_are_injected(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    seen: list[Any] = []

    async def looking(ctx: JobContext) -> None:
        seen.append(get_job_context() is ctx)
        await entrypoint(ctx)

    agent_room.add_participant("user")
    job = await run_entrypoint(looking)
    assert seen == [True] and run_entrypoint.ctx.room is agent_room
    assert job.clock is virtual_clock and AgentJob.for_job(run_entrypoint.ctx) is job
    agent_room.remove_participant("user", rtc.DisconnectReason.SIGNAL_CLOSE)
    await virtual_clock.advance(5)  # the entrypoint's own grace period, on the test's clock
    await run_entrypoint.wait_for("job", "closed")
    closed = [(t["t"], t["machine"]) for t in run_entrypoint.transitions if t["dest"] == "closed"]
    assert (5.0, "job") in closed  # the grace ran out on the test's virtual clock


def _http_user(sessions: list[Any]) -> Callable[[JobContext], Awaitable[None]]:
    """The entrypoint, with a plugin's call for the job's HTTP session (kept in
    ``sessions``)."""

    async def with_a_plugin(ctx: JobContext) -> None:
        sessions.append(http_context.http_session())
        await entrypoint(ctx)

    return with_a_plugin


async def test_plugins_get_the_jobs_http_session_as_under_livekits_job_runner(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # livekit's runner binds one per job: an HTTP plugin (an avatar, a TTS) failed here only
    # ("Attempted to use an http session outside of a job context")
    sessions: list[Any] = []
    with_a_plugin = _http_user(sessions)
    agent_room.add_participant("user")
    await run_entrypoint(with_a_plugin)
    (session,) = sessions
    assert not session.closed
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    await settle()
    assert session.closed  # after the job's end, as the runner closes it


async def test_the_job_knows_its_agents_identity_as_avatar_plugins_read_it(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    # livekit's fake job context has an empty token: local_participant_identity raised
    # ("Not enough segments"), and avatar plugins read it for lk.publish_on_behalf
    seen: list[str] = []

    async def looking(ctx: JobContext) -> None:
        seen.append(ctx.local_participant_identity)
        await entrypoint(ctx)

    agent_room.add_participant("user")
    await run_entrypoint(looking)
    assert seen == [agent_room.local_participant.identity]


async def test_a_tests_own_http_session_is_the_one_the_plugins_get(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    sessions: list[Any] = []
    with_a_plugin = _http_user(sessions)
    agent_room.add_participant("user")
    async with http_context.open() as own:
        await run_entrypoint(with_a_plugin)
        await run_entrypoint.aclose()
        assert sessions == [own] and not own.closed  # the test's to close


async def test_an_entrypoint_that_builds_no_job_is_told_what_to_do(
    run_entrypoint: EntrypointRunner,
) -> None:
    async def bare(ctx: JobContext) -> None:
        return None

    with pytest.raises(RuntimeError, match=r"built no AgentJob: call AgentJob.from_job_context"):
        await run_entrypoint(bare)


@pytest.mark.parametrize(
    ("machine", "state", "error", "match"),
    [
        ("jobs", "closed", ValueError, r"unknown machine 'jobs': one of \["),
        ("job", "done", ValueError, r"unknown job state 'done': one of \['serving'"),
        ("avatar", "joined", ValueError, "this job has no avatar machine"),
        ("job", "closed", TimeoutError, "job is 'serving', not 'closed', after 0.05s"),
    ],
)
async def test_wait_for_names_what_is_wrong(
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    machine: str,
    state: str,
    error: type[Exception],
    match: str,
) -> None:
    agent_room.add_participant("user")
    await run_entrypoint(entrypoint)
    with pytest.raises(error, match=match):
        await run_entrypoint.wait_for(machine, state, timeout=0.05)


async def test_bad_arguments_are_refused_before_anything_runs(
    run_entrypoint: EntrypointRunner,
) -> None:
    with pytest.raises(TypeError, match="give an AgentServer or an entrypoint function"):
        await run_entrypoint("examples.agent:entrypoint")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="avatar must be an AvatarSession"):
        await run_entrypoint(entrypoint, avatar=object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="no entrypoint has run yet"):
        run_entrypoint.session_end()


async def test_a_room_given_unconnected_is_connected_as_the_job_context_is() -> None:
    # the job served on a room that never connected, so it never disconnected either: the
    # user left, the job closed, and wait_ended() said "nothing ended it" (a trial's)
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.add_participant("user")
    runner = EntrypointRunner(room=room, clock=clock)
    job = await runner(entrypoint)
    assert room.isconnected() and job.states["job"] == "serving"
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()
    assert job.states["job"] == "closed" and runner.process.reason == "room disconnected"
    await runner.aclose()


async def test_teardown_stops_a_running_job_and_releases_its_context() -> None:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    baseline = room.listener_count()
    runner = EntrypointRunner(room=room, clock=clock)
    job = await runner(entrypoint)
    ctx = runner.ctx
    tempdir = Path(ctx._tempdir.name)
    assert tempdir.is_dir() and job.states["job"] == "serving"

    await runner.aclose()
    assert AgentJob.for_job(ctx) is None and not tempdir.exists()
    assert not job.session._started  # the session was closed too
    # every listener the job added is gone; the JobContext keeps its own, as livekit leaves it
    assert room.listener_count() == baseline + 1
