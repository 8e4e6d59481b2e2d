"""``AvatarLifecycle``: the ``avatar`` machine around one unchanged plugin. The state says
where it is; what it holds says the rest: the sink it follows (its ``SinkAdoption``), its
claim on the playback RPC (the handler registered in the room). Every event the machine
hears is made here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from livekit import rtc
from livekit.agents.voice.agent_session import AgentSession
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
from livekit.agents.voice.io import AudioOutput

from agent_runtime._messages import AlreadyStarted
from agent_runtime.actor import Event, EventRejected, StateChanged, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.emitter import event_names
from agent_runtime.observe.trace import Tracer
from agent_runtime.runtimes._base import Hear, MachineRuntime, check_parts, is_closed, released
from agent_runtime.runtimes.avatar._attempts import Attempts
from agent_runtime.runtimes.avatar._facts import Facts, Timeouts
from agent_runtime.runtimes.avatar._plugins import (
    PluginCloser,
    RemoveParticipant,
    built_plugin,
    check_plugin,
    check_start_args,
    stop_join_wait,
    warn_no_route,
)
from agent_runtime.runtimes.avatar._route import AudioRoute, finish_pending
from agent_runtime.runtimes.avatar._sink import (
    LifecycleEvents,
    SegmentFlushed,
    SinkAdoption,
    accept_playback_report,
    claim_playback_rpc,
    finish_segments,
    release_playback_rpc,
)
from agent_runtime.runtimes.avatar._view import AvatarView
from agent_runtime.runtimes.avatar._waits import leaving, wait_for_state
from agent_runtime.runtimes.room_events import RoomConnected, RoomEventAdapter, RoomFact
from agent_runtime.runtimes.routing import Wiring, follow
from agent_runtime.scheduler import Scheduler, after, ending
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import AvatarRetry, avatar_retry, check_setting
from statemachines.avatar import AVATAR, PLUGIN_CLEARS

logger = logging.getLogger("agent_runtime.avatar")


class AvatarLifecycle(MachineRuntime[LifecycleEvents], AvatarView):
    """Runs the ``avatar`` machine around one ``AvatarSession``. Emits ``state_changed``
    (a ``StateChanged``), and what playout follows: ``segment_flushed`` (a
    ``SegmentFlushed``: the session's audio reached the plugin's sink) and
    ``playback_finished`` (a ``PlaybackReport``: the avatar said it played it).

    ``remove_participant(identity)`` removes the avatar participant on close (and on a
    retry's release), once the plugin's own ``aclose()`` returned or ran past its bound:
    best effort, an in-process avatar (the agent itself) never. ``server_api_remover(room)``
    removes through the server API (``AgentJob``'s default); ``None`` leaves it to the plugin.

    ``room_audio()`` says whether the session's start asked RoomIO for audio output
    (``RoomOptions.audio_output``; ``AgentJob`` knows): a session that started over the
    avatar's route had it turned off by livekit either way, and a lost avatar gets a room
    audio output only where it was asked for. ``None``: taken as asked (livekit's default).
    """

    _EVENT_NAMES = event_names(LifecycleEvents)  # on("state_chnaged", ...) is refused

    def __init__(
        self,
        avatar: AvatarSession,  # type: ignore[type-arg]
        *,
        join_timeout: float = 30.0,
        close_timeout: float | None = None,
        retry: bool | AvatarRetry | Mapping[str, Any] = False,
        rebuild: Callable[[], AvatarSession] | None = None,  # type: ignore[type-arg]
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        room_events: RoomEventAdapter | None = None,
        remove_participant: RemoveParticipant | None = None,
        room_audio: Callable[[], bool] | None = None,
        wiring: Wiring | None = None,
        owner: Hear | None = None,
    ) -> None:
        super().__init__(owner)
        check_plugin(avatar)
        check_parts(
            room_events=room_events, remove_participant=remove_participant, room_audio=room_audio
        )
        join_timeout = float(check_setting("join_timeout", join_timeout))
        # what a close may take in all: the effect's bound, or the job's share if less
        budget = join_timeout if close_timeout is None else close_timeout
        self._close_budget = min(join_timeout, float(check_setting("close_timeout", budget)))
        self._avatar, self._rebuild = avatar, rebuild
        self._retry: AvatarRetry = avatar_retry(retry)
        self._tries = Attempts(self._retry, avatar, self._report)
        self._plugin_options: dict[str, Any] = {}
        self._clock: Clock = clock or AsyncioClock()
        self._given_adapter = room_events
        self._closer = PluginCloser(avatar, remove_participant, self._clock, self._report)
        self._adapter: RoomEventAdapter | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._route = AudioRoute(room_audio)  # the session and the room too, once started
        self._adopted: SinkAdoption | None = None  # the sink whose clear_buffer we follow
        self._facts = Facts(self, self._route)
        self._join_timeout = join_timeout
        self._run_machine(
            AVATAR,
            _EFFECTS,
            facts=self._facts,  # the shared guards (statemachines.glue) read this view
            instance=avatar.avatar_identity,
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            # closing the plugin gets the same budget as starting it
            effect_timeout=join_timeout,
            wiring=wiring,
            post=self.post_linked,  # the job's links reach it (the session's close)
        )

    # -- public (what it tells: _view) ------------------------------------------------------
    async def start(
        self, agent_session: AgentSession[Any], room: rtc.Room, **plugin_options: Any
    ) -> None:
        """Start the plugin with its route recorded; returns once its outcome is handled:
        ``routing`` (or further); after a failed, routeless or timed-out start (not raised)
        ``restored``, ``backoff`` or ``retiring`` (on room audio either way); ``closed``
        when ``aclose()`` cut it short.

        ``plugin_options`` go to the plugin's own ``start()`` as keyword arguments (e.g.
        ``livekit_url``), on every attempt; options its ``start()`` does not take are
        refused here (``AvatarPluginError``, a ``TypeError``), before anything starts."""
        if self._finished:
            raise RuntimeError("this AvatarLifecycle is closed")
        if self.state != "idle" or self._adapter is not None:  # or its start is queued
            raise AlreadyStarted(f"this AvatarLifecycle is already started (state {self.state!r})")
        adapter = self._given_adapter
        given_room = None if adapter is None else adapter.room
        check_start_args(self._avatar, agent_session, room, given_room, plugin_options)
        self._plugin_options = dict(plugin_options)
        self._route.session, self._route.room = agent_session, room
        self._label_room(room)  # a failing listener of its own names the room
        if adapter is None:
            adapter = RoomEventAdapter(room)
        adapter.start()
        self._adapter = adapter
        self._unsubscribe = follow(
            adapter, "avatar", self.actor.post, facts=self._facts, after=self._after_fact
        )
        started = leaving(self.actor, "starting")
        try:
            await self.actor.send(Event("start"))
            await started
        except EventRejected as e:
            # a close queued before it (the job's link, as its session closed): the
            # table's (closed, start) refuses, and so does start()
            raise RuntimeError(f"this AvatarLifecycle is {self.state}") from e
        finally:
            started.cancel()
        await self.actor.join()  # a failed start: on to restored

    def interrupt(self) -> None:
        """An interruption, as the session's own reaches the avatar's sink: while ``joined``
        the plugin's sink clears itself its own way (a data-stream avatar gets
        ``lk.clear_buffer`` when something is playing; a queue sink drops its audio and
        tells its plugin); in any other state the sink's pending playout is finished
        locally and nothing goes to a participant. Never raises."""
        if self._adopted is not None:
            self._on_sink_clear(self._adopted)
        else:
            self.actor.post(Event("interrupt", {"origin": "api"}))

    async def wait_for(self, state: str, *, timeout: float | None = None) -> None:
        """Wait until the machine is in ``state`` (at once if it is). ``TimeoutError`` after
        ``timeout`` seconds of the lifecycle's clock; ``ActorClosed`` if it closes first."""
        await wait_for_state(self.actor, state, self._clock, timeout)

    async def aclose(self) -> None:
        """From any state: the guarded restore, the avatar participant removed (best
        effort), the plugin closed, every listener and task released. A second call (or
        one after ``release()``) waits for the first one's close."""
        await released(self.release())

    def release(self) -> asyncio.Future[Any] | None:
        """``aclose()`` without its wait: the close is stepped at once (outside a step: the
        machine is ``closed`` when this returns, and ``start()`` refuses), its effects
        (the plugin's close) run as the scheduler's work; what is left to wait for, or
        None. A plugin still starting is a state task: cancelled, not awaited."""
        return self._close_now(self.actor.release)

    def release_now(self) -> asyncio.Future[Any] | None:
        # a failed attempt's aclose() outlives its state: cut with the machine, waited for
        return ending(self.actor.release(), self._closer.cut())

    def released_once_closed(self) -> asyncio.Future[Any] | None:
        """Once a close asked (by the job's link) has been stepped and its effects ended,
        the actor released; what is left to wait for, or None."""
        return after(self.actor.when_settled(is_closed), self.actor.release)

    def post_linked(self, event: Event) -> None:
        """An event the job's links bring (a close among them: stepped with the rest of
        what the input reaches, never ahead of it; the job's teardown releases the
        avatar in its avatar step)."""
        if not self.actor.closed:
            self.actor.post(event)

    # -- room facts (routed by statemachines.routing) ---------------------------------------
    def _after_fact(self, fact: RoomFact) -> None:
        if isinstance(fact, RoomConnected):
            self._route.start_room_output()  # a room output attached before the connection

    def _timeouts(self) -> Timeouts:
        # join_timeout bounds both the plugin's start() (starting) and the join (routing);
        # retry_backoff is the wait before the next restart
        return Timeouts(self, self._join_timeout)

    def _on_state(self, ev: StateChanged) -> None:
        self.actor.report(logger, logging.DEBUG, "%s -> %s on %s", ev.source, ev.dest, ev.event)
        self._emit_state(ev)

    def _report(self, *args: Any, **kw: Any) -> None:
        # the actor's, for the parts built before it (each line names the job and machine)
        self.actor.report(*args, **kw)

    def _warn(self, msg: str, *args: Any) -> None:
        self.actor.report(logger, logging.WARNING, msg, *args)

    def _presence_event(self) -> Event | None:
        """An avatar already in the room produces no participant_connected for us (nor does
        one that runs in the agent's own process)."""
        if not self._facts.avatar_present:
            return None
        return Event("avatar_connected", {"identity": self._avatar.avatar_identity})

    # -- effects ---------------------------------------------------------------------------
    async def _fx_start_plugin(self, ev: Event) -> Event:
        """The state task of ``starting``; cancelled when the state is left."""
        session, room = self._route.session, self._route.room
        assert session is not None and room is not None
        # a new attempt: nothing of a released one is recorded (a release cut at its bound
        # did not get to forget it), and its close will be its own
        self._route.forget()
        self._facts.forget()
        if self._tries.made and self._rebuild is not None:
            self._use(built_plugin(self._rebuild))  # a retry: a fresh plugin from the factory
        self._closer.begin()
        self._route.take_prev()
        # the sink is recorded right after the plugin's last line, in this task, before
        # anything the plugin scheduled runs (its sink registers an RPC on the next tick);
        # cut short (cancelled), the row that left starting records it instead
        try:
            await self._avatar.start(session, room, **self._plugin_options)
        except Exception:
            self._record_installed()  # a plugin failing late may have installed its route
            raise
        self._record_installed()
        if self._route.installed is None:
            # a plugin that caught its provider's error logs it and returns: no route is the
            # only sign, and waiting out join_timeout for it would help nobody
            warn_no_route(self._avatar, self._warn)
            return Event("no_route")
        return Event("plugin_started")

    def _use(self, plugin: AvatarSession) -> None:  # type: ignore[type-arg]
        self._avatar = self._tries.plugin = self._closer.plugin = plugin

    def _fx_record_route(self, ev: Event) -> None:
        self._record_installed()

    def _fx_look_for_late_avatar(self, ev: Event) -> Event | None:
        # one that joined after the removal was asked (not one whose removal failed)
        sid = self._route.sid_of(self._avatar.avatar_identity)
        return self._presence_event() if sid and sid != self._tries.retired else None

    def _fx_check_presence(self, ev: Event) -> Event | None:
        self._claim_playback_rpc()
        return self._presence_event()

    async def _fx_restore_route(self, ev: Event) -> Event:
        self._tries.cause = ev.name  # kept first: the retry guard reads it if this fails
        outcome = self._put_back()
        # the log policy: what the user hears changed; the cause's detail was logged with it
        self._tries.say_lost(silent=self._route.left_silent())
        if not self._retry.rejoin:
            # nothing will route to this avatar again: stop the SDK's waits for it now, or
            # they fail later (unretrieved) when the room goes away
            await self._route.retire_sink()
            await stop_join_wait(self._avatar)
        else:
            await self._route.stop_start_wait()
        return Event("route_restored", {"outcome": outcome, "cause": ev.name})

    async def _fx_release_attempt(self, ev: Event) -> Event:
        """The state task of ``releasing``, before the plugin starts again: the failed
        attempt closed (``_close_attempt``: so that two avatars never answer). Bounded by
        the state's own timeout; a failure here is logged, not fatal."""
        self._tries.restart()
        await self._close_attempt(" before a retry")
        return Event("released")

    async def _fx_retire_attempt(self, ev: Event) -> Event:
        """The state task of ``retiring``: an attempt given up (no retry, no rejoin) closed
        as a retry's release closes it, so that its avatar is not left in the room, still
        billed by its provider; a late avatar of it removed. Bounded by the state's timeout."""
        if self._facts.in_process or self._facts.agent_identity:
            # the avatar is the agent itself: nothing of it is in the room apart from the
            # agent, and its plugin's close (which asks the server to remove that identity)
            # waits for the job's own close
            return Event("released")
        self._tries.retire(self._route.sid_of(self._avatar.avatar_identity))
        await self._close_attempt(" as it is retired")
        return Event("released")

    async def _close_attempt(self, when: str) -> None:
        """A failed attempt's close: its plugin's ``aclose()`` cut at half of ``join_timeout``
        (the state's bound; left running if the state is left, for the job's close), its
        sink retired and let go, then its avatar participant removed in any case."""
        await self._closer.close_attempt(self._join_timeout, when)
        await self._route.retire_sink()
        self._unadopt()
        self._release_playback_rpc()
        await self._closer.remove(self._route.room, in_process=self._facts.in_process)

    def _fx_reinstall_route(self, ev: Event) -> Event | None:
        session, sink = self._route.session, self._route.installed
        assert session is not None and sink is not None
        self._route.take_prev()
        if lk.restart_failed_sink(sink):  # it had waited for this avatar, who left
            self.actor.report(logger, logging.DEBUG, "its sink's failed start is retried")
        session.output.replace_audio_tail(sink)
        self._claim_playback_rpc()
        self.actor.report(logger, logging.INFO, "the avatar is back: audio routed to it again")
        return self._presence_event()

    async def _fx_follow_plugin_clear(self, ev: Event) -> Event:
        """The state task of ``clearing``: the plugin's own clear does the clear's work
        (its RPC, its wait for the avatar's report, its fallback); this waits for it to
        settle. Cancelled with the state, it leaves the plugin's task alone."""
        task = self._facts.plugin_clear_task()
        if task is not None:
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)
        return Event("clear_buffer_done")

    def _fx_clear_local_buffer(self, ev: Event) -> None:
        # the avatar is not joined: its pending playout ends here, nothing goes to it
        if self._route.installed is not None:
            finish_pending(self._route.chain_to_sink())

    def _fx_mark_playout_done(self, ev: Event) -> None:
        if self._route.installed is not None:
            finish_segments(self._route.installed, self._adopted, ev.data)

    def _fx_put_route_back(self, ev: Event) -> None:  # closing: a waiting frame ends with it
        outcome = self._route.put_back(self.actor.report)
        self.actor.report(logger, logging.DEBUG, "closing: route %s", outcome, event=ev.name)

    def _fx_unhook(self, ev: Event) -> None:
        self._release_playback_rpc()
        self._unadopt()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._adapter is not None and self._adapter is not self._given_adapter:
            self._adapter.aclose()
        self._adapter = None

    async def _fx_close_plugin(self, ev: Event) -> None:
        # cut at its part of the budget: a hung plugin close never keeps the avatar in the room
        await self._closer.close(self._close_budget)
        await self._route.retire_sink()
        await self._route.settle_room_output()
        # last: a server API that never answers (this effect's bound, join_timeout, can be
        # shorter than the removal's) must not keep the plugin and its sink open
        await self._closer.remove(self._route.room, in_process=self._facts.in_process)

    # -- the route -------------------------------------------------------------------------
    def _record_installed(self) -> None:
        """Record the sink the plugin's start() put at the tail, once, and adopt it."""
        if (sink := self._route.record_installed()) is not None:
            self._adopt(sink)

    def _put_back(self) -> str:  # a frame waiting at the adopted sink moves on with it
        waiting = self._adopted if self._adopted and self._adopted.waiting else None
        return self._route.put_back(self.actor.report, waiting)

    # -- following the sink's clear, taking the playback_finished RPC ---------------------------
    def _segment_flushed(self, segment: SegmentFlushed) -> None:
        self.emit("segment_flushed", segment)

    def _adopt(self, sink: AudioOutput) -> None:
        """Follow, on this sink instance only, what would bypass the machine."""
        self._adopted = SinkAdoption(
            sink,
            clock=self._clock,
            on_clear=self._on_sink_clear,
            on_flushed=self._segment_flushed,
        )
        self._claim_playback_rpc()
        self._adopted.catch_up()

    def _unadopt(self) -> None:
        adopted, self._adopted = self._adopted, None
        if adopted is not None:
            adopted.release()

    def _on_sink_clear(self, adoption: SinkAdoption) -> None:
        """The session's clear (or ``interrupt()``). Joined: the plugin's own clear, here and
        now, exactly as without the lifecycle, then the machine is told (it follows the
        clear while it holds the sink). Otherwise nothing is sent to the avatar: a sink
        whose clear goes to no participant (a queue to the provider) still drops its audio
        its own way, and the machine finishes what is pending locally."""
        sink = adoption.sink
        if adoption is not self._adopted or self._finished or self._route.detaching(sink):
            # a sink let go (a failed attempt's, its release cut short), the close, or our
            # own put-back detaching it: its segments end here, nothing is sent
            finish_pending([sink])
            return
        if self.actor.state in PLUGIN_CLEARS:
            adoption.own_clear()
            self.actor.post(Event("interrupt", {"origin": "session", "delivered": True}))
            return
        if not isinstance(sink, DataStreamAudioOutput):
            adoption.own_clear()  # its clear sends nothing to a participant
        self.actor.post(Event("interrupt", {"origin": "session"}))

    def _claim_playback_rpc(self) -> None:
        room = self._route.room
        if room is None or not isinstance(self._route.installed, DataStreamAudioOutput):
            return  # only a data-stream avatar reports lk.playback_finished
        # once connected (the local participant exists only then; RoomConnected claims it)
        claim_playback_rpc(room, self._on_playback_finished_rpc)

    def _release_playback_rpc(self) -> None:
        # ours is what is registered, or nothing of ours is: a later handler stays
        if self._route.room is not None:
            release_playback_rpc(self._route.room, self._on_playback_finished_rpc)

    def _on_playback_finished_rpc(self, data: rtc.RpcInvocationData) -> str:
        # the plugin's sink names who reports its playback (its destination), whatever the
        # avatar participant is called
        report = accept_playback_report(data, self.report_identity, self.actor.report)
        adopted = self._adopted
        if adopted is not None and adopted.is_late(report, self._clock.now(), self.actor.report):
            return "ok"  # not for the audio it plays now (logged)
        self.actor.post(
            Event(
                "playback_finished",
                {"playback_position": report.playback_position, "interrupted": report.interrupted},
            )
        )
        self.emit("playback_finished", report)  # a listener's failure is logged there
        return "ok"


# the avatar machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(AvatarLifecycle, AVATAR)
