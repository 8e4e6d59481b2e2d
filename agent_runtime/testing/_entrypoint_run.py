"""One run of an entrypoint under the kit, as livekit's job runner and worker run it: the
job context it is given (its ``connect`` as livekit's), the watch that sees the job it
builds and when its start is over, what the run holds until its end, and the worker's
time passing at that end."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from livekit import rtc
from livekit.agents.simulation import SimulationDispatch
from livekit.agents.testing import fake_job_context
from livekit.agents.types import ATTRIBUTE_SIMULATOR_DISPATCH

from agent_runtime.clock import Clock
from agent_runtime.observe.trace import TraceRecord
from agent_runtime.runtimes.finalize import SimulationEndFn
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.system.agent_job import AgentJob, injected
from agent_runtime.testing.clock import VirtualClock, VirtualTimeLoop, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.job_process import JobProcess, callback_name
from agent_runtime.testing.server_api import KitServer
from agent_runtime.testing.user_code import PrewarmFailed, said

if TYPE_CHECKING:
    from livekit.agents.job import JobContext

# how long (the loop's seconds) teardown waits for a session still open to close, and for
# the job's end once it cancelled it
CLOSE_LIMIT = 10.0
# how many of the virtual clock's timers the test's end runs at the most, waiting for a job
_TIMERS_AT_TEARDOWN = 10_000
# the lifecycle states of an AgentJob whose start is over (started, or cut by its close)
_START_OVER = ("running", "closing", "closed")


def first_connect(ctx: JobContext, room: rtc.Room) -> Callable[..., Awaitable[None]]:
    """``ctx.connect`` whose first call does what livekit's does: the participant
    entrypoints run for each participant already in the room, then for each who joins. A
    fake job context is connected from the start (its own ``connect()`` does nothing) and
    hears joins at once: its listener is held until that first call, as a real room
    brings no event before it connects, so none runs twice or too early."""
    connect = ctx.connect
    # the listener the context put on the room for participants who join
    joined = [
        cb
        for event, cb in lk.emitter_listeners(room)
        if event == "participant_connected" and getattr(cb, "__self__", None) is ctx
    ]
    for cb in joined:
        room.off("participant_connected", cb)

    async def connect_once(**options: Any) -> None:
        await connect(**options)
        if joined:
            held = list(joined)
            joined.clear()
            for p in list(room.remote_participants.values()):
                for available in held:
                    available(p)
            for cb in held:
                room.on("participant_connected", cb)

    return connect_once


def still_starting(job: AgentJob) -> str:
    """What of a job's start has not returned, for the stall's message."""
    if job.states.get("avatar") == "starting":
        return (
            "; its avatar plugin's start() has not returned: a real plugin calls its "
            "provider (with retries of its own), avatar=scripted_avatar stands in for it; "
            "to test a start that hangs, run run_entrypoint as a task with a start_timeout "
            "past join_timeout and move the clock past join_timeout"
        )
    if job.states.get("session") == "new":
        return "; its session has not started"
    return ""


class StartWatch:
    """A trace sink that sees the jobs an entrypoint builds: the first one (taken while it
    is registered for the job context, so also once it closed) and when its start is over
    (the ``agent_job`` machine reaching ``running``, or ``closing``: the start was cut)."""

    def __init__(self) -> None:
        self.ctx: JobContext | None = None
        self.job: AgentJob | None = None
        self.started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def write(self, record: TraceRecord) -> None:
        if self.job is None and self.ctx is not None:
            self.job = AgentJob.for_job(self.ctx)
        if (
            record.kind == "transition"
            and record.machine == "agent_job"
            and record.dest in _START_OVER
            and not self.started.done()
        ):
            self.started.set_result(None)


class Run:
    """One run of an entrypoint: its job context, the context its tasks run in, and its end
    as livekit's job process runs it."""

    def __init__(
        self,
        ctx: JobContext,
        context: contextvars.Context,
        process: JobProcess,
        watch: StartWatch,
        http_bound: bool,
        kill_after: float,
    ) -> None:
        self.ctx = ctx
        self.kill_after = kill_after  # the server's shutdown_process_timeout
        self.context = context
        self.http_bound = http_bound  # the job's HTTP session is the kit's to close
        self._http_closing: asyncio.Task[None] | None = None
        self.process = process
        self.watch = watch  # sees the job the entrypoint builds, also after a stalled start
        self.job: AgentJob | None = None

    def close_http(self) -> asyncio.Task[None] | None:
        """Close the job's HTTP session, once: as livekit's runner does after the job's
        end (its shutdown callbacks), or at the test's end."""
        if self.http_bound and self._http_closing is None:
            self._http_closing = asyncio.get_running_loop().create_task(
                lk.close_job_http(self.context), name="job_http_close"
            )
        return self._http_closing

    async def end(self, clock: Clock) -> None:
        """End the run as a worker's shutdown ends it (``test ended``; no hold: the job is
        aborted), through livekit's order, ``clock`` running meanwhile (its timers, up to
        the server's ``shutdown_process_timeout``); then release the job context."""
        self.process.shutdown("test ended")
        job = self.job or AgentJob.for_job(self.ctx)
        closing = None if job is None else asyncio.ensure_future(job.aclose(graceful=False))
        # a worker's time goes on while it waits for the job: the job's own bounds (a
        # session whose close waits for an avatar that never joined) are met
        self.process.cut_entrypoint()  # its bound is the test's end: it is over
        await pass_time(clock, [f for f in (closing, self.process.ended) if f], self.kill_after)
        await session_end_over(clock, self.process, self.kill_after)
        with contextlib.suppress(TimeoutError):
            # then gives the process shutdown_process_timeout to end, and kills it
            await asyncio.wait_for(asyncio.shield(self.process.ended), self.kill_after)
        await self.process.kill(CLOSE_LIMIT, bound=self.kill_after)
        if closing is not None:
            await asyncio.wait([closing], timeout=CLOSE_LIMIT)
            closing.cancel()
            await asyncio.gather(closing, return_exceptions=True)
        if job is not None:
            session = job.session
            if lk.session_live(session):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(session.aclose(), CLOSE_LIMIT)
        closing = self.close_http()
        if closing is not None:
            await asyncio.gather(closing, return_exceptions=True)
        lk.release_job_context(self.ctx)  # upstream's job cleanup would; a fake job does not


