"""Running an agent's own ``rtc_session`` entrypoint in a test, as livekit's job runner would.

The entrypoint gets a real ``JobContext`` (livekit's ``fake_job_context``: a job with no
worker) over the test's in-memory room, and runs in a task whose context has that job
context current and the test's parts injected (``agent_runtime.injected``): every
``AgentJob`` it builds takes the test's virtual clock, the agent's end of an in-memory
session transport (the simulator is on the other end), an avatar plugin stand-in if one is
given, room deletion and avatar removal done on the room as the server would (a deleted
room disconnects, with ``ROOM_DELETED``) instead of sent to one, and a memory trace the test
can read. livekit's per-job HTTP session is bound there too
(what plugins' ``http_session()`` returns; one the test bound itself is left in place), and
closed after the job. Nothing in the entrypoint changes.

As livekit's job runner, the run goes on once the entrypoint has started its job: an
entrypoint that keeps running after ``await job.start(...)`` (waiting for the room to go,
say) runs on as a task, awaited at the job's end within livekit's bound and then cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import re
import sys
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from google.protobuf import json_format
from livekit import rtc
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.testing import fake_job_context
from livekit.agents.types import ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.remote_session import SessionTransport

from agent_runtime.clock import Clock, check_seconds
from agent_runtime.observe.trace import MemorySink, Tracer, TraceRecord
from agent_runtime.parts import check_part
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.system.agent_job import AgentJob, injected
from agent_runtime.testing.clock import VirtualClock, VirtualTimeLoop, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.job_process import JobProcess
from agent_runtime.testing.room_audio import pace_room_audio
from agent_runtime.testing.server_api import KitRoomService, KitServerApi
from agent_runtime.testing.user_code import (
    JOB_SIDE,
    TasksLeftRunning,
    UserFailure,
    UserFailures,
    is_agents_task,
    stop_task,
    task_name,
)

if TYPE_CHECKING:
    from livekit.agents import AgentServer
    from livekit.agents.job import JobContext

logger = logging.getLogger("agent_runtime.testing.entrypoint")
P = ParamSpec("P")
T = TypeVar("T")

Entrypoint = Callable[["JobContext"], Awaitable[None]]
SessionEndFn = Callable[["JobContext"], Awaitable[None]]
SimulationEndFn = Callable[[SimulationContext], Any]

# how long (the loop's seconds) teardown waits for a session still open to close, and for
# the job's end once it cancelled it
_CLOSE_LIMIT = 10.0
# how many of the virtual clock's timers the test's end runs at the most, waiting for a job
_TIMERS_AT_TEARDOWN = 10_000
# the lifecycle states of an AgentJob whose start is over (started, or cut by its close)
_START_OVER = ("running", "closing", "closed")


class NoAgentJob(RuntimeError):
    """The entrypoint ended without building an ``AgentJob`` for its job context."""


class EntrypointStalled(TimeoutError):
    """The entrypoint neither started its job nor ended within the wait."""


def _first_connect(ctx: JobContext, room: rtc.Room) -> Callable[..., Awaitable[None]]:
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


def _still_starting(job: AgentJob) -> str:
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


class _StartWatch:
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


class _Run:
    """One run of an entrypoint: its job context, the context its tasks run in, and its end
    as livekit's job process runs it."""

    def __init__(
        self,
        ctx: JobContext,
        context: contextvars.Context,
        process: JobProcess,
        watch: _StartWatch,
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


class _CountingFactory:
    """A loop task factory that notes, in ``made``, the tasks made in the context whose
    ``JOB_SIDE`` is ``side`` (a runner's job's), over the factory it found (or plain
    ``asyncio.Task``)."""

    def __init__(
        self, side: object, made: weakref.WeakSet[asyncio.Task[Any]], previous: Any
    ) -> None:
        self.side = side
        self.made = made
        self.previous = previous
        self.active = True

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Future[Any]:
        previous = self.previous
        task = (
            previous(loop, coro, **kwargs) if previous else asyncio.Task(coro, loop=loop, **kwargs)
        )
        if self.active and isinstance(task, asyncio.Task):
            context = kwargs.get("context")
            side = context.get(JOB_SIDE) if context is not None else JOB_SIDE.get()
            if side is self.side:
                self.made.add(task)
        return task

    def handing_on(self) -> Any:
        """The factory to put back: the first below this one that is not a runner's
        that was taken off already."""
        previous = self.previous
        while isinstance(previous, _CountingFactory) and not previous.active:
            previous = previous.previous
        return previous


class EntrypointRunner:
    """Runs ``rtc_session`` entrypoints on one in-memory room, clock and session transport.

    ``await runner(server)`` (an ``AgentServer`` with an ``rtc_session`` entrypoint) or
    ``await runner(entrypoint)`` (with the hooks of the server of its module that registered
    it, if one did) runs the entrypoint until it started its job (or ended) and
    returns the ``AgentJob`` it built, the room connected first if it was not (as a job's
    is once its entrypoint connects; ``connect=False``: left as it is). ``aclose()`` stops
    what is still running and releases the job contexts.
    """

    def __init__(
        self,
        *,
        room: InMemoryRoom,
        clock: Clock | None = None,
        transport: SessionTransport | None = None,
        connect: bool = True,
    ) -> None:
        if not isinstance(room, InMemoryRoom):
            raise TypeError(f"room must be an InMemoryRoom, not {type(room).__name__}")
        check_part("clock", clock)
        check_part("transport", transport)
        self.room = room
        # each run connects the room first, as a job's entrypoint does (False: the caller
        # connects it, when it says: the fuzzer's room_connected)
        self._connect = connect
        self.clock: Clock = clock or room.clock
        self.transport = transport
        self.sink = MemorySink()
        self.failures = UserFailures()
        self._runs: list[_Run] = []
        # the tasks there before the first run, and those made since in the job's context
        # (JOB_SIDE is this runner there), noted by a task factory on the loop: one of them
        # still running after the job's end is one the run left (tasks_left); the test's
        # own are its business
        self._tasks_before: set[asyncio.Task[Any]] | None = None
        self._job_tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        # tasks that refused their cancellation at the end, stopped as the worker's kill
        # stops them (still named as left running)
        self._stopped: list[asyncio.Task[Any]] = []
        self._factory: tuple[asyncio.AbstractEventLoop, _CountingFactory] | None = None
        room.local_participant.on_publish.append(self._on_publish)

    # -- running -------------------------------------------------------------------------
    async def __call__(
        self,
        entrypoint: AgentServer | Entrypoint,
        *,
        simulation: bool | SimulationDispatch = False,
        on_simulation_end: SimulationEndFn | None = None,
        on_session_end: SessionEndFn | None = None,
        avatar: AvatarSession | None = None,  # type: ignore[type-arg]
        job_id: str = "test-job",
        start_timeout: float = 5.0,
    ) -> AgentJob:
        """Run ``entrypoint`` until it started its job, or ended, and return the ``AgentJob``
        it built. What the entrypoint does after ``await job.start(...)`` runs on as a task
        (awaited at the job's end, 15 s on the job's clock, then cancelled, as livekit does).

        ``entrypoint``: an ``AgentServer`` (its ``rtc_session`` entrypoint and the
        ``on_session_end``/``on_simulation_end`` given there) or the entrypoint function;
        a function that an ``AgentServer`` of its module registered runs with that
        server's hooks and bounds, as a worker runs it (``served``, as ``fuzz()`` finds
        it), one no server registered (or that two did) with none.
        ``simulation``: run the job as a simulation dispatch (``True`` or a
        ``SimulationDispatch``). ``on_simulation_end``/``on_session_end`` override the
        server's. ``avatar``: an ``AvatarSession`` (the ``scripted_avatar``) that stands in
        for the avatar plugin the entrypoint gives its job, if it gives one.
        ``start_timeout`` (the loop's seconds: real ones, or virtual on a ``VirtualTimeLoop``):
        ``EntrypointStalled`` if the entrypoint has neither started its job nor ended by then.
        ``NoAgentJob`` if it ended without building one; its own failure is raised as is.
        """
        # the function a server of its module registered: that server's hooks and bounds
        entrypoint = served(entrypoint)
        fn, server_session_end, server_simulation_end = _entrypoint_of(entrypoint)
        start_timeout = check_seconds("start_timeout", start_timeout)
        if self._tasks_before is None:
            self._tasks_before = set(asyncio.all_tasks())
            self._count_job_tasks()
        by_server = fn is not entrypoint  # an AgentServer, with its own bounds
        end_timeout = lk.server_session_end_timeout(entrypoint) if by_server else 300.0
        kill_after = lk.server_shutdown_process_timeout(entrypoint) if by_server else 10.0
        if avatar is not None and not isinstance(avatar, AvatarSession):
            raise TypeError(f"avatar must be an AvatarSession, not {type(avatar).__name__}")
        watch = _StartWatch()
        parts: dict[str, Any] = {
            "clock": self.clock,
            "tracer": Tracer(self.sink, watch),
            "delete_room": self._delete_room,
            "remove_avatar_participant": self._remove_avatar,
        }
        if self.transport is not None:
            parts["transport"] = self.transport
        if avatar is not None:
            parts["avatar"] = avatar
        # the fake job context is connected from the start (its connect() does nothing), as
        # the room of a job livekit runs is once the entrypoint connects: a room left
        # unconnected here never disconnected, and the job's end never came
        if self._connect and not self.room.isconnected():
            self.room.connect_locally()
        # what livekit's job runner sets up: the job context current while the entrypoint
        # and the session-end hook run, in tasks that carry it (and the injected parts)
        agent = self.room.local_participant.identity
        with (
            fake_job_context(room=self.room, job_id=job_id, agent_identity=agent) as ctx,
            injected(**parts),
        ):
            lk.give_job_token(ctx, agent, self.room.name)
            # livekit's own deletion (EndCallTool's delete_room=True) on the room too: a
            # fake job's logs "not executed while in console mode" and does nothing
            ctx.delete_room = self._ctx_delete_room  # type: ignore[method-assign]
            # and the server client livekit's AvatarSession.aclose() removes its avatar with
            ctx.api = KitServerApi(  # type: ignore[assignment]
                KitRoomService(self.room.name, self._remove_avatar, self._ctx_delete_room)
            )
            ctx.connect = _first_connect(ctx, self.room)  # type: ignore[method-assign,assignment]
            if simulation is not False:
                dispatch = (
                    simulation
                    if isinstance(simulation, SimulationDispatch)
                    else SimulationDispatch(simulation_run_id=f"run-{job_id}", job_id=job_id)
                )
                ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(
                    dispatch
                )
            lk.set_job_simulation_end_fn(ctx, on_simulation_end or server_simulation_end)
            watch.ctx = ctx
            context = contextvars.copy_context()
        context.run(JOB_SIDE.set, self)  # what runs in it, and all it starts, is the job's
        self.room.deliver_in(context)  # as a real room's events come from its own task
        http_bound = lk.bind_job_http(context)
        if not self._runs:
            self.failures.caller = asyncio.current_task()
            self.failures.is_jobs = self._job_tasks.__contains__
            self.failures.install()
        process = JobProcess(
            ctx,
            clock=self.clock,
            on_session_end=on_session_end or server_session_end,
            session_end_timeout=end_timeout,
            failures=self.failures,
            context=context,
        )
        run = _Run(ctx, context, process, watch, http_bound, kill_after)
        self._runs.append(run)
        process.ended.add_done_callback(lambda _: run.close_http())
        aw = fn(ctx)  # the entrypoint's own coroutine is the task's: named by it when left
        entry = asyncio.get_running_loop().create_task(
            aw if asyncio.iscoroutine(aw) else _as_coroutine(aw),
            name="job_user_entrypoint",
            context=context,
        )
        process.watch_entrypoint(entry)
        # livekit's runner goes on once the job runs: the entrypoint may keep running
        await asyncio.wait(
            {entry, watch.started}, timeout=start_timeout, return_when="FIRST_COMPLETED"
        )
        # an entrypoint the job's end cut (livekit cancels it 15 s in) has no failure of its
        # own; one its own code cancelled is the test's, as any failure of its code
        cut = entry.done() and entry.cancelled() and process.begun
        if entry.done() and not cut:
            await entry  # its failure is the test's, with its traceback
        elif not entry.done():
            # what it fails with from here on is the test's too, as a failure of its code
            entry.add_done_callback(self._entry_done)
        await settle()  # the entrypoint runs on until it waits (its code after the start)
        job = watch.job or AgentJob.for_job(ctx)
        if job is None and not entry.done():
            raise EntrypointStalled(
                f"the entrypoint has neither built its AgentJob nor ended after "
                f"{start_timeout:g}s: it waits for something that has not happened"
            )
        if job is None and cut:
            raise NoAgentJob(
                "the entrypoint was cancelled before it built an AgentJob (livekit cancels "
                "it 15 s into the job's end)"
            )
        if job is None:
            raise NoAgentJob(
                "the entrypoint built no AgentJob: call AgentJob.from_job_context(ctx, "
                'session=...) in it and start the job there (the testing guide, "Your entrypoint '
                'under test")'
            )
        run.job = job
        if not watch.started.done() and not entry.done():
            raise EntrypointStalled(
                f"the entrypoint has not started its job after {start_timeout:g}s (the job "
                f"is {job.lifecycle}{_still_starting(job)}): it waits for something that "
                "has not happened"
            )
        return job

    def _entry_done(self, task: asyncio.Task[Any]) -> None:
        if task in self._stopped:  # the kill's end, not its own: named as left running
            return
        if not task.cancelled() and (error := task.exception()) is not None:
            self.failures.add("entrypoint", error)

    def session_end(self) -> asyncio.Task[None]:
        """End the last run's job now, as ``ctx.shutdown("session ended")`` would: livekit's
        end of a job begins (the session closes, then ``on_session_end(ctx)``, where the job
        holds for a simulator's verdict). Returns a task that ends once ``on_session_end``
        returned; await it (while virtual time moves on) for the hold's end."""
        run = self._last()
        process = run.process
        run.ctx.shutdown("session ended")  # the context's, as an agent's: the job hears it
        return asyncio.get_running_loop().create_task(
            _wait(process.session_end_done), name="on_session_end"
        )

    def in_job(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``fn(*args, **kwargs)`` as the agent's own code runs: in the last run's job
        context (``get_job_context()`` works there), and what it starts is the job's. For a
        turn the test drives (``run_entrypoint.in_job(job.session.generate_reply,
        user_input="bye")``) whose tools reach the job, as an end-call tool does; a
        coroutine runs there as a task: ``await run_entrypoint.in_job(asyncio.ensure_future,
        coro)``, and so does what an async ``fn`` returns (``await
        run_entrypoint.in_job(agent.end_call, None)``): its body would otherwise run where
        it is awaited, outside the job. Called from the test's own task, such a tool fails
        with livekit's "no job context found"."""
        context = self._last().context.copy()
        result = context.run(fn, *args, **kwargs)
        if asyncio.iscoroutine(result):
            return asyncio.get_running_loop().create_task(result, context=context)  # type: ignore[return-value]
        return result

    async def wait_ended(self, *, timeout: float = 5.0) -> None:
        """Wait (``timeout`` in the loop's seconds: real ones, or virtual on a test marked
        ``virtual_time``) until the last run's job has ended as livekit ends one: its
        ``on_session_end``, the room's disconnect and its shutdown callbacks are over. Then
        raise what failed in the agent's code, if anything did. The job must have been told
        to end (it left, closed, was shut down): this does not end it."""
        process = self._last().process
        try:
            await asyncio.wait_for(asyncio.shield(process.ended), timeout)
        except TimeoutError:
            why = process.waiting_on() if process.reason else "nothing ended it"
            raise TimeoutError(f"the job has not ended after {timeout:g}s ({why})") from None
        await settle()
        self.raise_failures()

    def raise_failures(self) -> None:
        """Raise the failures of the agent's code not yet reported: the first as a
        ``UserCodeError`` caused by the agent's own exception (its traceback), each other
        one named in the message and told in full in a note (they were taken all at once,
        and the later ones were lost)."""
        failures = self.failures.take()
        if not failures:
            return
        error = failures[0].as_error()
        if len(failures) > 1:
            error.args = (f"{error} (and {len(failures) - 1} more: see below)",)
            for other in failures[1:]:
                error.add_note(f"also: the agent's {other.describe()}")
        raise error

    @property
    def user_failures(self) -> list[UserFailure]:
        """What failed in the agent's code so far and was not yet raised."""
        return list(self.failures.failures)

    @property
    def process(self) -> JobProcess:
        """The last run's end, as livekit's job process runs it."""
        return self._last().process

    @property
    def shutdown_steps(self) -> list[tuple[float, str]]:
        """The steps of the last run's end as they began, ``(time, step)``: ``entrypoint``,
        ``session``, ``on_session_end``, ``report``, ``disconnect``, ``callbacks``."""
        return list(self._last().process.steps)

    async def wait_for(self, machine: str, state: str, *, timeout: float = 5.0) -> None:
        """Wait until ``machine`` of the last run's job is in ``state`` (at once if it is).

        For what takes real work rather than virtual time (a session closing, the job's
        close); ``timeout`` is in the loop's seconds (real ones, or virtual on a test marked
        ``virtual_time``), and ``TimeoutError`` says where the machine is instead. The job's
        clock does not move while waiting: advance it for the job's timers.
        """
        from statemachines.machines import MACHINES

        spec = MACHINES.get(machine)
        if spec is None:
            raise ValueError(f"unknown machine {machine!r}: one of {sorted(MACHINES)}")
        if state not in spec.state_names:
            raise ValueError(f"unknown {machine} state {state!r}: one of {list(spec.state_names)}")
        job = self.job
        if machine not in job.states:
            raise ValueError(f"this job has no {machine} machine (no avatar given to it?)")
        reached = asyncio.Event()

        def on_change(_: Any) -> None:
            if job.states.get(machine) == state:
                reached.set()

        job.on("state_changed", on_change)
        try:
            on_change(None)
            await asyncio.wait_for(reached.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"{machine} is {job.states.get(machine)!r}, not {state!r}, after {timeout:g}s"
            ) from None
        finally:
            job.off("state_changed", on_change)
        await settle()
        self.raise_failures()

    # -- what the test reads ---------------------------------------------------------------
    @property
    def ctx(self) -> JobContext:
        """The job context of the last run."""
        return self._last().ctx

    @property
    def job(self) -> AgentJob:
        """The ``AgentJob`` of the last run (also once it closed, and once an entrypoint
        that stalled before it built it went on to build it)."""
        run = self._last()
        job = run.job or run.watch.job
        if job is None:
            raise RuntimeError("the last run built no AgentJob")
        return job

    @property
    def records(self) -> list[TraceRecord]:
        """Every trace record of the jobs run so far (events, transitions, effects)."""
        return list(self.sink.records)

    @property
    def transitions(self) -> list[dict[str, Any]]:
        """Every transition so far as ``{t, machine, event, source, dest}``, in order."""
        return [
            {"t": r.t, "machine": r.machine, "event": r.event, "source": r.source, "dest": r.dest}
            for r in self.sink.records
            if r.kind == "transition"
        ]

    def tasks_left(self, *, callers_too: bool = False) -> list[asyncio.Task[Any]]:
        """The tasks the job started (from the first run on, in its context: the
        entrypoint, what it started, the handlers the SDK and the runtime call from there,
        what ``agent_room``'s events start) still running, by name: once the job's end is
        over, each is one the agent left running, or the SDK's. ``aclose()`` gives those
        being cancelled its bound to end first, as livekit's process loop lets them, then
        fails the test on the rest (``TasksLeftRunning``, each named by its coroutine). A
        task the test started is its own. ``callers_too``: those as well, every task
        started since the first run (the fuzzer's ``released``: its every input is the
        job's world)."""
        before = self._tasks_before
        if before is None:
            return []
        me = asyncio.current_task()
        ours = set(self._job_tasks)
        left = [
            t
            for t in [*asyncio.all_tasks(), *self._stopped]
            if t is not me
            and t not in before
            and (callers_too or t in ours)
            and (not t.done() or t in self._stopped)
        ]
        return sorted(set(left), key=task_name)

    def name_left(self, task: asyncio.Task[Any]) -> str:
        """A task of ``tasks_left`` by its coroutine, saying so when it swallowed its
        cancellation at the end (and was stopped then, as the worker's kill stops it)."""
        if task not in self._stopped:
            return task_name(task)
        why = "which swallowed its cancellation (livekit's job end waits for it)"
        return f"{task_name(task)}, {why}"

    def _count_job_tasks(self) -> None:
        """Put a task factory on the loop that notes the tasks made in this runner's job's
        context (``JOB_SIDE``), over the loop's own factory if it has one; ``aclose()``
        takes it off."""
        loop = asyncio.get_running_loop()
        factory = _CountingFactory(self, self._job_tasks, loop.get_task_factory())
        loop.set_task_factory(factory)
        self._factory = (loop, factory)

    def _uncount_job_tasks(self) -> bool:
        """Take the factory off; whether it was still the loop's all along. Under another
        runner's it stays, only handing on, and that one's removal skips it."""
        if self._factory is None:
            return True
        loop, factory = self._factory
        self._factory = None
        factory.active = False
        if loop.is_closed():
            return True
        ours = loop.get_task_factory() is factory
        if ours:
            loop.set_task_factory(factory.handing_on())
        return ours

    # -- teardown ------------------------------------------------------------------------------
    async def aclose(self, *, report: bool = True) -> None:
        """The test is over: every job still running ends as a worker's shutdown ends it
        (``test ended``; no hold: the job is aborted), through livekit's order (its
        ``on_session_end``, the room's disconnect, its shutdown callbacks; an entrypoint
        still running once the job closed is cancelled at once), the virtual clock running
        meanwhile (its timers, up to the server's ``shutdown_process_timeout``); the job
        contexts are released (their temporary directories). Then what failed in the
        agent's code and was not reported yet is raised (``report=False``: kept in
        ``user_failures``)."""
        runs, self._runs = self._runs, []
        for run in runs:
            run.process.shutdown("test ended")
            job = run.job or AgentJob.for_job(run.ctx)
            closing = None if job is None else asyncio.ensure_future(job.aclose(graceful=False))
            # a worker's time goes on while it waits for the job: the job's own bounds (a
            # session whose close waits for an avatar that never joined) are met
            run.process.cut_entrypoint()  # its bound is the test's end: it is over
            await self._pass_time([f for f in (closing, run.process.ended) if f], run.kill_after)
            await self._session_end_over(run.process, run.kill_after)
            with contextlib.suppress(TimeoutError):
                # then gives the process shutdown_process_timeout to end, and kills it
                await asyncio.wait_for(asyncio.shield(run.process.ended), run.kill_after)
            await run.process.kill(_CLOSE_LIMIT, bound=run.kill_after)
            if closing is not None:
                await asyncio.wait([closing], timeout=_CLOSE_LIMIT)
                closing.cancel()
                await asyncio.gather(closing, return_exceptions=True)
            if job is not None:
                session = job.session
                if lk.session_live(session):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(session.aclose(), _CLOSE_LIMIT)
            closing = run.close_http()
            if closing is not None:
                await asyncio.gather(closing, return_exceptions=True)
            lk.release_job_context(run.ctx)  # upstream's job cleanup would; a fake job does not
        try:
            if runs:
                await settle()
                # a task the agent cancelled ends its cleanup, as livekit's process loop
                # lets it end; one that takes no for an answer is still running after
                stopping = [t for t in self.tasks_left(callers_too=True) if t.cancelling()]
                if stopping:
                    await asyncio.wait(stopping, timeout=_CLOSE_LIMIT)
                await self._stop_refusing(stopping)
                self.failures.uninstall()
            # a session whose close the agent's code held is left half closed (reported):
            # livekit's tasks left then are its consequence; the agent's own are not
            left = self.tasks_left() if runs and report else []
            if self.failures.close_held:
                left = [t for t in left if is_agents_task(t)]
        finally:
            counted = self._uncount_job_tasks()
            self.room.deliver_in(None)
        if runs and not counted:
            logger.warning(
                "the loop's task factory was replaced during the run (by the agent's code?): "
                "the tasks started after that were not checked for being left running"
            )
        if report:
            if left:
                self.failures.add("job", TasksLeftRunning([self.name_left(t) for t in left]))
            self.raise_failures()

    async def _stop_refusing(self, stopping: list[asyncio.Task[Any]]) -> None:
        """A task that swallowed its cancellation past the bound would hang the loop's own
        close (``asyncio.run`` and pytest-asyncio cancel and await every task): the
        worker's kill ends it, and so does this (``stop_task``), the agent's own first (the
        tasks waiting on them then end by themselves). They are still named as left."""
        for agents in (True, False):
            for task in stopping:
                if not task.done() and is_agents_task(task) == agents:
                    stop_task(task)
                    self._stopped.append(task)
            await settle()

    async def _session_end_over(self, process: JobProcess, kill_after: float) -> None:
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
            await self._pass_time([done], process.session_end_timeout)

    async def _pass_time(self, waiting: list[asyncio.Future[None]], limit: float) -> None:
        """Run the virtual clock timer by timer, for at most ``limit`` of its seconds, until
        everything in ``waiting`` is done (a clock of another kind is left as it is)."""
        await settle()
        if not isinstance(self.clock, VirtualClock):
            return
        end = self.clock.now() + limit
        for _ in range(_TIMERS_AT_TEARDOWN):  # a timer that re-arms itself at once ends it
            if all(f.done() for f in waiting):
                return
            deadline = self.clock.next_deadline()
            if deadline is None or deadline > end:
                return
            await self.clock.run_until(deadline)

    # -- parts ---------------------------------------------------------------------------------
    async def _delete_room(self) -> None:
        """The server API call, as the server answers it: the room is deleted and everyone
        in it disconnected (reason ``ROOM_DELETED``). The agent hears only its own room's
        ``disconnected``, as a real room's SDK does (its listener ends there), and the job
        ends as livekit's job process ends one whose room disconnected. A room deleted
        already is no room to delete (the server's ``NOT_FOUND``, which livekit ignores)."""
        if self.room.deleted_at is not None:
            return
        self.room.deleted_at = self.clock.now()
        self.room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)

    def _ctx_delete_room(self, room_name: str | None = None) -> asyncio.Future[Any]:
        """``JobContext.delete_room`` as the server would answer it: the test's room
        deleted, and disconnected if it still was connected (another room's name is no room
        of the test's: nothing to record)."""
        if room_name not in (None, self.room.name):
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return asyncio.ensure_future(self._delete_room())

    async def _remove_avatar(self, identity: str) -> None:
        if identity in self.room.remote_participants:  # the server's "not found" is fine
            self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    def _on_publish(self, _: Any) -> None:
        """A track is published: on a virtual-time loop, the room audio outputs of the
        jobs run so far get the stand-in for livekit's native audio source, whose real-time
        pacing that loop does not wait for (``testing/room_audio.py``)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if not isinstance(loop, VirtualTimeLoop):
            return
        for run in self._runs:
            job = run.job or run.watch.job
            if job is not None:
                pace_room_audio(job.session)

    def _last(self) -> _Run:
        if not self._runs:
            raise RuntimeError("no entrypoint has run yet")
        return self._runs[-1]


async def _wait(fut: asyncio.Future[None]) -> None:
    await asyncio.shield(fut)


async def _as_coroutine(aw: Awaitable[Any]) -> Any:
    return await aw


def not_an_entrypoint(fn: Any) -> str | None:
    """Why ``fn`` cannot be the job's entrypoint (livekit awaits what it returns for the
    JobContext it is called with); None when it can. Run, it failed as a bug in the
    agent."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if not callable(fn):
        return f"{name} cannot be called"
    # whether it is async is not checked: livekit awaits what a plain function returns too
    # (a lambda, a sync tracing decorator around the async entrypoint)
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return f"{name}{inspect.signature(fn)} does not take the JobContext as its argument"
    except ValueError:  # no signature to read: it runs as it is
        return None
    return None


