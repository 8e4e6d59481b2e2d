"""A real ``AgentJob`` driven one model move at a time, and its view.

What runs is the runtime an agent embeds: ``AgentJob`` over an ``InMemoryRoom`` (a real
``rtc.Room`` with no connection), real ``AgentSession``s, the job-owned session host with
its protobuf messages on a paired in-memory transport, on a ``VirtualClock``. Stood in,
because they need a server or are the outside world's choice: the avatar provider
(``GatedAvatar``: its ``start()`` waits for the test to say what the provider does), the
agent's ``on_simulation_end``, room deletion and a shutdown callback (each waits for the
test to return, fail or hang), and the end of a session's close (the real close runs when
the test lets it finish; it may hang). The transport refuses to send while the room is
disconnected, as the room's byte stream does.

What the harness sees of the job, and the job's view, come from ``observe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
from livekit.protocol.agent_pb import agent_session as agent_pb
from livekit.protocol.agent_simulation import SimulationDispatch

from agent_runtime.clock import VirtualClock, settle
from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import AvatarRetry, Backoff, PlayoutOptions
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.wire import build_request
from statemachines.machines import MACHINES
from verification.conformance.observe import Observed, Sent, runtime_view
from verification.conformance.paths import BOUND, DRAIN_TIMEOUT, SETTINGS, WAIT, Step
from verification.explore.abstract import GRACE_PERIOD, MAX_REPROMPTS, PEOPLE, Config
from verification.explore.checks import LIVE_JOB
from verification.explore.view import JobView

_REAL_LIMIT = 10.0  # real seconds a session's released close may take (it never should)
VERDICT = "the harness vetoes this run"
SPEECH = 1.0  # seconds of audio in each of the agent's replies


class Gate:
    """One wait for the test's word: ``await gate.wait()`` returns what ``open`` said."""

    def __init__(self) -> None:
        self._fut: asyncio.Future[str] | None = None
        self.said: str | None = None

    @property
    def waiting(self) -> bool:
        return self._fut is not None and not self._fut.done()

    async def wait(self) -> str:
        self._fut = asyncio.get_running_loop().create_future()
        self.said = None
        return await self._fut

    def open(self, word: str) -> None:
        if self._fut is None or self._fut.done():
            raise RuntimeError(f"nothing waits to be told {word!r}")
        self.said = word
        self._fut.set_result(word)


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()


class GatedAvatar(AvatarSession):  # type: ignore[type-arg]
    """An avatar plugin whose provider is the test: ``start()`` runs the base class's start,
    then does what it is told, in order: put its route in (``route``), fail (``fail``),
    return with no route (``no_route``), return (``return``); told nothing, it waits (a
    hung provider). Its route is what the upstream plugins install."""

    def __init__(self, identity: str) -> None:
        super().__init__()
        self._identity = identity
        self.told: asyncio.Queue[str] = asyncio.Queue()
        self.starts = 0
        # where start() waits for the test's word: "start", "routed", or None (the real
        # explorer offers the provider's outcomes only while it waits)
        self.waits: str | None = None

    @property
    def avatar_identity(self) -> str:
        return self._identity

    @property
    def provider(self) -> str:
        return "gated"

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        self.starts += 1
        await super().start(agent_session, room)
        word = await self._told("start")
        if word == "fail":
            raise RuntimeError("the provider failed")
        if word == "no_route":
            return  # its error swallowed and logged, as simli does
        sink = DataStreamAudioOutput(
            room,
            destination_identity=self._identity,
            wait_remote_track=rtc.TrackKind.KIND_VIDEO,
            # the test settles a clear itself; the sink's own fallback runs on real time
            clear_buffer_timeout=3600.0,
        )
        agent_session.output.replace_audio_tail(sink)
        word = await self._told("routed")
        if word == "fail":
            raise RuntimeError("the provider failed after the route was in")

    async def _told(self, where: str) -> str:
        self.waits = where
        try:
            return await self.told.get()
        finally:
            self.waits = None


class _RoomBoundTransport(InMemorySessionTransport):
    """The agent's end: like the room's byte stream, it sends nothing while the room is
    disconnected (and says so for the request being answered)."""

    room: InMemoryRoom
    observed: Observed

    async def send_message(
        self, msg: agent_pb.AgentSessionMessage, *, sender: str | None = None
    ) -> None:
        if not self.room.isconnected():
            if msg.HasField("response"):
                self.observed.excused.add(msg.response.request_id)
            raise RuntimeError("the room is disconnected")
        await super().send_message(msg, sender=sender)


