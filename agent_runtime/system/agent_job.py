"""``AgentJob``: the one place a job is assembled.

From an ``rtc_session`` entrypoint, one call builds and starts every machine of the job over
its room, in the order their guarantees need::

    @server.rtc_session(on_session_end=on_session_end, on_simulation_end=my_verdict)
    async def entrypoint(ctx: JobContext) -> None:
        session = AgentSession(stt=..., llm=..., tts=...)
        job = AgentJob.from_job_context(ctx, session=session, avatar=bey.AvatarSession())
        await job.start(Agent(instructions="..."))

It checks what it is given (a refusal changes nothing), sets up the tracing and hands the
parts to ``JobSystem`` (``job_system.py``), which builds every machine, holds their actors and
runs the channels between them and the teardown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from livekit import rtc
from livekit.agents import NOT_GIVEN, Agent, AgentSession, JobContext, NotGivenOr
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.remote_session import SessionTransport
from livekit.agents.voice.room_io import RoomOptions
from opentelemetry import context as otel_context

from agent_runtime.actor import Actor, StateChanged
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.emitter import Emitter, event_names
from agent_runtime.observe.otel import OtelSink
from agent_runtime.observe.snapshot import JobSnapshot
from agent_runtime.observe.trace import Tracer
from agent_runtime.parts import JOB_PARTS, job_options
from agent_runtime.runtimes.avatar import RemoveParticipant, Route
from agent_runtime.runtimes.playout import RepromptFn
from agent_runtime.runtimes.room_deletion import DeleteRoomFn
from agent_runtime.runtimes.session_host import SimulationEndFn
from agent_runtime.runtimes.shutdown_callbacks import ShutdownCallback
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.native_exit import release_at_exit
from agent_runtime.settings import (
    AvatarRetry,
    JobSettings,
    PlayoutOptions,
    SettingError,
    observed,
    one_line,
)
from agent_runtime.system._inputs import (
    AvatarPlugin,
    Parts,
    build_avatar,
    check_agent,
    check_avatar,
    check_linked_identity,
    injected,
    injections,
)
from agent_runtime.system._inputs import room_options as room_options_for
from agent_runtime.system.job_system import JobSystem
from agent_runtime.system.livekit_job import (
    agent_asked,
    context_options,
    fill_trace_path,
    forget,
    job_of,
    on_session_end,
    register,
    session_end_hook,
)
from agent_runtime.system.snapshot import job_snapshot

logger = logging.getLogger("agent_runtime.agent_job")

Events = Literal["state_changed", "closed"]
# what AgentJob's keywords hand job_options: the settings (None: the default) and the parts
_OPTIONAL = frozenset({"participant_kinds", "closing_reasons"})
_OPTIONS = (*JobSettings.model_fields, *JOB_PARTS)
# the livekit job context a job is being built for, inside from_job_context only: the job is
# built with it, nothing is handed to it afterwards
_BUILDING_FOR: ContextVar[JobContext | None] = ContextVar("agent_job_building_for", default=None)


class AgentJob(Emitter[Events]):
    """Every machine of one job, composed over one room (``JobSystem`` holds them).

    Emits ``state_changed`` (a ``StateChanged`` from any machine of the job) and ``closed``
    (the job's virtual or real time of closing).
    """

    _EVENT_NAMES = event_names(Events)  # on("state_chnaged", ...) is refused

    def __init__(
        self,
        *,
        room: rtc.Room,
        session: AgentSession[Any],
        avatar: AvatarPlugin | None = None,
        avatar_start_options: Mapping[str, Any] | None = None,
        participant_identity: str | None = None,
        participant_kinds: Iterable[str | int] | None = None,
        close_on_disconnect: bool = True,
        closing_reasons: Iterable[str | int] | None = None,
        grace_period: float = 15.0,
        session_close_timeout: float = 60.0,
        join_timeout: float = 30.0,
        retry_avatar: bool | AvatarRetry | Mapping[str, Any] = False,
        session_end_timeout: float = 300.0,
        close_timeout: float = 10.0,
        delete_room_on_close: bool = False,
        playout: bool | PlayoutOptions | Mapping[str, Any] | None = None,
        on_reprompt: RepromptFn | None = None,
        trace_path: str | Path | None = None,
        tracer: Tracer | None = None,
        otel: bool | OtelSink = True,
        clock: Clock | None = None,
        simulation: SimulationContext | SimulationDispatch | None = None,
        on_simulation_end: SimulationEndFn | None = None,
        transport: SessionTransport | None = None,
        delete_room: DeleteRoomFn | None = None,
        remove_avatar_participant: RemoveParticipant | None = None,
    ) -> None:
        super().__init__()
        # everything that can refuse the input comes first: a refusal changes nothing
        given = locals()
        options = {k: given[k] for k in _OPTIONS if not (k in _OPTIONAL and given[k] is None)}
        # by default on with an avatar (never stuck "speaking" on a report that never
        # comes), off without one; playout=False turns it off explicitly
        options["playout"] = avatar is not None if playout is None else playout
        self.settings: JobSettings = job_options(options)
        if not isinstance(room, rtc.Room):
            raise TypeError(f"room must be an rtc.Room, not {type(room).__name__}")
        if not isinstance(session, AgentSession):
            raise TypeError(f"session must be an AgentSession, not {type(session).__name__}")
        if isinstance(trace_path, str):  # from_job_context's is filled in already (a Path)
            trace_path = fill_trace_path(trace_path, room=room.name)
        inject = injections()
        if avatar is not None and inject.get("avatar") is not None:
            avatar = inject["avatar"]  # a test's scripted avatar stands in for the plugin
        if lk.session_started(session):
            raise ValueError(
                "the session is already started: pass it unstarted, AgentJob starts it "
                "(with session_host=False and RoomIO's own close rules off) in job.start()"
            )
        start_options = check_avatar(avatar, avatar_start_options)
        if avatar is None and self.settings.retry_avatar != AvatarRetry():
            # as avatar_start_options: a policy for an avatar the job will never have
            raise SettingError("retry_avatar given without an avatar")
        if on_reprompt is not None and (
            self.settings.playout is None or not self.settings.playout.reprompt
        ):
            raise SettingError(
                "on_reprompt given, but the watchdog is off: pass "
                "playout=PlayoutOptions(reprompt=True) too"
            )
        if otel is True and isinstance(inject.get("otel"), OtelSink):
            otel = inject["otel"]
        # what every line about this job carries (the log policy: job, room, machine, ...)
        self._log_labels: dict[str, str] = {"job_id": "", "room": room.name}
        if (ctx := _BUILDING_FOR.get()) is not None:
            # the room is not connected yet (its name comes with it); ctx has it
            self._log_labels.update(job_id=ctx.job.id, room=ctx.job.room.name or room.name)
        # a factory-built plugin's start options and identity are the last check: only then
        # is the trace file opened (truncated), the one thing construction changes outside
        # this object
        self.avatar_error: str | None = None  # why the job runs without the avatar it was given
        plugin = None
        if avatar is not None:
            plugin, self.avatar_error = build_avatar(avatar, start_options, self._log_labels)
            check_linked_identity(self.settings.participant_identity, plugin)
        # the span current now (job_entrypoint inside a livekit job) takes the machines'
        # events whenever no session span is running
        self._otel_context = otel_context.get_current()
        tracer, self._trace_file, self.otel = observed(
            tracer or inject.get("tracer"), trace_path, otel, self._otel_parent
        )
        parts = Parts(
            clock=clock or inject.get("clock") or AsyncioClock(),
            tracer=tracer,
            transport=transport or inject.get("transport"),
            simulation=simulation,
            on_simulation_end=on_simulation_end,
            delete_room=delete_room or inject.get("delete_room"),
            remove_avatar_participant=remove_avatar_participant
            or inject.get("remove_avatar_participant"),
            on_reprompt=on_reprompt,
            plugin=plugin,
            rebuild_avatar=None if isinstance(avatar, AvatarSession) else avatar,
            avatar_start_options=start_options,
            job_context=ctx,
        )
        self.room, self.session, self.clock, self.tracer = room, session, parts.clock, tracer
        self.system = JobSystem(
            room=room,
            session=session,
            settings=self.settings,
            parts=parts,
            owner=self._forward_state,
        )
        sys = self.system
        self.events, self.job, self.link = sys.events, sys.job, sys.link
        self.avatar, self.playout, self.lifecycle_actor = sys.avatar, sys.playout, sys.lifecycle
        for actor in sys.actors:
            actor.labels = self._log_labels
        sys.events.labels = self._log_labels
        if tracer is not None:
            tracer.label(self._log_labels)

    # -- livekit-agents jobs ---------------------------------------------------------------
    @classmethod
    def from_job_context(
        cls,
        ctx: JobContext,
        *,
        session: AgentSession[Any],
        avatar: AvatarPlugin | None = None,
        **options: Any,
    ) -> AgentJob:
        """A job over ``ctx.room``, with its simulation context, the ``on_simulation_end``
        given to ``AgentServer.rtc_session`` and ``ctx.delete_room``, unless given in
        ``options``. ``trace_path`` may contain ``{job_id}`` (only here: ``AgentJob(...)``
        has no job id) and ``{room}``. Found again by
        ``AgentJob.for_job(ctx)`` and by ``on_session_end``."""
        options = context_options(ctx, options)
        token = _BUILDING_FOR.set(ctx)
        try:
            job = cls(room=ctx.room, session=session, avatar=avatar, **options)
        finally:
            _BUILDING_FOR.reset(token)
        register(ctx, job)
        return job

    @staticmethod
    def for_job(ctx: JobContext) -> AgentJob | None:
        """The ``AgentJob`` built for ``ctx``, until it closed."""
        if not isinstance(ctx, JobContext):
            # any other value finds no job: None would read as "closed already"
            raise TypeError(f"for_job takes a JobContext, not {type(ctx).__name__}")
        return job_of(ctx)

    # -- state -------------------------------------------------------------------------------
    @property
    def actors(self) -> list[Actor]:
        """Every machine of the job (its actor), in ``MACHINES`` order."""
        return list(self.system.actors)

    @property
    def states(self) -> dict[str, str]:
        """Every machine's current state, by machine name."""
        return {a.spec.name: a.state for a in self.system.actors}

    @property
    def lifecycle(self) -> str:
        """The job's own state: ``new``, ``starting``, ``running``, ``closing``, ``closed``;
        ``held`` and ``starting_held`` while the job holds before its session ran (it hangs
        up once it does)."""
        return self.system.lifecycle.state

    @property
    def close_reason(self) -> str | None:
        """The primary session's ``CloseReason``, once it closed."""
        return self.system.close_reason

    @property
    def finalize_answered(self) -> bool:
        return self.job.finalize_answered

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.job.verdict

    @property
    def closed_at(self) -> float | None:
        return self.job.closed_at

    @property
    def room_deleted_at(self) -> float | None:
        return self.job.room_deleted_at

    def audio_route(self) -> Route:
        """Where the agent's audio goes now: ``avatar`` (the sink the avatar plugin
        installed, whatever its class), ``room`` or ``none``."""
        return self.system.audio_route()

    @property
    def live_audio_route(self) -> Route:
        """Where the agent's audio went while its session was live, as last seen (the
        session's close tears its outputs down, so ``audio_route()`` is ``none`` after it):
        what a verdict about the run should look at."""
        return self.system.live_audio_route

    def snapshot(self) -> JobSnapshot:
        """What every machine is doing now: its state, since when and the timer armed in it
        (times on the job's clock), with the audio route, the linked identity, the attached
        session and the finalize status. Plain JSON-able data; cheap enough to log with every
        request."""
        return job_snapshot(self.system)

    # -- starting ----------------------------------------------------------------------------
    async def start(
        self, agent: Agent, *, room_options: NotGivenOr[RoomOptions] = NOT_GIVEN
    ) -> None:
        """Start everything: the job's runtime (room facts, the job machine, the session host
        with the session attached), the avatar (its route in before the session starts, as
        the plugins expect), the session, then the participant link.

        Refused (``RuntimeError``) while the job is already starting or started, or once it
        is closed; if the job is closed while this runs, this raises once the start is cut.
        A start that fails, or that its caller cancels (a timeout around it), closes the
        job with what did start: raised at once, ``wait_closed()`` waits for that close."""
        check_agent(agent)  # refused before anything, as are the options
        options = room_options_for(self.settings, room_options)
        await self.system.begin("start")
        await self.system.claim_session()
        await self.system.run_part(self.system.start_all(agent, options), session=True)
        # the room and its I/O started livekit's native runtime: its exit made safe
        release_at_exit()

    async def start_runtime(self) -> None:
        """Connect (inside a livekit job), follow the room, start the job machine and the
        session host. Idempotent; ``start()`` may follow it. The lifecycle moves on with the
        agent's own parts (``start``, ``start_avatar``, ``start_session``)."""
        await self.system.begin("follow_room")
        await self.system.run_part(self.system.start_runtime())

    async def start_avatar(self) -> None:
        """Start the avatar plugin through its lifecycle (before or after the session);
        returns once the outcome of the plugin's own start is handled."""
        if self.avatar is None:
            raise RuntimeError("this job has no avatar (pass avatar= to AgentJob)")
        await self.system.begin("start_part")
        await self.system.run_part(self.system.start_avatar())

    async def start_session(
        self, agent: Agent, *, room_options: NotGivenOr[RoomOptions] = NOT_GIVEN
    ) -> None:
        """Start the session on the room with the job's host and the machines' close rules,
        then link the participant."""
        check_agent(agent)
        options = room_options_for(self.settings, room_options)
        await self.system.begin("start_part")
        await self.system.claim_session()
        await self.system.run_part(self.system.start_session(agent, options), session=True)

    def attach(self, session: AgentSession[Any]) -> None:
        """Attach another session to the job's host (the previous one is detached; its
        events stop being forwarded). Its close then ends the job."""
        self.job.attach(session)

    # -- ending ------------------------------------------------------------------------------
    def shutdown(self, reason: str = "") -> None:
        """Ask the job to end: its session closes, then it holds for the simulator if one
        can still ask, then closes. Inside a livekit job, livekit's end is given ``reason``
        too, as by ``ctx.shutdown``."""
        self.job.shutdown(reason)  # refuses a reason that is no str, changing nothing
        if self.system.job_context is not None:
            agent_asked(self.system.job_context, reason)

    def request_room_deletion(self) -> None:
        """Delete the room once the hold is over (what an end-call tool's delete_room does)."""
        self.job.request_room_deletion()

    def add_shutdown_callback(self, callback: ShutdownCallback) -> None:
        """Run ``callback(reason)`` (or ``callback()``) at the end of the job's close."""
        self.job.add_shutdown_callback(callback)

    async def wait_closed(self) -> None:
        """Wait until the job is closed and everything that followed it released."""
        await self.job.wait_closed()
        await self.system.lifecycle.until(lambda state: state == "closed")

    async def aclose(self, *, graceful: bool = True) -> None:
        """Close the job. ``graceful`` (the default): shut down as ``shutdown()`` does,
        honouring the bounded hold. Otherwise the same teardown with no hold (an abort also
        ends a graceful close's hold). Either way this returns once every listener and task
        is released."""
        if not isinstance(graceful, bool):  # "no" would have closed gracefully
            raise TypeError(f"graceful must be True or False, not {graceful!r}")
        # inside a livekit job its end hears why, as from shutdown(): the lifecycle is closing
        await self.system.aclose(graceful=graceful)

    # -- observation -------------------------------------------------------------------------
    def _otel_parent(self) -> otel_context.Context:
        """The context whose span takes the machines' events: the attached session's
        (``agent_session``) while it runs, else the one current when the job was built."""
        for session in (self.system.host.session, self.session):
            # the SDK keeps its session span's context there from start() to the close's end
            ctx = lk.session_span_context(session) if session is not None else None
            if ctx is not None:
                return ctx
        return self._otel_context

    def _forward_state(self, sc: StateChanged) -> None:
        if sc.machine == "agent_job" and sc.dest == "closed":
            # after the lifecycle's own last transition is written: every machine is closed
            if self.otel is not None:
                self.otel.close()  # a state span still open was abandoned
            if self._trace_file is not None:
                self._trace_file.close()
            self._forget()
        self.emit("state_changed", sc)  # a listener that fails: the Emitter logs and drops it
        if sc.machine == "job" and sc.dest == "closed":
            # the system's "closed", heard as its owner: no listener table per job. What
            # fails here (a log filter of the user's) is logged as a listener's failure
            # would be: it must not cost the owner chain the job's changes still to come
            t = self.job.closed_at
            try:
                self._on_closed(t)
            except Exception as e:
                self._listener_failed("closed", self._on_closed, e, (t,))

    def _on_closed(self, t: float | None) -> None:
        logger.info(
            "job closed (%s)",
            one_line(self.job.reason) or "no reason given",
            extra=self.lifecycle_actor.log_fields(),
        )
        self._forget()
        self.emit("closed", t)

    def _forget(self) -> None:
        if self.system.job_context is not None:
            forget(self.system.job_context, room_followed=self.system.events.started)


__all__ = ["AgentJob", "injected", "on_session_end", "session_end_hook"]
