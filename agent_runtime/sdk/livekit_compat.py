"""The one module that reads livekit-agents' private names.

The runtime needs a few facts and one action the SDK (1.8.x) keeps private: whether a
session started or is closing, closing it without waiting, the span its events belong to,
RoomIO's options, the sink internals an avatar route needs. The testing kit and the tools
need a few more to stand in for the server and the job runner: a session's user state and
the end of its close, the hooks an ``AgentServer`` keeps, a fake job context's parts, and
the room's and participants' state an embedded room sets as the SFU would. Each is named
here, typed, and tested against the pinned SDK (``tests/test_livekit_compat.py``): an SDK
upgrade is this file to read, and its test to run.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from livekit import api, rtc
from livekit.agents import AgentSession, CloseReason
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.utils import http_context
from livekit.agents.voice.io import AudioOutput
from livekit.agents.voice.room_io import AudioOutputOptions
from livekit.agents.voice.room_io._output import _ParticipantAudioOutput

# the protobuf messages rtc's objects are built from (an embedded room builds them too;
# named again so that they are this module's to export)
from livekit.rtc._proto import participant_pb2 as participant_pb2
from livekit.rtc._proto import room_pb2 as room_pb2
from livekit.rtc._proto import track_pb2 as track_pb2
from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from livekit.agents.job import JobContext
    from livekit.agents.simulation import SimulationVerdict
    from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
    from livekit.agents.voice.events import UserState
    from livekit.agents.voice.room_io import RoomIO
    from livekit.protocol import agent_simulation as sim_pb


# -- the session ------------------------------------------------------------------------------
def session_started(session: AgentSession[Any]) -> bool:
    """``start()`` ran (whether or not it has closed since)."""
    return bool(session._started)


def session_closing_task(session: AgentSession[Any]) -> asyncio.Task[None] | None:
    """The session's own close, once asked (by anyone)."""
    task: asyncio.Task[None] | None = getattr(session, "_closing_task", None)
    return task


def session_live(session: AgentSession[Any]) -> bool:
    """Started and not closing."""
    return session_started(session) and session_closing_task(session) is None


def session_text_only(session: AgentSession[Any] | None) -> bool:
    """The session runs under a text simulation: livekit gives it no audio I/O (and no
    STT, TTS or VAD). Read from the job context of the task that asks."""
    return session is not None and session._text_only


def ask_session_close(session: AgentSession[Any], reason: CloseReason) -> None:
    """Ask the session to close with ``reason`` without waiting for it (what RoomIO does
    when the linked participant leaves); a close already under way is left as it is."""
    session._close_soon(reason=reason)


def session_half_started(session: AgentSession[Any]) -> bool:
    """A ``start()`` began and did not finish (it was cut, or it raised) and left what it
    had begun behind: RoomIO (its room listeners, its tasks, the inputs and outputs it gave
    the session) or the agent's activity. livekit's ``start()`` only cancels the tasks it
    was awaiting when it fails, and its ``aclose()`` does nothing for a session that is not
    ``_started``. A close asked and still running is not this (that close owns them)."""
    if session._started or (session._room_io is None and session._activity is None):
        return False
    closing = session_closing_task(session)
    return closing is None or closing.done()


async def release_half_started(session: AgentSession[Any]) -> None:
    """Release what a start that did not finish left behind (``session_half_started``),
    as livekit's own close would for a started session: RoomIO first (the inputs and
    outputs it attached detached, its listeners and tasks gone), then the activity's
    teardown, then the session's ``agent_session`` span. Under the session's lock, as
    livekit's start and close run: a start still running is waited for, and a session that
    started meanwhile is left as it is."""
    async with session._lock:
        if not session_half_started(session):
            return
        room_io, session._room_io = session._room_io, None
        if room_io is not None:
            attached = (
                (session.input, "audio", room_io.audio_input),
                (session.input, "video", room_io.video_input),
                (session.output, "audio", room_io.audio_output),
                (session.output, "transcription", room_io.transcription_output),
            )
            for side, name, own in attached:
                if own is not None and getattr(side, name) is own:
                    setattr(side, name, None)
            await room_io.aclose()
        await session._teardown_activity(reason=CloseReason.JOB_SHUTDOWN, drain=False)
        # the span the start opened is ended as livekit's close ends it: an open span is
        # never exported
        span, session._session_span = session._session_span, None
        if span is not None:
            span.end()
            session._root_span_context = None  # the job's later records go to its own parent