class Harness:
    """One ``AgentJob`` set up as the model's ``initial()`` world, driven by path steps."""

    def __init__(self, config: Config, *, playout: bool = False) -> None:
        """``playout``: the job as users get it, the playout machine on with its avatar
        (the real explorer's); off, the job the model without playout describes (the
        conformance replay's)."""
        self.config = config
        self.clock = VirtualClock()
        self.trace = MemorySink()
        self.room = InMemoryRoom(name="conformance", clock=self.clock)
        self.observed = Observed()
        agent_end, self.simulator = _RoomBoundTransport(), InMemorySessionTransport()
        agent_end._peer, self.simulator._peer = self.simulator, agent_end
        agent_end.room, agent_end.observed = self.room, self.observed
        self.plugin = GatedAvatar(PEOPLE["avatar"].identity)
        self.sessions: dict[str, AgentSession[Any]] = {"A": AgentSession()}
        self.closes: dict[str, Gate] = {}
        self.verdicts: list[Gate] = []
        self.deletion_gates: list[Gate] = []
        self.callback = Gate()
        self.other = 0  # requests sent that the model follows no reply of
        self.reprompts = 0  # the playout watchdog's re-prompts
        self._bg: set[asyncio.Task[Any]] = set()
        self.job = AgentJob(
            room=self.room,
            session=self.sessions["A"],
            avatar=self.plugin,
            participant_identity=config.participant_identity,
            close_on_disconnect=config.close_on_disconnect,
            grace_period=GRACE_PERIOD if config.grace else 0.0,
            session_close_timeout=SETTINGS["session_close_timeout"],
            join_timeout=SETTINGS["join_timeout"],
            retry_avatar=AvatarRetry(
                attempts=config.retry_attempts,
                rejoin=config.rejoin,
                backoff=Backoff(
                    initial=SETTINGS["backoff_initial"], multiplier=SETTINGS["backoff_multiplier"]
                ),
            ),
            session_end_timeout=SETTINGS["session_end_timeout"],
            close_timeout=SETTINGS["close_timeout"],
            delete_room_on_close=config.delete_room_on_close,
            playout=self._playout(config) if playout else False,
            on_reprompt=self._reprompt if playout and config.watchdog != "off" else None,
            clock=self.clock,
            tracer=Tracer(self.trace),
            otel=False,
            transport=agent_end,
            simulation=SimulationDispatch(simulation_run_id="RUN_conformance")
            if config.simulation
            else None,
            on_simulation_end=self._on_simulation_end,
            delete_room=self._delete_room,
            remove_avatar_participant=self._remove_avatar,
        )
        # the walker times the host's drain with the bound the job gives it
        assert math.isclose(
            self.job.system.host.actor._settings["drain_timeout"] or 0, DRAIN_TIMEOUT
        )
        self.job.add_shutdown_callback(self._shutdown_callback)
        self.observed.watch_job(self.job)
        self._gate_close("A")
        self._watch_rpcs()

    @staticmethod
    def _playout(config: Config) -> PlayoutOptions | None:
        # None: AgentJob's own choice, on with an avatar, its defaults (no watchdog)
        if config.watchdog == "off":
            return None
        return PlayoutOptions(
            reprompt=True, max_reprompts=MAX_REPROMPTS, when_exhausted=config.watchdog
        )

    def _reprompt(self, session: AgentSession[Any], attempt: int) -> None:
        # the LLM's reply needs a network: the re-prompt is counted, its reply not spoken
        self.reprompts += 1

    # -- the outside world, as the test decides it ------------------------------------------
    async def _on_simulation_end(self, ctx: Any) -> None:
        gate = Gate()
        self.verdicts.append(gate)
        if await gate.wait() == "hang":
            await _forever()
        ctx.fail(VERDICT)

    async def _delete_room(self) -> None:
        self.observed.deletions.append(self.job.job.state)
        gate = Gate()
        self.deletion_gates.append(gate)
        if await gate.wait() == "fail":
            raise RuntimeError("the server refused to delete the room")

    async def _remove_avatar(self, identity: str) -> None:
        self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    async def _shutdown_callback(self) -> None:
        if await self.callback.wait() == "hang":
            await _forever()

    def _gate_close(self, name: str) -> None:
        """The session's close runs once the test lets it (``finish``), or never
        (``hang``)."""
        session = self.sessions[name]
        gate = self.closes[name] = Gate()

        async def gated() -> None:
            if await gate.wait() == "hang":
                await _forever()

        lk.hold_session_close(session, gated)

    def _watch_rpcs(self) -> None:
        lp = self.room.local_participant
        perform = lp.perform_rpc

        async def recorded(**kw: Any) -> str:
            if kw["method"] == "lk.clear_buffer":
                state = self.job.avatar.state if self.job.avatar is not None else "none"
                self.observed.clear_rpcs.append(state)
            reply: str = await perform(**kw)
            return reply

        lp.perform_rpc = recorded

    def session_state(self, name: str = "A") -> str:
        session, gate = self.sessions[name], self.closes[name]
        task = lk.session_closing_task(session)
        if task is None:
            return "running"
        if task.done():
            return "closed"
        return "hung" if gate.said == "hang" else "closing"

    # -- start, drive, look ------------------------------------------------------------------
    async def start(self) -> None:
        """The model's initial world: the room connected with ``config.present`` in it, the
        session started and attached, the link following, the avatar not started."""
        self.room.connect_locally()
        for who in self.config.present:
            p = PEOPLE[who]
            self.room.add_participant(p.identity, kind=p.kind, attributes=dict(p.attributes))
        await self.job.start_runtime()
        await self.job.start_session(Agent(instructions="A conformance agent."))
        await self.quiesce()

    def view(self) -> JobView:
        return runtime_view(
            self.job,
            self.observed,
            self.trace.records,
            sessions=self.sessions,
            session=self.session_state("A"),
        )

    def bg(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"conformance:{name}")
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        # a user's call that fails (start_avatar() once the job closed) is the job's
        # answer, which the view judges: retrieved, not reported by asyncio at collection
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _busy(self) -> bool:
        for name, session in self.sessions.items():
            task = lk.session_closing_task(session)
            if task is not None and not task.done() and self.closes[name].said == "finish":
                return True
        return False

    async def quiesce(self) -> None:
        await settle()
        deadline = time.monotonic() + _REAL_LIMIT
        while self._busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            await settle()
        self._pump()

    def _pump(self) -> None:
        """The replies the simulator's end received, by request."""
        for msg in self.simulator.receive_nowait():
            if msg.HasField("response"):
                resp = msg.response
                kind = "verdict" if resp.HasField("finalize_simulation") else "error"
                self.observed.replies.setdefault(resp.request_id, []).append(kind)

    async def do(self, step: Step) -> None:
        """Do what the step says, then let everything it causes settle."""
        act = _ACTIONS.get(step.action.partition(":")[0])
        if step.action.startswith("timeout:") or step.action in (BOUND, WAIT):
            await self._time_passes(step)
        elif act is None:
            raise KeyError(f"the harness cannot do {step.action!r} ({step.label})")
        else:
            res = act(self, step.action.partition(":")[2])
            if asyncio.iscoroutine(res):
                await res
        await self.quiesce()

    async def _time_passes(self, step: Step) -> None:
        machine = step.action.removeprefix("timeout:")
        if machine in MACHINES:
            actor = {a.spec.name: a for a in self.job.actors}[machine]
            deadline = actor.timer_deadline
            if deadline is None or not math.isclose(deadline, step.at):
                raise AssertionError(
                    f"{step.label}: the model's timer is due at t={step.at:g}, the runtime's "
                    f"{machine} timer at {deadline}"
                )
        await self.clock.run_until(step.at)

    async def aclose(self) -> None:
        """Release everything: every gate told to go on, the job closed, time run out."""
        for gate in (*self.closes.values(), *self.verdicts, *self.deletion_gates, self.callback):
            if gate.waiting:
                gate.open("finish" if gate in self.closes.values() else "return")
        while not self.plugin.told.empty():
            self.plugin.told.get_nowait()
        for _ in range(4):
            self.plugin.told.put_nowait("fail")
        self.bg(self.job.aclose(), "job.aclose")
        for _ in range(120):
            if not self._bg:
                break
            await self.clock.advance(5.0)
            await self.quiesce()
        for task in list(self._bg):
            task.cancel()
        await asyncio.gather(*self._bg, return_exceptions=True)
        for session in self.sessions.values():
            if lk.session_live(session):
                lk.ask_session_close(session, CloseReason.JOB_SHUTDOWN)
        for gate in self.closes.values():
            if gate.waiting:
                gate.open("finish")
        await self.quiesce()
        for session in self.sessions.values():
            closing = lk.session_closing_task(session)
            if closing is not None and not closing.done():
                closing.cancel()
        await self.simulator.close()


