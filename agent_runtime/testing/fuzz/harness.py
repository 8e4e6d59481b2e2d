"""One run of the user's own entrypoint, driven step by step as a scenario file says.

The steps are scenario steps (``testing/scenario.py``), read for an entrypoint: at
``session.start`` the entrypoint runs (``run_entrypoint``: a real ``JobContext`` over the
in-memory room, the scripted avatar standing in for the entrypoint's plugin when the run has
an avatar); the others are what the room, the simulator, the avatar, the user and the
agent's own code do to the job. Virtual time moves only between steps, and the real work a
step starts (a session closing) is let finish first. Whatever is observed on the way
(replies to the simulator, when the job was told to end) is kept for the properties.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from livekit import rtc
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.protocol.agent_pb import agent_session as agent_pb
from livekit.protocol.agent_simulation import SimulationDispatch, SimulationMode

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing import scenario as sc
from agent_runtime.testing._silence import silence
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner, EntrypointStalled, NoAgentJob
from agent_runtime.testing.fuzz.runlog import RunLog
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.inmemory_transport import InMemorySessionTransport
from agent_runtime.testing.job_process import JobProcess
from agent_runtime.testing.result import refusal
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.testing.wire import build_request

AVATAR = "avatar"
JOB_ID = "fuzz-job"
SIMULATOR = "simulator"
# how long (real seconds) a step's real work may take before virtual time moves on anyway
_REAL_LIMIT = 10.0


@dataclass
class Sent:
    """A session request the simulator's end sent, and the replies it got."""

    request_id: str
    caller: str
    request: str
    # the job could still answer (serving, or holding for the verdict), or should: a
    # graceful end began with the simulator there, and livekit's on_session_end holds then
    while_open: bool
    replies: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Declined:
    """The entrypoint returned without a job: a room it declines."""

    error: NoAgentJob


@dataclass(frozen=True)
class Failed:
    """The entrypoint raised, or the job's end cut it before it built a job."""

    error: BaseException