def set_user_state(session: AgentSession[Any], state: UserState) -> None:
    """Set the user's state (``speaking``, ``listening``, ``away``) as the session's audio
    recognition does, ``user_state_changed`` and all."""
    session._update_user_state(state)


def session_span_context(session: AgentSession[Any]) -> otel_context.Context | None:
    """The context of the session's ``agent_session`` span, from ``start()`` to the end of
    its close."""
    ctx: otel_context.Context | None = getattr(session, "_root_span_context", None)
    return ctx


def session_runs_own_host(session: AgentSession[Any]) -> bool:
    """The session made its own session host (started with ``session_host`` allowed)."""
    return getattr(session, "_session_host", None) is not None


def room_io_closes_on_disconnect(room_io: Any) -> bool:
    """RoomIO was started with ``close_on_disconnect`` on."""
    return bool(getattr(getattr(room_io, "_options", None), "close_on_disconnect", False))


def after_room_io_pick(room_io: Any, then: Callable[[], None]) -> asyncio.Future[None] | None:
    """Run ``then`` once RoomIO's start-up task has taken the participant it picked.

    RoomIO picks its first participant in a room callback (it resolves the future its
    start-up task waits on) and links it on that task's next step. Picked and not yet
    taken, ``then`` is a callback of that same future: asyncio runs a future's callbacks in
    the order they were added, so the task's wake-up (added when it began waiting) runs
    first. Returns what is done once ``then`` ran; None when it ran now (nothing picked is
    pending)."""
    init = getattr(room_io, "_init_atask", None)
    picked = getattr(room_io, "_participant_available_fut", None)
    if init is None or init.done() or not isinstance(picked, asyncio.Future) or not picked.done():
        then()
        return None
    ran: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def run(_: object) -> None:
        try:
            then()
        except Exception as e:
            ran.set_exception(e)
        else:
            ran.set_result(None)

    picked.add_done_callback(run)
    return ran


# -- the job -----------------------------------------------------------------------------------
def job_simulation_end_fn(ctx: JobContext) -> Callable[..., Any] | None:
    """The ``on_simulation_end`` given to ``AgentServer.rtc_session``, where the job runner
    keeps it."""
    return cast("Callable[..., Any] | None", getattr(ctx, "_simulation_end_fnc", None))


def set_job_simulation_end_fn(ctx: JobContext, fn: Callable[..., Any] | None) -> None:
    """Give a job context the ``on_simulation_end`` the job runner would have given it."""
    ctx._simulation_end_fnc = fn


def bind_job_http(context: contextvars.Context) -> bool:
    """Give ``context`` the per-job HTTP session livekit's job runner binds before the
    entrypoint (what plugins' ``utils.http_context.http_session()`` returns); False when
    one is bound there already (a test's own ``http_context.open()``: left to it)."""
    if context.get(http_context._ContextVar, None) is not None:
        return False
    context.run(http_context._new_session_ctx)
    return True


async def close_job_http(context: contextvars.Context) -> None:
    """Close the session ``bind_job_http`` bound, as the job runner does after the job."""
    await asyncio.get_running_loop().create_task(http_context._close_http_ctx(), context=context)


def give_job_token(ctx: JobContext, identity: str, room: str) -> None:
    """livekit's ``fake_job_context`` leaves the job's token empty, so
    ``ctx.local_participant_identity`` (which avatar plugins read to name their
    ``lk.publish_on_behalf``) fails on it: give the job the agent token a worker would have
    got, for ``identity`` in ``room``. livekit reads it without checking its signature; the
    key and secret are placeholders."""
    grants = api.VideoGrants(room_join=True, room=room, agent=True)
    ctx._info.token = (
        api.AccessToken("test-key", "test-secret-placeholder-of-32-bytes")
        .with_identity(identity)
        .with_kind("agent")
        .with_grants(grants)
        .to_jwt()
    )


