"""A JobSessionHost over a paired in-memory transport, with a scripted simulator."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from livekit.agents import (
    Agent,
    AgentSession,
    UserInputTranscribedEvent,
)
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime import Event, MemorySink, Tracer
from agent_runtime.runtimes.session_host import (
    JobSessionHost,
)
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemorySessionTransport
from agent_runtime.testing.wire import build_request

DISPATCH = SimulationDispatch(simulation_run_id="run-1", job_id="simjob-1")


class Simulator:
    """The remote end, speaking raw protobuf: requests out, responses and events in."""

    def __init__(self, end: InMemorySessionTransport) -> None:
        self.end = end
        self.responses: dict[str, agent_pb.SessionResponse] = {}
        self.received: list[agent_pb.SessionResponse] = []  # every response, in order
        self.events: list[agent_pb.AgentSessionEvent] = []
        self._ids = itertools.count(1)

    def pump(self) -> None:
        for msg in self.end.receive_nowait():
            if msg.HasField("response"):
                self.responses[msg.response.request_id] = msg.response
                self.received.append(msg.response)
            elif msg.HasField("event"):
                self.events.append(msg.event)

    async def send(
        self, kind: str, payload: dict[str, Any] | None = None, *, sender: str | None = None
    ) -> str:
        rid = f"req-{next(self._ids)}"
        req = build_request(kind, payload, request_id=rid)
        await self.end.send_message(agent_pb.AgentSessionMessage(request=req), sender=sender)
        return rid

    async def reply(self, rid: str) -> agent_pb.SessionResponse:
        for _ in range(20):
            await settle()
            self.pump()
            if rid in self.responses:
                return self.responses.pop(rid)
        raise AssertionError(f"no reply to {rid}")

    async def ask(
        self, kind: str, payload: dict[str, Any] | None = None, *, sender: str | None = None
    ) -> agent_pb.SessionResponse:
        return await self.reply(await self.send(kind, payload, sender=sender))

    def transcripts(self) -> list[str]:
        self.pump()
        out = [
            e.user_input_transcribed.transcript
            for e in self.events
            if e.HasField("user_input_transcribed")
        ]
        self.events.clear()
        return out


class Rig:
    def __init__(
        self,
        *,
        simulation: Any = DISPATCH,
        on_simulation_end: Callable[[SimulationContext], Any] | None = None,
        transport: type[InMemorySessionTransport] = InMemorySessionTransport,
        is_simulator: Callable[[str], bool] | None = None,
    ) -> None:
        self.clock = VirtualClock()
        self.sink = MemorySink()
        # the simulator's end: its messages come from the participant "simulator"
        self.sim_end, self.agent_end = transport.pair(identities=("simulator", "agent"))
        self.sim = Simulator(self.sim_end)
        self.closed_reasons: list[str] = []
        self.answered: list[dict[str, Any] | None] = []
        self.host = JobSessionHost(
            self.agent_end,
            simulation=simulation,
            on_simulation_end=on_simulation_end,
            on_session_closed=self.closed_reasons.append,
            on_finalize_answered=self.answered.append,
            clock=self.clock,
            tracer=Tracer(self.sink),
            instance="test",
            is_simulator=is_simulator,
        )

    async def settle(self) -> None:
        await settle()
        await self.host.actor.join()
        await settle()

    def last(self, event: str, machine: str = "session_host") -> Any:
        recs = [
            r
            for r in self.sink.records
            if r.machine == machine
            and r.event == event
            and r.kind in ("transition", "ignore", "reject")
        ]
        assert recs, f"no record for {event}"
        return recs[-1]

    def effect_outcomes(self) -> dict[str, str]:
        return {r.effect: r.outcome for r in self.sink.records if r.kind == "effect"}

    async def close_keeping_actors(self) -> None:
        """Close the host as ``aclose`` does, but leave its actors open (a cell test still
        sends them events)."""
        await self.host.actor.send(Event("close"))
        await self.host.actor.until(lambda state: state == "closed")


async def started_session(instructions: str) -> AgentSession[Any]:
    s: AgentSession[Any] = AgentSession()
    await s.start(Agent(instructions=instructions), session_host=False)
    return s


def listeners(session: AgentSession[Any]) -> int:
    return sum(len(v) for v in session._events.values())


def say(session: AgentSession[Any], text: str) -> None:
    # the event the session's STT path emits for a user transcript
    session.emit(
        "user_input_transcribed", UserInputTranscribedEvent(transcript=text, is_final=True)
    )
