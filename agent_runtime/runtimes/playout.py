"""The ``playout`` machine on a real ``AgentSession``: the agent's audio until it was heard,
and the re-prompt watchdog.

``wait_for_playout()`` ends when the session's audio output says the audio played: for an
avatar's data-stream sink that is the avatar's ``lk.playback_finished``, which an avatar
that hangs or leaves never sends, so upstream the agent stays "speaking" and the SDK's
``user_away_timeout`` (which starts once both sides are listening) never starts either.
``PlayoutTracker`` follows, without changing them:

- the session's own events: ``speech_created``, ``agent_state_changed``,
  ``user_state_changed``, and each speech handle's interruption (its public
  ``wait_if_not_interrupted``); its ``close`` through the ``session`` machine's link (the
  job's, or alone one of its own: ``sessions.own_sessions``);
- the avatar lifecycle (``AvatarLifecycle``, when the job has one): its state changes
  (``statemachines.system.WATCHES``) and its reports of the plugin's sink
  (``statemachines.system.REPORTS``: ``segment_flushed``, the session's audio reached the
  sink, with its duration; ``playback_finished``, the avatar's own report), whose event
  data the handlers here make; composed, the job system delivers both, alone the tracker
  connects the reports itself (``routing.hear_reports``);
- the participant link's state changes (the linked user left, ``WATCHES``).

The wait for the avatar is bounded by what was pushed: the segment's first frame plus its
duration (cut short by an interruption) plus ``margin``, computed when the wait begins. On
expiry the segment is finished locally through the avatar machine (its
``playback_finished`` row, marked ``origin: playout``), so the SDK's own wait ends too;
nothing is ever sent to the avatar from here.

The re-prompt (``on_reprompt(session, attempt)``, by default
``session.generate_reply(instructions=...)``) is an effect of the machine: its call is
bounded by the actor's effect budget, its failure logged. A returned ``SpeechHandle`` is not
awaited (the reply's playout is the machine's next turn); another awaitable is.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from livekit.agents import AgentSession, CloseReason
from livekit.agents.voice.events import (
    AgentStateChangedEvent,
    SpeechCreatedEvent,
    UserStateChangedEvent,
)
from livekit.agents.voice.speech_handle import SpeechHandle

from agent_runtime._messages import Reported
from agent_runtime.actor import Event, Output, effect_table
from agent_runtime.clock import AsyncioClock, Clock
from agent_runtime.emitter import Listener, event_names
from agent_runtime.observe.trace import Tracer, describe
from agent_runtime.parts import check_part
from agent_runtime.runtimes._base import (
    Hear,
    MachineRuntime,
    check_instance,
    listen,
    released,
    unlisten,
)
from agent_runtime.runtimes.avatar import AvatarLifecycle, PlaybackReport, SegmentFlushed
from agent_runtime.runtimes.participant import ParticipantLink
from agent_runtime.runtimes.routing import Hearer, Wiring, hear_reports
from agent_runtime.runtimes.sessions import own_sessions
from agent_runtime.scheduler import Scheduler, ending
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import PlayoutOptions, check_setting
from statemachines import glue
from statemachines.playout import PLAYOUT

logger = logging.getLogger("agent_runtime.playout")

RepromptFn = Callable[[AgentSession[Any], int], object]
PlayoutEvents = Literal["state_changed", "playout_done", "reprompt"]


@dataclass(frozen=True, slots=True)
class PlayoutDone:
    """Emitted as ``playout_done``: the agent's audio is done, and why (the machine's
    event: ``playback_finished`` the avatar said so, ``playout_timeout`` the bound, ``avatar_left``,
    ``agent_listening`` the SDK's own report, ``speech_done`` a speech that never reached the
    output)."""

    t: float  # on the tracker's clock
    cause: str


@dataclass(frozen=True, slots=True)
class Reprompted:
    """Emitted as ``reprompt``: the watchdog re-prompted the user (``attempt`` from 1)."""

    t: float
    attempt: int


@functools.lru_cache(maxsize=32)
def default_reprompt(instructions: str) -> RepromptFn:
    """The re-prompt ``AgentJob`` uses unless given one: a short reply with these
    instructions (one function per instructions, shared by the jobs that use them)."""

    def reprompt(session: AgentSession[Any], attempt: int) -> SpeechHandle:
        return session.generate_reply(instructions=instructions)

    return reprompt


class _Facts:
    """What the playout machine's guards read (``statemachines.glue.PlayoutFacts``)."""

    __slots__ = ("_t",)

    def __init__(self, tracker: PlayoutTracker) -> None:
        self._t = tracker

    @property
    def avatar_state(self) -> str | None:
        avatar = self._t._avatar
        return avatar.state if avatar is not None else None

    @property
    def audio_at_avatar(self) -> bool:
        return self._t._owed() > 0

    @property
    def watchdog_on(self) -> bool:
        return self._t.options.reprompt

    @property
    def user_linked(self) -> bool:
        link = self._t._link
        return link is None or link.state == "linked"  # else: nobody to re-prompt

    @property
    def user_speaking(self) -> bool:
        return self._t.session.user_state == "speaking"  # listening, or away: silent

    @property
    def reprompts(self) -> int:
        return self._t._reprompts

    @property
    def max_reprompts(self) -> int:
        return self._t.options.max_reprompts