# -- what each action does to the real job -----------------------------------------------------


def _joins(h: Harness, who: str) -> None:
    p = PEOPLE[who]
    h.room.add_participant(p.identity, kind=p.kind, attributes=dict(p.attributes))


async def _finalize(h: Harness, caller: str) -> None:
    rid = f"RQ_{len(h.observed.sent) + 1}"
    req = build_request("finalize_simulation", {"provisional_success": True}, request_id=rid)
    try:
        await h.simulator.send_message(agent_pb.AgentSessionMessage(request=req), sender=caller)
    except RuntimeError:
        return  # the agent's end is closed: nobody reads it (the model follows nothing)
    simulator = caller == PEOPLE["simulator"].identity
    h.observed.sent.append(Sent(rid, simulator, simulator and h.job.job.state in LIVE_JOB))


async def _other_request(h: Harness, kind: str, payload: dict[str, Any] | None) -> None:
    # a request the model follows no reply of: the job's view does not change
    h.other += 1
    req = build_request(kind, payload, request_id=f"OTHER_{h.other}")
    with contextlib.suppress(RuntimeError):  # the agent's end is closed: nobody reads it
        msg = agent_pb.AgentSessionMessage(request=req)
        await h.simulator.send_message(msg, sender=PEOPLE["simulator"].identity)


