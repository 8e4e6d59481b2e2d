"""The scenario runner: one composed job, on the embedded in-memory room and a virtual
clock.

What runs is the real runtime — one ``AgentJob`` (the job machine and its session host, the
linked participant, the avatar lifecycle around a ``ScriptedAvatar`` plugin, the playout
machine when configured) — with real ``AgentSession`` objects. Only the network is stood in
for: the room's SFU side (``InMemoryRoom``), the simulator's end of the session transport,
room deletion (recorded, not sent), and the LLM a re-prompt would ask (the scripted
re-prompt says ``reprompt_speech`` seconds of audio instead).

The agent speaks through the SDK's own ``session.say(..., audio=...)``: real frames down the
session's real audio chain. To an avatar the audio is pushed at once and its playout ends
when the avatar says so (an ``rpc`` step of ``lk.playback_finished``). On a
``VirtualTimeLoop`` (simulate, record --check, scenario files under pytest) the room's
audio output plays it through the kit's stand-in for livekit's native source, on the
loop's clock (``testing/room_audio.py``): it takes its length in virtual seconds; on
another loop livekit's own source plays it in real time, which the runner waits for at
the step's virtual instant.
The user's voice activity is the session's own user state, set as its VAD sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice.events import AgentStateChangedEvent, CloseReason
from livekit.agents.voice.speech_handle import SpeechHandle
from livekit.protocol.agent_pb import agent_session as agent_pb
from livekit.protocol.agent_simulation import SimulationDispatch

from agent_runtime.observe.trace import JsonlSink, MemorySink, Tracer, TraceRecord
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing import scenario as sc
from agent_runtime.testing._silence import silence
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.held import Held
from agent_runtime.testing.inmemory import InMemoryRoom, stranger, stranger_track
from agent_runtime.testing.inmemory_transport import InMemorySessionTransport
from agent_runtime.testing.invariants.watch import InvariantWatch
from agent_runtime.testing.result import refusal, scenario_result, seconds_text
from agent_runtime.testing.room_audio import pace_as_published
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.testing.sdk_logs import quiet_sdk_logs, sdk_task_failures_at_debug
from agent_runtime.testing.server_api import KitServer
from agent_runtime.testing.wire import build_request

logger = logging.getLogger("agent_runtime.testing.runner")

# how long (real seconds) to let real SDK work finish (a session closing, the job's close
# work) before virtual time moves on; generous, it only bounds a stuck step
_REAL_SETTLE_LIMIT = 10.0

# stranger and stranger_track are the room's now (inmemory.py); they stay here too
__all__ = ["run_scenario", "stranger", "stranger_track"]


class _Simulation:
    def __init__(self, scenario: sc.Scenario, tracer: Tracer) -> None:
        self.scenario = scenario
        self.cfg = cfg = scenario.config
        self.tracer = tracer
        self.clock = VirtualClock()
        self.room = InMemoryRoom(name=_slug(scenario.name), clock=self.clock)
        self.agent_end, self.simulator_end = InMemorySessionTransport.pair()
        self.sessions: dict[str, AgentSession[Any]] = {"a": AgentSession()}
        self.session_closed_at: dict[str, float] = {}
        self.session_close_reason: dict[str, str] = {}
        self.held = Held(cfg.hold)  # the outside calls a held.end step ends
        self.plugin: ScriptedAvatar | None = None
        if cfg.avatar_identity is not None:
            held = self.held.held("avatar_start")
            self.plugin = ScriptedAvatar(avatar_identity=cfg.avatar_identity, held=held)
        self.deleted_at: float | None = None
        self.session_replies: list[dict[str, Any]] = []
        self.rpc_replies: list[dict[str, Any]] = []
        self.requests: dict[str, str] = {}
        self.errors: list[str] = []
        self.speeches: list[SpeechHandle] = []  # what the scenario had the agent say
        self._closes: list[asyncio.Future[None]] = []  # the scenario's job.aclose steps
        self.agent_listening_at: list[float] = []  # the primary session's own view
        self._reader: asyncio.Task[None] | None = None
        self.watch: InvariantWatch | None = None  # expect: invariants asks for it
        # the one composition, with only what needs a network stood in
        self.agent_job = AgentJob(
            room=self.room,
            session=self.sessions["a"],
            avatar=self.plugin,
            participant_identity=cfg.participant_identity,
            close_on_disconnect=cfg.close_on_disconnect,
            grace_period=cfg.grace_period,
            session_close_timeout=cfg.session_close_timeout,
            join_timeout=cfg.join_timeout,
            retry_avatar=cfg.retry_avatar,
            session_end_timeout=cfg.session_end_timeout,
            close_timeout=cfg.close_timeout,
            delete_room_on_close=cfg.delete_room_on_close,
            # unsaid in the file: AgentJob's own default (on with an avatar)
            playout=(cfg.playout or False) if "playout" in cfg.model_fields_set else None,
            on_reprompt=self._reprompt if cfg.playout and cfg.playout.reprompt else None,
            clock=self.clock,
            tracer=tracer,
            transport=self.agent_end,
            simulation=SimulationDispatch(simulation_run_id=f"RUN_{_slug(scenario.name)}")
            if cfg.simulation
            else None,
            on_simulation_end=self._on_simulation_end,
            delete_room=self._delete_room,
            remove_avatar_participant=KitServer(self.room, self.clock).remove_avatar,
        )
        self.job = self.agent_job.job
        self.link = self.agent_job.link
        self.avatar = self.agent_job.avatar
        # on a VirtualTimeLoop the room's audio output plays on its clock (the module's doc)
        self.paced = pace_as_published(self.room, self.sessions.values)

    # -- set-up ------------------------------------------------------------------------------
    async def setup(self) -> None:
        if self.cfg.room_connected:
            self.room.connect_locally()
        for p in self.scenario.participants:
            self.room.add_participant(p.identity, kind=p.kind, attributes=p.attributes)
        await self.agent_job.start_runtime()
        self._reader = asyncio.create_task(self._read_replies(), name="simulator.replies")
        for name, session in self.sessions.items():
            self._watch_close(name, session)
        if self.held.held("shutdown_callback"):
            self.agent_job.add_shutdown_callback(self.held.shutdown_callback)
        self.sessions["a"].on("agent_state_changed", self._on_agent_state)
        self._check("the start")

    def _check(self, where: str, *, end: bool = False) -> None:
        if self.watch is not None:
            self.watch.check(where, end=end)

    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        if ev.new_state == "listening" and ev.old_state in ("speaking", "thinking"):
            self.agent_listening_at.append(self.clock.now())

    def _say(self, session: AgentSession[Any], text: str, seconds: float) -> SpeechHandle:
        handle = session.say(text, audio=silence(seconds))
        self.speeches.append(handle)
        return handle

    def _reprompt(self, session: AgentSession[Any], attempt: int) -> SpeechHandle:
        # what generate_reply would have the LLM say, with no LLM to ask
        return self._say(session, f"(re-prompt {attempt})", self.cfg.reprompt_speech)

    def _watch_close(self, name: str, session: AgentSession[Any]) -> None:
        def on_close(ev: Any) -> None:
            self.session_closed_at.setdefault(name, self.clock.now())
            reason = getattr(ev, "reason", "")
            self.session_close_reason.setdefault(name, getattr(reason, "value", str(reason)))

        session.on("close", on_close)
        self.held.hold_close(session, name)

    async def _on_simulation_end(self, ctx: Any) -> None:
        await self.held.call("simulation_end")
        verdict = self.cfg.agent_verdict
        if not verdict.success:
            ctx.fail(verdict.reason)

    async def _delete_room(self) -> None:
        # the server API call (held: its answer is a held.end step); recorded here, and
        # the room goes as the SFU would take it
        if self.watch is not None:
            self.watch.deletion()
        await self.held.call("room_deletion")
        self.room.deleted_at = self.deleted_at = self.clock.now()

    async def _read_replies(self) -> None:
        async for msg in self.simulator_end:
            if not msg.HasField("response"):
                continue
            resp = msg.response
            entry: dict[str, Any] = {
                "t": self.clock.now(),
                "request": self.requests.get(resp.request_id, "unknown"),
            }
            if resp.HasField("error"):
                entry["error"] = resp.error
            if resp.HasField("finalize_simulation"):
                fs = resp.finalize_simulation
                entry["verdict"] = (
                    {"success": fs.user_verdict.success, "reason": fs.user_verdict.reason}
                    if fs.HasField("user_verdict")
                    else None
                )
            self.session_replies.append(entry)
            if self.watch is not None:
                kind = "verdict" if resp.HasField("finalize_simulation") else "error"
                self.watch.replied(resp.request_id, kind)

    # -- steps -------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.setup()
        for i, step in enumerate(self.scenario.steps):
            await self.advance_to(step.at)
            self.tracer.write(
                TraceRecord(
                    self.clock.now(),
                    "input",
                    "scenario",
                    self.scenario.name,
                    event=step.event,
                    data=step.model_dump(exclude={"at", "event"}),
                )
            )
            if isinstance(step, sc.End):
                break
            try:
                await self.apply(step)
            except Exception as e:  # a step the runtime refuses is a result, not a crash
                self.errors.append(refusal(step.at, step.event, e))
            await self.quiesce()
            self._check(f"step {i + 1} ({step.event})")
        await self.quiesce()
        # what must hold once every bound passed: only when no timer is left
        self._check("the last step", end=self.clock.next_deadline() is None)

    async def apply(self, step: sc.Step) -> None:
        room = self.room
        if isinstance(step, sc.SessionStart):
            await self._start_session("a")
        elif isinstance(step, sc.SessionClose):
            lk.ask_session_close(self.sessions["a"], CloseReason(step.reason))
        elif isinstance(step, sc.SessionInterrupt):
            if any(not h.done() for h in self.speeches):
                # the agent is speaking: interrupted as the SDK interrupts it
                self.sessions["a"].interrupt()
            elif self.avatar is not None:
                self.avatar.interrupt()
            elif lk.session_started(self.sessions["a"]):
                with contextlib.suppress(RuntimeError):
                    self.sessions["a"].interrupt()
        elif isinstance(step, sc.SessionAttach):
            await self._attach_other(step.session)
        elif isinstance(step, sc.AgentSay):
            self._say(self.sessions["a"], step.text, step.duration)
        elif isinstance(step, sc.UserSpeech):
            session = self.sessions["a"]
            lk.set_user_state(session, "speaking")
            self.clock.call_later(step.duration, lambda: lk.set_user_state(session, "listening"))
        elif isinstance(step, sc.UserState):
            lk.set_user_state(self.sessions["a"], step.state)
        elif isinstance(step, sc.AvatarStart | sc.AvatarStartError):
            if self.avatar is None or self.plugin is None:
                raise RuntimeError("no avatar configured (config.avatar_identity)")
            armed = (self.plugin.start_error, self.plugin.start_errors)
            calls = self.plugin.start_calls
            if isinstance(step, sc.AvatarStartError):
                self.plugin.start_error = RuntimeError("scripted start error")
                self.plugin.start_errors = step.times
            if self.plugin.held:  # its start waits for held.end steps: begun, not awaited
                self._aside(self.agent_job.start_avatar(), step)
                return
            try:
                await self.agent_job.start_avatar()
            except Exception:
                if self.plugin.start_calls == calls:
                    # refused before the plugin was asked: the step changes nothing
                    self.plugin.start_error, self.plugin.start_errors = armed
                raise
        elif isinstance(step, sc.AvatarClose):
            if self.avatar is None:
                raise RuntimeError("no avatar configured (config.avatar_identity)")
            await self.avatar.aclose()
        elif isinstance(step, sc.JobShutdown):
            self.agent_job.shutdown(step.reason)  # what the agent's end-call tool calls
        elif isinstance(step, sc.JobRequestRoomDeletion):
            self.agent_job.request_room_deletion()
        elif isinstance(step, sc.CtxShutdown):  # livekit's order: the session, then the hold
            if lk.session_started(primary := self.sessions["a"]):
                lk.ask_session_close(primary, CloseReason.JOB_SHUTDOWN)
            self.job.shutdown(step.reason)
        elif isinstance(step, sc.JobAclose):
            # begun, not awaited: the scenario's next steps (the simulator's request during
            # the hold) happen while it runs; its outcome is the lifecycle's state
            self._aside(self.agent_job.aclose(graceful=step.graceful), step)
        elif isinstance(step, sc.RoomConnected):
            room.connect_locally()
        elif isinstance(step, sc.RoomDisconnected):
            room.disconnect_locally(rtc.DisconnectReason.Value(step.reason))
        elif isinstance(step, sc.ParticipantConnected):
            if step.identity in room.remote_participants:
                raise ValueError(f"participant {step.identity!r} is already in the room")
            room.add_participant(step.identity, kind=step.kind, attributes=step.attributes)
        elif isinstance(step, sc.ParticipantDisconnected):
            if step.identity in room.remote_participants:
                room.remove_participant(step.identity, rtc.DisconnectReason.Value(step.reason))
            else:  # the SFU never reports a stranger; emit it anyway, the runtime must shrug
                room.emit("participant_disconnected", stranger(step.identity))
        elif isinstance(step, sc.TrackPublished):
            if step.identity in room.remote_participants:
                room.publish_track(step.identity, step.kind)
            else:
                room.emit("track_published", stranger_track(step.kind), stranger(step.identity))
        elif isinstance(step, sc.TrackMuted):
            if step.identity in room.remote_participants:
                room.mute_track(step.identity)
            else:
                room.emit("track_muted", stranger(step.identity), stranger_track("audio"))
        elif isinstance(step, sc.AttributesChanged):
            if step.identity not in room.remote_participants:
                raise ValueError(f"participant {step.identity!r} is not in the room")
            room.set_participant_attributes(step.identity, step.attributes)
        elif isinstance(step, sc.Rpc):
            payload = step.payload if isinstance(step.payload, str) else json.dumps(step.payload)
            entry: dict[str, Any] = {
                "t": self.clock.now(),
                "method": step.method,
                "caller": step.caller,
            }
            try:
                entry["response"] = await room.invoke_rpc(step.method, step.caller, payload)
            except rtc.RpcError as e:
                entry["error"] = {"code": int(e.code), "message": e.message}
            self.rpc_replies.append(entry)
        elif isinstance(step, sc.SessionRequest):
            request_id = f"RQ_{len(self.requests) + 1}"
            self.requests[request_id] = step.request
            if self.watch is not None and step.request == "finalize_simulation":
                self.watch.sent(request_id, step.caller)
            req = build_request(step.request, step.payload, request_id=request_id)
            # from the participant the step names, as the room's byte stream would say
            await self.simulator_end.send_message(
                agent_pb.AgentSessionMessage(request=req), sender=step.caller
            )
        elif isinstance(step, sc.RpcOutcome):
            room.local_participant.rpc_script[step.method].append(step.result)
        elif isinstance(step, sc.HeldEnd):
            if step.call == "avatar_start" and self.plugin is not None and self.plugin.held:
                self.plugin.tell(step.result)
            else:
                key = (step.session or "a") if step.call == "session_close" else ""
                self.held.end(step.call, step.result, key)
        else:  # pragma: no cover - the scenario model admits no other step
            raise AssertionError(step)

    def _aside(self, work: Any, step: sc.Step) -> None:
        """``work`` begun at the step, not awaited; its failure is the step's error."""
        task = asyncio.ensure_future(work)

        def failed(done: asyncio.Future[None]) -> None:
            e = None if done.cancelled() else done.exception()
            if e is not None:
                self.errors.append(refusal(step.at, step.event, e))

        task.add_done_callback(failed)
        self._closes.append(task)

    async def _start_session(self, name: str) -> None:
        session = self.sessions[name]
        if lk.session_started(session):
            raise RuntimeError(f"session {name!r} is already started")
        await self.agent_job.start_session(Agent(instructions="A scenario agent."))

    async def _attach_other(self, name: str) -> None:
        if name in self.sessions:
            raise ValueError(f"a session named {name!r} already exists")
        session: AgentSession[Any] = AgentSession()
        self.sessions[name] = session
        self._watch_close(name, session)
        self.agent_job.attach(session)
        # a second session has no room of its own: RoomIO belongs to the primary one
        await session.start(Agent(instructions="A second scenario agent."), session_host=False)

    # -- waiting for real work ---------------------------------------------------------------
    def _busy(self) -> bool:
        """Real (not virtual-time) work in flight: a session closing, the job's close work
        (its machine's and its own teardown's), the participant link waiting on a session
        close."""
        for name, s in self.sessions.items():
            task = lk.session_closing_task(s)
            if task is not None and not task.done() and not self.held.stalled(name):
                return True
        # unpaced, the room's audio output plays in real time, whatever a held call holds back
        speaking = any(not h.done() for h in self.speeches)
        if not self.paced and speaking and self.agent_job.audio_route() == "room":
            return True
        if self.held.stalled() or (self.plugin is not None and self.plugin.waits):
            return False  # the rest waits for a held call, which only a step ends
        if self.job.state == "closing":
            return True
        if self.agent_job.lifecycle == "closing" and self.job.state != "awaiting_finalize":
            return True  # the release after the job's close (the hold is virtual time)
        return self.link.state == "closing"  # (an avatar's playout is the script's)

    async def advance_to(self, when: float) -> None:
        """Virtual time up to ``when``, letting the real work each timer starts finish
        before the next one fires (a re-prompt playing on the room's audio output)."""
        while (deadline := self.clock.next_deadline()) is not None and deadline <= when:
            await self.clock.run_until(deadline)
            await self.quiesce()
            self._check(f"the deadline at t={seconds_text(deadline)}")
        await self.clock.run_until(when)
        await self.quiesce()

    async def quiesce(self) -> None:
        await settle()
        # the loop's seconds bound work that never settles alike on any machine; the wall
        # clock's stays as a guard for a loop whose time cannot move (tests/test_quiesce_bound)
        deadline = time.monotonic() + _REAL_SETTLE_LIMIT
        loop = asyncio.get_running_loop()
        loop_deadline = loop.time() + _REAL_SETTLE_LIMIT
        while self._busy() and time.monotonic() < deadline and loop.time() < loop_deadline:
            await asyncio.sleep(0.002)
            await settle()

    # -- the result ----------------------------------------------------------------------------
    def result(self, records: list[TraceRecord]) -> dict[str, Any]:
        return scenario_result(self, records)

    async def aclose(self) -> None:
        """Release everything without driving the machines further (the result is taken)."""
        self.held.release()  # what the steps left held ends now (a hang is cancelled)
        if self.plugin is not None:
            self.plugin.release()
        with contextlib.suppress(Exception):
            await self.agent_job.aclose(graceful=False)
        # the scenario's own closes have returned with it (an abort ends a close's hold)
        await asyncio.gather(*self._closes, return_exceptions=True)
        for s in self.sessions.values():
            if lk.session_live(s):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(s.aclose(), _REAL_SETTLE_LIMIT)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.agent_end.close()
        await self.simulator_end.close()


