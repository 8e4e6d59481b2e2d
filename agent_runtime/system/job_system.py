"""``JobSystem``: every actor of one job, built in one place, and the channels between them.

It builds the runtimes side by side (the links' wiring; the session host with its finalize
answer; the room deletion; the job machine, handed those; the participant link; the avatar;
playout) and the job's own lifecycle (``statemachines.agent_job``), holds their actors in
``MACHINES`` order, delivers the declared channels that are not room facts
(``statemachines.system.WATCHES`` and ``REPORTS``, the links' targets) and runs the
lifecycle's teardown as declared (``statemachines.system.RELEASE``, through
``teardown.Teardown``: each step bounded, a cut step never skipping the next, independent
steps at once). ``AgentJob`` is its user-facing front: it checks the input, sets up tracing
and hands the parts (``Parts``) here.

The composition: the room-event adapter (room facts reach each machine through the declared
routing table, in ``FOLLOW_ORDER``), the ``job`` machine and the job's session host (the
session starts with ``session_host=False``, attached before it starts), the linked
``participant`` (listening from the job's start; RoomIO's ``close_on_disconnect`` and
``delete_room_on_close`` are off: the machines decide), the optional ``avatar`` around any
``AvatarSession`` plugin, the optional ``playout`` machine. The avatar goes with the session
while the room is still connected; the job's ``closing`` closes the host, then the session
and avatar if still up, disconnects the room (livekit does, after on_session_end, once its
shutdown was asked), deletes the room if asked and runs the shutdown callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, CloseReason
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime._messages import AlreadyStarted
from agent_runtime.actor import (
    ActorClosed,
    Event,
    EventRejected,
    Output,
    StateChanged,
    effect_table,
)
from agent_runtime.runtimes._base import Hear, MachineRuntime
from agent_runtime.runtimes.avatar import (
    AvatarLifecycle,
    Route,
    route_of,
    server_api_remover,
)
from agent_runtime.runtimes.job import JobRuntime
from agent_runtime.runtimes.participant import ParticipantLink
from agent_runtime.runtimes.playout import PlayoutTracker
from agent_runtime.runtimes.room_deletion import room_deletion_for
from agent_runtime.runtimes.room_events import RoomEventAdapter
from agent_runtime.runtimes.routing import Wiring, hear_reports
from agent_runtime.runtimes.session_host import (
    session_host_for,
    simulation_context,
)
from agent_runtime.runtimes.sessions import JobSessions
from agent_runtime.runtimes.teardown import Teardown, Work
from agent_runtime.scheduler import Scheduler, ending, relay
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import JobSettings
from agent_runtime.system import livekit_job
from agent_runtime.system._inputs import Parts
from agent_runtime.system._start_part import StartPart
from statemachines.agent_job import AGENT_JOB, STARTING
from statemachines.machines import MACHINES
from statemachines.system import RELEASE, WATCHES, Report, bound_of, watched

logger = logging.getLogger("agent_runtime.system")


class JobSystem(MachineRuntime[str]):
    """The actors of one job and every channel between them; the runtime of the job's own
    lifecycle (``actor``, also ``lifecycle``). Emits ``state_changed`` (a ``StateChanged``
    from any machine of the job) and ``closed`` (the job machine's time of closing)."""

    _EVENT_NAMES = frozenset({"state_changed", "closed"})

    def __init__(
        self,
        *,
        room: rtc.Room,
        session: AgentSession[Any],
        settings: JobSettings,
        parts: Parts,
        owner: Hear | None = None,
    ) -> None:
        super().__init__(owner)
        s = settings
        self.room, self.session, self.settings = room, session, settings
        self.job_context = ctx = parts.job_context
        self.clock, self.tracer = clock, tracer = parts.clock, parts.tracer
        # one scheduler steps every actor of the job (agent_runtime.scheduler)
        self.scheduler = scheduler = Scheduler()
        self.events = RoomEventAdapter(room)
        # every part is built with this system as its owner: it hears each change first
        forward = self._forward_state  # one bound method for every part it owns
        # the links between the machines (statemachines.links.LINKS), the job machine's parts
        self.wiring = Wiring(flags={"delete_room_on_close": s.delete_room_on_close})
        simulation = simulation_context(parts.simulation)
        self.host = session_host_for(
            room,
            transport=parts.transport,
            simulation=simulation,
            on_simulation_end=parts.on_simulation_end,
            wiring=self.wiring,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            close_timeout=s.close_timeout,
            is_simulator=self._is_simulator,
            owner=forward,  # with its finalize machine's
        )
        self.finalize = self.host.finalize
        self.deletion = room_deletion_for(
            room,
            parts.delete_room,
            close_timeout=s.close_timeout,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            owner=forward,
            wiring=self.wiring,
        )
        # the job's sessions: one listener per session hears its close (its own: ``session``)
        self.sessions = JobSessions(
            session,
            label=self.host.label_of,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=self.wiring,
            instance=room.name or "job",
            owner=forward,
        )
        self.job = JobRuntime(
            room=room,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            simulation=simulation,
            session_end_timeout=s.session_end_timeout,
            close_timeout=s.close_timeout,
            room_events=self.events,
            wiring=self.wiring,
            host=self.host,
            deletion=self.deletion,
            sessions=self.sessions,
            composed_works=self._teardown_works,  # run_close's steps that need the room
            lost_room_hint=None if ctx is None else lambda: livekit_job.hold_hint(ctx),
            owner=forward,
        )
        self.link = ParticipantLink(
            session,
            room_events=self.events,
            participant_identity=s.participant_identity,
            participant_kinds=s.participant_kinds,
            close_on_disconnect=s.close_on_disconnect,
            closing_reasons=s.closing_reasons,
            grace_period=s.grace_period,
            session_close_timeout=s.session_close_timeout,
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=self.wiring,
            owner=forward,
        )
        self.avatar: AvatarLifecycle | None = None
        self._avatar_start_options = parts.avatar_start_options
        self._room_options: RoomOptions | None = None  # the session's start's, once begun
        if parts.plugin is not None:
            self.avatar = AvatarLifecycle(
                parts.plugin,
                join_timeout=s.join_timeout,
                retry=s.retry_avatar,
                rebuild=parts.rebuild_avatar,
                clock=clock,
                tracer=tracer,
                scheduler=scheduler,
                room_events=self.events,
                # removed through the server API whether or not the plugin's close did
                remove_participant=parts.remove_avatar_participant or server_api_remover(room),
                room_audio=self._room_audio,
                close_timeout=bound_of("avatar", s.close_timeout),
                wiring=self.wiring,
                owner=forward,
            )
        self.playout: PlayoutTracker | None = None
        if s.playout is not None:
            self.playout = PlayoutTracker(
                session,
                options=s.playout,
                on_reprompt=parts.on_reprompt,
                avatar=self.avatar,
                link=self.link,
                clock=clock,
                tracer=tracer,
                scheduler=scheduler,
                instance=room.name or "room",
                wiring=self.wiring,
                owner=forward,
            )
        # the job's own lifecycle (statemachines.agent_job): start, close and abort
        self.lifecycle = self._run_machine(
            AGENT_JOB,
            _EFFECTS,
            instance=room.name or "job",
            clock=clock,
            tracer=tracer,
            scheduler=scheduler,
            hear=forward,  # this system hears its lifecycle as it hears every part
            wiring=self.wiring,
        )
        # every actor of the job, held here, in MACHINES order
        owned = [self.job.actor, self.host.actor, self.finalize.actor, self.deletion.actor]
        owned += [r.actor for r in (self.link, self.avatar, self.playout) if r is not None]
        owned += [self.sessions.actor, self.lifecycle]
        order = list(MACHINES)
        self.actors = tuple(sorted(owned, key=lambda a: order.index(a.spec.name)))
        self._live_route: Route = "none"
        # the parts of a start still running, each in its caller: the teardown cuts them
        # (a dict as an ordered set: an empty one is a quarter of an empty set's size)
        self._starts: dict[StartPart, None] = {}
        # who hears the declared watches (statemachines.system.WATCHES), by machine
        self._watchers: dict[str, Callable[[Event], None]] = {"agent_job": self._post}
        if self.playout is not None:
            self._watchers["playout"] = self.playout._post
        self._unhear = self._hear_reports()

    # -- state -------------------------------------------------------------------------------
    @property
    def close_reason(self) -> str | None:
        """The job's own session's ``CloseReason``, once it closed (as the session machine
        heard it)."""
        return self.sessions.own_close_reason

    def audio_route(self) -> Route:
        return route_of(self.session, self.avatar.installed_sink if self.avatar else None)

    @property
    def live_audio_route(self) -> Route:
        if lk.session_live(self.session):
            self._live_route = route_of(self.session)
        return self._live_route

    # -- starting ----------------------------------------------------------------------------
    async def begin(self, event: str) -> None:
        """Ask the lifecycle for a start; its reject cells are the user's clear errors."""
        try:
            await self.lifecycle.send(Event(event))
        except EventRejected:
            state = self.lifecycle.state
            if state in STARTING:
                raise RuntimeError("this job is already starting") from None
            if state == "running":
                raise RuntimeError("this job is already started") from None
            if self.job_context is not None and livekit_job.context_ended(self.job_context):
                raise RuntimeError(livekit_job.CONTEXT_ENDED) from None
            raise RuntimeError("this job is closed; build a new AgentJob") from None

    async def run_part(self, work: Awaitable[None], *, session: bool = False) -> None:
        """Run one part of the start in the calling task, where the teardown can cut it
        (as ``asyncio.timeout`` does: the caller's task is cancelled and the cut is told
        from anyone else's cancellation); its failure, or its caller's cancellation, is the
        lifecycle's ``start_failed`` (the job closes what did start) and is raised."""
        part = StartPart()
        self._starts[part] = None
        try:
            await work
        except asyncio.CancelledError:
            if (cut := part.end()) == "none":  # the caller gave up (a timeout): it failed
                self.lifecycle.post(Event("start_failed", {"error": "start() was cancelled"}))
            if cut != "alone":
                raise  # the caller itself was cancelled (too)
            raise RuntimeError("the job was closed before it finished starting") from None
        except AlreadyStarted:
            raise  # a part started twice is refused, and nothing changes
        except Exception as e:
            # the room went away meanwhile, or the cut became another error in the part
            ending = part.end() != "none" or self.job.state in ("closing", "closed")
            with contextlib.suppress(ActorClosed):
                await self.lifecycle.send(
                    Event("start_failed", {"error": f"{type(e).__name__}: {e}"})
                )
            if ending:
                raise RuntimeError("the job was closed before it finished starting") from e
            raise
        finally:
            self._starts.pop(part, None)
            part.end()
        if session:
            with contextlib.suppress(ActorClosed):
                await self.lifecycle.send(Event("started"))
        if self.lifecycle.state in ("closing", "closed"):
            # the part ended (a start that swallowed the cut) but the job closed under it
            raise RuntimeError("the job was closed before it finished starting")

    async def start_all(self, agent: Agent, options: RoomOptions) -> None:
        await self.start_runtime()
        if self.avatar is not None:
            await self.start_avatar()
        await self.start_session(agent, options)

    async def start_runtime(self) -> None:
        if self.events.started:
            return
        if self.job_context is not None:
            await self.job_context.connect()
        self.events.start()
        self.link.listen()
        await self.job.start()

    async def start_avatar(self) -> None:
        assert self.avatar is not None
        await self.start_runtime()
        await self.avatar.start(self.session, self.room, **self._avatar_start_options)

    async def claim_session(self) -> None:
        """The session's start is the calling start's from here on: a second one is refused
        plainly (the session machine's reject cell), whatever the SDK's lock lets through."""
        await self.sessions.claim()

    async def start_session(self, agent: Agent, options: RoomOptions) -> None:
        if lk.session_started(self.session) or lk.session_closing_task(self.session):
            # started outside the job: this start fails (the lifecycle hears start_failed)
            raise RuntimeError("the job's session is already started (or closed)")
        await self.start_runtime()
        # attached as it starts (until then a request gets "no active session"), before its
        # first event so every one of them is forwarded
        self.job.attach(self.session)
        if self.playout is not None:
            self.playout.start()  # before the session's first speech
        self._room_options = options
        await self.session.start(agent, room=self.room, room_options=options, session_host=False)
        self._live_route = route_of(self.session)
        self.link.start()

    # -- ending ------------------------------------------------------------------------------
    async def aclose(self, *, graceful: bool) -> None:
        """``close`` (or ``abort``) the lifecycle; returns once it is ``closed``."""
        with contextlib.suppress(ActorClosed):
            await self.lifecycle.send(Event("close" if graceful else "abort"))
        await self.lifecycle.until(lambda state: state == "closed")
        # a deletion under way (asked for late) runs to its end or its bound first
        await self.deletion.aclose()

    # -- channels ----------------------------------------------------------------------------
    def _forward_state(self, sc: StateChanged) -> None:
        if sc.machine == "avatar" and lk.session_live(self.session):
            self._live_route = route_of(self.session)  # only the avatar moves the route
        if sc.machine in _WATCHED:
            for target, post in self._watchers.items():  # statemachines.system.WATCHES
                for event in watched(sc.machine, sc.source, sc.dest, target):
                    post(Event(event, {sc.machine: sc.dest}))
        self._emit_state(sc)  # an owner or listener that fails is logged and dropped there
        if sc.machine == "job" and sc.dest == "closed":
            # heard here rather than by a listener on the job: a listener table per job
            self.emit("closed", self.job.closed_at)

    def _room_audio(self) -> bool:
        # what the agent asked of RoomIO (livekit turns it off under the avatar's route)
        options = self._room_options
        return options is None or options.get_audio_output_options() is not None

    def _is_simulator(self, identity: str) -> bool:
        # only the simulator participant decides the job's fate (the job knows who it is)
        return identity in self.job.simulators

    # -- the job machine's run_close: the session and avatar steps ---------------------------
    # In livekit's order: the session's close first (its speech ends on the route it has,
    # and its close event closes the avatar), then the avatar, so the avatar's restore never
    # builds a room track for a session that is going away. A session still closing after
    # its step's share no longer holds the avatar's close back (it leaves while connected).
    def _teardown_works(self) -> dict[str, Work]:
        works: dict[str, Work] = {"session": self._close_session, "avatar": self._avatar_left}
        if (ctx := self.job_context) is not None:  # livekit's end: told why, or left to go
            works["disconnect"] = livekit_job.disconnect_work(ctx, self.job, self.events)
        return works

    def _close_session(self) -> Awaitable[None] | None:
        """The session closes (when the job ends for another reason, e.g. the simulator
        left, the job asks it to)."""
        if lk.session_live(self.session):
            lk.ask_session_close(self.session, CloseReason.JOB_SHUTDOWN)
        return ending(lk.session_closing_task(self.session))

    def _avatar_left(self) -> Awaitable[None] | None:
        """The avatar's close, which its step's link asked (the work only waits for it: the
        link is the one way the close is asked here), and a session close still running."""
        if self.avatar is None:  # nothing to wait for: the session had its own share
            return None
        return ending(lk.session_closing_task(self.session), self.avatar.released_once_closed())

    # -- the lifecycle's effects -------------------------------------------------------------
    # the job machine hears them through the declared links (statemachines.links.LINKS)
    def _hang_up(self) -> None:
        """livekit's order (``_shutdown_job``): the primary session closes first, then the
        job holds for a verdict (``on_session_end``); the job's own host answers it
        meanwhile. A session left live would stay on the call through the hold."""
        if lk.session_live(self.session):
            lk.ask_session_close(self.session, CloseReason.JOB_SHUTDOWN)

    def _fx_ask_shutdown(self, _ev: Event) -> Output:
        self._hang_up()
        return Output({"reason": LIFECYCLE_SHUTDOWN})

    def _fx_hang_up(self, _ev: Event) -> None:
        self._hang_up()

    def _fx_ask_abort(self, _ev: Event) -> Output:
        return Output({"reason": "aborted"})

    def _fx_run_teardown(self, _ev: Event) -> Event | asyncio.Future[Event]:
        """``closing``'s task: the steps of ``statemachines.system.RELEASE`` (each step's
        links, run_teardown/STEP, fire as it begins); whatever a step was cut at, its last
        step lets the job runtime and every follower go before ``released``."""
        teardown = Teardown(
            RELEASE,
            close_timeout=self.settings.close_timeout,
            clock=self.clock,
            log=logger,
            who=self.lifecycle.where(),
            fields=self.lifecycle.log_fields(),
            begin=self._begin_release,
        )
        works: dict[str, Work] = {
            "starts": self._cut_starts,
            "job": self._job_closed,
            "session": self._no_session_left,
            "participant": self.link.release,
            "avatar": self._avatar_closed,
            "let_go": self._let_go,
        }
        if self.playout is not None:
            works["playout"] = self.playout.release
        return relay(teardown.run(works, None), Event("released"))

    def _let_go(self) -> asyncio.Future[None] | None:
        left = self.job.release_now()
        # each earlier step had its share: a follower whose close still runs past it is
        # cut now; the usual follower is released already (nothing to do)
        cut = [f.release_now() for f in self._followers() if not f.actor.closed]
        self._unhook()
        return ending(left, *cut) if cut else left

    def _hear_reports(self, **table: tuple[Report, ...]) -> Callable[[], None]:
        """Connect the followers' reports of their livekit parts: those declared
        (``statemachines.system.REPORTS``, ``hear_reports``' default), or ``reports=``
        another table (the explorer's faults)."""
        hearers = {"playout": self.playout.hearer()} if self.playout is not None else {}
        sources = {r.actor.spec.name: r for r in self._followers()}
        return hear_reports(sources, hearers, **table)

    def _followers(self) -> list[MachineRuntime[Any]]:
        """The runtimes RELEASE lets go after the job machine: the link, avatar, playout."""
        return [r for r in (self.link, self.avatar, self.playout) if r is not None]

    def _begin_release(self, step: str) -> None:
        self.wiring.fire("agent_job", "run_teardown", step=step)

    def _cut_starts(self) -> Awaitable[None] | None:
        # one that swallows its cancellation runs on past this step's share
        return ending(*(part.cancel() for part in list(self._starts)))

    def _job_closed(self) -> asyncio.Future[None] | None:
        return self.job.when_closed()

    def _no_session_left(self) -> Awaitable[None] | None:
        if lk.session_live(self.session):
            # the job's bound cut its close before the session's step: a closed job leaves
            # no session running (its close is the session's own; not waited for here)
            lk.ask_session_close(self.session, CloseReason.JOB_SHUTDOWN)
        return self.sessions.release_half_started()  # a start cut or failed half-way

    def _avatar_closed(self) -> Awaitable[None] | None:
        """The avatar's close, if the job's close was cut before its avatar step (the close
        runs once, whoever asked first)."""
        return self.avatar.release() if self.avatar is not None else None

    def _unhook(self) -> None:
        self.events.aclose()
        self._unhear()


# the reason the job machine's shutdown carries when the user's aclose() asked it
LIFECYCLE_SHUTDOWN = "job closed"

# the machines some watch follows
_WATCHED = frozenset(w.source for w in WATCHES)


# the lifecycle's handlers, shared by every job (Handlers binds them to one)
_EFFECTS = effect_table(JobSystem, AGENT_JOB)