async def outside_job_context(aw: Awaitable[Any]) -> Any:
    """Await ``aw`` with no job context current: livekit's ``AvatarSession.aclose()`` then
    leaves the avatar participant's removal to its caller instead of the server API."""
    from livekit.agents.job import _JobContextVar

    token = _JobContextVar.set(cast("JobContext", None))
    try:
        return await aw
    finally:
        _JobContextVar.reset(token)


def release_job_context(ctx: JobContext) -> None:
    """Remove the job context's temporary directory (the job runner's cleanup does, after
    the job; a job context made outside a job runner has nobody else to)."""
    ctx._tempdir.cleanup()


class ServerHooks(NamedTuple):
    """What an ``AgentServer`` keeps from ``@server.rtc_session(...)``."""

    entrypoint: Callable[[JobContext], Awaitable[None]] | None
    session_end: Callable[[JobContext], Awaitable[None]] | None
    simulation_end: Callable[..., Any] | None


def server_hooks(server: object) -> ServerHooks | None:
    """The entrypoint and hooks ``server`` keeps, or None when it is not an
    ``AgentServer`` (say, a bare entrypoint function)."""
    if not hasattr(server, "_entrypoint_fnc") and not hasattr(server, "_session_end_fnc"):
        return None
    return ServerHooks(
        getattr(server, "_entrypoint_fnc", None),
        getattr(server, "_session_end_fnc", None),
        getattr(server, "_simulation_end_fnc", None),
    )


def begin_finalize(
    sim: SimulationContext, verdict: SimulationVerdict, run: sim_pb.SimulationRun
) -> None:
    """Give the simulation context the simulator's provisional verdict and its run, before
    ``on_simulation_end`` reads them (what the SDK's own remote session does)."""
    sim._begin_finalize(simulator_verdict=verdict, run=run)


# -- audio outputs and the avatar's data-stream sink --------------------------------------------
def pending_playbacks(out: AudioOutput) -> int:
    """Segments captured and not yet reported finished (the base class's count)."""
    return int(out._pending_playback_count)


def segment_open(out: AudioOutput) -> bool:
    """A segment is being captured (its first frame came, its ``flush()`` not yet)."""
    return bool(out._AudioOutput__capturing)  # type: ignore[attr-defined]


def ended_unreported(out: AudioOutput) -> int:
    """Segments whose ``flush()`` came and that are not reported finished."""
    return pending_playbacks(out) - segment_open(out)


def pushed_seconds(out: AudioOutput) -> float:
    """The seconds of audio the sink pushed of its last segment (0 where it keeps no count)."""
    return float(getattr(out, "_pushed_duration", 0.0) or 0.0)


def user_away_armed(session: AgentSession[Any]) -> bool:
    """Whether the session's user-away timer runs (armed once both sides listen)."""
    return session._user_away_timer is not None


def sink_takes_frames(sink: AudioOutput) -> bool:
    """Whether a frame handed to ``sink`` reaches it: a ``DataStreamAudioOutput`` only once
    its start (its wait for the avatar) is done; any other output at once."""
    from livekit.agents.voice.avatar import DataStreamAudioOutput

    return not isinstance(sink, DataStreamAudioOutput) or bool(sink._started)


def restart_failed_sink(sink: AudioOutput) -> bool:
    """Let a ``DataStreamAudioOutput`` whose start failed (its avatar left while the sink
    waited for it) start again at its next frame, as a new one would: livekit's sink keeps
    that failed start and raises it at every frame after. True when it had failed."""
    from livekit.agents.voice.avatar import DataStreamAudioOutput

    task = sink._start_atask if isinstance(sink, DataStreamAudioOutput) else None
    if not isinstance(task, asyncio.Task) or not task.done():
        return False
    if not task.cancelled() and task.exception() is None:
        return False  # started: nothing to do
    sink._start_atask = None  # type: ignore[attr-defined]
    return True


def keep_sink_off_the_playback_rpc(sink: DataStreamAudioOutput, noop: Callable[..., None]) -> None:
    """Keep ``sink`` from registering its own ``lk.playback_finished`` handler when the room
    connects (it would replace the runtime's)."""
    sink._register_playback_finished_rpc = noop  # type: ignore[method-assign]


