"""A session host owned by the job, driven by the ``session_host`` machine.

One host per job over any ``SessionTransport`` (in production the room's, on topic
``lk.agent.session``). Sessions attach and detach; the host outlives them, so a simulator's
``finalize_simulation`` is answered after the agent hung up. Ordinary requests and event
forwarding are livekit's own: each attached session gets a fresh livekit ``SessionHost`` over
a pipe onto the job's transport; detaching closes it (its first step, on the loop's next
turn, drops its event subscriptions). ``finalize_simulation`` is the host's
``FinalizeAnswer`` (the ``finalize`` machine), attached session or not. Closing is a state:
replies in flight go out within ``drain_timeout``, later requests and an unfinished answer
get an error reply, then the reader ends and closes the transport.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.voice.remote_session import SessionHost, SessionTransport
from livekit.protocol.agent_pb import agent_session as agent_pb

from agent_runtime.actor import ActorClosed, Event, Output, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.observe.trace import Tracer, describe
from agent_runtime.parts import check_part
from agent_runtime.runtimes._base import Hear, MachineRuntime, check_parts, is_closed, released
from agent_runtime.runtimes.finalize import FINALIZE_UNFINISHED, FinalizeAnswer, SimulationEndFn
from agent_runtime.runtimes.routing import Wiring
from agent_runtime.scheduler import Scheduler, after, ending, relay, within
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.livekit_compat import simulation_context
from agent_runtime.sdk.session_transport import (
    RequestReader,
    RoomRequestTransport,
    SessionPipe,
    close_quietly,
    request_problem,
    sender_aware,
    start_on_pipe,
)
from statemachines.session_host import SESSION_HOST
from statemachines.system import host_drain

logger = logging.getLogger("agent_runtime.session_host")

NO_ACTIVE_SESSION = "no active session"
HOST_CLOSING = "the session host is closing"
NOT_THE_SIMULATOR = "finalize_simulation is accepted only from the simulator"
__all__ = [
    "FINALIZE_UNFINISHED",
    "HOST_CLOSING",
    "NOT_THE_SIMULATOR",
    "NO_ACTIVE_SESSION",
    "JobSessionHost",
    "SimulationEndFn",
    "request_problem",
    "session_host_for",
    "simulation_context",
]


@dataclass
class _Attached:
    label: str
    pipe: SessionPipe
    host: SessionHost | None  # None: its subscribe failed (subscribe_failed is queued)


class _Facts:
    """What the host's guards read (``statemachines.glue``), live."""

    __slots__ = ("_host",)

    def __init__(self, host: JobSessionHost) -> None:
        self._host = host

    @property
    def attached_session(self) -> str | None:
        host = self._host
        return host._attachment().label if host.actor.state == "attached" else None

    def is_simulator(self, identity: str) -> bool | None:
        known = self._host._is_simulator
        return None if known is None else bool(identity) and known(identity)