async def _attach_b(h: Harness, _: str) -> None:
    session: AgentSession[Any] = AgentSession()
    h.sessions["B"] = session
    h._gate_close("B")
    h.job.attach(session)
    # a second session has no room of its own: RoomIO belongs to the primary one
    await session.start(Agent(instructions="Another agent."), session_host=False)


def _close(h: Harness, name: str) -> None:
    lk.ask_session_close(h.sessions[name], CloseReason.USER_INITIATED)


def _shutdown(h: Harness, _: str) -> None:
    # livekit's order: the primary session closes, then on_session_end (the hold)
    primary = h.sessions["A"]
    if lk.session_live(primary):
        lk.ask_session_close(primary, CloseReason.JOB_SHUTDOWN)
    h.job.shutdown("the conformance test ends it")


async def _interrupt(h: Harness, playing: bool) -> None:
    avatar = h.job.avatar
    assert avatar is not None
    sink = avatar.installed_sink
    if playing and avatar.state == "joined" and isinstance(sink, DataStreamAudioOutput):
        # something is playing to the avatar: one segment in its sink
        frame = rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)
        await sink.capture_frame(frame)
        sink.flush()
    avatar.interrupt()


async def _clear_settles(h: Harness, _: str) -> None:
    # the avatar says where it stopped: the plugin's own clear has its answer
    payload = json.dumps({"playback_position": 0.0, "interrupted": True})
    # an RpcError: nobody takes it any more, the clear is over already
    with contextlib.suppress(rtc.RpcError):
        await h.room.invoke_rpc("lk.playback_finished", PEOPLE["avatar"].identity, payload)


async def _frames(seconds: float) -> Any:
    per = 240  # 10 ms at 24 kHz
    for _ in range(max(1, round(seconds * 100))):
        yield rtc.AudioFrame(b"\0\0" * per, 24000, 1, per)


def _say(h: Harness, _: str) -> None:
    # the agent's reply, through the SDK's own say() (its audio produced at once: the
    # hand-off to the sink, if any, comes in the same step)
    h.sessions["A"].say("A reply.", audio=_frames(SPEECH))


def _barge_in(h: Harness, _: str) -> None:
    # the user speaks over the agent: the session interrupts its speech, its own way
    done = h.sessions["A"].interrupt()
    done.add_done_callback(lambda f: f.cancelled() or f.exception())


async def _report(h: Harness, _: str) -> None:
    # the avatar played what it was given, and says so
    payload = json.dumps({"playback_position": SPEECH, "interrupted": False})
    with contextlib.suppress(rtc.RpcError):  # nobody takes it: the sink went
        await h.room.invoke_rpc("lk.playback_finished", PEOPLE["avatar"].identity, payload)


