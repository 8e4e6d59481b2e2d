"""``AgentJob``: the one place a job is assembled.

From an ``rtc_session`` entrypoint, one call builds and starts every machine of the job over
its room, in the order their guarantees need::

    @server.rtc_session(on_session_end=on_session_end, on_simulation_end=my_verdict)
    async def entrypoint(ctx: JobContext) -> None:
        session = AgentSession(stt=..., llm=..., tts=...)
        job = AgentJob.from_job_context(ctx, session=session, avatar=bey.AvatarSession())
        await job.start(Agent(instructions="..."))

What it composes: the room-event adapter (room facts reach each machine through the
declared routing table), the ``job`` machine and the job-owned session host (the session
starts with ``session_host=False`` and is attached before it starts), the linked
``participant`` (RoomIO's own ``close_on_disconnect`` and ``delete_room_on_close`` are turned
off: the machines decide), the optional ``avatar`` around any ``AvatarSession`` plugin, the
optional ``playout`` machine (the agent's audio until heard, the re-prompt watchdog),
tracing, and the teardown: when the session closes the avatar goes with it while the room is
still connected; the job's ``closing`` closes the host, then the session and avatar if they
are still up, then disconnects, deletes the room if asked and runs the shutdown callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from livekit import rtc
from livekit.agents import NOT_GIVEN, Agent, AgentSession, CloseReason, NotGivenOr
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.utils import is_given
from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.events import CloseEvent
from livekit.agents.voice.remote_session import SessionTransport
from livekit.agents.voice.room_io import RoomOptions
from opentelemetry import context as otel_context

from statemachines.agent_job import AGENT_JOB
from statemachines.system import bound_of, watched

from . import livekit_compat as lk
from .actor import Actor, ActorClosed, Event, EventRejected, Handlers, StateChanged, effect_table
from .avatar import (
    AvatarLifecycle,
    RemoveParticipant,
    Route,
    check_plugin,
    check_start_options,
    plugin_name,
    route_of,
    server_api_remover,
)
from .clock import AsyncioClock, Clock
from .emitter import Emitter
from .job import JobRuntime, ShutdownCallback
from .otel import OtelSink
from .participant import ParticipantLink
from .playout import PlayoutTracker, RepromptFn
from .room_deletion import DeleteRoomFn
from .room_events import RoomEventAdapter
from .session_host import SimulationEndFn
from .settings import AvatarRetry, JobSettings, PlayoutOptions, SettingError, job_options
from .snapshot import JobSnapshot, find_actors, machines_snapshot
from .trace import JsonlSink, LoggingSink, Tracer

if TYPE_CHECKING:
    from livekit.agents.job import JobContext

logger = logging.getLogger("agent_runtime.agent_job")

# the live job of each job context, for on_session_end / on_simulation_end; dropped at close
_JOBS: dict[Any, AgentJob] = {}
# parts the testing kit injects into jobs built in its context (virtual clock, in-memory
# transport, recorded room deletion); production never sets it
_INJECTED: ContextVar[Mapping[str, Any] | None] = ContextVar("agent_runtime_injected", default=None)
_INJECTABLE = frozenset(
    {"clock", "transport", "tracer", "delete_room", "remove_avatar_participant", "otel", "avatar"}
)

Events = Literal["state_changed", "closed"]
# an avatar plugin, or what builds one when the job is built (a class, a functools.partial)
AvatarPlugin = AvatarSession | Callable[[], AvatarSession]  # type: ignore[type-arg]


@contextlib.contextmanager
def injected(**parts: Any) -> Iterator[None]:
    """Jobs built inside this context (``AgentJob(...)`` or ``from_job_context``) take these
    parts unless given explicitly: ``clock``, ``transport``, ``tracer``, ``delete_room``,
    ``remove_avatar_participant``, ``otel`` (an ``OtelSink``). ``avatar`` (an
    ``AvatarSession``) replaces the avatar plugin a job is given, if it is given one. For
    tests that run an unchanged entrypoint on virtual time and an in-memory room."""
    unknown = sorted(set(parts) - _INJECTABLE)
    if unknown:
        raise TypeError(f"cannot inject {', '.join(unknown)}; one of {sorted(_INJECTABLE)}")
    token = _INJECTED.set({**(_INJECTED.get() or {}), **parts})
    try:
        yield
    finally:
        _INJECTED.reset(token)


class AgentJob(Emitter[Events]):
    """Every machine of one job, composed over one room.

    Emits ``state_changed`` (a ``StateChanged`` from any machine of the job) and ``closed``
    (the job's virtual or real time of closing).
    """

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
        options: dict[str, Any] = {
            "participant_identity": participant_identity,
            "close_on_disconnect": close_on_disconnect,
            "grace_period": grace_period,
            "session_close_timeout": session_close_timeout,
            "join_timeout": join_timeout,
            "retry_avatar": retry_avatar,
            "session_end_timeout": session_end_timeout,
            "close_timeout": close_timeout,
            "delete_room_on_close": delete_room_on_close,
            # by default on with an avatar (never stuck "speaking" on a report that never
            # comes), off without one; playout=False turns it off explicitly
            "playout": avatar is not None if playout is None else playout,
            # the parts: their types (settings.JOB_PARTS)
            "trace_path": trace_path,
            "tracer": tracer,
            "otel": otel,
            "clock": clock,
            "transport": transport,
            "simulation": simulation,
            "on_simulation_end": on_simulation_end,
            "delete_room": delete_room,
            "remove_avatar_participant": remove_avatar_participant,
            "on_reprompt": on_reprompt,
        }
        if participant_kinds is not None:
            options["participant_kinds"] = participant_kinds
        if closing_reasons is not None:
            options["closing_reasons"] = closing_reasons
        self.settings: JobSettings = job_options(options)
        if not isinstance(room, rtc.Room):
            raise TypeError(f"room must be an rtc.Room, not {type(room).__name__}")
        if not isinstance(session, AgentSession):
            raise TypeError(f"session must be an AgentSession, not {type(session).__name__}")
        inject = _INJECTED.get() or {}
        if avatar is not None and inject.get("avatar") is not None:
            avatar = inject["avatar"]  # a test's scripted avatar stands in for the plugin
        if lk.session_started(session):
            raise ValueError(
                "the session is already started: pass it unstarted, AgentJob starts it "
                "(with session_host=False and RoomIO's own close rules off) in job.start()"
            )
        if avatar is not None and not isinstance(avatar, AvatarSession) and not callable(avatar):
            check_plugin(avatar)  # AvatarPluginError (a TypeError) naming it
        if avatar_start_options is not None and not isinstance(avatar_start_options, Mapping):
            raise TypeError(
                "avatar_start_options must be a mapping of the plugin's start() keyword "
                f"options, not {type(avatar_start_options).__name__}"
            )
        start_options = dict(avatar_start_options or {})
        if start_options and avatar is None:
            raise ValueError("avatar_start_options given without an avatar")
        if isinstance(avatar, AvatarSession):
            check_start_options(avatar, start_options)
        if on_reprompt is not None and (
            self.settings.playout is None or not self.settings.playout.reprompt
        ):
            raise ValueError(
                "on_reprompt given, but the watchdog is off: pass "
                "playout=PlayoutOptions(reprompt=True) too"
            )
        if otel is True and isinstance(inject.get("otel"), OtelSink):
            otel = inject["otel"]
        clock = clock or inject.get("clock") or AsyncioClock()
        tracer = tracer or inject.get("tracer")
        transport = transport or inject.get("transport")
        delete_room = delete_room or inject.get("delete_room")
        remove_avatar_participant = remove_avatar_participant or inject.get(
            "remove_avatar_participant"
        )
        # a factory-built plugin's start options are the last check: only then is the trace
        # file opened (truncated), the one thing construction changes outside this object
        self.avatar_error: str | None = None  # why the job runs without the avatar it was given
        plugin = self._build_avatar(avatar, start_options) if avatar is not None else None
        self._trace_file: JsonlSink | None = None
        if trace_path is not None:
            try:
                self._trace_file = JsonlSink(trace_path)
            except OSError as e:
                raise SettingError(
                    f"trace_path: cannot write the trace to {str(trace_path)!r}: {e}"
                ) from None
            # production traces: the JSONL `agent-runtime replay` reads, plus the logs
            tracer = Tracer(*(tracer.sinks if tracer else [LoggingSink()]), self._trace_file)
        self.otel: OtelSink | None = None
        if otel is not False:
            # the span current now (job_entrypoint inside a livekit job) takes the machines'
            # events whenever no session span is running
            self._otel_context = otel_context.get_current()
            self.otel = OtelSink() if otel is True else otel
            if self.otel.parent is None:
                self.otel.parent = self._otel_parent
            tracer = Tracer(*(tracer.sinks if tracer else []), self.otel)

        s = self.settings
        self.room = room
        self.session = session
        self.clock: Clock = clock
        self.tracer = tracer
        self.events = RoomEventAdapter(room)
        self.job = JobRuntime(
            room=room,
            clock=clock,
            tracer=tracer,
            transport=transport,
            simulation=simulation,
            on_simulation_end=on_simulation_end,
            session_end_timeout=s.session_end_timeout,
            close_timeout=s.close_timeout,
            delete_room_on_close=s.delete_room_on_close,
            delete_room=delete_room,
            room_events=self.events,
            before_disconnect=self._close_session_and_avatar,
        )
        self.job.primary = session
        self.link = ParticipantLink(
            session,
            room_events=self.events,
            participant_identity=s.participant_identity,
            participant_kinds=s.participant_kinds,
            close_on_disconnect=s.close_on_disconnect,
            closing_reasons=s.closing_reasons,
            grace_period=s.grace_period,
            session_close_timeout=s.session_close_timeout,
            clock=clock,
            tracer=tracer,
            wiring=self.job.wiring,
        )
        self.avatar: AvatarLifecycle | None = None
        self._avatar_start_options = start_options
        if plugin is not None:
            self.avatar = AvatarLifecycle(
                plugin,
                join_timeout=s.join_timeout,
                retry=s.retry_avatar,
                clock=clock,
                tracer=tracer,
                room_events=self.events,
                # the job removes the avatar through the server API whether or not the
                # plugin's own close did
                remove_participant=remove_avatar_participant or server_api_remover(room),
            )
        # the agent's audio until heard, and the re-prompt watchdog (playout=...)
        self.playout: PlayoutTracker | None = None
        if s.playout is not None:
            self.playout = PlayoutTracker(
                session,
                options=s.playout,
                on_reprompt=on_reprompt,
                avatar=self.avatar,
                link=self.link,
                clock=clock,
                tracer=tracer,
                instance=room.name or "room",
                wiring=self.job.wiring,
            )
        self.close_reason: str | None = None  # the primary session's CloseReason, once closed
        self._live_route: Route = "none"
        self._actors: list[Actor] | None = None
        self._job_context: JobContext | None = None
        self._avatar_closing: asyncio.Task[None] | None = None
        # the parts of a start still running: the teardown cuts them
        self._starts: set[asyncio.Task[Any]] = set()
        # the job's own lifecycle (statemachines.agent_job): start, close and abort
        self.lifecycle_actor = Actor(
            AGENT_JOB,
            instance=room.name or "job",
            effects=Handlers(self, _EFFECTS),
            clock=clock,
            tracer=tracer,
        )
        self.lifecycle_actor.on("state_changed", self._forward_state)
        self.job.on("state_changed", self._forward_state)
        self.link.on("state_changed", self._forward_state)
        if self.avatar is not None:
            self.avatar.on("state_changed", self._forward_state)
            self.job.wiring.connect("avatar", self._post_avatar)
        if self.playout is not None:
            self.playout.on("state_changed", self._forward_state)
        self.job.on("closed", self._on_closed)
        # what every machine's warnings carry (the log policy: job, room, machine, ...);
        # one dict for all of them, so from_job_context's job id reaches each
        self._log_labels: dict[str, str] = {"job_id": "", "room": room.name}
        for actor in find_actors(
            self.job, self.link, self.avatar, self.playout, self.lifecycle_actor
        ):
            actor.labels = self._log_labels
        if tracer is not None:
            tracer.labels = self._log_labels

    def _build_avatar(
        self,
        avatar: AvatarPlugin,
        start_options: Mapping[str, Any],
    ) -> AvatarSession | None:  # type: ignore[type-arg]
        """The plugin, built by its factory when one was given. A factory that raises (a
        plugin whose service is gone, a provider key missing in this deployment) or builds
        something that is no ``AvatarSession`` is a fault of the run, not of the code: it
        is logged naming the plugin, and the job runs on room audio."""
        if isinstance(avatar, AvatarSession):
            return avatar
        try:
            built = avatar()
            check_plugin(built)
        except Exception as e:
            self.avatar_error = (
                f"avatar plugin {plugin_name(avatar)} could not be built "
                f"({type(e).__name__}: {e}); the agent runs on room audio"
            )
            logger.error("%s", self.avatar_error)
            return None
        check_start_options(built, start_options)  # the code's own mistake: refused
        return built

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
        ``options``. ``trace_path`` may contain ``{job_id}`` and ``{room}``. Found again by
        ``AgentJob.for_job(ctx)`` and by ``on_session_end``."""
        if ctx in _JOBS:
            raise RuntimeError("this job context already has an AgentJob")
        trace_path = options.get("trace_path")
        if isinstance(trace_path, str):
            try:
                options["trace_path"] = trace_path.format(job_id=ctx.job.id, room=ctx.room.name)
            except (KeyError, IndexError, ValueError) as e:
                raise SettingError(
                    f"trace_path: only {{job_id}} and {{room}} can be filled in ({e})"
                ) from None
        if options.get("simulation") is None:
            options["simulation"] = ctx.simulation_context()
        if options.get("on_simulation_end") is None:
            # where the job runner puts rtc_session(on_simulation_end=...)
            options["on_simulation_end"] = lk.job_simulation_end_fn(ctx)
        inject = _INJECTED.get() or {}
        if options.get("delete_room") is None and "delete_room" not in inject:

            async def delete_room() -> None:
                await ctx.delete_room()

            options["delete_room"] = delete_room
        job = cls(room=ctx.room, session=session, avatar=avatar, **options)
        job._job_context = ctx
        # the room is not connected yet (its name comes with the connection); the job has it
        job._log_labels.update(job_id=ctx.job.id, room=ctx.job.room.name or ctx.room.name)
        _JOBS[ctx] = job
        # the safety net when on_session_end was not passed: the job closes with livekit's
        # own shutdown (no hold then: the room is already disconnected)
        ctx.add_shutdown_callback(job._on_livekit_shutdown)
        return job

    @staticmethod
    def for_job(ctx: JobContext) -> AgentJob | None:
        """The ``AgentJob`` built for ``ctx``, until it closed."""
        return _JOBS.get(ctx)

    # -- state -------------------------------------------------------------------------------
    @property
    def states(self) -> dict[str, str]:
        """Every machine's current state, by machine name."""
        return {a.spec.name: a.state for a in self.actors}

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
        return route_of(self.session, self.avatar.installed_sink if self.avatar else None)

    @property
    def live_audio_route(self) -> Route:
        """Where the agent's audio went while its session was live, as last seen (the
        session's close tears its outputs down, so ``audio_route()`` is ``none`` after it):
        what a verdict about the run should look at."""
        if self._session_live():
            self._live_route = route_of(self.session)
        return self._live_route

    @property
    def actors(self) -> list[Actor]:
        """Every machine of the job (its actor), in ``MACHINES`` order."""
        if self._actors is None:
            # found once: each runtime builds its machines when it is built
            self._actors = find_actors(
                self.job, self.link, self.avatar, self.playout, self.lifecycle_actor
            )
        return self._actors

    def snapshot(self) -> JobSnapshot:
        """What every machine is doing now: its state, since when and the timer armed in it
        (times on the job's clock), with the audio route, the linked identity, the attached
        session and the finalize status. Plain JSON-able data; cheap enough to log with every
        request."""
        host = self.job.host
        attached = host.session
        return {
            "t": self.clock.now(),
            "room": self.room.name,
            "room_connected": self.room.isconnected(),
            "machines": machines_snapshot(self.actors),
            "audio_route": self.audio_route(),
            "linked_identity": self.link.linked_identity,
            "attached_session": host.label_of(attached) if attached is not None else None,
            "primary_session_attached": attached is self.session,
            "finalize": {
                "simulation": self.job.simulation is not None,
                "simulators": sorted(self.job.simulators),
                "hold_needed": self.job.hold_needed,
                "answered": self.job.finalize_answered,
                "verdict": self.job.verdict,
            },
            "close_reason": self.close_reason,
            "job_reason": self.job.reason,
            "room_deleted_at": self.job.room_deleted_at,
            "closed_at": self.job.closed_at,
        }

    # -- starting ----------------------------------------------------------------------------
    @property
    def lifecycle(self) -> str:
        """The job's own state: ``new``, ``starting``, ``running``, ``closing``, ``closed``."""
        return self.lifecycle_actor.state

    async def start(
        self, agent: Agent, *, room_options: NotGivenOr[RoomOptions] = NOT_GIVEN
    ) -> None:
        """Start everything: the job's runtime (room facts, the job machine, the session host
        with the session attached), the avatar (its route in before the session starts, as
        the plugins expect), the session, then the participant link.

        Refused (``RuntimeError``) while the job is already starting or started, or once it
        is closed; if the job is closed while this runs, this raises once the start is cut."""
        options = self._room_options(room_options)  # refuse before anything starts
        await self._begin("start")
        await self._run_part(self._start_all(agent, options), session=True)

    async def start_runtime(self) -> None:
        """Connect (inside a livekit job), follow the room, start the job machine and the
        session host. Idempotent; ``start()`` may follow it. The lifecycle moves on with the
        agent's own parts (``start``, ``start_avatar``, ``start_session``)."""
        if self.lifecycle in ("closing", "closed"):
            raise RuntimeError("this job is closed; build a new AgentJob")
        await self._run_part(self._start_runtime())

    async def start_avatar(self) -> None:
        """Start the avatar plugin through its lifecycle (before or after the session);
        returns once the outcome of the plugin's own start is handled."""
        if self.avatar is None:
            raise RuntimeError("this job has no avatar (pass avatar= to AgentJob)")
        await self._begin("start_part")
        await self._run_part(self._start_avatar())

    async def start_session(
        self, agent: Agent, *, room_options: NotGivenOr[RoomOptions] = NOT_GIVEN
    ) -> None:
        """Start the session on the room with the job's host and the machines' close rules,
        then link the participant."""
        options = self._room_options(room_options)
        await self._begin("start_part")
        await self._run_part(self._start_session(agent, options), session=True)

    async def _begin(self, event: str) -> None:
        """Ask the lifecycle for a start; its reject cells are the user's clear errors."""
        try:
            await self.lifecycle_actor.send(Event(event))
        except EventRejected:
            state = self.lifecycle_actor.state
            if state == "starting":
                raise RuntimeError("this job is already starting") from None
            if state == "running":
                raise RuntimeError("this job is already started") from None
            raise RuntimeError("this job is closed; build a new AgentJob") from None

    async def _run_part(self, work: Awaitable[None], *, session: bool = False) -> None:
        """Run one part of the start as a task the teardown can cut; its failure is the
        lifecycle's ``start_failed`` and is raised to the caller."""
        task = asyncio.ensure_future(work)
        self._starts.add(task)
        task.add_done_callback(self._starts.discard)
        try:
            await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if (me is not None and me.cancelling()) or not task.cancelled():
                raise  # the caller itself was cancelled
            raise RuntimeError("the job was closed before it finished starting") from None
        except Exception as e:
            ending = self.job.state in ("closing", "closed")  # the room went away meanwhile
            with contextlib.suppress(ActorClosed):
                await self.lifecycle_actor.send(
                    Event("start_failed", {"error": f"{type(e).__name__}: {e}"})
                )
            if ending:
                raise RuntimeError("the job was closed before it finished starting") from e
            raise
        if session:
            with contextlib.suppress(ActorClosed):
                await self.lifecycle_actor.send(Event("started"))

    async def _start_all(self, agent: Agent, options: RoomOptions) -> None:
        await self._start_runtime()
        if self.avatar is not None:
            await self._start_avatar()
        await self._start_session(agent, options)

    async def _start_runtime(self) -> None:
        if self.events.started:
            return
        if self._job_context is not None:
            await self._job_context.connect()
        self.events.start()
        self.session.on("close", self._on_session_close)
        await self.job.start()

    async def _start_avatar(self) -> None:
        assert self.avatar is not None
        await self._start_runtime()
        await self.avatar.start(self.session, self.room, **self._avatar_start_options)

    async def _start_session(self, agent: Agent, options: RoomOptions) -> None:
        if lk.session_started(self.session) or lk.session_closing_task(self.session):
            raise RuntimeError("the job's session is already started (or closed)")
        await self._start_runtime()
        # attached as it starts (until then a request gets "no active session"), before its
        # first event so every one of them is forwarded
        self.job.attach(self.session)
        if self.playout is not None:
            self.playout.start()  # before the session's first speech
        await self.session.start(agent, room=self.room, room_options=options, session_host=False)
        self._live_route = route_of(self.session)
        self.link.start()

    def attach(self, session: AgentSession[Any]) -> None:
        """Attach another session to the job's host (the previous one is detached; its
        events stop being forwarded). Its close then ends the job."""
        self.job.attach(session)

    def _room_options(self, given: NotGivenOr[RoomOptions]) -> RoomOptions:
        s = self.settings
        opts = copy.copy(given) if is_given(given) else RoomOptions()
        if not isinstance(opts, RoomOptions):
            raise TypeError(f"room_options must be a RoomOptions, not {type(opts).__name__}")
        if opts.delete_room_on_close:
            raise ValueError(
                "RoomOptions(delete_room_on_close=True) deletes the room as the session closes, "
                "before a simulator can ask for its verdict: pass delete_room_on_close=True to "
                "AgentJob instead (the room is deleted after the job's hold)"
            )
        if not opts.close_on_disconnect:
            raise ValueError(
                "RoomOptions(close_on_disconnect=False): pass close_on_disconnect=False to "
                "AgentJob instead (the participant machine decides what a departure means)"
            )
        if is_given(opts.participant_identity) and (
            opts.participant_identity != s.participant_identity
        ):
            raise ValueError(
                "RoomOptions.participant_identity: pass participant_identity= to AgentJob "
                "instead (the participant machine links that identity)"
            )
        if is_given(opts.participant_kinds):
            raise ValueError(
                "RoomOptions.participant_kinds: pass participant_kinds= to AgentJob instead"
            )
        opts.close_on_disconnect = False  # the participant machine decides
        opts.delete_room_on_close = False  # the job machine defers deletion past its hold
        opts.participant_identity = s.participant_identity or NOT_GIVEN
        opts.participant_kinds = [
            rtc.ParticipantKind.Value(f"PARTICIPANT_KIND_{k.upper()}") for k in s.participant_kinds
        ]
        return opts

    # -- ending ------------------------------------------------------------------------------
    def shutdown(self, reason: str = "") -> None:
        """Ask the job to end: it holds for the simulator if one can still ask, then closes."""
        self.job.shutdown(reason)

    def request_room_deletion(self) -> None:
        """Delete the room once the hold is over (what an end-call tool's delete_room does)."""
        self.job.request_room_deletion()

    def add_shutdown_callback(self, callback: ShutdownCallback) -> None:
        """Run ``callback(reason)`` (or ``callback()``) at the end of the job's close."""
        self.job.add_shutdown_callback(callback)

    async def wait_closed(self) -> None:
        """Wait until the job is closed and everything that followed it released."""
        await self.job.wait_closed()
        await self.lifecycle_actor.until(lambda state: state == "closed")

    async def aclose(self, *, graceful: bool = True) -> None:
        """Close the job. ``graceful`` (the default): shut down as ``shutdown()`` does,
        honouring the bounded hold. Otherwise the same teardown with no hold (an abort also
        ends a graceful close's hold). Either way this returns once every listener and task
        is released."""
        with contextlib.suppress(ActorClosed):
            await self.lifecycle_actor.send(Event("close" if graceful else "abort"))
        await self.lifecycle_actor.until(lambda state: state == "closed")
        # a deletion under way (asked for late) runs to its end or its bound first
        await self.job.deletion.aclose()

    # -- wiring --------------------------------------------------------------------------------
    def _otel_parent(self) -> otel_context.Context:
        """The context whose span takes the machines' events: the attached session's
        (``agent_session``) while it runs, else the one current when the job was built."""
        for session in (self.job.host.session, self.session):
            # the SDK keeps its session span's context there from start() to the close's end
            ctx = lk.session_span_context(session) if session is not None else None
            if ctx is not None:
                return ctx
        return self._otel_context

    def _session_live(self) -> bool:
        return lk.session_live(self.session)

    def _forward_state(self, sc: StateChanged) -> None:
        if sc.machine == "avatar" and self._session_live():
            self._live_route = route_of(self.session)  # only the avatar moves the route
        for event in watched(sc.machine, sc.source, sc.dest, "agent_job"):
            self.lifecycle_actor.post(Event(event))
        if sc.machine == "agent_job" and sc.dest == "closed":
            self._on_lifecycle_closed()
        try:
            self.emit("state_changed", sc)
        except Exception:
            # a listener's failure must not abort the machine's step that called it
            logger.exception("a state_changed listener failed")

    def _on_session_close(self, ev: CloseEvent) -> None:
        # the avatar goes with it through the job's links (statemachines.glue.LINKS)
        reason = getattr(ev, "reason", None)
        self.close_reason = self.close_reason or getattr(reason, "value", str(reason))

    def _post_avatar(self, event: Event) -> None:
        """An event the job's links send the avatar: its close is ``aclose()``."""
        if event.name == "close":
            self._close_avatar()
        elif self.avatar is not None and not self.avatar.actor.closed:
            self.avatar.actor.post(event)

    def _close_avatar(self) -> None:
        # the avatar goes with the session, while the room is still connected (its removal
        # goes through the server API only then)
        if self.avatar is not None and self._avatar_closing is None:
            self._avatar_closing = asyncio.get_running_loop().create_task(
                self.avatar.aclose(), name="AgentJob.avatar.aclose"
            )

    async def _close_session_and_avatar(self) -> None:
        """The part of the job's close that needs the room, run_close's session and avatar
        steps: the session (when the job ends for another reason, e.g. the simulator left),
        then the avatar, whose close the avatar step's link asks.

        In livekit's order: the session's close first (its speech ends on the route it has,
        and its close event closes the avatar), then the avatar, so the avatar's restore
        never builds a room track for a session that is going away. A session whose close
        is still running after half of this step's bound no longer holds the avatar's close
        back (the avatar must leave while the room is connected)."""
        if lk.session_live(self.session):
            lk.ask_session_close(self.session, CloseReason.JOB_SHUTDOWN)
        task = lk.session_closing_task(self.session)
        if task is not None and not task.done():
            with contextlib.suppress(Exception):  # a failed close is the session's to log
                await self.clock.wait_for(
                    asyncio.shield(task), bound_of("session", self.settings.close_timeout)
                )
        self.job.wiring.fire("job", "run_close", step="avatar")
        closing: list[Awaitable[Any]] = []
        if task is not None and not task.done():
            closing.append(asyncio.shield(task))
        if self._avatar_closing is not None:
            closing.append(asyncio.shield(self._avatar_closing))
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)

    # -- the lifecycle's effects --------------------------------------------------------------
    # the job machine hears them through the declared links (statemachines.glue.LINKS)
    def _fx_ask_shutdown(self, _ev: Event) -> None:
        self.job.wiring.fire("agent_job", "ask_shutdown", {"reason": "job closed"})

    def _fx_ask_abort(self, _ev: Event) -> None:
        self.job.wiring.fire("agent_job", "ask_abort", {"reason": "aborted"})

    async def _fx_run_teardown(self, _ev: Event) -> Event:
        """``closing``'s task: statemachines.system.RELEASE, each step bounded."""
        bound = self.settings.close_timeout
        starts = [t for t in self._starts if not t.done()]
        for t in starts:
            t.cancel()
        if starts:
            await self._bounded("starts", asyncio.gather(*starts, return_exceptions=True), bound)
        # the job machine's own timers bound its hold and its close (TEARDOWN)
        await self.job.wait_closed()
        try:
            await self._bounded("followers", self._release_followers(), bound)
        finally:
            # whatever the followers' step was cut at: the job runtime and the room are let go
            await self.job.release()
            self._unhook()
        return Event("released")

    async def _bounded(self, step: str, work: Awaitable[Any], close_timeout: float) -> None:
        seconds = bound_of(step, close_timeout)
        try:
            await self.clock.wait_for(work, seconds)
        except TimeoutError:
            logger.warning(
                "job %s: the teardown's %r step took longer than %gs; cut off, the next runs",
                self.room.name,
                step,
                seconds,
            )
        except Exception:
            logger.exception("job %s: the teardown's %r step failed", self.room.name, step)

    async def _release_followers(self) -> None:
        """What follows the room and the session stops: the link, playout, the avatar (each
        close runs once, whoever asked first)."""
        # what run_close's callbacks step closes, as its links declare (fired again when
        # the job's bound cut its close: each close runs once)
        self.job.wiring.fire("job", "run_close", step="callbacks")
        if lk.session_live(self.session):
            # the job's bound cut its close before the session's step: a closed job leaves
            # no session running (its close is the session's own; not waited for here)
            lk.ask_session_close(self.session, CloseReason.JOB_SHUTDOWN)
        if self.playout is not None:
            await self.playout.aclose()
        await self.link.aclose()
        if self._avatar_closing is not None:
            await asyncio.gather(asyncio.shield(self._avatar_closing), return_exceptions=True)

    def _unhook(self) -> None:
        self.session.off("close", self._on_session_close)
        self.events.aclose()
        if self._job_context is not None:
            _JOBS.pop(self._job_context, None)

    def _on_lifecycle_closed(self) -> None:
        # after the lifecycle's own last transition is written
        if self.otel is not None:
            self.otel.close()  # every machine is closed: a state span still open was abandoned
        if self._trace_file is not None:
            self._trace_file.close()

    def _on_closed(self, t: float | None) -> None:
        logger.info("job closed (%s)", self.job.reason or "no reason given")
        if self._job_context is not None:
            _JOBS.pop(self._job_context, None)
        self._emit_closed(t)

    def _emit_closed(self, t: float | None) -> None:
        try:
            self.emit("closed", t)
        except Exception:
            logger.exception("a closed listener failed")

    async def _on_livekit_shutdown(self, reason: str) -> None:
        self.shutdown(reason)
        await self.wait_closed()


async def on_session_end(ctx: JobContext) -> None:
    """Pass to ``AgentServer.rtc_session(..., on_session_end=on_session_end)``.

    livekit-agents calls it after the primary session closed and before it disconnects the
    room: the job shuts down here, holding for the simulator's finalize (bounded by
    ``session_end_timeout``), and this returns once the job is ``closed``.
    """
    job = _JOBS.get(ctx)
    if job is None:
        logger.info("on_session_end: no live AgentJob for this job (none made, or closed)")
        return
    job.shutdown("session ended")
    await job.wait_closed()


def session_end_hook(
    then: Callable[[JobContext], Any] | None = None,
) -> Callable[[JobContext], Awaitable[None]]:
    """``on_session_end`` followed by your own session-end callback ``then(ctx)``."""
    if then is not None and not callable(then):
        raise TypeError("then must be callable")

    async def hook(ctx: JobContext) -> None:
        await on_session_end(ctx)
        if then is not None:
            res = then(ctx)
            if inspect.isawaitable(res):
                await res

    return hook


# the lifecycle's handlers, shared by every job (Handlers binds them to one)
_EFFECTS = effect_table(AgentJob, AGENT_JOB)