async def wait_shielded(fut: asyncio.Future[None]) -> None:
    await asyncio.shield(fut)


async def as_coroutine(aw: Awaitable[Any]) -> Any:
    return await aw


def job_context(
    room: InMemoryRoom,
    server: KitServer,
    job_id: str,
    parts: dict[str, Any],
    simulation: bool | SimulationDispatch,
    on_simulation_end: SimulationEndFn | None,
) -> tuple[JobContext, contextvars.Context]:
    """What livekit's job runner sets up for a job: its context (a fake job's, over the
    test's room, its server calls answered by ``server``) and the context its tasks run in,
    that job context current there and ``parts`` injected."""
    agent = room.local_participant.identity
    with (
        fake_job_context(room=room, job_id=job_id, agent_identity=agent) as ctx,
        injected(**parts),
    ):
        lk.give_job_token(ctx, agent, room.name)
        # livekit's own deletion (EndCallTool's delete_room=True) on the room too: a
        # fake job's logs "not executed while in console mode" and does nothing
        ctx.delete_room = server.ctx_delete_room  # type: ignore[method-assign]
        # and the server client livekit's AvatarSession.aclose() removes its avatar with
        ctx.api = server.api()  # type: ignore[assignment]
        ctx.connect = first_connect(ctx, room)  # type: ignore[method-assign,assignment]
        if simulation is not False:
            dispatch = (
                simulation
                if isinstance(simulation, SimulationDispatch)
                else SimulationDispatch(simulation_run_id=f"run-{job_id}", job_id=job_id)
            )
            ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(dispatch)
        lk.set_job_simulation_end_fn(ctx, on_simulation_end)
        context = contextvars.copy_context()
    return ctx, context


def prewarm(server: Any, ctx: JobContext) -> None:
    """The server's ``setup_fnc`` (livekit's docs call it ``prewarm``) on the job's process,
    as livekit's job process runs it before its one job: outside any job context and any
    event loop, filling ``ctx.proc.userdata`` for the entrypoint, within the server's
    ``initialize_process_timeout`` (real seconds, as the worker counts them). What it
    raises (``SystemExit`` too: the process exits), or its not returning by then, is a
    ``PrewarmFailed`` naming it, caused by its exception; the job's context is released
    then (the entrypoint never runs)."""
    setup = getattr(server, "setup_fnc", None)
    if setup is None:
        return
    failed: list[BaseException] = []

    def run() -> None:
        try:
            setup(ctx.proc)
        except BaseException as e:  # livekit's process fails its initialization on any
            failed.append(e)

    # on a thread of its own, the loop blocked as a process's start blocks: livekit runs it
    # before the job's loop exists, so a prewarm running a loop of its own (asyncio.run)
    # works, and one reaching for the job's loop fails, as deployed. One that hangs is left
    # to itself (a thread cannot be killed as the worker kills the process); a daemon, it
    # never holds the interpreter's exit
    name = callback_name(setup)
    thread = threading.Thread(target=run, name=f"prewarm {name}", daemon=True)
    bound = lk.server_initialize_process_timeout(server)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        lk.release_job_context(ctx)
        raise PrewarmFailed(
            f"the agent's setup_fnc {name} had not returned after {bound:g}s (the server's "
            "initialize_process_timeout): livekit's worker gives up on the process then"
        )
    if failed:
        lk.release_job_context(ctx)
        error = failed[0]
        raise PrewarmFailed(f"the agent's setup_fnc {name} {said(error)}") from error


async def session_end_over(clock: Clock, process: JobProcess, kill_after: float) -> None:
    """As a worker's shutdown: it waits for the job process to say it is shutting down,
    which it does once ``on_session_end`` is over (the process bounds it by the
    server's ``session_end_timeout``), and only then counts ``shutdown_process_timeout``
    (on a loop of real time, at most that long: a test is not kept minutes). One still
    running then is cut at its bound, as the process cuts it."""
    done = process.session_end_done
    virtual = isinstance(asyncio.get_running_loop(), VirtualTimeLoop)
    wait = process.session_end_timeout if virtual else kill_after
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(done), wait)
    if virtual and not done.done():
        await pass_time(clock, [done], process.session_end_timeout)


async def pass_time(clock: Clock, waiting: list[asyncio.Future[None]], limit: float) -> None:
    """Run the virtual clock timer by timer, for at most ``limit`` of its seconds, until
    everything in ``waiting`` is done (a clock of another kind is left as it is)."""
    await settle()
    if not isinstance(clock, VirtualClock):
        return
    end = clock.now() + limit
    for _ in range(_TIMERS_AT_TEARDOWN):  # a timer that re-arms itself at once ends it
        if all(f.done() for f in waiting):
            return
        deadline = clock.next_deadline()
        if deadline is None or deadline > end:
            return
        await clock.run_until(deadline)
