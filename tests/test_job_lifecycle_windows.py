"""``AgentJob``'s lifecycle in the windows a user can reach between two calls: while a close
runs, right after a start failed, after the job closed on its own, once it is closed.

What a user sees there is what these tests pin: ``job.lifecycle``, which calls are refused
with which error, whether ``wait_closed()`` and ``aclose()`` return, what a
``state_changed`` listener hears, the room's listeners. Each window is held open the way
a user's code holds it: a shutdown callback that waits (the close's callbacks step runs
it), a start part that fails, the room going away.

Real: ``AgentSession``, every machine's runtime, the scripted avatar plugin, livekit's own
fake ``JobContext``. Faked, because they need a server: the room (``InMemoryRoom``, a real
``rtc.Room`` with no connection), the session transport's byte stream (paired in memory),
the job context's ``connect()`` (a network call; it fails once as a flaky network would)
and the model provider behind ``AgentSession.start()`` (subclasses whose start fails,
never answers, or swallows its cancellation: faults injected where livekit-agents would
meet them).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.job import JobContext
from livekit.agents.simulation import SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, StateChanged
from agent_runtime.system.agent_job import injected
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.tools.cli import main as cli

ROOM = "lw-room"  # the room the fixtures build (tests/conftest.py)
SIM = {ATTRIBUTE_SIMULATOR: "1"}
DISPATCH = SimulationDispatch(simulation_run_id="run-lw", job_id="simjob-lw")


def agent() -> Agent:
    return Agent(instructions="agent")


def other_tasks() -> list[str]:
    me = asyncio.current_task()
    return sorted(t.get_name() for t in asyncio.all_tasks() if t is not me and not t.done())


def heard(job: AgentJob) -> list[tuple[str, str]]:
    """The lifecycle's changes, as a user's ``state_changed`` listener hears them."""
    changes: list[tuple[str, str]] = []

    def listen(sc: StateChanged) -> None:
        if sc.machine == "agent_job":
            changes.append((sc.source, sc.dest))

    job.on("state_changed", listen)
    return changes


async def assert_every_start_is_refused(job: AgentJob) -> None:
    for call in (job.start(agent()), job.start_runtime(), job.start_session(agent())):
        with pytest.raises(RuntimeError, match="this job is closed; build a new AgentJob"):
            await call


class CountingSession(AgentSession):  # type: ignore[type-arg]
    """A session whose start() raises each time it is called (a fault injected where
    livekit-agents would fail), counting the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.starts = 0

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        self.starts += 1
        raise ConnectionError("the model provider refused the session")


class HangingSession(AgentSession):  # type: ignore[type-arg]
    """A session whose start() waits on a provider that never answers (until cancelled)."""

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.get_running_loop().create_future()


class StubbornSession(AgentSession):  # type: ignore[type-arg]
    """A session whose start() waits on its provider and does not stop when cancelled (a
    provider SDK that swallows ``CancelledError``, as some do): ``late`` seconds after the
    cut the provider answers and the session starts, or its connection drops."""

    def __init__(self, clock: VirtualClock, *, late: float, fails: bool) -> None:
        super().__init__()
        self.clock, self.late, self.fails = clock, late, fails
        self.cut = False

    async def start(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.get_running_loop().create_future()  # the provider never answers
        except asyncio.CancelledError:
            self.cut = True  # swallowed
        answer = self.clock.now() + self.late
        for _ in range(3 if self.late else 0):  # the cut's, its bound's (not the test's own)
            with contextlib.suppress(asyncio.CancelledError):
                await self.clock.sleep(max(0.0, answer - self.clock.now()))
                break
        if self.fails:
            raise ConnectionError("the provider's connection dropped")
        return await super().start(*args, **kwargs)


# -- while a close runs ----------------------------------------------------------------------


@pytest.mark.parametrize("when", ["never-started", "starting", "running"])
@pytest.mark.parametrize("graceful", [True, False], ids=["close", "abort"])
async def test_while_the_job_closes_it_says_so_and_refuses_every_start(
    room: InMemoryRoom, clock: VirtualClock, when: str, graceful: bool
) -> None:
    gate = asyncio.Event()
    session = HangingSession() if when == "starting" else AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, otel=False)
    job.add_shutdown_callback(gate.wait)  # the close waits in its callbacks step
    starting = asyncio.create_task(job.start(agent())) if when != "never-started" else None
    await settle()
    assert job.lifecycle == {"never-started": "new"}.get(when, when)
    closing = asyncio.create_task(job.aclose(graceful=graceful))
    await settle()
    assert job.lifecycle == "closing" and not closing.done()
    if when == "starting":
        assert starting is not None and starting.done()  # cut at once, not when closed
        with pytest.raises(RuntimeError, match="closed before it finished starting"):
            await starting
    await assert_every_start_is_refused(job)
    assert job.lifecycle == "closing"  # the refused starts changed nothing
    gate.set()
    await asyncio.wait_for(closing, 5)
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    await assert_every_start_is_refused(job)