SINK_REGISTRATION = "_register_playback_finished_rpc"  # what the above sets on the instance


def let_sink_register_the_playback_rpc(sink: AudioOutput) -> None:
    """Undo ``keep_sink_off_the_playback_rpc`` (nothing if it was never done)."""
    vars(sink).pop(SINK_REGISTRATION, None)


def sink_destination(sink: DataStreamAudioOutput) -> str:
    """The identity a data-stream sink streams to, and accepts ``lk.playback_finished``
    from (not always the avatar participant's)."""
    return str(sink._destination_identity)


def sink_clear_task(out: AudioOutput) -> asyncio.Task[None] | None:
    """The clear a data-stream sink is still held by (its ``lk.clear_buffer`` and the wait
    for the avatar's answer); None when there is none, it is over, or the output keeps none."""
    task = getattr(out, "_clear_buffer_atask", None)
    return task if isinstance(task, asyncio.Task) and not task.done() else None


def avatar_join_task(avatar: AvatarSession[Any]) -> asyncio.Task[None] | None:
    """The plugin base class's wait for its avatar participant to join, while it runs."""
    task = getattr(avatar, "_wait_avatar_join_task", None)
    return task if isinstance(task, asyncio.Task) and not task.done() else None


# RoomIO's audio output to the room (a private class of the SDK's)
RoomAudioOutput = _ParticipantAudioOutput


def room_io_audio_output(room_io: RoomIO) -> RoomAudioOutput | None:
    """RoomIO's own audio output to the room; None when it was built without one
    (``session.start()`` turns it off when ``output.audio`` is already set)."""
    out = getattr(room_io, "_audio_output", None)
    return out if isinstance(out, RoomAudioOutput) else None


def new_room_audio_output(room: rtc.Room) -> RoomAudioOutput:
    """A room audio output like the one RoomIO builds, with RoomIO's defaults."""
    opts = AudioOutputOptions()
    return RoomAudioOutput(
        room,
        sample_rate=opts.sample_rate,
        num_channels=opts.num_channels,
        track_publish_options=opts.track_publish_options,
        track_name="roomio_audio",
    )


def rpc_handlers(local_participant: Any) -> Mapping[str, Any] | None:
    """The local participant's registered RPC handlers, by method name."""
    return cast("Mapping[str, Any] | None", getattr(local_participant, "_rpc_handlers", None))


def rpc_handler(local_participant: Any, method: str) -> Any:
    """The handler registered for ``method`` now (None when there is none)."""
    handlers = rpc_handlers(local_participant)
    return handlers.get(method) if handlers is not None else None


def sink_connection_listener(sink: DataStreamAudioOutput) -> Callable[..., Any]:
    """The room listener a data-stream sink adds (``connection_state_changed``)."""
    return cast("Callable[..., Any]", sink._handle_connection_state_changed)


def sink_start_wait(sink: DataStreamAudioOutput) -> asyncio.Task[Any] | None:
    """The sink's wait for its avatar (its start), while it runs."""
    task = sink._start_atask
    return task if isinstance(task, asyncio.Task) and not task.done() else None


def sink_waits(sink: DataStreamAudioOutput) -> list[asyncio.Task[Any]]:
    """The sink's own tasks: its wait for the avatar, and a clear still holding it."""
    return [t for t in (sink._start_atask, sink._clear_buffer_atask) if t is not None]


# -- the room's state, as the SFU would set it (what an embedded room needs) --------------------
def set_room_info(room: rtc.Room, info: room_pb2.RoomInfo) -> None:
    """The room's info (its name, ...) as the server sends it on connect."""
    room._info = info


def set_connection_state(room: rtc.Room, state: rtc.ConnectionState.ValueType) -> None:
    """The room's connection state (``room.connection_state``), as the SDK sets it from the
    server's events; nothing is emitted."""
    room._connection_state = state


def room_participants(room: rtc.Room) -> dict[str, rtc.RemoteParticipant]:
    """The room's table of remote participants by identity, to change in place
    (``room.remote_participants`` is a read-only view of it)."""
    return room._remote_participants