def _tell_plugin(word: str) -> Callable[[Harness, str], None]:
    return lambda h, _: h.plugin.told.put_nowait(word)


def _open(pick: Callable[[Harness], Gate], word: str) -> Callable[[Harness, str], None]:
    def act(h: Harness, _: str) -> None:
        pick(h).open(word)

    return act


def _nothing(h: Harness, _: str) -> None:
    return None  # a hang: whatever waits goes on waiting


def _person(action: str) -> Callable[[Harness, str], Any]:
    who, _, event = action.rpartition("_")

    def act(h: Harness, arg: str) -> None:
        if event == "joins":
            _joins(h, who)
        else:
            h.room.remove_participant(PEOPLE[who].identity, rtc.DisconnectReason.Value(arg))

    return act


_ACTIONS: dict[str, Callable[[Harness, str], Any]] = {
    **{
        f"{who}_{e}": _person(f"{who}_{e}")
        for who in ("user", "sip", "simulator")
        for e in ("joins", "leaves")
    },
    "room_disconnects": lambda h, _: h.room.disconnect_locally(),
    "finalize": lambda h, _: _finalize(h, PEOPLE["simulator"].identity),
    "stranger_finalize": lambda h, _: _finalize(h, PEOPLE["stranger"].identity),
    "ping": lambda h, _: _other_request(h, "ping", None),
    "malformed": lambda h, _: _other_request(
        h, "finalize_simulation", {"provisional_success": "yes"}
    ),
    "attach_b": _attach_b,
    "close_a": lambda h, _: _close(h, "A"),
    "close_b": lambda h, _: _close(h, "B"),
    "shutdown": _shutdown,
    "request_deletion": lambda h, _: h.job.request_room_deletion(),
    "release": lambda h, _: h.bg(h.job.aclose(), "job.aclose"),
    # the user's own calls, each returning once the job is closed
    "aclose": lambda h, _: h.bg(h.job.aclose(), "job.aclose"),
    "abort": lambda h, _: h.bg(h.job.aclose(graceful=False), "job.abort"),
    "avatar_start": lambda h, _: h.bg(h.job.start_avatar(), "avatar.start"),
    "avatar_joins": lambda h, _: _joins(h, "avatar"),
    "avatar_video": lambda h, _: h.room.publish_track(PEOPLE["avatar"].identity, "video"),
    "avatar_leaves": lambda h, _: h.room.remove_participant(
        PEOPLE["avatar"].identity, rtc.DisconnectReason.CLIENT_INITIATED
    ),
    "interrupt": lambda h, _: _interrupt(h, playing=True),
    "interrupt_idle": lambda h, _: _interrupt(h, playing=False),
    # the agent's speech and the user's, as the session's pipeline and VAD report them
    "agent_says": _say,
    "user_interrupts": _barge_in,
    "avatar_reports": _report,
    "user_speaks": lambda h, _: lk.set_user_state(h.sessions["A"], "speaking"),
    "user_listens": lambda h, _: lk.set_user_state(h.sessions["A"], "listening"),
    "avatar_close": lambda h, _: (
        h.bg(h.job.avatar.aclose(), "avatar.aclose") if h.job.avatar is not None else None
    ),
    # outcomes of work running aside
    "verdict_ready": _open(lambda h: h.verdicts[-1], "return"),
    "verdict_hangs": _nothing,
    "plugin_routed": _tell_plugin("route"),
    "plugin_fails": _tell_plugin("fail"),
    "plugin_no_route": _tell_plugin("no_route"),
    "plugin_hangs": _nothing,
    "plugin_returns": _tell_plugin("return"),
    "plugin_fails_late": _tell_plugin("fail"),
    "plugin_hangs_routed": _nothing,
    "clear_settles": _clear_settles,
    "a_closed": _open(lambda h: h.closes["A"], "finish"),
    "a_hangs": _open(lambda h: h.closes["A"], "hang"),
    "b_closed": _open(lambda h: h.closes["B"], "finish"),
    "deletion_returns": _open(lambda h: h.deletion_gates[-1], "ok"),
    "deletion_fails": _open(lambda h: h.deletion_gates[-1], "fail"),
    "callbacks_return": _open(lambda h: h.callback, "return"),
    "callback_hangs": _open(lambda h: h.callback, "hang"),
}
