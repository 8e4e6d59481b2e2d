"""``JobRuntime``: one per job, driven by the ``job`` machine, with its session host and
room deletion (built here when used alone; handed in by ``JobSystem`` when composed).

The job keeps its room and its session host until the simulator has had its verdict:
shutdown holds in ``awaiting_finalize`` only while a simulator is there to ask, and room
deletion (``room_deletion``, a machine of its own) waits for the hold to end (the table:
``statemachines.job``). With livekit-agents, use ``AgentJob.from_job_context(ctx, ...)``
(which composes this with the session, the participant link and the avatar) and pass
``on_session_end`` to ``AgentServer.rtc_session``: upstream calls it after the session
closed and before it disconnects the room, so the hold runs while the simulator can still
reach the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.voice.remote_session import SessionTransport

from agent_runtime._messages import NO_NAMES
from agent_runtime.actor import Event, StateChanged, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes._base import Hear, MachineRuntime, check_parts, is_closed, released
from agent_runtime.runtimes.job_close import JobClose
from agent_runtime.runtimes.room_deletion import DeleteRoomFn, RoomDeletion, room_deletion_for
from agent_runtime.runtimes.room_events import RoomEventAdapter, RoomFact, simulators_in
from agent_runtime.runtimes.routing import Wiring, follow, plain_fact
from agent_runtime.runtimes.session_host import (
    JobSessionHost,
    SimulationEndFn,
    session_host_for,
    simulation_context,
)
from agent_runtime.runtimes.sessions import JobSessions
from agent_runtime.runtimes.shutdown_callbacks import ShutdownCallback
from agent_runtime.runtimes.teardown import Work, service_call
from agent_runtime.scheduler import Scheduler, after, ending
from agent_runtime.settings import check_setting, observed
from statemachines.glue import hold_needed, simulators_after
from statemachines.job import JOB

logger = logging.getLogger("agent_runtime.job")


class _Facts:
    """What the job's guard and room conditions read (``statemachines.glue``), live."""

    __slots__ = ("_rt",)
    avatar_identity = None  # no route of the job's is about the avatar

    def __init__(self, runtime: JobRuntime) -> None:
        self._rt = runtime

    @property
    def is_simulation(self) -> bool:
        return self._rt._simulation is not None

    @property
    def simulator_present(self) -> bool:
        return bool(self._rt._simulators)

    @property
    def simulators(self) -> frozenset[str]:
        return self._rt._simulators

    @property
    def room_connected(self) -> bool:
        return self._rt._room.isconnected()

    @property
    def finalize_answered(self) -> bool:
        return self._rt.host.finalize_answered


