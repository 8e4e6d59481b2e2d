"""``AgentJob``'s own lifecycle: start, close and abort in any order and at once.

Each case was observed to fail before the job's lifecycle was a machine of its own (issue
24): an abort that left a hanging start, a graceful close that never returned, a host whose
loops outlived the job, listeners subscribed again by a refused start, a second agent
silently dropped, shutdown callbacks lost behind a hung deletion.

Real: ``AgentSession`` with its RoomIO, every machine's runtime, the scripted avatar plugin
(an ``AvatarSession`` subclass doing what the published plugins do, its base class's join
watcher included). Faked, because they need a server: the room (``InMemoryRoom``, a real
``rtc.Room`` with no connection), the session transport's byte stream (a paired in-memory
transport carrying the real protobuf messages) and the room deletion's server API call.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from statemachines.machines import MACHINES

SIM = {ATTRIBUTE_SIMULATOR: "1"}
DISPATCH = SimulationDispatch(simulation_run_id="run-lc", job_id="simjob-lc")


ROOM = "lc-room"  # the room the fixtures build (tests/conftest.py)


class CountingAvatar(ScriptedAvatar):
    """The scripted plugin, counting its ``aclose()`` calls."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.closes = 0

    async def aclose(self) -> None:
        self.closes += 1
        await super().aclose()


def other_tasks() -> list[str]:
    me = asyncio.current_task()
    return sorted(t.get_name() for t in asyncio.all_tasks() if t is not me and not t.done())


def agent() -> Agent:
    return Agent(instructions="agent")


def simulated_job(
    room: InMemoryRoom, clock: VirtualClock, **options: Any
) -> tuple[AgentJob, InMemorySessionTransport]:
    """A job in a simulation with the simulator in the room, and the simulator's end of the
    session transport."""
    room.add_participant("simulator", attributes=SIM)
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    job = AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        transport=agent_end,
        simulation=DISPATCH,
        otel=False,
        **options,
    )
    return job, sim_end


async def test_an_abort_while_the_avatar_plugin_hangs_in_start_ends_the_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    plugin = CountingAvatar(start_delay=1e9, clock=clock)  # a provider that never answers
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    starting = asyncio.create_task(job.start(agent()))
    await settle()
    assert job.states["avatar"] == "starting" and job.lifecycle == "starting"
    await asyncio.wait_for(job.aclose(graceful=False), 5)
    with pytest.raises(RuntimeError, match="closed before it finished starting"):
        await asyncio.wait_for(starting, 5)
    await settle()
    assert job.lifecycle == "closed"
    # the plugin was closed (its join watcher and its two room listeners with it)
    assert plugin.closes == 1
    assert room.listener_count() == listeners
    assert other_tasks() == []


