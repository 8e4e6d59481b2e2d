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
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from livekit.agents.simulation import SimulationDispatch
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.remote_session import SessionTransport

from agent_runtime.clock import Clock, check_seconds
from agent_runtime.observe.trace import MemorySink, Tracer, TraceRecord
from agent_runtime.parts import check_part
from agent_runtime.runtimes.finalize import SimulationEndFn
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing._entrypoint_run import (
    CLOSE_LIMIT,
    Run,
    StartWatch,
    as_coroutine,
    job_context,
    prewarm,
    wait_shielded,
)
from agent_runtime.testing._entrypoint_start import EntrypointStalled, NoAgentJob, started_job
from agent_runtime.testing._job_tasks import JobTasks
from agent_runtime.testing.clock import VirtualTimeLoop, settle
from agent_runtime.testing.entrypoint_lookup import (
    Entrypoint,
    SessionEndFn,
    agent_label,
    check_agent,
    entrypoint_and_hooks,
    not_an_entrypoint,
    served,
)
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.job_process import JobProcess
from agent_runtime.testing.room_audio import pace_room_audio
from agent_runtime.testing.server_api import KitServer
from agent_runtime.testing.user_code import (
    JOB_SIDE,
    TasksLeftRunning,
    UserFailure,
    UserFailures,
    is_agents_task,
)

if TYPE_CHECKING:
    from livekit.agents import AgentServer
    from livekit.agents.job import JobContext

logger = logging.getLogger("agent_runtime.testing.entrypoint")
P = ParamSpec("P")
T = TypeVar("T")


# what of an agent a run uses has a module of its own; its names stay here too, where users
# import them
__all__ = [
    "EntrypointRunner",
    "EntrypointStalled",
    "NoAgentJob",
    "agent_label",
    "check_agent",
    "not_an_entrypoint",
    "served",
]


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
        self._server = KitServer(room, self.clock)  # the server's answers to the job's calls
        self.failures = UserFailures()
        self._runs: list[Run] = []
        # the tasks made in the job's context (JOB_SIDE is this runner there) from the first
        # run on: one still running after the job's end is one the run left (tasks_left)
        self._tasks = JobTasks(self)
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
        fn, server_session_end, server_simulation_end = entrypoint_and_hooks(entrypoint)
        start_timeout = check_seconds("start_timeout", start_timeout)
        self._tasks.count()
        by_server = fn is not entrypoint  # an AgentServer, with its own bounds
        end_timeout = lk.server_session_end_timeout(entrypoint) if by_server else 300.0
        kill_after = lk.server_shutdown_process_timeout(entrypoint) if by_server else 10.0
        if avatar is not None and not isinstance(avatar, AvatarSession):
            raise TypeError(f"avatar must be an AvatarSession, not {type(avatar).__name__}")
        watch = StartWatch()
        parts: dict[str, Any] = {
            "clock": self.clock,
            "tracer": Tracer(self.sink, watch),
            "delete_room": self._server.delete_room,
            "remove_avatar_participant": self._server.remove_avatar,
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
        ctx, context = job_context(
            self.room,
            self._server,
            job_id,
            parts,
            simulation,
            on_simulation_end or server_simulation_end,
        )
        prewarm(entrypoint if by_server else None, ctx)  # what livekit's process did first
        watch.ctx = ctx
        context.run(JOB_SIDE.set, self)  # what runs in it, and all it starts, is the job's
        self.room.deliver_in(context)  # as a real room's events come from its own task
        http_bound = lk.bind_job_http(context)
        if not self._runs:
            self.failures.caller = asyncio.current_task()
            self.failures.is_jobs = self._tasks.made.__contains__
            self.failures.install()
        process = JobProcess(
            ctx,
            clock=self.clock,
            on_session_end=on_session_end or server_session_end,
            session_end_timeout=end_timeout,
            failures=self.failures,
            context=context,
        )
        run = Run(ctx, context, process, watch, http_bound, kill_after)
        self._runs.append(run)
        process.ended.add_done_callback(lambda _: run.close_http())
        aw = fn(ctx)  # the entrypoint's own coroutine is the task's: named by it when left
        entry = asyncio.get_running_loop().create_task(
            aw if asyncio.iscoroutine(aw) else as_coroutine(aw),
            name="job_user_entrypoint",
            context=context,
        )
        process.watch_entrypoint(entry)
        return await started_job(run, entry, start_timeout, self._entry_done)

    def _entry_done(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks.stopped:  # the kill's end, not its own: named as left running
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
            wait_shielded(process.session_end_done), name="on_session_end"
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
        return self._tasks.left(callers_too=callers_too)

    def name_left(self, task: asyncio.Task[Any]) -> str:
        """A task of ``tasks_left`` by its coroutine, saying so when it swallowed its
        cancellation at the end (and was stopped then, as the worker's kill stops it)."""
        return self._tasks.name(task)

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
            await run.end(self.clock)
        try:
            if runs:
                await settle()
                # a task the agent cancelled ends its cleanup, as livekit's process loop
                # lets it end; one that takes no for an answer is still running after
                stopping = [t for t in self.tasks_left(callers_too=True) if t.cancelling()]
                if stopping:
                    await asyncio.wait(stopping, timeout=CLOSE_LIMIT)
                await self._tasks.stop_refusing(stopping)
                self._tasks.take_failed(self.failures)
                self.failures.uninstall()
            # a session whose close the agent's code held is left half closed (reported):
            # livekit's tasks left then are its consequence; the agent's own are not
            left = self.tasks_left() if runs and report else []
            if self.failures.close_held:
                left = [t for t in left if is_agents_task(t)]
        finally:
            counted = self._tasks.uncount()
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

    def _last(self) -> Run:
        if not self._runs:
            raise RuntimeError("no entrypoint has run yet")
        return self._runs[-1]
