"""A JobRuntime in an in-memory room, with livekit's RemoteSession as the simulator."""

from __future__ import annotations

from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.agents.voice.remote_session import (
    RemoteSession,
)

from agent_runtime import MemorySink, Tracer
from agent_runtime.runtimes.job import JobRuntime
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport

DISPATCH = SimulationDispatch(simulation_run_id="run-7", job_id="simjob-7")
SIM = {ATTRIBUTE_SIMULATOR: "1"}


class JobRig:
    """A job in a connected in-memory room, a simulator participant, and its transport end."""

    def __init__(
        self,
        *,
        simulation: Any = DISPATCH,
        simulator: bool = True,
        others: tuple[tuple[str, str], ...] = (),
        on_simulation_end: Any = None,
        wrap_transport: Any = None,
        **opts: Any,
    ) -> None:
        self.clock = VirtualClock()
        self.sink = MemorySink()
        self.room = InMemoryRoom(name="sim-room", clock=self.clock)
        self.room.connect_locally()
        if simulator:
            self.room.add_participant("simulator", attributes=SIM)
        for identity, kind in others:
            self.room.add_participant(identity, kind=kind)
        # the simulator's end: its messages come from the simulator participant
        self.sim_end, self.agent_end = InMemorySessionTransport.pair(
            identities=("simulator", "agent")
        )
        self.deletions: list[tuple[float, bool]] = []
        self.verdicts_seen: list[Any] = []
        self.callbacks: list[tuple[float, str]] = []

        def veto(ctx: SimulationContext) -> None:
            self.verdicts_seen.append(ctx.simulator_verdict)
            ctx.fail("orders table does not match the scenario")

        async def delete_room() -> None:
            # what the server does: the room goes, with everyone in it
            self.deletions.append((self.clock.now(), self.runtime.finalize_answered))
            self.room.deleted_at = self.clock.now()
            self.room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)

        self.runtime = JobRuntime(
            room=self.room,
            clock=self.clock,
            tracer=Tracer(self.sink),
            # wrap_transport: the job's end as a transport of another kind
            transport=wrap_transport(self.agent_end) if wrap_transport else self.agent_end,
            simulation=simulation,
            on_simulation_end=on_simulation_end or veto,
            delete_room=opts.pop("delete_room", delete_room),
            **opts,
        )

        async def record(reason: str) -> None:
            self.callbacks.append((self.clock.now(), reason))

        self.runtime.add_shutdown_callback(record)

    async def settle(self) -> None:
        await settle()
        await self.runtime.host.actor.join()
        await self.runtime.actor.join()
        await settle()

    def path(self) -> list[tuple[float, str, str, str]]:
        return [
            (r.t, r.event, r.source, r.dest)
            for r in self.sink.records
            if r.machine == "job" and r.kind == "transition"
        ]

    async def remote(self) -> RemoteSession:
        remote = RemoteSession(self.sim_end)
        await remote.start()
        return remote


async def session_in(
    room: InMemoryRoom, instructions: str = "You take orders."
) -> AgentSession[Any]:
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions=instructions), room=room, session_host=False)
    return session


async def bare_session(instructions: str) -> AgentSession[Any]:
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions=instructions), session_host=False)
    return session


# -- the cases of the issue --------------------------------------------------------------------
