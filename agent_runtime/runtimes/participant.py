"""The linked participant machine on a real ``AgentSession``.

``ParticipantLink`` follows one remote participant (a configured identity, or the first
participant of the allowed kinds in join order) through the room-event adapter and decides
what its departure means: a closing reason closes the session through the session's own
close path, so its ``close`` event carries ``CloseReason.PARTICIPANT_DISCONNECTED`` and the
job sees it; any other reason waits ``grace_period`` seconds for the same identity, whose
rejoin points the session's room input (RoomIO) at the new participant object. A session
whose close hangs is given up after ``session_close_timeout`` seconds, and one that fails
(it ends without ``close``) or cannot even be asked at once: the link is then ``closed``
and emits ``close_timed_out`` (a ``SessionCloseTimedOut``), on which the job that composes
the link shuts down.

RoomIO has its own ``close_on_disconnect`` (on by default, for CLIENT_INITIATED,
ROOM_DELETED and USER_REJECTED). Start the session with
``RoomOptions(close_on_disconnect=False)`` so the link alone decides; RoomIO still relinks
the same identity on rejoin by itself, which the link confirms.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from livekit.agents import AgentSession, CloseReason
from livekit.agents.voice.room_io import RoomIO

from agent_runtime._messages import StateChanged
from agent_runtime.actor import Event, Output, effect_table
from agent_runtime.clock import Clock
from agent_runtime.emitter import event_names
from agent_runtime.observe.trace import Tracer, describe
from agent_runtime.parts import check_part
from agent_runtime.runtimes._base import Hear, MachineRuntime, check_instance, released
from agent_runtime.runtimes.room_events import (
    RoomEventAdapter,
    kind_name,
)
from agent_runtime.runtimes.routing import Wiring, follow
from agent_runtime.runtimes.sessions import own_sessions
from agent_runtime.scheduler import Scheduler
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import (
    DEFAULT_CLOSING_REASONS,
    DEFAULT_PARTICIPANT_KINDS,
    check_setting,
    kind_names,
    reason_names,
    shared_names,
)
from statemachines.glue import PUBLISH_ON_BEHALF, eligible
from statemachines.participant import PARTICIPANT

logger = logging.getLogger("agent_runtime.participant")

# a participant publishing on the agent's behalf (an avatar worker) is never the user
ATTRIBUTE_PUBLISH_ON_BEHALF = PUBLISH_ON_BEHALF

DEFAULT_KINDS = DEFAULT_PARTICIPANT_KINDS
LinkEvents = Literal["state_changed", "close_timed_out"]


@dataclass(frozen=True, slots=True)
class SessionCloseTimedOut:
    """Emitted as ``close_timed_out``: the session's close did not end within ``after``
    seconds, or ``error`` says why it failed (then ``after`` is 0: it could not be asked,
    its teardown failed or an earlier one had stopped the session); the link is
    ``closed``. ``reason`` is a shutdown reason for the job."""

    identity: str | None  # the participant whose departure started the close
    after: float
    reason: str
    error: str | None = None


class ParticipantLink(MachineRuntime[LinkEvents]):
    """The ``participant`` machine for one session. Emits ``state_changed`` (StateChanged)
    and ``close_timed_out`` (SessionCloseTimedOut).

    Wire ``close_timed_out`` to the job's shutdown, e.g.
    ``link.on("close_timed_out", lambda ev: job.shutdown(ev.reason))``: the session will not
    say it closed (its close hung or failed), so nothing else would end the job.

    The link does not own the session, the room or the adapter: ``aclose()`` only stops
    following (it never closes the session).

    In a composed job pass ``wiring`` (the job's declared links): the session's close and
    the link's own close reach the machine through it, and ``close_timed_out`` shuts the
    job down through it. Alone, the link has links of its own and a session machine of its
    own (``own_sessions``), from ``start()`` to ``aclose()``: the session's close comes
    by the same declared link. The link is itself the facts view its guards read
    (``statemachines.glue.ParticipantFacts``).
    """

    _EVENT_NAMES = event_names(LinkEvents)  # on("state_chnaged", ...) is refused

    def __init__(
        self,
        session: AgentSession[Any],
        *,
        room_events: RoomEventAdapter,
        participant_identity: str | None = None,
        participant_kinds: Iterable[str | int] = DEFAULT_KINDS,
        close_on_disconnect: bool = True,
        closing_reasons: Iterable[str | int] = DEFAULT_CLOSING_REASONS,
        grace_period: float = 15.0,
        session_close_timeout: float = 60.0,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        wiring: Wiring | None = None,
        owner: Hear | None = None,
    ) -> None:
        super().__init__(owner)
        check_part("session", session, required=True)  # not an AttributeError at start()
        # required: the link has no adapter of its own
        check_instance("room_events", room_events, RoomEventAdapter, required=True)
        participant_identity = check_setting("participant_identity", participant_identity)
        grace_period = check_setting("grace_period", grace_period)
        session_close_timeout = check_setting("session_close_timeout", session_close_timeout)
        self._kinds = shared_names(kind_names(participant_kinds))
        self._closing_reasons = shared_names(reason_names(closing_reasons))
        self.session = session
        self.room_events = room_events
        self.participant_identity = participant_identity
        self.close_on_disconnect = bool(close_on_disconnect)
        self.grace_period = float(grace_period)
        self.session_close_timeout = float(session_close_timeout)
        self._identity: str | None = None
        # what the link holds: its room subscription while it follows (from start() to
        # the close); the machine says the rest
        self._unsubscribe: Callable[[], None] | None = None
        # what the room's participants did between listen() and start() that start() may
        # need, in order (``_hold``): the machine hears it once the session's room input
        # exists to act on it
        self._held: list[Event] = []
        self._warned_room_io = False
        # why each participant the link follows or may still follow last left (as heard),
        # for the log line of a drop the machine waits on; once it follows one, only theirs
        self._left: dict[str, str] = {}
        # the shared guards (statemachines.glue) read this link as their facts view
        self._run_machine(
            PARTICIPANT,
            _EFFECTS,
            instance=room_events.room.name or "room",
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=wiring,
            post=self._post_linked,
        )
        self._label_room(room_events.room)  # a failing listener of its own names the room
        self._own_sessions = own_sessions(wiring, self.actor, self._post_linked, session)

    def _timeouts(self) -> Mapping[str, float | None]:
        # without close_on_disconnect a departure never closes: grace waits with no timer
        return {
            "grace_period": self.grace_period if self.close_on_disconnect else None,
            "session_close_timeout": self.session_close_timeout,
        }

    # -- public --------------------------------------------------------------------------
    @property
    def linked_identity(self) -> str | None:
        """The identity the link follows: None while waiting; kept through grace and after."""
        return self._identity

    @property
    def participant_kinds(self) -> frozenset[str]:
        return self._kinds

    @property
    def closing_reasons(self) -> frozenset[str]:
        return self._closing_reasons

    @property
    def agent_identity(self) -> str | None:
        """The agent's own identity in the room (None before it connected)."""
        try:
            identity = self.room_events.room.local_participant.identity
        except Exception:
            return None  # an rtc.Room that never connected has no local participant
        return identity if isinstance(identity, str) else None

    def listen(self) -> None:
        """Hear the room's participants from now on, before the session has started. At
        ``start()``, when nobody the link may follow is in the room, what they did meanwhile
        is handed to the machine in order: a job listens from its own start, so a user who
        left while the avatar or the session was still starting is seen leaving."""
        if self._unsubscribe is None and not self.actor.started:
            self._held = []
            for event in _present(self.room_events):
                self._hold(event)
            self._unsubscribe = follow(self.room_events, "participant", self._hear)
            self.room_events.start()

    def start(self) -> None:
        """Follow the room; a participant already there is considered in join order (after
        ``listen()``, with nobody to follow there, what the room's participants did since).

        Call it after ``await session.start(..., room=room)``: the link points the session's
        RoomIO, which exists only from then on.
        """
        if self._finished:
            raise RuntimeError("ParticipantLink is closed; create a new one")
        if self.actor.started:
            return  # following already (the machine starts with the room's subscription)
        if self._room_io() is None:
            if not lk.session_started(self.session):
                raise RuntimeError(
                    "the session has no room input yet: start the link after "
                    "`await session.start(..., room=room)`"
                )
            # console mode (or a session started without a room): nobody to link or follow
            logger.info(
                "the session has no room I/O (console mode?): the participant machine has "
                "nothing to follow and stays %r",
                self.state,
                extra=self.actor.log_fields(),
            )
            self._unhook()
            return
        if self._unsubscribe is None:
            self._held = _present(self.room_events)
            self._unsubscribe = follow(self.room_events, "participant", self._hear)
        held, self._held = self._held, []
        present = _present(self.room_events)
        if any(eligible(self, e.data) for e in present):
            # someone the link may follow is here now: the room as it is decides, as RoomIO
            # picks (what happened meanwhile decides only when nobody is left to follow)
            held = present
        if self._own_sessions is not None:  # let go with the room's subscription
            self._own_sessions.follow(self.session)
        self.room_events.start()
        self.actor.start()
        for event in held:
            self.actor.post(event)

    def _hear(self, event: Event) -> None:
        if event.name == "participant_disconnected":
            # kept past a rejoin: the room may report both before the machine steps the drop
            identity = str(event.data.get("identity", ""))
            if identity == self._identity or (
                self._identity is None and eligible(self, event.data)
            ):
                self._left[identity] = str(event.data.get("reason", "UNKNOWN_REASON"))
        if self.actor.started:
            self.actor.post(event)
        else:  # listening before the session started: start() hands it on
            self._hold(event)

    def _hold(self, event: Event) -> None:
        """Keep of an event heard before ``start()`` what the machine may need, so that a
        room churning through a long start holds a bounded list: the comings and goings of
        the first participant the link may follow (nobody else's moves the machine from
        waiting, nor once it follows them), less a leave and rejoin whose leave's reason was
        held already (it leads where the first one did: closing, or back to linked)."""
        held = self._held
        if not held:
            if event.name == "participant_connected" and eligible(self, event.data):
                held.append(event)
            return
        if event.data.get("identity") != held[0].data.get("identity"):
            return
        last = held[-1]
        if (
            event.name == "participant_connected"
            and last.name == "participant_disconnected"
            and any(_reason(e) == _reason(last) for e in held[1:-1])
        ):
            held.pop()  # back where the same leave and rejoin left it before
            return
        held.append(event)

    async def aclose(self) -> None:
        """Stop following: unhook, enter ``closed``. The session is left as it is."""
        await released(self.release())

    def release(self) -> asyncio.Future[Any] | None:
        """``aclose()`` as the job's teardown runs it: what is left to wait for, or None
        (the usual case). The machine is ``closed`` when this returns: ``start()`` refuses."""
        self._unhook()
        return self._close_now(self.actor.release)

    def release_now(self) -> asyncio.Future[Any] | None:
        self._unhook()
        return self.actor.release()

    def _unhook(self) -> None:
        self._held = []
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        if self._own_sessions is not None:  # its listener goes now; its close runs no effect
            self._own_sessions.release_now()

    def _on_state(self, change: StateChanged) -> None:
        if change.dest == "grace" and change.source == "linked":
            who = self._identity
            why = self._left.get(who or "", "UNKNOWN_REASON")
            if self.close_on_disconnect:
                logger.info(
                    "participant %s dropped (%s): the session waits up to %gs for them to rejoin",
                    who,
                    why,
                    self.grace_period,
                    extra=self.actor.log_fields(change.event),
                )
            else:
                logger.info(
                    "participant %s left (%s): close_on_disconnect is off, the session stays "
                    "open and waits for them to rejoin",
                    who,
                    why,
                    extra=self.actor.log_fields(change.event),
                )
        super()._on_state(change)

    # -- inputs ----------------------------------------------------------------------------
    def _post_linked(self, event: Event) -> None:
        """An event its links bring: the session's close (from the job's session machine,
        or its own), or the link's own close (the job's close)."""
        if event.name == "close":
            # the link's machine closes now; the job's teardown releases it (aclose())
            self._unhook()
            self._post(event)
        elif self._unsubscribe is not None and self.actor.started:  # while it follows
            self._post(event)

    # -- effects -----------------------------------------------------------------------------
    def _fx_link(self, ev: Event) -> asyncio.Future[None] | None:
        self._identity = str(ev.data["identity"])
        # the link follows nobody else from now on (a rejoin is the same identity)
        self._left = {k: v for k, v in self._left.items() if k == self._identity}
        logger.info("linked participant %s", self._identity, extra=self.actor.log_fields(ev.name))
        return self._point_room_input(self._identity)

    def _fx_relink(self, ev: Event) -> asyncio.Future[None] | None:
        identity = str(ev.data["identity"])
        logger.info(
            "participant %s rejoined: relinked", identity, extra=self.actor.log_fields(ev.name)
        )
        return self._point_room_input(identity)

    def _fx_close_session(self, ev: Event) -> None:
        if ev.name == "grace_timeout":
            logger.info(
                "closing the session: participant %s did not rejoin within %gs",
                self._identity,
                self.grace_period,
                extra=self.actor.log_fields(ev.name),
            )
        else:
            logger.info(
                "closing the session: participant %s left (%s)",
                self._identity,
                ev.data.get("reason", ev.name),
                extra=self.actor.log_fields(ev.name),
            )
        # the session's own close path, as RoomIO uses it: its `close` event then carries
        # CloseReason.PARTICIPANT_DISCONNECTED for the job
        # a session stopped already (an earlier close of its own failed) returns from this
        # close at once and never says `close`: known now, not guessed from an order later
        stopped = not lk.session_started(self.session)
        lk.ask_session_close(self.session, CloseReason.PARTICIPANT_DISCONNECTED)
        task = lk.session_closing_task(self.session)
        if not isinstance(task, asyncio.Future):
            return
        # the session says it closed with its `close` event (to the session machine, the
        # job's or its own, whose links tell this one), heard once. A close that never says
        # so (its teardown failed, or the session had stopped without closing) is told by
        # the task's end: close_failed
        task.add_done_callback(functools.partial(self._on_close_task_done, stopped))

    def _fx_report_close_timed_out(self, ev: Event) -> Output:
        who = f"participant {self._identity} left"
        error: str | None = None
        if ev.name == "close_failed":  # it failed: nothing to wait for
            after, error = 0.0, str(ev.data.get("detail", "")) or "no detail"
            if ev.data.get("effect") == "close_session":
                reason = f"the session could not be asked to close after {who} ({error})"
            else:
                reason = f"the session's close failed after {who} ({error})"
        else:
            after = float(ev.data.get("after", self.session_close_timeout))
            reason = f"the session did not close within {after:g}s after {who}"
        logger.warning("%s; the link gives up on it", reason, extra=self.actor.log_fields(ev.name))
        self.emit("close_timed_out", SessionCloseTimedOut(self._identity, after, reason, error))
        return Output({"reason": reason})

    def _on_close_task_done(self, stopped: bool, task: asyncio.Future[Any]) -> None:
        if task.cancelled():
            self._post(Event("close_failed", {"detail": "the close was cancelled"}))
        elif (error := task.exception()) is not None:  # the SDK has logged it already
            # livekit then never says `close`: the session did not close as asked
            self._post(Event("close_failed", {"detail": describe(error)}))
        elif stopped:
            # it ended without `close`: the session had stopped without closing (its own
            # close failed before), and will never say it closed. A close of a running
            # session that ends well said `close`, heard once (by the links)
            detail = "the session had stopped without closing: an earlier close failed"
            self._post(Event("close_failed", {"detail": detail}))

    # -- RoomIO ------------------------------------------------------------------------------
    def _room_io(self) -> RoomIO | None:
        try:
            rio = self.session.room_io
        except RuntimeError:
            return None  # started without a room, or not started yet: nothing to point
        if not self._warned_room_io and lk.room_io_closes_on_disconnect(rio):
            self._warned_room_io = True
            logger.warning(
                "RoomIO also closes the session on its default disconnect reasons; start the "
                "session with RoomOptions(close_on_disconnect=False) so the link alone decides",
                extra=self.actor.log_fields(),
            )
        return rio

    def _point_room_input(self, identity: str) -> asyncio.Future[None] | None:
        """Make RoomIO's linked participant the room's current participant ``identity``:
        after RoomIO's start-up task has taken a participant it picked itself in the room
        callback that brought this event (it would overrule us otherwise)."""
        rio = self._room_io()
        if rio is None:
            return None
        return lk.after_room_io_pick(rio, lambda: self._point(rio, identity))

    def _point(self, rio: RoomIO, identity: str) -> None:
        target = self.room_events.room.remote_participants.get(identity)
        if target is not None and rio.linked_participant is target:
            return
        # a participant not in the room (yet) pins RoomIO to the identity
        rio.set_participant(identity)


def _reason(event: Event) -> str | None:
    if event.name != "participant_disconnected":
        return None
    return str(event.data.get("reason", "UNKNOWN_REASON"))


def _present(room_events: RoomEventAdapter) -> list[Event]:
    """The room's remote participants as the joins that brought them (rtc.Room keeps them
    in join order)."""
    return [
        Event(
            "participant_connected",
            {"identity": p.identity, "kind": kind_name(p.kind), "attributes": dict(p.attributes)},
        )
        for p in list(room_events.room.remote_participants.values())
    ]


# the participant machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(ParticipantLink, PARTICIPANT)