def check_agent(agent: Any) -> None:
    """Refuse, before anything runs, what cannot be run as a job: neither an
    ``AgentServer`` with an ``rtc_session`` entrypoint nor an entrypoint function."""
    entrypoint, _, _ = _entrypoint_of(agent)
    why = not_an_entrypoint(entrypoint)
    if why is not None:
        raise TypeError(f"the entrypoint must be a function taking the JobContext: {why}")


def served(agent: Any, module: Any = None) -> Any:
    """The ``AgentServer`` whose ``rtc_session`` entrypoint ``agent`` is, when ``agent`` is
    an entrypoint function and a server among the globals of ``module`` (by default the
    function's own module) registered it: run with that server's ``on_session_end``,
    ``on_simulation_end`` and timeouts, as a worker runs it; servers that registered it
    alike (those the same) are one answer. Servers that registered it with different
    hooks or timeouts are a ``TypeError`` naming them: which one runs it is the caller's
    to say (pass that server). Anything else (a server, a function no server of its
    module registered) is returned as given."""
    if _hooks_of(agent) is not None or not callable(agent):
        return agent
    if module is None:
        module = sys.modules.get(getattr(agent, "__module__", None) or "")
    if module is None:
        return agent
    try:
        named = list(vars(module).items())
    except TypeError:  # no namespace to look in
        return agent
    servers: dict[int, tuple[str, Any]] = {}
    for name, v in named:
        if (hooks := _hooks_of(v)) is not None and hooks.entrypoint is agent:
            servers.setdefault(id(v), (name, v))
    if not servers:
        return agent
    (_, first), *others = servers.values()
    if any(_run_as(o) != _run_as(first) for _, o in others):
        names = ", ".join(name for name, _ in servers.values())
        raise TypeError(
            f"{getattr(agent, '__qualname__', agent)!s} is the entrypoint of AgentServers "
            f"with different hooks or timeouts ({names}): pass the server to run it with"
        )
    return first


