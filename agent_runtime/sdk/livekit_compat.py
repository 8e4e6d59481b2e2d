"""The one module that reads livekit-agents' private names.

The runtime needs a few facts and one action the SDK (1.8.x) keeps private: whether a
session started or is closing, closing it without waiting, the span its events belong to,
RoomIO's options, the sink internals an avatar route needs. Each is named here, typed, and
tested against the pinned SDK (``tests/test_livekit_compat.py``): an SDK upgrade is this
file to read, and its test to run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from livekit import rtc
from livekit.agents import AgentSession, CloseReason
from livekit.agents.voice.io import AudioOutput
from livekit.agents.voice.room_io import AudioOutputOptions
from livekit.agents.voice.room_io._output import _ParticipantAudioOutput
from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from livekit.agents.job import JobContext
    from livekit.agents.simulation import SimulationContext, SimulationVerdict
    from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
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


def ask_session_close(session: AgentSession[Any], reason: CloseReason) -> None:
    """Ask the session to close with ``reason`` without waiting for it (what RoomIO does
    when the linked participant leaves); a close already under way is left as it is."""
    session._close_soon(reason=reason)


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


# -- the job -----------------------------------------------------------------------------------
def job_simulation_end_fn(ctx: JobContext) -> Callable[..., Any] | None:
    """The ``on_simulation_end`` given to ``AgentServer.rtc_session``, where the job runner
    keeps it."""
    return cast("Callable[..., Any] | None", getattr(ctx, "_simulation_end_fnc", None))


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


def sink_waits(sink: DataStreamAudioOutput) -> list[asyncio.Task[Any]]:
    """The sink's own tasks: its wait for the avatar, and a clear still holding it."""
    return [t for t in (sink._start_atask, sink._clear_buffer_atask) if t is not None]


# -- the job process's shutdown, as the testing kit runs it (ipc/job_proc_lazy_main.py) --------
def job_primary_session(ctx: JobContext) -> AgentSession[Any] | None:
    """The session livekit closes first when the job shuts down (the first one started)."""
    return cast("AgentSession[Any] | None", getattr(ctx, "_primary_agent_session", None))


def job_shutdown_callbacks(ctx: JobContext) -> list[Callable[[str], Any]]:
    """The callbacks ``ctx.add_shutdown_callback`` collected, each taking the reason."""
    return list(getattr(ctx, "_shutdown_callbacks", ()))


def set_job_shutdown_hook(ctx: JobContext, hook: Callable[[str], None]) -> None:
    """What ``ctx.shutdown(reason)`` calls (the job process's shutdown; a fake job's does
    nothing)."""
    ctx._on_shutdown = hook


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


def set_user_state(session: AgentSession[Any], state: str) -> None:
    """The session's user state, set as its voice activity detection sets it."""
    session._update_user_state(state)  # type: ignore[arg-type]


def emitter_listeners(emitter: Any) -> list[tuple[str, Callable[..., Any]]]:
    """Every ``(event, callback)`` registered on a livekit ``EventEmitter`` (a room)."""
    events: dict[str, Any] = getattr(emitter, "_events", {})
    return [(event, cb) for event, cbs in events.items() for cb in cbs]