class JobRuntime(MachineRuntime[str]):
    """The job machine, its session host and its room deletion, over one room. Emits
    ``state_changed`` (a ``StateChanged``, from any of those machines) and ``closed``."""

    _EVENT_NAMES = frozenset({"state_changed", "closed"})  # on("state_chnaged") is refused

    def __init__(
        self,
        *,
        room: rtc.Room,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        trace_path: str | Path | None = None,
        transport: SessionTransport | None = None,
        simulation: SimulationContext | SimulationDispatch | None = None,
        on_simulation_end: SimulationEndFn | None = None,
        session_end_timeout: float = 300.0,
        close_timeout: float = 10.0,
        delete_room_on_close: bool = False,
        delete_room: DeleteRoomFn | None = None,
        room_events: RoomEventAdapter | None = None,
        wiring: Wiring | None = None,
        host: JobSessionHost | None = None,
        deletion: RoomDeletion | None = None,
        sessions: JobSessions | None = None,
        composed_works: Callable[[], Mapping[str, Work]] | None = None,
        lost_room_hint: Callable[[], str] | None = None,
        owner: Hear | None = None,
    ) -> None:
        """``wiring``, ``host``, ``deletion`` and ``sessions``: the parts a composing system
        built and holds itself (its ``owner`` hears their state changes); alone, the job
        builds its own (its sessions with no own session: any attached one's close ends the
        job through the host). ``composed_works``: the works of run_close's steps the
        composer does; ``lost_room_hint()``: a lost verdict's word on a room gone in a hold."""
        super().__init__(owner)
        # its machines share one scheduler, the job's when composed
        scheduler = scheduler if scheduler is not None else Scheduler()
        if not isinstance(room, rtc.Room):
            raise TypeError(f"room must be an rtc.Room, not {type(room).__name__}")
        session_end_timeout = check_setting("session_end_timeout", session_end_timeout)
        close_timeout = check_setting("close_timeout", close_timeout)
        # every part's type, before the trace file is opened (truncated)
        check_parts(
            trace_path=trace_path,
            clock=clock,
            tracer=tracer,
            transport=transport,
            scheduler=scheduler,
            on_simulation_end=on_simulation_end,
            delete_room=delete_room,
            room_events=room_events,
        )
        if room_events is not None and room_events.room is not room:
            raise ValueError("room_events must be an adapter over the same room")
        if host is not None and (transport is not None or on_simulation_end is not None):
            raise ValueError("give a host, or its transport and on_simulation_end: not both")
        if deletion is not None and delete_room is not None:
            raise ValueError("give a deletion, or delete_room: not both")
        if wiring is not None and delete_room_on_close:
            raise ValueError("with a wiring given, delete_room_on_close is the wiring's flag")
        # production traces: the same JSONL `agent-runtime replay` reads, plus the logs
        tracer, self._trace_file, _ = observed(tracer, trace_path, otel=False)
        self.tracer = tracer  # hand it to ParticipantLink/AvatarLifecycle to trace them too
        self._room = room
        self._clock: Clock = clock or AsyncioClock()
        self._close_timeout = float(close_timeout)
        self._session_end_timeout = float(session_end_timeout)
        self._own_events = room_events is None
        self._room_events = room_events or RoomEventAdapter(room)
        self._unsubscribe_facts: Callable[[], None] | None = None
        self._simulation = simulation_context(simulation)
        self._simulators: frozenset[str] = NO_NAMES
        self._facts = _Facts(self)
        # the links between the job's machines, as declared (statemachines.links.LINKS)
        self.wiring = wiring or Wiring(flags={"delete_room_on_close": bool(delete_room_on_close)})
        self._close = JobClose(
            self, composed_works, close_timeout=self._close_timeout, clock=self._clock
        )
        self._reason = ""
        self.disconnect_hint: Callable[[], str] = lost_room_hint or str  # str(): ""
        instance = room.name or "job"
        # a part the job builds itself, it forwards the changes of (a composer forwards its own)
        self.host = host or session_host_for(
            room,
            transport=transport,
            simulation=self._simulation,
            on_simulation_end=on_simulation_end,
            wiring=self.wiring,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            close_timeout=self._close_timeout,
            is_simulator=lambda identity: identity in self._simulators,
            owner=self._emit_state,
        )
        # the shared guard (statemachines.glue) reads the job's facts view
        self._run_machine(
            JOB,
            _EFFECTS,
            facts=self._facts,
            instance=instance,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=self.wiring,
            post=self._post_linked,
        )
        self._label_room(room)  # a failing listener of its own names the room
        # asked for by anyone, run once the job's closing work allows it
        self.deletion = deletion or room_deletion_for(
            room,
            delete_room,
            close_timeout=self._close_timeout,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            owner=self._emit_state,
            wiring=self.wiring,
        )
        # each session's close, one listener per session, told through the links
        self.sessions = sessions or JobSessions(
            None,
            label=self.host.label_of,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=self.wiring,
            instance=instance,
            owner=self._emit_state,
        )
        self.wiring.connect("room_deletion", self.deletion.post)

    def _timeouts(self) -> Mapping[str, float | None]:
        return {
            "session_end_timeout": self._session_end_timeout,
            "close_timeout": self._close_timeout,
        }

    # -- state and facts -------------------------------------------------------------------
    @property
    def host_state(self) -> str:
        return self.host.state

    @property
    def simulation(self) -> SimulationContext | None:
        return self._simulation

    @property
    def simulators(self) -> frozenset[str]:
        """Identities of participants carrying the ``lk.simulator`` attribute."""
        return frozenset(self._simulators)

    @property
    def hold_needed(self) -> bool:
        """Would shutdown hold now: a simulation, a simulator present, the room connected
        and no finalize answered yet."""
        return hold_needed(self._facts)

    @property
    def finalize_answered(self) -> bool:
        return self.host.finalize_answered

    @property
    def verdict(self) -> dict[str, Any] | None:
        return self.host.verdict

    @property
    def reason(self) -> str:
        """Why the job is ending: the first shutdown reason given, or the session's close."""
        return self._reason

    @property
    def room_deleted_at(self) -> float | None:
        return self.deletion.deleted_at

    @property
    def closed_at(self) -> float | None:
        """When the machine entered ``closed`` (the job's clock), or None before."""
        return self.actor.entered_at if self.actor.state == "closed" else None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Watch the room, start the session host. Idempotent (the room's subscription says
        the job follows it); nothing once closing."""
        if self._unsubscribe_facts is not None or self.actor.state == "closing" or self._finished:
            return
        self._simulators = simulators_in(self._room)
        self._unsubscribe_facts = follow(
            self._room_events, "job", self._post, facts=self._facts, after=self._track_simulators
        )
        if self._own_events:
            self._room_events.start()
        self.actor.start()
        await self.host.start()

    def attach(self, session: AgentSession[Any]) -> None:
        """Attach ``session`` to the job's host (detaching any other). Its close detaches it
        and, if it is still the attached one, shuts the job down (with ``delete_room_on_close``,
        room deletion is requested, deferred until the hold ends). Attach before
        ``session.start()`` to forward its events from the first one."""
        self.host.attach(session)  # raises on bad input or a closed host, changing nothing
        self.sessions.follow(session)

    def detach(self, session: AgentSession[Any]) -> None:
        """Detach ``session`` if it is the attached one; otherwise nothing changes."""
        self.host.detach(session)

    def shutdown(self, reason: str = "") -> None:
        """Ask the job to end: it holds for the simulator if one can still ask, then closes."""
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a string, not {type(reason).__name__}")
        self._reason = self._reason or reason
        self._post(Event("shutdown", {"reason": reason}))

    def note_reason(self, reason: str) -> None:
        """Why the job ends, told to livekit first (``ctx.shutdown``); the first stands."""
        self._reason = self._reason or reason

    def request_room_deletion(self) -> None:
        """Delete the room once the hold is over (what an end-call tool's delete_room does).
        Deferred to ``closing``; after the room work there it runs at once."""
        self.deletion.request()

    def add_shutdown_callback(self, callback: ShutdownCallback) -> None:
        """Run ``callback(reason)`` (or ``callback()``) at the end of ``closing``; all of them
        at once, within ``close_timeout``."""
        if not callable(callback):
            raise TypeError("a shutdown callback must be callable")
        if self.actor.state == "closed":
            raise RuntimeError("the job is closed; the callback would never run")
        self._close.callbacks.add(callback)

    async def wait_closed(self) -> None:
        await released(self.when_closed())

    def when_closed(self) -> asyncio.Future[None] | None:
        """``wait_closed()`` as a future (a waiter cancelled leaves the job as it is), or
        None when the job is closed (or released) now."""
        return self.actor.when_settled(is_closed)

    async def aclose(self) -> None:
        """Shut down (honouring the hold, which is bounded), wait for ``closed``, then release
        every listener and task."""
        self.shutdown("job runtime closed")
        await self.wait_closed()
        await self.release()
        # a deletion under way (asked for late) runs to its end or its bound first
        await self.deletion.aclose()

    def abort(self) -> None:
        """Close now: no hold (the same close otherwise, each step bounded)."""
        self._reason = self._reason or "aborted"
        self._post(Event("abort"))

    async def release(self) -> None:
        """Once ``closed``: stop the host's reader, release every listener. The room
        deletion stays where it is (asked for after the close, it still runs: see
        ``request_room_deletion``) until ``aclose()``. Safe to run again. Refused
        (``RuntimeError``, nothing changes) before the job is closed: it would skip the
        close (``aclose()``, ``abort()``)."""
        if not self._finished:
            raise RuntimeError(
                f"the job is {self.actor.state}, not closed: aclose() (or abort()) closes it"
            )
        await released(self.release_now())

    def release_now(self) -> asyncio.Future[None] | None:
        """``release()`` without its wait: what is left to wait for, or None."""
        return after(self.actor.release(), self._release_host)

    def _release_host(self) -> asyncio.Future[None] | None:
        host, sessions = self.host.release(), self.sessions.release_now()
        self._release_listeners()
        return ending(host, sessions)

    def _release_listeners(self) -> None:
        if self._unsubscribe_facts is not None:
            self._unsubscribe_facts()
            self._unsubscribe_facts = None
        if self._own_events:
            self._room_events.aclose()
        if self._trace_file is not None:
            self._trace_file.close()

    # -- inputs: room facts (routed by statemachines.routing) -------------------------------
    def _track_simulators(self, fact: RoomFact) -> None:
        """The simulators after ``fact``; a room that drops is why the job ends, if first."""
        seen = plain_fact(fact)
        if seen["fact"] == "room_disconnected":
            self._reason = self._reason or "room disconnected"
        self._simulators = simulators_after(self._simulators, seen)

    def _post_linked(self, event: Event) -> None:
        """An event another machine's effect sends the job (``statemachines.links.LINKS``)."""
        reason = str(event.data.get("reason", ""))
        if event.name == "shutdown":
            self.shutdown(reason)
            return
        if event.name == "abort":
            self.abort()
            return
        if event.name == "session_closed":
            self._reason = self._reason or f"session closed: {reason}"
        self._post(event)

    def _on_state(self, sc: StateChanged) -> None:
        # livekit's reason then; set here, before the change is heard (an effect of the row
        # runs after its listeners), as every other reason is set before its step
        if sc.event == "simulator_left" and sc.machine == "job":
            self._reason = self._reason or "simulation completed"
        if sc.source == "awaiting_finalize" and sc.event in ("hold_timeout", "room_disconnected"):
            self._report_lost_verdict(sc.event)
        self._emit_state(sc)
        if sc.dest == "closed":
            self.emit("closed", self.closed_at)

    def _report_lost_verdict(self, event: str) -> None:
        """The hold ran out or lost its room with the simulator still there: its verdict is
        lost (the log policy: a WARNING naming why)."""
        step = self.host.finalize.actor.state
        why = {
            "answering": "on_simulation_end had not returned",
            "replying": "the reply was still being sent",
        }.get(step, "the simulator had not asked for it (finalize_simulation)")
        ended = (
            f"after session_end_timeout ({self._session_end_timeout:g}s)"
            if event == "hold_timeout"
            else f"as the room disconnected{self.disconnect_hint()}"
        )
        self.actor.report(
            logger,
            logging.WARNING,
            "the hold ended %s without the simulator's verdict: %s; the job closes without it",
            ended,
            why,
            event=event,
        )

    # -- closing (run_close's steps: job_close) --------------------------------------------
    def _fx_run_close(self, _ev: Event) -> asyncio.Future[Event]:
        """``closing``'s task: the steps of ``statemachines.system.TEARDOWN``."""
        return self._close.run(Event("close_done"))

    def _fx_report_cut(self, ev: Event) -> None:
        self._close.report_cut(ev)

    def disconnect_room(self) -> Awaitable[None] | None:
        # a room the job never followed (closed before it started) is not its to end
        if not self._room_events.started or not self._room.isconnected():
            return None
        return service_call(self._room.disconnect())


# the job machine's handlers, shared by every job (Handlers binds them to one)
_EFFECTS = effect_table(JobRuntime, JOB)