async def run_scenario(
    scenario: sc.Scenario, *, trace_path: str | Path | None = None
) -> dict[str, Any]:
    """Run one scenario; returns the contract's result object."""
    asyncio.get_running_loop().set_exception_handler(sdk_task_failures_at_debug)
    memory = MemorySink()
    jsonl = JsonlSink(trace_path) if trace_path else None
    tracer = Tracer(memory, *([jsonl] if jsonl else []))
    with quiet_sdk_logs():
        sim = _Simulation(scenario, tracer)
        if scenario.expect is not None and scenario.expect.invariants is not None:
            sim.watch = InvariantWatch(
                sim.agent_job,
                sim.sessions,
                memory.records,
                sim.clock.now,
                hung=lambda: sim.held.hung("session_close", "a"),
                tracer=tracer,
            )
        try:
            await sim.run()
            result = sim.result(memory.records)
        finally:
            if jsonl is not None:
                jsonl.close()  # the trace ends where the scenario did, before the teardown
            # tearing down mid-scenario makes the SDK's own tasks complain; nothing to see
            with quiet_sdk_logs(logging.CRITICAL):
                await sim.aclose()
    if jsonl is not None and jsonl.failed is not None:
        # the run went on without it (tracing is observation); say the file is incomplete
        result["trace_error"] = jsonl.failed
    return result


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "scenario"