def participant_info(participant: rtc.Participant) -> participant_pb2.ParticipantInfo:
    """The participant's info (state, attributes, disconnect reason), to change in place."""
    return participant._info


def participant_publications(
    participant: rtc.RemoteParticipant,
) -> dict[str, rtc.RemoteTrackPublication]:
    """The participant's publications by sid, to change in place."""
    return participant._track_publications


def publication_info(publication: rtc.TrackPublication) -> track_pb2.TrackPublicationInfo:
    """The publication's info (``muted``, ...), to change in place."""
    return publication._info


def listeners(emitter: rtc.EventEmitter[Any]) -> Mapping[Any, Collection[Callable[..., Any]]]:
    """The callbacks registered on a livekit emitter (a room, a session), by event."""
    return cast("Mapping[Any, Collection[Callable[..., Any]]]", emitter._events)


# -- the job process's shutdown, as the testing kit runs it (ipc/job_proc_lazy_main.py) --------
def job_primary_session(ctx: JobContext) -> AgentSession[Any] | None:
    """The session livekit closes first when the job shuts down (the first one started)."""
    return cast("AgentSession[Any] | None", getattr(ctx, "_primary_agent_session", None))


def job_shutdown_callbacks(ctx: JobContext) -> list[Callable[[str], Any]]:
    """The callbacks ``ctx.add_shutdown_callback`` collected, each taking the reason."""
    return list(getattr(ctx, "_shutdown_callbacks", ()))


def set_job_shutdown_hook(ctx: JobContext, hook: Callable[[str], None]) -> Callable[[str], None]:
    """Make ``hook`` what ``ctx.shutdown(reason)`` calls (the job process's shutdown; a fake
    job's does nothing); returns what it called before."""
    before, ctx._on_shutdown = ctx._on_shutdown, hook
    return before


def job_simulator_left(ctx: JobContext) -> Callable[[rtc.RemoteParticipant], None]:
    """The room listener ``ctx.connect()`` adds: the job shuts down when the simulator
    leaves (a fake job context, connected from the start, never adds it)."""
    return cast("Callable[[rtc.RemoteParticipant], None]", ctx._on_simulator_disconnected)


async def job_session_report(ctx: JobContext) -> None:
    """The job's session report (and its upload, when the job has somewhere to send it)."""
    await ctx._on_session_end()


def server_session_end_timeout(server: Any) -> float:
    """``AgentServer(session_end_timeout=...)``: the bound livekit puts on ``on_session_end``."""
    return float(getattr(server, "_session_end_timeout", 300.0))


def server_initialize_process_timeout(server: Any) -> float:
    """``AgentServer(initialize_process_timeout=...)``: how long a worker waits for a job
    process to initialize (its prewarm, ``setup_fnc``) before it gives up on it."""
    return float(getattr(server, "_initialize_process_timeout", 10.0))


def server_shutdown_process_timeout(server: Any) -> float:
    """``AgentServer(shutdown_process_timeout=...)``: how long a worker's shutdown waits for
    a job process before it kills it."""
    return float(getattr(server, "_shutdown_process_timeout", 10.0))


def emitter_listeners(emitter: rtc.EventEmitter[Any]) -> list[tuple[Any, Callable[..., Any]]]:
    """Every ``(event, callback)`` registered on a livekit emitter, flattened."""
    return [(event, cb) for event, cbs in listeners(emitter).items() for cb in cbs]


def simulation_context(
    simulation: SimulationContext | SimulationDispatch | None,
    job_ctx: JobContext | None = None,
) -> SimulationContext | None:
    """A ``SimulationContext`` from either a context or a ``SimulationDispatch``.

    Built from a dispatch outside a job (a bare room), ``job_context`` is ``None``.
    """
    if simulation is None or isinstance(simulation, SimulationContext):
        return simulation
    if isinstance(simulation, SimulationDispatch):
        if not simulation.simulation_run_id:
            raise ValueError("a SimulationDispatch needs a simulation_run_id")
        return SimulationContext(simulation, cast("JobContext", job_ctx))
    raise TypeError(
        "simulation must be a SimulationContext, a SimulationDispatch or None, "
        f"not {type(simulation).__name__}"
    )