async def test_an_abort_ends_a_graceful_close_holding_for_the_simulator(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job, _sim_end = simulated_job(room, clock)
    await job.start(agent())
    graceful = asyncio.create_task(job.aclose())
    await settle()
    assert job.states["job"] == "awaiting_finalize" and job.lifecycle == "closing"
    await asyncio.wait_for(job.aclose(graceful=False), 5)
    await asyncio.wait_for(graceful, 5)  # the graceful call returns too
    assert job.lifecycle == "closed"
    await settle()
    assert other_tasks() == []


async def test_a_graceful_close_in_a_simulation_closes_the_session_then_holds_for_the_verdict(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """livekit's order (``_shutdown_job``): the primary session closes first, then
    ``on_session_end`` holds for the verdict; the job's own host answers the simulator's
    finalize with no session attached."""
    seen: list[str | None] = []

    async def verdict_of(sim: SimulationContext) -> None:
        seen.append(job.close_reason)  # the session closed before the verdict was asked
        sim.fail("too slow")

    job, sim_end = simulated_job(room, clock, on_simulation_end=verdict_of)
    await job.start(agent())
    graceful = asyncio.create_task(job.aclose())
    await settle()
    assert job.close_reason == "job_shutdown"  # the session is closed already
    assert job.states["job"] == "awaiting_finalize"
    assert job.states["session_host"] == "detached"
    assert not graceful.done()
    remote = RemoteSession(sim_end)
    await remote.start()
    verdict = await remote.finalize_simulation(provisional_success=True)
    assert (verdict.user_verdict.success, verdict.user_verdict.reason) == (False, "too slow")
    assert seen == ["job_shutdown"]
    await asyncio.wait_for(graceful, 5)
    assert job.lifecycle == "closed"
    await remote.aclose()
    await settle()
    assert other_tasks() == []


async def test_an_abort_in_the_same_tick_as_a_graceful_close_ends_both(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    graceful = asyncio.create_task(job.aclose())
    aborting = asyncio.create_task(job.aclose(graceful=False))
    await asyncio.wait_for(asyncio.gather(graceful, aborting), 5)
    assert job.lifecycle == "closed"
    assert job.states["job"] != "closing"  # not frozen half-way through its close
    await settle()
    assert room.listener_count() == listeners and other_tasks() == []


async def test_an_abort_after_start_stops_the_host_and_closes_a_joined_avatar(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    plugin = CountingAvatar(clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    await job.start(agent())
    room.add_participant("avatar")
    room.publish_track("avatar", "video")
    await settle()
    assert job.states["avatar"] == "joined" and job.audio_route() == "avatar"
    await asyncio.wait_for(job.aclose(graceful=False), 5)
    await settle()
    assert plugin.closes == 1  # the plugin's own aclose ran
    assert job.audio_route() != "avatar"  # the route is off the avatar
    assert job.lifecycle == "closed"
    await job.session.aclose()  # an abort stops the machines; the session is the user's
    await settle()
    assert room.listener_count() == listeners
    assert other_tasks() == []  # the host's read and write loops included


async def test_start_after_close_is_refused_and_subscribes_nothing(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    for graceful in (True, False):
        job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
        await job.aclose(graceful=graceful)
        listeners = room.listener_count()
        with pytest.raises(RuntimeError, match="this job is closed"):
            await job.start(agent())
        await settle()
        assert room.listener_count() == listeners and other_tasks() == []
        assert not job.session._started


@pytest.mark.parametrize("with_avatar", [False, True], ids=["no-avatar", "avatar"])
async def test_a_second_start_while_starting_is_refused_with_a_clear_error(
    room: InMemoryRoom, clock: VirtualClock, with_avatar: bool
) -> None:
    avatar = CountingAvatar(start_delay=1.0, clock=clock) if with_avatar else None
    job = AgentJob(room=room, session=AgentSession(), avatar=avatar, clock=clock, otel=False)
    first = asyncio.create_task(job.start(agent()))
    second = asyncio.create_task(job.start(agent()))
    await settle()
    await clock.advance(1.0)
    results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
    assert results[0] is None
    assert isinstance(results[1], RuntimeError)
    assert "already starting" in str(results[1])
    assert job.lifecycle == "running" and job.session._started
    await job.aclose()


async def test_a_hung_room_deletion_does_not_lose_the_shutdown_callbacks(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    async def hangs() -> None:
        await asyncio.get_running_loop().create_future()

    ran: list[tuple[str, float]] = []
    job = AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        delete_room_on_close=True,
        delete_room=hangs,
        close_timeout=10.0,
        otel=False,
    )
    job.add_shutdown_callback(lambda reason: ran.append((reason, clock.now())))
    await job.start(agent())
    job.shutdown("done")
    await settle()
    for _ in range(12):
        await clock.advance(1.0)
    await asyncio.wait_for(job.wait_closed(), 5)
    # the callbacks ran once the deletion's share of the close was spent, well before the
    # whole close's bound (10 s), and the job closed then
    assert len(ran) == 1 and ran[0][0] == "done" and ran[0][1] < 10.0
    assert job.closed_at is not None and job.closed_at < 10.0
    assert job.room_deleted_at is None  # the deletion never returned: not counted as done
    await asyncio.wait_for(job.aclose(), 5)  # the deletion was cut at its own bound
    assert job.states["room_deletion"] == "abandoned"


async def test_aclose_returns_once_a_hung_deletion_reaches_its_own_bound(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """What the room deletion's ``(deleting, close)`` cell says: the job closes at its room
    step's share of ``close_timeout`` (the callbacks are not held), the deletion ignores the
    release's ``close`` and runs on to its own bound, and ``aclose()`` returns then."""
    from statemachines.room_deletion import ROOM_DELETION
    from statemachines.system import bound_of

    async def hangs() -> None:
        await asyncio.get_running_loop().create_future()

    job = AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        delete_room_on_close=True,
        delete_room=hangs,
        close_timeout=10.0,
        otel=False,
    )
    await job.start(agent())
    closing = asyncio.ensure_future(job.aclose())
    returned: list[float] = []
    closing.add_done_callback(lambda _: returned.append(clock.now()))
    for _ in range(12):
        await settle()
        await clock.advance(1.0)
    await asyncio.wait_for(closing, 5)
    assert job.closed_at == pytest.approx(bound_of("room", 10.0))  # 1.5 s: the room share
    assert returned == [10.0] and job.states["room_deletion"] == "abandoned"
    reason = next(
        c.note for c in ROOM_DELETION.ignore if (c.state, c.event) == ("deleting", "close")
    )
    assert "runs on to that bound; aclose() returns once it ends" in reason


def test_the_room_fact_channels_are_registered_only_by_a_started_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    assert room.listener_count() == listeners


async def test_a_remote_disconnect_closes_the_lifecycle_too(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    await asyncio.wait_for(job.wait_closed(), 5)
    await settle()
    assert job.lifecycle == "closed"
    assert job.states["job"] == "closed"
    await job.aclose()


# -- every way the lifecycle moves, as a user drives it -------------------------------------


async def test_a_start_in_parts_is_starting_until_the_session_runs(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = CountingAvatar(clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    assert job.lifecycle == "new"
    await job.start_runtime()  # follows the room; the agent's own parts move the lifecycle
    assert job.lifecycle == "new" and job.states["job"] == "serving"
    await job.start_avatar()
    assert job.lifecycle == "starting" and plugin.start_calls == 1
    with pytest.raises(RuntimeError, match="this job is already starting"):
        await job.start(agent())  # the whole start, while its parts run
    await job.start_session(agent())
    assert job.lifecycle == "running" and job.session._started
    await job.aclose()
    assert job.lifecycle == "closed"


async def test_the_avatar_may_start_after_the_session_and_the_job_keeps_running(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = CountingAvatar(clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    await job.start_session(agent())
    assert job.lifecycle == "running"
    await job.start_avatar()
    assert job.lifecycle == "running" and plugin.start_calls == 1
    assert job.states["avatar"] == "routing"
    # the plugin cannot start twice: that part fails, the job goes on as it was
    with pytest.raises(RuntimeError, match="already started"):
        await job.start_avatar()
    await settle()
    assert job.lifecycle == "running" and job.session._started
    assert job.states["job"] == "serving"
    await job.aclose()


async def test_a_late_avatar_start_its_caller_gives_up_on_leaves_the_job_running(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    # the avatar started once the agent already talks (a late plugin, a retry by the
    # agent's code), under the caller's own timeout: the provider hangs, the caller gives
    # up (its task cancelled), and the call goes on with the agent on the room's audio
    plugin = ScriptedAvatar(clock=clock, held=True)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    await job.start_session(agent())
    assert job.lifecycle == "running"
    heard: list[tuple[str, str]] = []  # a dashboard's listener on the job's own lifecycle
    job.on(
        "state_changed",
        lambda sc: heard.append((sc.source, sc.dest)) if sc.machine == "agent_job" else None,
    )
    late = asyncio.create_task(job.start_avatar())
    await settle()
    assert not late.done()  # waiting on the provider
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    await settle()
    assert job.lifecycle == "running" and job.states["job"] == "serving" and heard == []
    assert lk.session_started(job.session) and job.audio_route() == "room"
    await job.aclose()
    assert job.lifecycle == "closed"


async def test_start_after_start_is_refused_and_changes_nothing(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    listeners = room.listener_count()
    with pytest.raises(RuntimeError, match="this job is already started"):
        await job.start(agent())
    assert job.lifecycle == "running" and room.listener_count() == listeners
    await job.aclose()


class FailingSession(AgentSession):  # type: ignore[type-arg]
    """A session whose start() raises (a fault injected where livekit-agents would fail)."""

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the model provider refused the session")


async def test_a_start_that_fails_raises_its_error_and_releases_what_started(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    ran: list[str] = []
    job = AgentJob(room=room, session=FailingSession(), clock=clock, otel=False)
    job.add_shutdown_callback(lambda: ran.append("callback"))
    with pytest.raises(ConnectionError, match="refused the session"):
        await job.start(agent())
    await asyncio.wait_for(job.aclose(), 5)
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert ran == ["callback"]  # the close ran as any close does
    await settle()
    assert room.listener_count() == listeners and other_tasks() == []


@pytest.mark.parametrize("graceful", [True, False], ids=["close", "abort"])
async def test_closing_a_job_never_started_runs_its_close_and_returns(
    room: InMemoryRoom, clock: VirtualClock, graceful: bool
) -> None:
    ran: list[str] = []
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.add_shutdown_callback(lambda: ran.append("callback"))
    await asyncio.wait_for(job.aclose(graceful=graceful), 5)
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert ran == ["callback"]
    # every machine is let go in a final state, the session's from new (never started)
    assert job.states["session"] == "closed"
    assert all(MACHINES[m].state(s).final for m, s in job.states.items()), job.states


async def test_a_graceful_close_while_the_avatar_hangs_in_start_ends_the_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = CountingAvatar(start_delay=1e9, clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    starting = asyncio.create_task(job.start(agent()))
    await settle()
    await asyncio.wait_for(job.aclose(), 5)
    with pytest.raises(RuntimeError, match="closed before it finished starting"):
        await asyncio.wait_for(starting, 5)
    assert job.lifecycle == "closed" and plugin.closes == 1
    assert not job.session._started  # the session never started


async def test_the_room_going_away_while_starting_ends_the_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = CountingAvatar(start_delay=1e9, clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    starting = asyncio.create_task(job.start(agent()))
    await settle()
    room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    with pytest.raises(RuntimeError, match="closed before it finished starting"):
        await asyncio.wait_for(starting, 5)
    await asyncio.wait_for(job.lifecycle_actor.until(lambda s: s == "closed"), 5)
    assert job.states["job"] == "closed" and plugin.closes == 1
    await job.aclose()


async def test_start_while_the_job_closes_is_refused(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    gate = asyncio.Event()
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.add_shutdown_callback(gate.wait)  # the close waits in its callbacks step
    await job.start(agent())
    for graceful in (True, False):
        closing = asyncio.create_task(job.aclose(graceful=graceful))
        await settle()
        assert job.lifecycle == "closing"
        for call in (job.start(agent()), job.start_runtime(), job.start_session(agent())):
            with pytest.raises(RuntimeError, match="this job is closed"):
                await call
        assert not closing.done()
    gate.set()
    await asyncio.wait_for(job.aclose(), 5)
    assert job.lifecycle == "closed"


async def test_an_abort_then_a_close_returns_once_closed(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    gate = asyncio.Event()
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.add_shutdown_callback(gate.wait)
    await job.start(agent())
    aborting = asyncio.create_task(job.aclose(graceful=False))
    await settle()
    closing = asyncio.create_task(job.aclose())  # a graceful close while aborting: joins it
    await settle()
    assert job.lifecycle == "closing" and not closing.done() and not aborting.done()
    gate.set()
    await asyncio.wait_for(asyncio.gather(aborting, closing), 5)
    assert job.lifecycle == "closed"


async def test_start_after_start_runtime_is_the_whole_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start_runtime()
    await job.start_runtime()  # idempotent
    await job.start(agent())
    assert job.lifecycle == "running" and job.session._started
    await job.aclose()