class Harness:
    """Runs scenario steps against ``server``'s entrypoint; ``close()`` ends the job as the
    test's end does and releases everything."""

    def __init__(self, server: Any, config: sc.Config, *, keep_logs: bool = True) -> None:
        self.server = server
        self.config = config
        self.clock = VirtualClock()
        self.room = InMemoryRoom(name="fuzz-room", clock=self.clock)
        self.agent_end, self.simulator_end = InMemorySessionTransport.pair(
            identities=("agent", SIMULATOR)
        )
        self.runner = EntrypointRunner(
            room=self.room, clock=self.clock, transport=self.agent_end, connect=False
        )
        self.avatar: ScriptedAvatar | None = None
        if config.avatar_identity is not None:
            self.avatar = ScriptedAvatar(avatar_identity=config.avatar_identity, clock=self.clock)
        self.job: AgentJob | None = None
        self.ctx: Any = None  # the run's JobContext, and its end (kept past the release)
        self.process: JobProcess | None = None
        # how the entrypoint ended without handing over a job (none: not run yet, still
        # waiting, or it handed one over)
        self.entry: Declined | Failed | None = None
        self.sent: dict[str, Sent] = {}
        self.closes: list[asyncio.Future[None]] = []
        self.refused: list[str] = []
        self.ended_at: float | None = None  # when something first told the job to end
        self.aborted = False  # an aclose(graceful=False) came: no hold is owed from then on
        # the world's side (the agent's own leaving is not the simulator's or the room's end)
        self.simulator_here = False
        self.simulator_at_end = False  # in the room when the job was told to end
        self.room_gone = False
        self.end_cause: str | None = None
        self.failures_at_end = 0
        self.listeners_before: list[tuple[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        # real seconds the run may still wait for work the agent gave a thread: one that
        # never ends (a blocking consumer) costs the run this much once, not at every step
        self.thread_wait = _REAL_LIMIT
        # the run's records, kept for its report rather than printed (none: printed)
        self.log: RunLog | None = None
        if keep_logs:
            self.log = RunLog(self.clock, JOB_ID, self.room.name, self._hears)

    # -- set-up --------------------------------------------------------------------------
    async def open(self, participants: tuple[sc.Participant, ...]) -> None:
        """The room as the run starts; the run's log taken from here until ``release_log``
        (``close`` does it)."""
        if self.log is not None:
            self.log.install()
        if self.config.room_connected:
            self.room.connect_locally()
        self.listeners_before = lk.emitter_listeners(self.room)
        for p in participants:
            self.room.add_participant(p.identity, kind=p.kind, attributes=p.attributes)
        self.simulator_here = SIMULATOR in self.room.remote_participants
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())

    @property
    def started(self) -> bool:
        return self.process is not None

    def end_condition(self, cause: str) -> None:
        if self.ended_at is None:
            self.ended_at, self.end_cause = self.clock.now(), cause
            self.simulator_at_end = self.simulator_here
            self.failures_at_end = len(self.runner.user_failures)  # those before it

    # -- steps ---------------------------------------------------------------------------
    async def step(self, step: sc.Step) -> None:
        await self.advance_to(step.at)
        try:
            await self._apply(step)
        except Exception as e:  # a step the world refuses changes nothing
            self.refused.append(refusal(step.at, step.event, e))
        await self.quiesce()
        self._take_job()

    async def _apply(self, step: sc.Step) -> None:
        room, job = self.room, self.job
        if isinstance(step, sc.SessionStart):
            await self._start()
        elif isinstance(step, sc.AvatarStartError):
            if self.avatar is None:
                raise RuntimeError("no avatar in this run")
            self.avatar.start_error = RuntimeError("the avatar provider refused the session")
            self.avatar.start_errors = step.times
        elif isinstance(step, sc.ParticipantConnected):
            if step.identity in room.remote_participants:
                raise ValueError(f"{step.identity!r} is already in the room")
            room.add_participant(step.identity, kind=step.kind, attributes=step.attributes)
            self.simulator_here = self.simulator_here or step.identity == SIMULATOR
        elif isinstance(step, sc.ParticipantDisconnected):
            linked = job.link.linked_identity if job is not None else None
            if step.identity not in room.remote_participants:
                raise ValueError(f"{step.identity!r} is not in the room")
            p = room.remove_participant(step.identity, rtc.DisconnectReason.Value(step.reason))
            self.simulator_here = self.simulator_here and step.identity != SIMULATOR
            if ATTRIBUTE_SIMULATOR in p.attributes:
                self.end_condition("the simulator left")
            elif step.identity == linked and step.reason in _CLOSING:
                self.end_condition(f"the linked participant left ({step.reason})")
        elif isinstance(step, sc.TrackPublished):
            room.publish_track(step.identity, step.kind)
        elif isinstance(step, sc.Rpc):
            payload = step.payload if isinstance(step.payload, str) else json.dumps(step.payload)
            with contextlib.suppress(rtc.RpcError):
                await room.invoke_rpc(step.method, step.caller, payload)
        elif isinstance(step, sc.SessionRequest):
            await self._request(step)
        elif isinstance(step, sc.RoomDisconnected):
            self.end_condition(f"the room went ({step.reason})")
            self.room_gone = True
            room.disconnect_locally(rtc.DisconnectReason.Value(step.reason))
        # the session's turns in the job's context, as livekit runs them: what the agent's
        # handlers start there (an end-call tool) finds its job (get_job_context())
        elif isinstance(step, sc.UserSpeech):
            session, in_job = self._session(), self.runner.in_job
            in_job(lk.set_user_state, session, "speaking")
            self.clock.call_later(step.duration, lambda: in_job(_listening, session))
        elif isinstance(step, sc.SessionInterrupt):
            self.runner.in_job(self._session().interrupt)
        elif isinstance(step, sc.AgentSay):
            self.runner.in_job(self._session().say, step.text, audio=silence(step.duration))
        elif isinstance(step, sc.JobAclose):
            if job is None:
                raise RuntimeError("no job yet")
            self.end_condition("the agent's code closed the job")
            self.aborted = self.aborted or not step.graceful
            # from the agent's code, in the job's context: what its close handlers start too
            close = job.aclose(graceful=step.graceful)
            self.closes.append(self.runner.in_job(asyncio.ensure_future, close))
        elif isinstance(step, sc.JobShutdown):
            if job is None:
                raise RuntimeError("no job yet")
            self.end_condition("the agent's code shut the job down")
            self.runner.in_job(job.shutdown, step.reason)  # as its end-call tool calls it
        elif isinstance(step, sc.CtxShutdown):
            if not self.started:
                raise RuntimeError("no job yet")
            self.end_condition("ctx.shutdown()")
            self.ctx.shutdown(step.reason)
        else:
            raise ValueError(f"{step.event} is not a step the fuzzer takes")

    async def _start(self) -> None:
        if self.started:
            raise RuntimeError("the entrypoint already ran")
        try:
            # an audio simulation: the agent speaks, as in the audio runs it is deployed for
            dispatch = SimulationDispatch(
                simulation_run_id="RUN_fuzz",
                job_id=JOB_ID,
                mode=SimulationMode.SIMULATION_MODE_AUDIO,
            )
            self.job = await self.runner(
                self.server,
                simulation=dispatch if self.config.simulation else False,
                avatar=self.avatar,
                job_id=JOB_ID,
            )
        except EntrypointStalled:
            # it waits (for a participant, say) as a livekit job would: its job, once
            # built, is taken after a later step (_take_job)
            pass
        except NoAgentJob as e:
            if e.cut:  # the job's end cancelled it first
                self.entry = Failed(e)
                self.end_condition("the entrypoint raised")
            else:
                # it returned without a job: a room it declines (nobody in it yet, say) is
                # the agent's choice, checked as a run with no job; the preflight refuses
                # an agent that declines every room
                self.entry = Declined(e)
        except Exception as e:
            self.entry = Failed(e)
            self.end_condition("the entrypoint raised")
        finally:
            with contextlib.suppress(RuntimeError):  # refused before it ran: no run
                self.ctx, self.process = self.runner.ctx, self.runner.process

    def _take_job(self) -> None:
        """The job an entrypoint that waited built since."""
        if self.job is None and self.started:
            with contextlib.suppress(RuntimeError):  # none built yet
                self.job = self.runner.job

    def _session(self) -> Any:
        if self.job is None or not lk.session_live(self.job.session):
            raise RuntimeError("no session running")
        return self.job.session

    async def _request(self, step: sc.SessionRequest) -> None:
        self._take_job()  # one built on a timer since the last step
        request_id = f"RQ_{len(self.sent) + 1}"
        req = build_request(step.request, step.payload, request_id=request_id)
        msg = agent_pb.AgentSessionMessage(request=req)
        job = self.job
        open_ = job is not None and job.states.get("job") in ("serving", "awaiting_finalize")
        open_ = open_ or self._hold_owed()
        # recorded first: one the agent's closed end refuses is a request never answered
        self.sent[request_id] = Sent(request_id, step.caller, step.request, open_)
        await self.simulator_end.send_message(msg, sender=step.caller)

    def _hold_owed(self) -> bool:
        """A graceful end began in a simulation with the simulator still in the room and no
        verdict given yet: the job holds for it (``on_session_end``), up to its bounds,
        unless the job machine itself ends the hold (its timeout, the simulator leaving).
        Owed, then: a job that never held, or whose hold its own room's end cut (the
        agent's side left, the server did not delete the room)."""
        job, process = self.job, self.process
        if job is None or process is None or self.ended_at is None or self.aborted:
            return False
        if isinstance(self.entry, Failed) or not self.config.simulation:
            return False
        if not (self.simulator_at_end and self.simulator_here) or self.room_gone:
            # the end began as the simulator left (livekit ends a simulation then, with no
            # hold): a simulator back later finds the job gone
            return False
        if any(
            s.caller == SIMULATOR and any(r.get("verdict") for r in s.replies)
            for s in self.sent.values()
        ):
            return False
        began, left = self.ended_at, None
        for t in self.runner.transitions:
            if t["machine"] == "job" and t["dest"] == "awaiting_finalize" and left is None:
                began = min(began, t["t"])
            elif t["machine"] == "job" and t["source"] == "awaiting_finalize" and left is None:
                left = t["event"]
        if left is not None and left != "room_disconnected":
            return False
        hold = min(job.settings.session_end_timeout, process.session_end_timeout)
        return self.clock.now() < began + hold  # at its end the hold is over

    async def _read_replies(self) -> None:
        async for msg in self.simulator_end:
            if not msg.HasField("response"):
                continue
            resp = msg.response
            sent = self.sent.get(resp.request_id)
            entry: dict[str, Any] = {"t": self.clock.now(), "error": resp.error or None}
            if resp.HasField("finalize_simulation"):
                fs = resp.finalize_simulation
                entry["verdict"] = fs.HasField("user_verdict") or not resp.error
            if sent is not None:
                sent.replies.append(entry)

    # -- time ----------------------------------------------------------------------------
    def _busy(self) -> bool:
        job = self.job
        if job is None:
            return False
        task = lk.session_closing_task(job.session)
        if task is not None and not task.done():
            return True
        if job.states.get("job") == "closing" or job.states.get("participant") == "closing":
            return True
        if job.lifecycle == "closing" and job.states.get("job") != "awaiting_finalize":
            return True
        # livekit's end of the job, where it waits on real work (not on a bound)
        process = self.process
        return (
            process is not None
            and not process.ended.done()
            and bool(process.steps)
            and (process.steps[-1][1] in ("session", "report", "disconnect"))
        )

    def _ending(self) -> bool:
        """livekit's end of the job is under way, and the run may still wait on threads."""
        process = self.process
        ending = process is not None and process.begun and not process.ended.done()
        return ending and self.thread_wait > 0

    async def quiesce(self) -> None:
        await settle()
        deadline = time.monotonic() + _REAL_LIMIT
        # the loop's seconds too: on a virtual loop with nothing on a thread or a socket
        # they pass at once, and a close waiting on what never comes (the agent's on_exit)
        # spent the whole real limit at every step
        loop = asyncio.get_running_loop()
        loop_deadline = loop.time() + _REAL_LIMIT
        while time.monotonic() < deadline and loop.time() < loop_deadline:
            # work on a thread (to_thread, run_in_executor) in the job's end takes real
            # time: the job's clock waits for it, as the loop's own does, rather than
            # running past it to a bound (during the session the SDK's own keep it busy)
            threads = self._ending() and getattr(loop, "threads", 0) > 0
            if not (threads or self._busy()):
                break
            began = time.monotonic()
            await asyncio.sleep(0.001)
            await settle()
            if threads:
                self.thread_wait -= time.monotonic() - began

    async def advance_to(self, when: float) -> None:
        while (deadline := self.clock.next_deadline()) is not None and deadline <= when:
            await self.clock.run_until(deadline)
            await self.quiesce()
        await self.clock.run_until(when)
        await self.quiesce()

    def process_ended(self) -> bool:
        return self.process is not None and self.process.ended.done()

    async def run_out(self, limit: float) -> None:
        """Let virtual time run (up to ``limit`` seconds more) until the job has ended."""
        end = self.clock.now() + limit
        while not self.process_ended() and self.clock.now() < end:
            nxt = self.clock.next_deadline()
            await self.advance_to(min(nxt, end) if nxt is not None else end)
            if nxt is None:
                break

    # -- the end -------------------------------------------------------------------------
    async def close(self) -> None:
        """End the job as the end of a test does, then release everything (the agent's
        failures stay in ``runner.failures``)."""
        if self.started:
            # first: the test's end moves the job's clock until its end is over, which the
            # job.aclose() steps still waiting may need (a run hypothesis cut short)
            await self.runner.aclose(report=False)
        await asyncio.gather(*self.closes, return_exceptions=True)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.agent_end.close()
        await self.simulator_end.close()
        self.release_log()

    def release_log(self) -> None:
        """Stop taking the run's log (``close`` does; whoever opened the run calls it in a
        ``finally`` too, for a run cut short): what was kept stays in ``log_lines``."""
        if self.log is not None:
            self.log.remove()

    def log_lines(self) -> list[str]:
        """The run's records kept for its report (none when they were printed)."""
        return self.log.report_lines() if self.log is not None else []

    def _hears(self) -> logging.Handler | None:
        # the run's UserFailures, while it listens: what it would have heard, it hears
        failures = self.runner.failures
        return failures if failures in logging.getLogger().handlers else None


_CLOSING = ("CLIENT_INITIATED", "ROOM_DELETED", "USER_REJECTED")

# the steps ``Harness.step`` takes (``_apply``), and ``end``: a scenario with others cannot
# be replayed against an entrypoint (``simulate`` runs the job itself and takes them all)
TAKES: tuple[type[Any], ...] = (
    sc.SessionStart,
    sc.AvatarStartError,
    sc.ParticipantConnected,
    sc.ParticipantDisconnected,
    sc.TrackPublished,
    sc.Rpc,
    sc.SessionRequest,
    sc.RoomDisconnected,
    sc.UserSpeech,
    sc.SessionInterrupt,
    sc.AgentSay,
    sc.JobAclose,
    sc.JobShutdown,
    sc.CtxShutdown,
    sc.End,
)
# the config a replay honours: the rest is the entrypoint's own (its AgentJob's options)
CONFIG = ("avatar_identity", "simulation", "room_connected")


def _listening(session: Any) -> None:
    if lk.session_live(session):
        lk.set_user_state(session, "listening")
