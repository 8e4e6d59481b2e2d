"""A composed job for the property tests and the bad-input table (no tests here).

What runs is the real runtime, wired as ``agent_runtime.testing.runner`` wires it: ``JobRuntime``
(job + session host), ``ParticipantLink``, ``AvatarLifecycle`` around a scripted plugin,
real ``AgentSession``s on an ``InMemoryRoom``, a ``VirtualClock``, and the simulator's end
of a paired ``InMemorySessionTransport`` carrying the real protobuf messages. Stood in,
because they need a server: the SFU side of the room, the transport's byte stream, room
deletion and the avatar participant's removal (both server API calls).

Faults are injected where a deployment has them: room deletion, shutdown callbacks,
``on_simulation_end``, the plugin's ``start()`` and the avatar's removal can each raise or
hang forever, and a ``state_changed`` listener can raise. The world records what a user
would notice: replies the simulator got, when the room was deleted and in which job state,
which RPCs went out and in which avatar state, and every failure that escaped a room
callback, a task or a logger at ERROR.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import types
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.api import TwirpError
from livekit.protocol.agent_pb import agent_session as agent_pb
from livekit.rtc._proto import participant_pb2, track_pb2

from agent_runtime.actor import Actor
from agent_runtime.observe.trace import MemorySink, Tracer, TraceRecord
from agent_runtime.runtimes.avatar import _HANDED_OFF, AvatarLifecycle
from agent_runtime.runtimes.participant import ParticipantLink
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.invariants.checks import LIVE_JOB
from agent_runtime.testing.invariants.observe import Observed, runtime_view, session_state
from agent_runtime.testing.invariants.observe import Sent as Finalize
from agent_runtime.testing.invariants.view import JobView
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.testing.wire import build_request

AVATAR = "avatar-1"
USER = "user"
SIMULATOR = "sim"
# identity -> (kind, attributes) of everyone who may join besides the avatar
PEOPLE: dict[str, tuple[str, dict[str, str]]] = {
    USER: ("standard", {}),
    "user-2": ("standard", {}),
    SIMULATOR: ("standard", {ATTRIBUTE_SIMULATOR: "1"}),
    "sip-1": ("sip", {}),
}
VETO = "the orders table does not match"

Mode = Literal["ok", "raise", "hang"]


@dataclass(frozen=True)
class Faults:
    delete_room: Mode = "ok"
    shutdown_callback: Literal["none", "ok", "raise", "hang"] = "none"
    simulation_end: Literal["ok", "veto", "raise", "hang"] = "veto"
    # swallow: the provider's error caught and logged, no route installed (simli)
    plugin_start: Literal["ok", "raise", "raise_after_route", "swallow", "hang"] = "ok"
    remove_avatar: Literal["ok", "not_found", "raise", "hang"] = "ok"
    state_listener: Literal["ok", "raise"] = "ok"


@dataclass(frozen=True)
class Config:
    simulation: bool = True
    avatar: bool = True
    connected: bool = True
    delete_room_on_close: bool = False
    close_on_disconnect: bool = True
    participant_identity: str | None = None
    retry_avatar: bool | dict[str, Any] = False  # AgentJob's retry_avatar: flag or policy
    grace_period: float = 5.0
    session_end_timeout: float = 30.0
    close_timeout: float = 5.0
    join_timeout: float = 10.0
    faults: Faults = Faults()

    @property
    def shutdown_bound(self) -> float:
        """Virtual seconds from leaving ``serving`` to ``closed``, at most."""
        return self.session_end_timeout + self.close_timeout


class InjectedFault(RuntimeError):
    """A failure the test put there on purpose."""


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


class FaultyAvatar(ScriptedAvatar):
    """The scripted plugin, whose ``start()`` can also hang forever (a provider that never
    answers)."""

    def __init__(self, *, hang: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.hang = hang

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        if self.hang:
            self.start_calls += 1
            await _forever()
        await super().start(agent_session, room)


@dataclass
class Sent:
    """A session request the simulator sent, and what the job was doing then."""

    kind: str
    payload: dict[str, Any]
    job_state: str
    delivered: bool  # the transport took it
    caller: str = SIMULATOR
    simulator: bool = True  # the job knew its sender as carrying lk.simulator


@dataclass
class Problems:
    """What a user should never see; each list must stay empty."""

    escaped_callbacks: list[str] = field(default_factory=list)
    loop_errors: list[str] = field(default_factory=list)
    error_logs: list[str] = field(default_factory=list)


def _from_livekit(context: dict[str, Any]) -> bool:
    """A failure of one of the SDK's own background tasks (see simulator.py: they fail once
    the room disconnects, which is expected here)."""
    task = context.get("future") or context.get("task")
    get_coro = getattr(task, "get_coro", None)
    code = getattr(get_coro(), "cr_code", None) if get_coro is not None else None
    return "/livekit/" in getattr(code, "co_filename", "").replace("\\", "/")


class _Capture(logging.Handler):
    def __init__(self, sink: list[logging.LogRecord]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record)


def stranger(identity: str, *, attributes: dict[str, str] | None = None) -> rtc.RemoteParticipant:
    """A participant object the room never had (the SFU never reports one; a test does)."""
    info = participant_pb2.ParticipantInfo(
        identity=identity, sid="PA_unknown", attributes=dict(attributes or {})
    )
    return rtc.RemoteParticipant(participant_pb2.OwnedParticipant(info=info))


def stranger_track(kind: str) -> rtc.RemoteTrackPublication:
    k = track_pb2.TrackKind.KIND_VIDEO if kind == "video" else track_pb2.TrackKind.KIND_AUDIO
    info = track_pb2.TrackPublicationInfo(sid="TR_unknown", kind=k)
    return rtc.RemoteTrackPublication(track_pb2.OwnedTrackPublication(info=info))


async def frames(n: int, *, rate: int = 24000) -> AsyncIterator[rtc.AudioFrame]:
    per = rate // 100
    for _ in range(n):
        yield rtc.AudioFrame(b"\0\0" * per, rate, 1, per)


def session_listeners(session: AgentSession[Any]) -> int:
    return sum(len(v) for v in session._events.values())


class World:
    """One job in one room. Build it inside a running loop, then ``await start()``."""

    def __init__(self, config: Config) -> None:
        self.config = cfg = config
        faults = cfg.faults
        self.clock = VirtualClock()
        self.trace = MemorySink()
        tracer = Tracer(self.trace)
        self.room = InMemoryRoom(name="props", clock=self.clock)
        self.room_listeners_before = self.room.listener_count()
        self.problems = Problems()
        self._wrap_room_emit()
        self.rpc_log: list[tuple[str, str, str]] = []  # (method, destination, avatar state)
        self._wrap_perform_rpc()
        if cfg.connected:
            self.room.connect_locally()
        self.agent_end, self.sim_end = InMemorySessionTransport.pair()
        self.deletions: list[tuple[float, str]] = []  # (t, job state when deletion began)
        self.callbacks: list[tuple[float, str]] = []
        self.sent: dict[str, Sent] = {}
        self.replies: dict[str, list[agent_pb.SessionResponse]] = {}
        self.left_serving_at: float | None = None
        self.sessions: list[AgentSession[Any]] = [AgentSession()]
        self.session_listeners_before = [session_listeners(self.sessions[0])]
        self.refused: list[str] = []  # calls the runtime refused with a clear error
        self.speech: list[Any] = []
        self._bg: set[asyncio.Task[Any]] = set()
        self._ids = 0
        self.steps: list[str] = []  # the rules run, for a failure's message
        self.plugin: FaultyAvatar | None = None
        if cfg.avatar:
            self.plugin = FaultyAvatar(
                avatar_identity=AVATAR,
                hang=faults.plugin_start == "hang",
                start_error=InjectedFault("plugin start")
                if faults.plugin_start.startswith("raise")
                else None,
                error_after_route=faults.plugin_start == "raise_after_route",
                swallow_error=faults.plugin_start == "swallow",
            )
        # the one composition, with only what needs a server stood in
        self.agent_job = AgentJob(
            room=self.room,
            session=self.sessions[0],
            avatar=self.plugin,
            participant_identity=cfg.participant_identity,
            close_on_disconnect=cfg.close_on_disconnect,
            grace_period=cfg.grace_period,
            join_timeout=cfg.join_timeout,
            retry_avatar=cfg.retry_avatar if cfg.avatar else False,  # refused without one
            session_end_timeout=cfg.session_end_timeout,
            close_timeout=cfg.close_timeout,
            delete_room_on_close=cfg.delete_room_on_close,
            clock=self.clock,
            tracer=tracer,
            transport=self.agent_end,
            simulation=SimulationDispatch(simulation_run_id="RUN_props")
            if cfg.simulation
            else None,
            on_simulation_end=self._on_simulation_end,
            delete_room=self._delete_room,
            remove_avatar_participant=self._remove_avatar,
        )
        self.job = self.agent_job.job
        self.avatar: AvatarLifecycle | None = self.agent_job.avatar
        self.link: ParticipantLink = self.agent_job.link
        self.events = self.agent_job.events
        self.job.actor.on("state_changed", self._on_job_state)
        # what the shared invariants read besides the job itself (see ``view``)
        self.observed = Observed()
        self.observed.watch_job(self.agent_job)
        if faults.shutdown_callback != "none":
            self.job.add_shutdown_callback(self._shutdown_callback)
        if faults.state_listener == "raise":
            # TypeError is the one the SDK's EventEmitter lets through to the emitter
            self.job.on("state_changed", _raising_listener)
            self.link.on("state_changed", _raising_listener)
            if self.avatar is not None:
                self.avatar.on("state_changed", _raising_listener)
        self.tracer = tracer
        self._logs: list[logging.LogRecord] = []
        self._handler = _Capture(self._logs)
        for name in ("agent_runtime", "livekit"):
            logging.getLogger(name).addHandler(self._handler)

    # -- wiring ------------------------------------------------------------------------------
    def _wrap_room_emit(self) -> None:
        emit = self.room.emit

        def guarded(event: str, *args: Any) -> None:
            try:
                emit(event, *args)
            except Exception as e:  # what escaped a room callback to whoever emitted
                if _in_runtime(e.__traceback__):
                    self.problems.escaped_callbacks.append(f"{event}: {type(e).__name__}: {e}")
                # else the SDK's own listener (RoomIO) choking on an ill-typed event

        self.room.emit = guarded  # type: ignore[method-assign]

    def _wrap_perform_rpc(self) -> None:
        lp = self.room.local_participant
        perform = lp.perform_rpc

        async def recorded(**kw: Any) -> str:
            self.rpc_log.append((kw["method"], kw["destination_identity"], self.avatar_state))
            reply: str = await perform(**kw)
            if kw["method"] == "lk.clear_buffer" and AVATAR in self.room.remote_participants:
                # an avatar that took the clear says where it stopped, as real ones do (else
                # the plugin's own clear waits its fallback out, on the loop's real clock)
                payload = json.dumps({"playback_position": 0.0, "interrupted": True})
                with contextlib.suppress(Exception):
                    await self.room.invoke_rpc("lk.playback_finished", AVATAR, payload)
            return reply

        lp.perform_rpc = recorded

    def install_loop_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if _from_livekit(context):
                return
            exc = context.get("exception")
            self.problems.loop_errors.append(
                f"{context.get('message')}: {type(exc).__name__ if exc else ''} {exc or ''}"
            )

        loop.set_exception_handler(handler)

    async def start(self) -> None:
        await self.agent_job.start_runtime()

    # -- injected behaviour ------------------------------------------------------------------
    async def _delete_room(self) -> None:
        self.deletions.append((self.clock.now(), self.job.state))
        mode = self.config.faults.delete_room
        if mode == "raise":
            raise InjectedFault("delete_room")
        if mode == "hang":
            await _forever()
        self.room.deleted_at = self.clock.now()
        # the server takes the room, and everyone with it
        for identity in list(self.room.remote_participants):
            self.room.remove_participant(identity, rtc.DisconnectReason.ROOM_DELETED)
        self.room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)

    async def _shutdown_callback(self, reason: str) -> None:
        self.callbacks.append((self.clock.now(), reason))
        mode = self.config.faults.shutdown_callback
        if mode == "raise":
            raise InjectedFault("shutdown callback")
        if mode == "hang":
            await _forever()

    async def _on_simulation_end(self, ctx: SimulationContext) -> None:
        mode = self.config.faults.simulation_end
        if mode == "veto":
            ctx.fail(VETO)
        elif mode == "raise":
            raise InjectedFault("on_simulation_end")
        elif mode == "hang":
            await _forever()

    async def _remove_avatar(self, identity: str) -> None:
        mode = self.config.faults.remove_avatar
        if mode == "raise":
            raise InjectedFault("remove participant")
        if mode == "hang":
            await _forever()
        if identity not in self.room.remote_participants:
            raise TwirpError("not_found", "participant not found", status=404)
        self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)
        if mode == "not_found":
            raise TwirpError("not_found", "participant not found", status=404)

    def _on_job_state(self, sc: Any) -> None:
        if sc.source == "serving" and self.left_serving_at is None:
            self.left_serving_at = self.clock.now()

    # -- driving -----------------------------------------------------------------------------
    @property
    def avatar_state(self) -> str:
        return self.avatar.state if self.avatar is not None else "none"

    @property
    def primary(self) -> AgentSession[Any]:
        return self.sessions[0]

    def bg(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run work that may wait on virtual time (or hang) aside; teardown awaits it."""
        task = asyncio.get_running_loop().create_task(coro, name=f"props:{name}")
        self._bg.add(task)

    @property
    def bg_pending(self) -> list[asyncio.Task[Any]]:
        return [t for t in self._bg if not t.done()]

    async def quiesce(self) -> None:
        """Let every consequence of the last input settle (no virtual time passes)."""
        for _ in range(20):
            await settle()
            busy = any(
                s._closing_task is not None and not s._closing_task.done() for s in self.sessions
            )
            if not busy:
                break
        self.pump()

    def pump(self) -> None:
        for msg in self.sim_end.receive_nowait():
            if msg.HasField("response"):
                self.replies.setdefault(msg.response.request_id, []).append(msg.response)

    async def advance(self, seconds: float) -> None:
        await self.clock.advance(seconds)
        await self.quiesce()

    async def start_session(self) -> None:
        try:
            await self.agent_job.start_session(Agent(instructions="A property-test agent."))
        except RuntimeError as e:
            assert "closed" in str(e), e  # the only refusal: the job's host is gone
            self.refused.append(f"attach: {e}")

    async def start_avatar(self) -> None:
        await self.agent_job.start_avatar()

    async def attach_other(self) -> None:
        session: AgentSession[Any] = AgentSession()
        self.sessions.append(session)
        self.session_listeners_before.append(session_listeners(session))
        try:
            self.agent_job.attach(session)
        except RuntimeError as e:
            assert "closed" in str(e), e
            self.refused.append(f"attach: {e}")
            return
        # a second session has no room of its own: RoomIO belongs to the primary one
        await session.start(Agent(instructions="Another agent."), session_host=False)

    def next_id(self) -> str:
        self._ids += 1
        return f"RQ_{self._ids}"

    async def request(
        self, kind: str, payload: dict[str, Any] | None = None, *, caller: str = SIMULATOR
    ) -> str:
        rid = self.next_id()
        simulator = caller in self.job.simulators
        req = build_request(kind, payload, request_id=rid)
        delivered = True
        try:
            msg = agent_pb.AgentSessionMessage(request=req)
            await self.sim_end.send_message(msg, sender=caller)
        except RuntimeError:
            delivered = False  # the job's end is closed: nobody to hear it
        self.sent[rid] = Sent(
            kind, dict(payload or {}), self.job.state, delivered, caller, simulator
        )
        return rid

    # -- what happened -------------------------------------------------------------------------
    def view(self) -> JobView:
        """The job's ``JobView``, as the explorer's invariants read it: the sessions by
        name (``A`` the primary), the finalize requests the transport took and their
        replies, the deletions and the clear RPCs."""
        obs = self.observed
        obs.sent = [
            Finalize(rid, s.simulator, s.simulator and s.job_state in LIVE_JOB)
            for rid, s in self.sent.items()
            if s.kind == "finalize_simulation" and s.delivered
        ]
        obs.replies = {
            rid: ["verdict" if r.HasField("finalize_simulation") else "error" for r in rs]
            for rid, rs in self.replies.items()
        }
        obs.deletions = [state for _, state in self.deletions]
        obs.clear_rpcs = [state for m, _, state in self.rpc_log if m == "lk.clear_buffer"]
        session = session_state(self.primary)
        return runtime_view(
            self.agent_job,
            obs,
            self.trace.records,
            sessions={chr(ord("A") + i): s for i, s in enumerate(self.sessions)},
            session=session,
        )

    def records(self, machine: str, *events: str) -> list[TraceRecord]:
        return [
            r
            for r in self.trace.records
            if r.machine == machine
            and r.kind in ("transition", "ignore", "reject")
            and (not events or r.event in events)
        ]

    def received(self) -> dict[str, str]:
        """request id -> the host's event for it, for every request the host took in."""
        return {
            str(r.data["request_id"]): r.event
            for r in self.records("session_host", "request", "finalize", "bad_request")
        }

    def actors(self) -> list[Actor]:
        out = [
            self.job.actor,
            self.job.host.actor,
            self.job.host.finalize.actor,
            self.job.deletion.actor,
            self.link.actor,
        ]
        if self.avatar is not None:
            out.append(self.avatar.actor)
        return out

    def unexpected_errors(self) -> list[str]:
        """ERROR log records that no injected fault explains."""
        faults = self.config.faults
        allowed: list[str] = []
        if faults.state_listener == "raise":
            allowed += ["listener failed", "failed to emit event state_changed"]
        if faults.shutdown_callback == "raise":
            allowed.append("shutdown callback")
        if faults.simulation_end == "raise":
            allowed.append("on_simulation_end failed")
        out = []
        for rec in self._logs:
            msg = rec.getMessage()
            if rec.name.startswith("livekit") and not _raised_in_runtime(rec):
                continue  # the SDK's own complaints about an unconnected room
            if any(a in msg for a in allowed):
                continue
            out.append(f"{rec.name}: {msg}")
        return out

    # -- teardown ----------------------------------------------------------------------------
    async def drain_background(self, *, limit: float = 600.0) -> None:
        """Advance virtual time until every background call returned (each is bounded)."""
        waited = 0.0
        while self.bg_pending and waited < limit:
            await self.advance(1.0)
            waited += 1.0
        assert not self.bg_pending, f"still running after {limit}s:\n{_stacks()}"
        for t in self._bg:
            if not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                raise AssertionError(f"{t.get_name()} raised {type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        """Release everything: the job (its hold and close, which take the session, the
        avatar and the link with them), then every other session."""
        self.bg(self.agent_job.aclose(), "job.aclose")
        await self.drain_background()
        for s in self.sessions:
            if s._started:
                await s.aclose()
        await self.quiesce()
        await self.sim_end.close()
        await self.agent_end.close()
        await self.quiesce()
        for name in ("agent_runtime", "livekit"):
            logging.getLogger(name).removeHandler(self._handler)

    def leftovers(self) -> list[str]:
        """Listeners, tasks and timers still held after ``aclose``."""
        out = []
        if self.room.listener_count() != self.room_listeners_before:
            out.append(f"room listeners: {_listeners(self.room)}")
        for i, s in enumerate(self.sessions):
            if session_listeners(s) != self.session_listeners_before[i]:
                out.append(f"session {i} listeners: {_listeners(s)}")
        for a in self.actors():
            if not a.closed or a.live_tasks or a.timer_armed:
                out.append(f"actor {a.spec.name}: closed={a.closed} tasks={a.live_tasks}")
        if len(asyncio.all_tasks()) > 1:
            out.append(f"tasks:\n{_stacks()}")
        if _HANDED_OFF:
            out.append(f"handed-off room outputs: {len(_HANDED_OFF)}")
        if self.clock.pending:
            out.append(f"virtual timers: {self.clock.pending}")
        return out


def _listeners(emitter: rtc.EventEmitter[Any]) -> dict[str, list[str]]:
    return {
        k: [getattr(cb, "__qualname__", repr(cb)) for cb in v]
        for k, v in emitter._events.items()
        if v
    }


def _stacks() -> str:
    """Where every other task is waiting (for a hang's failure message)."""
    out = []
    for t in asyncio.all_tasks():
        if t is asyncio.current_task():
            continue
        frames = [f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno}" for f in t.get_stack()]
        owner = getattr(getattr(t.get_coro(), "cr_frame", None), "f_locals", {}).get("self")
        if owner is not None:
            frames.append(f"({type(owner).__name__})")
        out.append(f"  {t.get_name()}: {' > '.join(frames)}")
    return "\n".join(out)


def _raising_listener(*_: Any) -> None:
    raise TypeError("a state_changed listener with a bug")


def _raised_in_runtime(rec: logging.LogRecord) -> bool:
    """Whether the exception logged came out of agent_runtime code (not the SDK's own)."""
    return bool(rec.exc_info) and _in_runtime(rec.exc_info[2])  # type: ignore[index]


def _in_runtime(tb: types.TracebackType | None) -> bool:
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        # the testing kit's in-memory room raises the injected RPC faults: not the runtime
        if "/agent_runtime/" in path and "/agent_runtime/testing/" not in path:
            return True
        tb = tb.tb_next
    return False