class JobSessionHost(MachineRuntime[str]):
    """The job's session host. Emits ``state_changed`` (an ``actor.StateChanged``, of the
    ``session_host`` or the ``finalize`` machine).

    ``on_session_closed(reason)`` is called when the attached session closes;
    ``on_finalize_answered(verdict)`` once the finalize reply went out; in a composed job
    both reach the job machine through ``wiring`` (the declared links). With
    ``is_simulator(identity)``, a ``finalize_simulation`` is answered only when its sender
    (as the transport names it: ``RoomRequestTransport``) is the simulator participant;
    anyone else gets an error reply and changes nothing.
    """

    def __init__(
        self,
        transport: SessionTransport,
        *,
        simulation: SimulationContext | SimulationDispatch | None = None,
        on_simulation_end: SimulationEndFn | None = None,
        on_session_closed: Callable[[str], None] | None = None,
        on_finalize_answered: Callable[[dict[str, Any] | None], None] | None = None,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        instance: str = "",
        drain_timeout: float = 3.0,
        is_simulator: Callable[[str], bool] | None = None,
        wiring: Wiring | None = None,
        owner: Hear | None = None,
    ) -> None:
        super().__init__(owner)
        # its parts, refused naming them before anything is built on them
        check_part("transport", transport, required=True)
        check_parts(on_simulation_end=on_simulation_end)
        # its machines share one scheduler, the job's when composed
        scheduler = scheduler if scheduler is not None else Scheduler()
        self._scheduler = scheduler
        if is_simulator is not None and not callable(is_simulator):
            raise TypeError("is_simulator must be callable")
        self._is_simulator = is_simulator
        self._transport = transport
        self._simulation = simulation_context(simulation)
        self._on_session_closed = on_session_closed
        self._clock: Clock = clock or AsyncioClock()
        self._labels = itertools.count(1)
        self._sessions: dict[str, AgentSession[Any]] = {}
        self._pending: dict[int, agent_pb.SessionRequest] = {}
        self._refs = itertools.count(1)
        self._attached: _Attached | None = None  # its parts; the state says if one is
        # per-session hosts closing aside (a dict as an ordered set: small while empty)
        self._closing_hosts: dict[asyncio.Future[Any], None] = {}
        self._reading: RequestReader | None = None  # open_transport's
        self._drain_timeout = drain_timeout
        self.wiring = wiring if wiring is not None else Wiring()
        self.finalize = FinalizeAnswer(
            transport.send_message,
            simulation=self._simulation,
            on_simulation_end=on_simulation_end,
            on_answered=on_finalize_answered,
            reply_timeout=drain_timeout,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            instance=instance,
            wiring=self.wiring,
            owner=self._emit_state,  # the host forwards its finalize machine's changes
        )
        self._run_machine(
            SESSION_HOST,
            _EFFECTS,
            facts=_Facts(self),  # what the shared guards (statemachines.glue) read
            instance=instance,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            # closing the finalize answer may wait for a reply under way, then its own
            effect_timeout=max(5.0, 2 * drain_timeout),
            wiring=self.wiring,
            post=self._post,
        )

    def _timeouts(self) -> Mapping[str, float | None]:
        return {"drain_timeout": self._drain_timeout}

    # -- public ----------------------------------------------------------------------------
    @property
    def session(self) -> AgentSession[Any] | None:
        """The attached session, as of the last event the machine handled."""
        # the parts, not the state: a step enters attached before its subscribe has run
        att = self._attached
        return self._sessions.get(att.label) if att and att.host else None

    @property
    def simulation(self) -> SimulationContext | None:
        return self._simulation

    @property
    def finalize_answered(self) -> bool:
        return self.finalize.answered

    @property
    def verdict(self) -> dict[str, Any] | None:
        """The agent's own verdict as delivered (``user_verdict``), or ``None``."""
        return self.finalize.verdict

    async def start(self) -> None:
        """Start the transport and begin reading requests (the machine's ``start``; where
        it started already, by a first ``start()`` or an ``attach()``, the table ignores
        it); returns once the transport started (raising what refused it) or the host
        closed meanwhile. Nothing starts once closing."""
        if self.actor.closed:
            return
        try:
            await self.actor.send(Event("start"))
        except ActorClosed:
            return  # released meanwhile: nothing to start
        if (reading := self._reading) is not None:
            await asyncio.shield(reading.opened)  # how the transport's start went

    def attach(self, session: AgentSession[Any]) -> None:
        """Attach ``session`` (detaching any other). Before ``start()`` this starts the host
        too (its transport opens, requests are read). Raises once the host is closed."""
        if not isinstance(session, AgentSession):
            raise TypeError(f"attach() takes an AgentSession, not {type(session).__name__}")
        if self.actor.state == "closing" or self._finished:
            raise RuntimeError("the session host is closed; no session can attach")
        if lk.session_runs_own_host(session):
            raise ValueError(
                "this session runs its own session host; start it with session_host=False"
            )
        self.actor.post(Event("attach", {"session": self.label_of(session)}))

    def detach(self, session: AgentSession[Any]) -> None:
        """Detach ``session`` if it is the attached one; otherwise nothing changes."""
        self.actor.post(Event("detach", {"session": self.label_of(session)}))

    def session_closed(self, session: AgentSession[Any], reason: str) -> None:
        """``session`` closed: if it is the attached one it detaches and the job is told."""
        label = self.label_of(session)
        self.actor.post(Event("session_closed", {"session": label, "reason": reason}))

    def known_label(self, session: AgentSession[Any]) -> str | None:
        """The label ``session`` got here (attached now or before), or None: unlike
        ``label_of`` it never gives a new one."""
        return next((label for label, s in self._sessions.items() if s is session), None)

    def label_of(self, session: AgentSession[Any]) -> str:
        """A stable label for traces (``session-1``, ``session-2``, ...)."""
        if (known := self.known_label(session)) is not None:
            return known
        label = f"session-{next(self._labels)}"
        self._sessions[label] = session
        return label

    async def aclose(self) -> None:
        """Close the host (in-flight replies go out within ``drain_timeout``, then the
        transport closes) and release its machines."""
        await released(self.release())

    def release(self) -> asyncio.Future[None] | None:
        """``aclose()`` without its wait: what is left to wait for, or None."""
        if not self.actor.closed and self.actor.state in ("new", "detached", "attached"):
            self.actor.post(Event("close"))
        return self.released_once_closed()

    def released_once_closed(self) -> asyncio.Future[None] | None:
        """The host's machines released once the close asked has ended (bounded: closing
        ends at its drain bound, its effects at theirs); None when nothing is left."""
        return after(self.actor.when_settled(is_closed), self._release)

    def _release(self) -> asyncio.Future[None] | None:
        self._sessions.clear()
        self._pending.clear()
        reading = self._reading.stop() if self._reading is not None else None
        return ending(self.actor.release(), self.finalize.release(), reading)

    # -- incoming --------------------------------------------------------------------------
    def _on_request(self, req: agent_pb.SessionRequest, sender: str | None) -> None:
        if self.actor.closed:
            return
        kind = req.WhichOneof("request") or ""
        ref = next(self._refs)
        data: dict[str, Any] = {
            "request_id": req.request_id,
            "kind": kind or "unknown",
            "ref": ref,
            "caller": sender,
        }
        problem = request_problem(req)
        if problem is not None:
            self._pending[ref] = req
            self.actor.post(Event("bad_request", {**data, "error": problem}))
            return
        self._pending[ref] = req
        if kind == "finalize_simulation":
            fin = req.finalize_simulation
            for name in _FINALIZE_FIELDS:
                data[name] = getattr(fin, name)
            self.actor.post(Event("finalize", data))
        else:
            self.actor.post(Event("request", data))

    # -- effects ---------------------------------------------------------------------------
    def _fx_open_transport(self, ev: Event) -> None:
        if self._is_simulator is not None and not sender_aware(self._transport):
            self.actor.report(
                logger,
                logging.WARNING,
                "the session transport %s cannot say who sent a request: every "
                "finalize_simulation will be refused (use RoomRequestTransport)",
                type(self._transport).__name__,
                event=ev.name,
            )
        # the transport's start, reads and close run aside (the mailbox keeps moving)
        self._reading = reading = RequestReader(
            self._transport, self._on_request, self.actor.log_fields
        )
        if reading.opened.done():
            self._on_opened(reading.opened)
        else:
            reading.opened.add_done_callback(self._on_opened)

    def _on_opened(self, opened: asyncio.Future[None]) -> None:
        """How the transport's start went, as an event: one that failed closes the host."""
        if opened.cancelled() or (error := opened.exception()) is None or self.actor.closed:
            return
        self.actor.post(Event("transport_failed", {"error": describe(error)}))

    def _fx_subscribe(self, ev: Event) -> Event | None:
        label = str(ev.data["session"])
        session = self._sessions[label]
        pipe = SessionPipe(self._transport)
        # attached from here: until the table hears how this went, the label is the
        # attached one (the guards read it) and a request to it is answered
        self._attached = _Attached(label, pipe, None)
        host: SessionHost | None = None
        try:
            host = SessionHost(pipe)
            host.register_session(session)
            start_on_pipe(host)  # never waits: no task for it
        except Exception as e:
            if host is not None:  # built (maybe subscribed to the session): closed aside
                self._close_aside(label, host)
            self.actor.report(
                logger,
                logging.WARNING,
                "%s cannot be served (%s): it is not forwarded, the host stays detached",
                label,
                describe(e),
                event=ev.name,
                exc_info=e,
            )
            return Event("subscribe_failed", {"session": label, "error": describe(e)})
        self._attached = _Attached(label, pipe, host)
        return None

    def _fx_unsubscribe(self, ev: Event) -> None:
        att, self._attached = self._attachment(), None
        if att.host is None:
            return  # its subscribe failed: nothing was started for it
        self._close_aside(att.label, att.host)

    def _close_aside(self, label: str, host: SessionHost) -> None:
        # it can wait on its in-flight requests: the scheduler's work, aside from the mailbox
        name = f"JobSessionHost.detach:{label}"
        self._closing_hosts[self._scheduler.own(host.aclose(), self._host_closed, name=name)] = None

    def _host_closed(self, work: asyncio.Future[Any]) -> None:
        self._closing_hosts.pop(work, None)
        if not work.cancelled() and (error := work.exception()) is not None:
            self.actor.report(logger, logging.WARNING, "detached host: %s", describe(error))

    def _fx_delegate_request(self, ev: Event) -> Awaitable[None] | None:
        if self._attachment().host is None:
            # queued before its subscribe's failure was decided: nobody serves it
            return self._fx_reply_no_session(ev)
        req = self._pending.pop(int(ev.data["ref"]), None)
        if req is not None:
            self._attachment().pipe.feed(req)
        return None

    async def _fx_reply_no_session(self, ev: Event) -> None:
        self._pending.pop(int(ev.data["ref"]), None)
        await self._send_error(str(ev.data["request_id"]), NO_ACTIVE_SESSION)

    async def _fx_reply_error(self, ev: Event) -> None:
        self._pending.pop(int(ev.data["ref"]), None)
        await self._send_error(str(ev.data["request_id"]), str(ev.data["error"]))

    def _fx_forward_finalize(self, ev: Event) -> Output:
        self._pending.pop(int(ev.data["ref"]), None)
        return Output({k: v for k, v in ev.data.items() if k in ("request_id", *_FINALIZE_FIELDS)})

    async def _fx_refuse_stranger(self, ev: Event) -> None:
        self._pending.pop(int(ev.data["ref"]), None)
        who = ev.data.get("caller")
        msg = "refused finalize_simulation from %r: not the simulator participant"
        self.actor.report(logger, logging.WARNING, msg, who, event=ev.name)
        await self._send_error(str(ev.data["request_id"]), NOT_THE_SIMULATOR)

    def _fx_report_session_closed(self, ev: Event) -> Output:
        reason = str(ev.data.get("reason", ""))
        if self._on_session_closed is not None:
            try:
                self._on_session_closed(reason)
            except Exception:
                # the user's callback: its failure is logged, the job still hears the close
                logger.exception("on_session_closed failed", extra=self.actor.log_fields())
        return Output({"reason": reason})

    def _fx_drain(self, _ev: Event) -> Event | asyncio.Future[Event]:
        # cut by its drain_timeout; the per-session closes and an answer under way followed
        waiting = ending(*self._closing_hosts, self.finalize.when_settled())
        return Event("drained") if waiting is None else relay(waiting, Event("drained"))

    async def _fx_reply_closing(self, ev: Event) -> None:
        self._pending.pop(int(ev.data["ref"]), None)
        await self._send_error(str(ev.data["request_id"]), HOST_CLOSING)

    def _fx_close_finalize(self, _ev: Event) -> None:
        """Its link closes the finalize machine (an unfinished answer is cut)."""

    def _fx_close_transport(self, _ev: Event) -> asyncio.Future[None] | None:
        """After close_finalize: the finalize machine settled, the per-session hosts given
        their drain bound once more (then cut), the reader ended: no task of its own."""
        return after(self.finalize.actor.when_settled(), self._close_hosts_left)

    def _close_hosts_left(self) -> asyncio.Future[None] | None:
        if (left := ending(*self._closing_hosts)) is None:
            return self._end_reading()

        def cut() -> asyncio.Future[None] | None:
            for t in list(self._closing_hosts):
                t.cancel()
            return after(ending(*self._closing_hosts), self._end_reading)

        return after(within(left, self._drain_timeout, self._clock), cut)

    def _end_reading(self) -> asyncio.Future[Any] | None:
        self._pending.clear()
        if self._reading is None:  # never opened: closed here all the same
            return asyncio.ensure_future(close_quietly(self._transport, self.actor.log_fields))
        return self._reading.stop()

    # -- helpers ---------------------------------------------------------------------------
    def _attachment(self) -> _Attached:
        """The attached session's parts, where the table says one is attached."""
        if (att := self._attached) is None:
            raise RuntimeError(f"session host {self.actor.instance!r}: no session attached")
        return att

    async def _send_error(self, request_id: str, error: str) -> None:
        await self._transport.send_message(
            agent_pb.AgentSessionMessage(
                response=agent_pb.SessionResponse(request_id=request_id, error=error)
            )
        )


_FINALIZE_FIELDS = ("provisional_success", "provisional_reason")


# the session_host machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(JobSessionHost, SESSION_HOST)


def session_host_for(
    room: rtc.Room,
    *,
    transport: SessionTransport | None,
    simulation: SimulationContext | None,
    on_simulation_end: SimulationEndFn | None,
    wiring: Wiring,
    clock: Clock,
    tracer: Tracer | None,
    scheduler: Scheduler | None,
    close_timeout: float,
    is_simulator: Callable[[str], bool],
    owner: Hear,
) -> JobSessionHost:
    """The job's session host: on the room's request transport unless given one, its drain
    within the host step's share of the close, answering only the simulator."""
    if transport is None:
        transport = RoomRequestTransport(room)
    return JobSessionHost(
        transport,
        simulation=simulation,
        on_simulation_end=on_simulation_end,
        wiring=wiring,
        clock=clock,
        tracer=tracer,
        scheduler=scheduler,
        instance=room.name or "job",
        drain_timeout=host_drain(close_timeout),  # ends inside the host step's share
        is_simulator=is_simulator,  # only the simulator participant decides the job's fate
        owner=owner,
    )