def _run_as(server: Any) -> tuple[Any, ...]:
    """What of ``server`` a run of its entrypoint uses besides the entrypoint."""
    hooks = _hooks_of(server)
    return (
        getattr(hooks, "session_end", None),
        getattr(hooks, "simulation_end", None),
        lk.server_session_end_timeout(server),
        lk.server_shutdown_process_timeout(server),
    )


def _hooks_of(value: Any) -> Any:
    """``value``'s server hooks; None for what is no server, and for a global of a module
    whose attribute reads raise (a framework's proxy outside its context)."""
    try:
        return lk.server_hooks(value)
    except Exception:
        return None


def agent_label(agent: Any) -> str:
    """The agent's name for files written about it: its entrypoint's module and function
    (``my_agent.entrypoint``; a script run as ``__main__`` by its file's name), only
    letters, digits, ``_``, ``.`` and ``-``."""
    hooks = lk.server_hooks(agent)
    fn: Any = hooks.entrypoint if hooks is not None else agent
    for _ in range(100):  # functools.partial (nested too), __wrapped__: the function inside
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        with contextlib.suppress(ValueError):  # a cycle of __wrapped__: the function as given
            fn = inspect.unwrap(fn)
        if not isinstance(fn, functools.partial):
            break
    module = getattr(fn, "__module__", None) or ""
    if module == "__main__":
        try:
            module = Path(inspect.getfile(fn if inspect.isroutine(fn) else type(fn))).stem
        except TypeError:  # no file (a builtin)
            module = ""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{module}.{name}" if module else name)
    return label.strip(".-")[:100] or "agent"


def _entrypoint_of(
    entrypoint: Any,
) -> tuple[Entrypoint, SessionEndFn | None, SimulationEndFn | None]:
    """The entrypoint function and the server's hooks (``None`` for a bare function)."""
    hooks = lk.server_hooks(entrypoint)
    if hooks is not None:
        if hooks.entrypoint is None:
            raise ValueError("this AgentServer has no rtc_session entrypoint registered")
        return hooks.entrypoint, hooks.session_end, hooks.simulation_end
    if not callable(entrypoint):
        raise TypeError(
            f"give an AgentServer or an entrypoint function, not {type(entrypoint).__name__}"
        )
    return entrypoint, None, None
