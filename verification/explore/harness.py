"""A real ``AgentJob`` driven one input at a time, and its view.

What runs is the runtime an agent embeds: ``AgentJob`` over an ``InMemoryRoom`` (a real
``rtc.Room`` with no connection), real ``AgentSession``s, the job-owned session host with
its protobuf messages on a paired in-memory transport, on a ``VirtualClock``. Stood in,
because they need a server or are the outside world's choice: the avatar provider
(a held ``ScriptedAvatar``: its ``start()`` waits for the test to say what the provider
does), the
agent's ``on_simulation_end``, room deletion and a shutdown callback (each waits for the
test to return, fail or hang), and the end of a session's close (the real close runs when
the test lets it finish; it may hang). The transport refuses to send while the room is
disconnected, as the room's byte stream does.

What the harness sees of the job, and the job's view, come from ``observe``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.protocol.agent_pb import agent_session as agent_pb
from livekit.protocol.agent_simulation import SimulationDispatch

from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.session_close import hold_session_close
from agent_runtime.settings import AvatarRetry, Backoff, PlayoutOptions
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.held import Gate
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.inmemory_transport import InMemorySessionTransport
from agent_runtime.testing.invariants.observe import Observed, runtime_view, session_state
from agent_runtime.testing.invariants.view import JobView
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from verification.explore.actions import ACTIONS
from verification.explore.config import (
    GRACE_PERIOD,
    MAX_REPROMPTS,
    PEOPLE,
    SETTINGS,
    Config,
)
from verification.explore.speaker import RoomSpeaker

_CLOSE_LIMIT = 10.0  # seconds of the loop a session's released close may take (it never should)
VERDICT = "the harness vetoes this run"


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
    """One ``AgentJob`` as users get it (playout on with its avatar), set up as
    ``config`` says, driven one input at a time."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.clock = VirtualClock()
        self.trace = MemorySink()
        self.tracer = Tracer(self.trace)  # a checker may add its own sink
        self.room: InMemoryRoom = InMemoryRoom(name="explored", clock=self.clock)
        self.observed = Observed()
        agent_end, self.simulator = _RoomBoundTransport(), InMemorySessionTransport()
        agent_end._peer, self.simulator._peer = self.simulator, agent_end
        agent_end.room, agent_end.observed = self.room, self.observed
        # the world settles a clear (clear_settles), or time passes the sink's own bound
        # (livekit's 2 s, on the loop's virtual time)
        self.plugin = ScriptedAvatar(avatar_identity=PEOPLE["avatar"].identity, held=True)
        self.sessions: dict[str, AgentSession[Any]] = {"A": AgentSession()}
        self.closes: dict[str, Gate] = {}
        self.verdicts: list[Gate] = []
        self.deletion_gates: list[Gate] = []
        self.callback: Gate = Gate()
        self.other = 0  # requests sent whose replies the view does not follow
        self.reprompts = 0  # the playout watchdog's re-prompts
        self._bg: set[asyncio.Task[Any]] = set()
        self.job: AgentJob = AgentJob(
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
            playout=self._playout(config),
            on_reprompt=self._reprompt if config.watchdog != "off" else None,
            clock=self.clock,
            tracer=self.tracer,
            otel=False,
            transport=agent_end,
            simulation=SimulationDispatch(simulation_run_id="RUN_explored")
            if config.simulation
            else None,
            on_simulation_end=self._on_simulation_end,
            delete_room=self._delete_room,
            remove_avatar_participant=self._remove_avatar,
        )
        self.job.add_shutdown_callback(self._shutdown_callback)
        self.observed.watch_job(self.job)
        self._gate_close("A")
        self.observed.watch_rpcs(self.job)

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
        await gate.outcome()
        ctx.fail(VERDICT)

    async def _delete_room(self) -> None:
        self.observed.deletions.append(self.job.job.state)
        gate = Gate()
        self.deletion_gates.append(gate)
        if await gate.outcome() == "fail":
            raise RuntimeError("the server refused to delete the room")

    async def _remove_avatar(self, identity: str) -> None:
        self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    async def _shutdown_callback(self) -> None:
        await self.callback.outcome()

    def _gate_close(self, name: str) -> None:
        """The session's close runs once the test lets it (``finish``), fails in its
        teardown (``fail``), or never ends (``hang``)."""
        gate = self.closes[name] = Gate()

        async def before() -> None:
            if await gate.outcome() == "fail":
                raise RuntimeError("a plugin raised in the session's teardown")

        hold_session_close(self.sessions[name], before)

    def session_state(self, name: str = "A") -> str:
        return session_state(self.sessions[name], hung=self.closes[name].said == "hang")

    # -- start, drive, look ------------------------------------------------------------------
    async def start(self) -> None:
        """The run's start: the room connected with ``config.present`` in it, the runtime
        following the room, the avatar not started; the session started and attached and
        the link following, unless ``config.session_started`` is off (an input then)."""
        self.room.connect_locally()
        for who in self.config.present:
            p = PEOPLE[who]
            self.room.add_participant(p.identity, kind=p.kind, attributes=dict(p.attributes))
        await self.job.start_runtime()
        if self.config.session_started:
            await self.start_session()
        await self.quiesce()

    async def start_session(self) -> None:
        """The user's ``job.start_session()``, then the room's track on the job's clock."""
        await self.job.start_session(Agent(instructions="An explored agent."))
        # the room's track plays on the job's clock (no server plays RoomIO's own)
        self.sessions["A"].output.replace_audio_tail(RoomSpeaker(self.room, self.clock))

    def session_began(self) -> bool:
        """The primary session started, whether or not it closed since (the SDK says a
        closed session is not started: its close is what tells)."""
        session = self.sessions["A"]
        return lk.session_started(session) or lk.session_closing_task(session) is not None

    def view(self) -> JobView:
        return runtime_view(
            self.job,
            self.observed,
            self.trace.records,
            sessions=self.sessions,
            session=self.session_state("A"),
        )

    def bg(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"harness:{name}")
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        # a user's call that fails (start_avatar() once the job closed) is the job's
        # answer, which the view judges: retrieved, not reported by asyncio at collection
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _busy(self) -> list[asyncio.Task[Any]]:
        """The sessions' closes the world let go on and that still run."""
        avatar = self.job.avatar
        busy = []
        for name, session in self.sessions.items():
            if name == "A" and avatar is not None and avatar.state == "clearing":
                # its close interrupts the agent's speech, which waits for the plugin's
                # clear, which ends with the world's word (clear_settles) or with the sink's
                # own bound as time passes: both inputs, not this wait's
                continue
            task = lk.session_closing_task(session)
            said = self.closes[name].said
            if task is not None and not task.done() and said in ("finish", "fail"):
                busy.append(task)
        return busy

    async def quiesce(self) -> None:
        """Settle; then wait for the closes the world let go on (the SDK's own timers may
        bound them: on the explorer's ``VirtualTimeLoop`` that wait is virtual)."""
        await settle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLOSE_LIMIT
        while (busy := self._busy()) and loop.time() < deadline:
            await asyncio.wait(busy, timeout=deadline - loop.time())
            await settle()
        self._pump()

    def _pump(self) -> None:
        """The replies the simulator's end received, by request."""
        for msg in self.simulator.receive_nowait():
            if msg.HasField("response"):
                resp = msg.response
                kind = "verdict" if resp.HasField("finalize_simulation") else "error"
                self.observed.replies.setdefault(resp.request_id, []).append(kind)

    async def do(self, action: str) -> None:
        """Do one input (``ACTIONS``: ``NAME`` or ``NAME:ARG``), then let everything it
        causes settle."""
        name, _, arg = action.partition(":")
        if (act := ACTIONS.get(name)) is None:
            raise KeyError(f"the harness cannot do {action!r}")
        res = act(self, arg)
        if asyncio.iscoroutine(res):
            await res
        await self.quiesce()

    async def aclose(self) -> None:
        """Release everything: every gate told to go on, the job closed, time run out."""
        for gate in (*self.closes.values(), *self.verdicts, *self.deletion_gates, self.callback):
            if gate.waiting:
                gate.open("finish" if gate in self.closes.values() else "return")
        # the provider fails every start from now on, the one waiting too
        self.plugin.release("error")
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