class _Timeouts(Mapping[str, float | None]):
    """The state timeouts: ``playout_bound`` computed when ``remote_playout`` is entered,
    the watchdog's two from the options."""

    __slots__ = ("_t",)

    def __init__(self, tracker: PlayoutTracker) -> None:
        self._t = tracker

    def __getitem__(self, key: str) -> float | None:
        if key == "playout_bound":
            return self._t.playout_bound()
        if key in ("safety_window", "reprompt_after"):
            return float(getattr(self._t.options, key))
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("playout_bound", "safety_window", "reprompt_after"))

    def __len__(self) -> int:
        return 3


class PlayoutTracker(MachineRuntime[PlayoutEvents]):
    """Runs the ``playout`` machine for one session. Emits ``state_changed`` (a
    ``StateChanged``), ``playout_done`` (a ``PlayoutDone``) and ``reprompt`` (a
    ``Reprompted``).

    It does not own the session, the avatar or the link: ``aclose()`` only stops following.
    ``done`` and ``reprompted`` keep the last ``HISTORY`` of each (a long session's turns
    must not grow a job's memory).
    """

    HISTORY = 256
    _EVENT_NAMES = event_names(PlayoutEvents)  # on("state_chnaged", ...) is refused
    _done: deque[PlayoutDone] | None
    _reprompted: deque[Reprompted] | None
    _unhear: Callable[[], None] | None = None  # alone: what takes its reports back

    @property
    def done(self) -> deque[PlayoutDone]:
        """The last ``HISTORY`` turns' ends, oldest first."""
        if self._done is None:
            self._done = deque(maxlen=self.HISTORY)
        return self._done

    @property
    def reprompted(self) -> deque[Reprompted]:
        """The last ``HISTORY`` re-prompts, oldest first."""
        if self._reprompted is None:
            self._reprompted = deque(maxlen=self.HISTORY)
        return self._reprompted

    def __init__(
        self,
        session: AgentSession[Any],
        *,
        options: PlayoutOptions | Mapping[str, Any] | bool = True,
        on_reprompt: RepromptFn | None = None,
        avatar: AvatarLifecycle | None = None,
        link: ParticipantLink | None = None,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        scheduler: Scheduler | None = None,
        instance: str = "session",
        wiring: Wiring | None = None,
        owner: Hear | None = None,
    ) -> None:
        super().__init__(owner)
        check_part("session", session, required=True)
        check_part("on_reprompt", on_reprompt)  # its arity too: called (session, attempt)
        check_instance("avatar", avatar, AvatarLifecycle)
        check_instance("link", link, ParticipantLink)
        opts = check_setting("playout", options)
        if opts is None:
            raise ValueError("options=False: build no PlayoutTracker instead")
        self.options: PlayoutOptions = opts
        self.session = session
        self._avatar = avatar
        self._link = link
        # what it follows of the session, from start() to its close; the session's close
        # comes by the links, from the job's session machine or its own (own_sessions)
        self._follows: dict[str, Callable[..., None]] = {
            "speech_created": Listener(self._on_speech_created),
            "agent_state_changed": Listener(self._on_agent_state),
            "user_state_changed": Listener(self._on_user_state),
        }
        self._clock: Clock = clock or AsyncioClock()
        self._on_reprompt = on_reprompt or default_reprompt(opts.reprompt_instructions)
        self._reprompts = 0  # in a row, since the user last spoke
        # the last segment handed to the avatar's sink (first frame at, seconds pushed), and
        # when the agent's speech was last interrupted (on this clock)
        self._segment: tuple[float, float] | None = None
        self._cut_at: float | None = None
        # re-prompts running (a dict as an ordered set: small while empty, as it mostly is)
        self._speeches: dict[asyncio.Task[None], None] = {}
        # made at the first turn (or read): an empty deque is a 64-slot block, and a job
        # whose agent has not spoken yet needs neither
        self._done = None
        self._reprompted = None
        self._run_machine(
            PLAYOUT,
            _EFFECTS,
            facts=_Facts(self),  # what the shared guards (statemachines.glue) read
            instance=instance or "session",  # a trace names every instance
            clock=self._clock,
            tracer=tracer,
            scheduler=scheduler,
            wiring=wiring,
            post=self._post,
        )
        self._own_sessions = own_sessions(wiring, self.actor, self._post, session)
        if self._own_sessions is not None and avatar is not None:
            # alone, its avatar hears its links and it hears its avatar's reports, as in a
            # job; once built, so that a tracker refused above leaves its avatar as it was
            self.wiring.connect("avatar", avatar.post_linked)
            self._unhear = hear_reports({"avatar": avatar}, {"playout": self.hearer()})

    def _timeouts(self) -> Mapping[str, float | None]:
        return _Timeouts(self)

    # -- public ----------------------------------------------------------------------------
    @property
    def reprompts(self) -> int:
        """Re-prompts in a row since the user last spoke."""
        return self._reprompts

    @property
    def avatar_joined(self) -> bool:
        return glue.avatar_joined(_Facts(self), glue.EMPTY)

    @property
    def audio_at_avatar(self) -> bool:
        """The avatar's sink holds ended segments of agent audio it has not reported."""
        return _Facts(self).audio_at_avatar

    @property
    def user_listening(self) -> bool:
        """A linked user is there and silent (what the watchdog's guard reads)."""
        return glue.user_listening(_Facts(self), glue.EMPTY)

    def start(self) -> None:
        """Follow the session (before it starts, so its first speech is seen). Idempotent.
        The machine's start says that it follows: nothing else starts it (``_post``)."""
        if self.actor.started or self.actor.closed:
            return
        self.actor.start()
        listen(self.session, self._follows)
        if self._own_sessions is not None:  # alone: its close, by its own session machine
            self._own_sessions.follow(self.session)

    def playout_bound(self) -> float:
        """How long the avatar has, from now, to report the audio it was given: what is left
        of the last segment (cut at an interruption) plus the margin."""
        now = self._clock.now()
        end = now
        if self._segment is not None:
            started, pushed = self._segment
            # audio its sink took before the avatar joined is played from the join on
            end = max(started, self._joined_since()) + pushed
            if self._cut_at is not None and self._cut_at >= started:
                end = min(end, self._cut_at)
        elif self._cut_at is not None:
            end = self._cut_at
        return round(max(0.0, end - now) + self.options.margin, 6)

    def _joined_since(self) -> float:
        """When the avatar last entered ``joined`` (the beginning of time when it is not)."""
        avatar = self._avatar
        if avatar is None or avatar.state != "joined" or avatar.actor.entered_at is None:
            return float("-inf")
        return avatar.actor.entered_at

    async def aclose(self) -> None:
        """Stop following: the machine closes, listeners and speech followers go."""
        await released(self.release())

    def release(self) -> asyncio.Future[Any] | None:
        """``aclose()`` as the job's teardown runs it: what is left to wait for, or None
        (the usual case: the close is stepped at once and nothing is running)."""
        return self._close_now(self._stop)

    def release_now(self) -> asyncio.Future[Any] | None:
        return self._stop()

    async def stop(self) -> None:
        """Stop the machine where it is (no ``close`` event) and stop following."""
        await released(self._stop())

    def _stop(self) -> asyncio.Future[Any] | None:
        stopped = self.actor.release()
        unlisten(self.session, self._follows)  # nothing to take back if never started
        if self._own_sessions is not None:  # its listener goes now; its close runs no effect
            self._own_sessions.release_now()
        if self._unhear is not None:  # composed, the job takes its connections back
            self._unhear()
        for t in self._speeches:
            t.cancel()
        return ending(stopped, *self._speeches)

    # -- what it follows ---------------------------------------------------------------------
    def _on_speech_created(self, ev: SpeechCreatedEvent) -> None:
        handle = ev.speech_handle
        self._post(Event("speech_created", {"speech_id": handle.id, "source": ev.source}))
        if not self.actor.closed and not handle.done():
            task = asyncio.get_running_loop().create_task(
                self._follow_speech(handle), name=f"playout:{handle.id}"
            )
            self._speeches[task] = None
            task.add_done_callback(lambda t: self._speeches.pop(t, None))

    async def _follow_speech(self, handle: SpeechHandle) -> None:
        """Until the speech is done: its interruption, then its end, through the handle's
        public API."""
        played = asyncio.ensure_future(handle.wait_for_playout())
        try:
            await handle.wait_if_not_interrupted([played])
            if handle.interrupted:
                self._cut_at = self._clock.now()
                self._post(Event("interrupted", {"speech_id": handle.id}))
                await played
        finally:
            played.cancel()
        self._post(
            Event("speech_done", {"speech_id": handle.id, "interrupted": handle.interrupted})
        )

    def _on_agent_state(self, ev: AgentStateChangedEvent) -> None:
        event = glue.agent_state_event(ev.new_state, ev.old_state)
        if event is not None:
            self._post(Event(event, {"state": ev.new_state}))

    def _on_user_state(self, ev: UserStateChangedEvent) -> None:
        if ev.new_state == "speaking":
            self._post(Event("user_speaking"))

    def _post(self, event: Event) -> None:
        """An event for the machine while it follows the session (started, not released).
        Before ``start()`` nothing of the session is pending: what another machine says (a
        watch, the job's link) would change nothing but start the machine early."""
        if self.actor.started and not self.actor.closed:
            self.actor.post(event)

    def _owed(self) -> int:
        """Ended segments at the avatar's sink it has not reported (0 without one)."""
        avatar = self._avatar
        sink = avatar.installed_sink if avatar is not None else None
        return lk.ended_unreported(sink) if sink is not None else 0

    def hearer(self) -> Hearer:
        """How it hears the reports declared to it (``statemachines.system.REPORTS``): its
        poster, and the event's data each report makes."""
        return self._post, {
            ("avatar", "segment_flushed"): self._segment_flushed,
            ("avatar", "playback_finished"): self._playback_report,
        }

    def _segment_flushed(self, seg: SegmentFlushed) -> dict[str, Any]:
        started = seg.started_at
        if self._segment is not None and self._owed() > 1:
            # another ended segment is still owed: the avatar plays this one after it
            started = max(started, self._segment[0] + self._segment[1])
        self._segment = (started, seg.pushed)
        return {"pushed": round(seg.pushed, 6)}

    def _playback_report(self, rep: PlaybackReport) -> dict[str, Any]:
        return {
            "playback_position": rep.playback_position,
            "interrupted": rep.interrupted,
            # what this report leaves owed, counted as it comes (the avatar counts it in
            # its own step, which may come after this machine's)
            "owed": max(0, self._owed() - 1),
        }

    # -- effects -------------------------------------------------------------------------------
    def _fx_playout_done(self, ev: Event) -> None:
        done = PlayoutDone(self._clock.now(), ev.name)
        self.done.append(done)
        logger.debug("playout done (%s)", ev.name, extra=self.actor.log_fields(ev.name))
        self.emit("playout_done", done)

    def _fx_finish_playout(self, ev: Event) -> Output:
        started, pushed = self._segment if self._segment is not None else (None, 0.0)
        avatar = self._avatar
        # this segment's interruption (as playout_bound reads it), not an earlier one's
        cut = self._cut_at is not None and (started is None or self._cut_at >= started)
        # the wait: the audio pushed plus the margin, or after a clear the margin alone
        why = (
            "of the interruption's clear"
            if cut
            else f"({pushed:g}s of audio pushed and a {self.options.margin:g}s margin)"
        )
        self.actor.report(
            logger,
            logging.WARNING,
            "avatar %s sent no lk.playback_finished within %gs %s; counting the playout "
            "done and finishing it locally",
            avatar.avatar.avatar_identity if avatar is not None else "?",
            float(ev.data.get("after", 0.0)),
            why,
            event=ev.name,
        )
        # through the avatar's own table (statemachines.links.LINKS): it ends the sink's
        # segments still owed (no RPC), as the avatar's reports would have
        return Output({"playback_position": pushed, "interrupted": cut, "origin": "playout"})

    async def _fx_reprompt(self, ev: Event) -> None:
        n = self._reprompts = self._reprompts + 1
        self.reprompted.append(sent := Reprompted(self._clock.now(), n))
        self.actor.report(
            logger,
            logging.INFO,
            "the user has been silent for %.1fs; re-prompt %d of %d",
            self.options.reprompt_after,
            n,
            self.options.max_reprompts,
            event=ev.name,
        )
        self.emit("reprompt", sent)
        try:
            res = self._on_reprompt(self.session, n)
            if inspect.isawaitable(res) and not isinstance(res, SpeechHandle):
                await res  # bounded by the actor's effect budget
        except Exception as e:  # the agent's bug: its traceback, once; the trace keeps it
            why = describe(e)
            self.actor.report(logger, logging.ERROR, "on_reprompt failed: %s", why, exc_info=e)
            raise Reported(e) from e

    def _fx_reset_reprompts(self, ev: Event) -> None:
        self._reprompts = 0

    def _fx_hand_over(self, ev: Event) -> None:
        opts = self.options
        close = opts.when_exhausted == "close"
        then = f"closing the session ({opts.close_reason})" if close else "waiting for the user"
        self.actor.report(
            logger,
            logging.INFO,
            "no answer after %d re-prompts; %s",
            self._reprompts,
            then,
            event=ev.name,
        )
        if close and lk.session_live(self.session):
            lk.ask_session_close(self.session, CloseReason(opts.close_reason))


# the playout machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(PlayoutTracker, PLAYOUT)