def simulated_job(room: InMemoryRoom, clock: VirtualClock) -> AgentJob:
    """A job of a simulation whose simulator is in the room (a graceful close holds)."""
    room.add_participant("simulator", attributes=SIM)
    _sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    return AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        transport=agent_end,
        simulation=DISPATCH,
        otel=False,
    )


async def test_an_abort_ends_a_graceful_close_holding_for_the_simulator_at_once(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = simulated_job(room, clock)
    await job.start(agent())
    graceful = asyncio.create_task(job.aclose())
    await settle()
    assert job.states["job"] == "awaiting_finalize" and not graceful.done()
    aborting = asyncio.create_task(job.aclose(graceful=False))
    await settle()  # no clock moves: the hold (session_end_timeout) is not what ends it
    assert aborting.done() and graceful.done()
    assert job.lifecycle == "closed" and job.states["job"] == "closed"


async def test_an_abort_during_the_hold_still_runs_the_whole_close(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The abort ends the hold, not the close: the job closes the host, disconnects the
    room and runs the shutdown callbacks (with the reason of the close that held)."""
    job = simulated_job(room, clock)
    ran: list[tuple[float, str]] = []

    async def callback(reason: str) -> None:
        ran.append((clock.now(), reason))

    job.add_shutdown_callback(callback)
    await job.start(agent())
    graceful = asyncio.create_task(job.aclose())
    await settle()
    await clock.advance(8.0)
    assert job.states["job"] == "awaiting_finalize" and room.isconnected() and ran == []
    await job.aclose(graceful=False)
    await graceful
    assert ran == [(8.0, "job closed")]  # the close's reason: the graceful one asked it
    assert not room.isconnected()
    assert job.states["session_host"] == "closed" and job.closed_at == 8.0


@pytest.mark.parametrize("graceful", [True, False], ids=["close", "abort"])
async def test_a_second_close_while_closing_neither_extends_nor_restarts_the_close(
    room: InMemoryRoom, clock: VirtualClock, graceful: bool
) -> None:
    """A shutdown callback hangs; a second ``aclose()`` (or an abort) arrives mid-close. The
    close still ends at its own bound from when it began (close_timeout, 10 s), not 10 s
    after the second call; the callbacks are not started again, and a ``state_changed``
    listener hears the lifecycle go from ``closing`` to ``closed`` once, nothing between
    (the close is not begun again over the one running)."""
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    calls: list[float] = []

    async def hangs() -> None:
        calls.append(clock.now())
        await asyncio.get_running_loop().create_future()

    job.add_shutdown_callback(hangs)
    await job.start(agent())
    closing = asyncio.create_task(job.aclose())
    await settle()
    assert job.states["job"] == "closing" and calls == [0.0]
    assert job.lifecycle == "closing"
    changes = heard(job)
    await clock.advance(5.0)
    second = asyncio.create_task(job.aclose(graceful=graceful))
    await settle()
    assert job.states["job"] == "closing" and not second.done()
    assert changes == []
    await clock.advance(5.0)
    await settle()
    assert closing.done() and second.done()
    assert job.states["job"] == "closed" and job.closed_at == 10.0 and calls == [0.0]
    assert changes == [("closing", "closed")]


# -- after a start failed --------------------------------------------------------------------


async def test_a_failed_start_closes_the_job_and_a_second_start_is_refused(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    listeners = room.listener_count()
    session = CountingSession()
    job = AgentJob(room=room, session=session, clock=clock, otel=False)
    with pytest.raises(ConnectionError, match="refused the session"):
        await job.start(agent())
    # at once: the job is on its way out, not ready for another try
    assert job.lifecycle in ("closing", "closed")
    with pytest.raises(RuntimeError, match="this job is closed; build a new AgentJob"):
        await job.start(agent())
    assert session.starts == 1  # the session was not tried again
    await asyncio.wait_for(job.wait_closed(), 5)  # closed without anyone asking
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    await settle()
    assert room.listener_count() == listeners and other_tasks() == []


async def test_a_connect_that_fails_leaves_the_job_new_and_it_can_start_after(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    async def flaky_connect(*args: Any, **kwargs: Any) -> None:
        calls.append("connect")
        if len(calls) == 1:
            raise ConnectionError("the server did not answer")

    monkeypatch.setattr(ctx, "connect", flaky_connect)
    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), otel=False)
    changes = heard(job)
    with pytest.raises(ConnectionError, match="did not answer"):
        await job.start_runtime()
    assert job.lifecycle == "new" and changes == []  # nothing of the agent started
    await job.start(agent())  # the user tries again: the whole start runs
    assert len(calls) > 1  # connected this time (livekit's connect() is idempotent)
    assert job.lifecycle == "running" and job.session._started
    assert changes == [("new", "starting"), ("starting", "running")]
    await asyncio.wait_for(job.aclose(), 5)
    assert job.lifecycle == "closed"


# -- after the job closed on its own ---------------------------------------------------------


@pytest.mark.parametrize("how", ["shutdown", "room-deleted"])
async def test_a_job_that_closes_before_its_agent_starts_is_closed_for_good(
    room: InMemoryRoom, clock: VirtualClock, how: str
) -> None:
    listeners = room.listener_count()
    ran: list[str] = []
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    job.add_shutdown_callback(lambda: ran.append("callback"))
    changes = heard(job)
    if how == "shutdown":
        job.shutdown("nothing to do")  # e.g. an entrypoint that decides not to serve
    else:
        await job.start_runtime()  # following the room; the agent not started yet
        room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    await asyncio.wait_for(job.wait_closed(), 5)  # returns: nobody has to call aclose()
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert ran == ["callback"]
    assert changes == [("new", "closing"), ("closing", "closed")]
    await assert_every_start_is_refused(job)
    assert not job.session._started
    await settle()
    assert room.listener_count() == listeners and other_tasks() == []


@pytest.mark.parametrize("how", ["shutdown", "room-deleted"])
async def test_a_job_that_closes_on_its_own_while_starting_ends_the_start(
    room: InMemoryRoom, clock: VirtualClock, how: str
) -> None:
    listeners = room.listener_count()
    job = AgentJob(room=room, session=HangingSession(), clock=clock, otel=False)
    changes = heard(job)
    starting = asyncio.create_task(job.start(agent()))
    await settle()
    assert job.lifecycle == "starting"
    if how == "shutdown":
        job.shutdown("the caller hung up")
    else:
        room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    with pytest.raises(RuntimeError, match="closed before it finished starting"):
        await asyncio.wait_for(starting, 5)
    await asyncio.wait_for(job.wait_closed(), 5)  # nobody has to call aclose()
    assert job.lifecycle == "closed" and job.states["job"] == "closed"
    assert changes == [("new", "starting"), ("starting", "closing"), ("closing", "closed")]
    await assert_every_start_is_refused(job)
    await settle()
    assert room.listener_count() == listeners and other_tasks() == []


# -- once closed -----------------------------------------------------------------------------


@pytest.mark.parametrize("first", [True, False], ids=["closed", "aborted"])
async def test_closing_a_closed_job_again_returns_quietly(
    room: InMemoryRoom, clock: VirtualClock, first: bool
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    await job.start(agent())
    await asyncio.wait_for(job.aclose(graceful=first), 5)
    changes = heard(job)
    for graceful in (True, False, True):
        await asyncio.wait_for(job.aclose(graceful=graceful), 5)  # no error
    await asyncio.wait_for(job.wait_closed(), 5)
    assert job.lifecycle == "closed" and changes == []


def session_listeners(session: AgentSession) -> dict[str, int]:  # type: ignore[type-arg]
    # livekit's EventEmitter keeps its handlers there; no public count exists
    return {name: len(fns) for name, fns in session._events.items() if fns}


@pytest.mark.parametrize("graceful", [True, False], ids=["close", "abort"])
async def test_a_closed_job_lets_go_of_the_users_session_and_every_machine(
    room: InMemoryRoom, clock: VirtualClock, graceful: bool
) -> None:
    listeners = room.listener_count()
    session = AgentSession()
    before = session_listeners(session)
    job = AgentJob(
        room=room,
        session=session,
        avatar=ScriptedAvatar(clock=clock),
        playout=True,
        clock=clock,
        otel=False,
    )
    await job.start(agent())
    room.add_participant("user")
    await settle()
    await asyncio.wait_for(job.aclose(graceful=graceful), 5)
    await settle()
    assert job.lifecycle == "closed"
    # none takes events any more, but the lifecycle, which still answers the user's calls
    assert [a.spec.name for a in job.actors if not a.closed] == ["agent_job"]
    assert session_listeners(session) == before  # the playout follows it no more
    assert room.listener_count() == listeners and other_tasks() == []


# -- what a listener hears -------------------------------------------------------------------


@pytest.mark.parametrize("avatar_first", [True, False], ids=["avatar-first", "session-first"])
async def test_a_start_in_parts_and_a_close_are_heard_once_each(
    room: InMemoryRoom, clock: VirtualClock, avatar_first: bool
) -> None:
    plugin = ScriptedAvatar(clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    changes = heard(job)
    # start_runtime() between the parts is idempotent: it moves nothing
    if avatar_first:
        await job.start_avatar()
        await job.start_runtime()
        assert job.lifecycle == "starting"
        await job.start_session(agent())
    else:
        await job.start_session(agent())
        await job.start_avatar()
        # a part that fails once the job runs is its caller's: the job runs on
        with pytest.raises(RuntimeError, match="already started"):
            await job.start_avatar()
    await job.start_runtime()
    assert job.lifecycle == "running"
    await asyncio.wait_for(job.aclose(), 5)
    # a listener counting starts and closes (a dashboard, a metric) counts one of each
    assert changes == [
        ("new", "starting"),
        ("starting", "running"),
        ("running", "closing"),
        ("closing", "closed"),
    ]


# -- a start that outlives its cut -----------------------------------------------------------


async def start_then_close(
    job: AgentJob, clock: VirtualClock, *, limit: float = 20.0
) -> tuple[Any, float]:
    """Start ``job``, close it while its session starts, run the clock until both calls
    ended (at most ``limit`` seconds): (the start's outcome, when the close returned)."""
    starting = asyncio.create_task(job.start(agent()))
    await settle()
    assert job.lifecycle == "starting"
    closing = asyncio.create_task(job.aclose())
    closed_at: list[float] = []
    closing.add_done_callback(lambda _: closed_at.append(clock.now()))
    while not (closing.done() and starting.done()):
        assert clock.now() < limit, "still waiting"
        await settle()
        await clock.advance(1.0)
    await closing
    (outcome,) = await asyncio.gather(starting, return_exceptions=True)
    return outcome, closed_at[0]


@pytest.mark.parametrize("fails", [False, True], ids=["starts", "fails"])
async def test_a_session_start_that_ignores_the_cut_does_not_hold_the_close_back(
    room: InMemoryRoom, clock: VirtualClock, fails: bool
) -> None:
    listeners = room.listener_count()
    session = StubbornSession(clock, late=0.0, fails=fails)  # it ends once cut
    job = AgentJob(room=room, session=session, clock=clock, otel=False)
    changes = heard(job)
    outcome, _ = await start_then_close(job, clock)
    assert session.cut and job.lifecycle == "closed" and job.states["job"] == "closed"
    # the caller gets no internal error: the start returns, or it says the job closed first
    if outcome is not None:
        assert isinstance(outcome, RuntimeError), repr(outcome)
        assert "closed before it finished starting" in str(outcome)
    assert changes == [("new", "starting"), ("starting", "closing"), ("closing", "closed")]
    await assert_every_start_is_refused(job)
    await settle()
    # a session that started late was closed with the rest: nothing of it runs on
    assert room.listener_count() == listeners and other_tasks() == []


async def test_a_start_that_swallows_the_cut_for_long_does_not_hold_the_close_back(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    session = StubbornSession(clock, late=30.0, fails=False)  # it ends 30 s after the cut
    job = AgentJob(room=room, session=session, clock=clock, otel=False)
    outcome, closed_at = await start_then_close(job, clock, limit=60.0)
    assert isinstance(outcome, RuntimeError) and job.lifecycle == "closed"
    assert "closed before it finished starting" in str(outcome)
    assert closed_at <= 10.0  # close_timeout bounds the close, whatever the start does


async def test_a_start_runs_in_the_callers_task_and_its_cancellation_stays_the_callers(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The start runs in the task that called ``start()`` (no task of its own); the close
    cuts it by cancelling that task once, and takes the cancellation back as the start
    ends: the caller gets the job's plain error, and a task that goes on afterwards (an
    entrypoint) is not left cancelled. Cancelled by somebody else as well, the caller
    gets its ``CancelledError``, never the job's error."""
    job = AgentJob(room=room, session=HangingSession(), clock=clock, otel=False)
    after: list[str] = []

    async def entrypoint() -> None:
        try:
            await job.start(agent())
        except RuntimeError as e:
            after.append(str(e))
        await asyncio.sleep(0)  # the caller's task goes on: not cancelled any more
        after.append("went on")

    caller = asyncio.create_task(entrypoint())
    await settle()
    assert job.lifecycle == "starting" and other_starts() == []
    closing = asyncio.create_task(job.aclose())
    await settle()
    await caller
    assert after == ["the job was closed before it finished starting", "went on"]
    assert caller.cancelling() == 0
    await closing

    second = AgentJob(
        room=InMemoryRoom(name="lw-2", clock=clock),
        session=HangingSession(),
        clock=clock,
        otel=False,
    )
    starting = asyncio.create_task(second.start(agent()))
    await settle()
    starting.cancel()  # the caller's own cancellation, with the close's cut at once
    closing = asyncio.create_task(second.aclose())
    with pytest.raises(asyncio.CancelledError):
        await starting
    await closing
    assert second.lifecycle == "closed"


async def test_a_start_its_caller_gave_up_on_fails_and_closes_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """A timeout around ``start()`` (the caller's cancellation, not the close's cut) fails
    the start: the job closes with what did start, a second ``start()`` says the job is
    closed, and the caller still gets its own cancellation. It used to leave the lifecycle
    ``starting`` for good: the start refused as "already starting", the room's end never
    heard, nothing logged."""
    avatar = ScriptedAvatar(avatar_identity="avatar-1", clock=clock)
    job = AgentJob(room=room, session=HangingSession(), clock=clock, avatar=avatar, otel=False)
    changes = heard(job)
    starting = asyncio.create_task(clock.wait_for(job.start(agent()), 5))
    await clock.advance(6)
    with pytest.raises(TimeoutError):
        await starting
    await settle()
    assert job.lifecycle == "closed"
    assert changes == [("new", "starting"), ("starting", "closing"), ("closing", "closed")]
    # every machine at its end (room deletion, not asked for, stays allowed until aclose)
    assert {m: s for m, s in job.states.items() if s != "closed"} == {"room_deletion": "allowed"}
    await assert_every_start_is_refused(job)
    await asyncio.wait_for(job.aclose(), 5)  # nothing left to close: returns at once


async def test_a_second_avatar_start_is_refused_and_changes_nothing(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """``start_avatar()`` again, after it or at the same time, is refused as "already
    started"; the job goes on and its session still starts. The refusal used to fail the
    start: the whole job closed, and the concurrent one cut the good start. At the same
    time, whichever call reaches the job first starts it and the other is refused (which
    one depends on where each call first yields, so the test asks only that one is)."""
    room.add_participant("user-1")
    for concurrent in (False, True):
        avatar = ScriptedAvatar(avatar_identity="avatar-1", start_delay=1.0, clock=clock)
        job = AgentJob(room=room, session=AgentSession(), clock=clock, avatar=avatar, otel=False)
        first = asyncio.create_task(job.start_avatar())
        if concurrent:
            second = asyncio.create_task(job.start_avatar())
            await clock.advance(2)
            outcomes = await asyncio.gather(first, second, return_exceptions=True)
            assert outcomes.count(None) == 1, outcomes
            (refused,) = [o for o in outcomes if o is not None]
            assert isinstance(refused, RuntimeError) and "already started" in str(refused)
        else:
            await clock.advance(2)
            await first
            with pytest.raises(RuntimeError, match="already started"):
                await job.start_avatar()
        assert avatar.start_calls == 1
        assert job.lifecycle == "starting" and job.states["job"] != "closing"
        await job.start_session(agent())
        room.add_participant("avatar-1", kind="agent")
        room.publish_track("avatar-1", "video")
        await clock.advance(1)
        assert job.lifecycle == "running" and job.states["avatar"] == "joined"
        assert job.audio_route() == "avatar"
        await asyncio.wait_for(job.aclose(), 5)
        room.remove_participant("avatar-1")


def other_starts() -> list[str]:
    """Tasks running a part of the job's start (none: each part runs in its caller's)."""
    coros = (t.get_coro() for t in asyncio.all_tasks())
    names = [getattr(c, "__qualname__", "") for c in coros]
    return [n for n in names if n.startswith("JobSystem.start")]


async def test_concurrent_session_starts_run_one_session_and_say_so_plainly(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    changes = heard(job)
    results = await asyncio.wait_for(
        asyncio.gather(
            job.start_session(Agent(instructions="one")),
            job.start_session(Agent(instructions="two")),
            return_exceptions=True,
        ),
        5,
    )
    assert None in results
    for r in results:  # a refused one says why in the user's terms
        assert r is None or (isinstance(r, RuntimeError) and "already started" in str(r)), r
    assert job.lifecycle == "running" and job.session._started
    assert changes == [("new", "starting"), ("starting", "running")]
    await asyncio.wait_for(job.aclose(), 5)
    assert changes[-2:] == [("running", "closing"), ("closing", "closed")]


async def test_a_trace_of_a_start_in_parts_with_start_runtime_between_reproduces(
    room: InMemoryRoom, clock: VirtualClock, tmp_path: Path
) -> None:
    """start_runtime() is no part of the agent: a trace where it was called between the
    parts is one ``agent-runtime record --check`` rebuilds and reproduces (a scenario has
    no step for it)."""
    trace = tmp_path / "job.jsonl"
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=ScriptedAvatar(clock=clock),
        clock=clock,
        trace_path=trace,
        otel=False,
    )
    await job.start_avatar()
    await job.start_runtime()  # while starting
    await job.start_session(agent())
    await job.start_runtime()  # while running
    await clock.advance(1)
    job.shutdown("done")
    await asyncio.wait_for(job.wait_closed(), 5)
    # --check runs the scenario on a loop of its own: from a thread here
    args = ["record", str(trace), "-o", str(tmp_path / "incident.yaml"), "--check"]
    assert await asyncio.to_thread(cli, args) == 0
