"""The avatar lifecycle around any livekit-agents ``AvatarSession`` plugin.

Upstream plugins point the session's audio at the avatar in ``start()`` and nothing ever
points it back: an avatar that never joins, or leaves, leaves the agent talking into a
data stream nobody reads. ``AvatarLifecycle`` runs the ``avatar`` machine around the
unchanged plugin: it snapshots the audio chain before the plugin's ``start()``, records the
sink the plugin installed, follows the avatar participant through room facts on the
injected clock, and on failure puts the previous route back, but only while the chain's
tail is still the plugin's sink (a route someone installed later is left alone).

The plugin's ``start()`` (with its own keyword options passed through) runs as a state
task of ``starting``: the mailbox keeps moving while it waits, and leaving the state
cancels it. A start that returns having installed no route (a plugin that caught and
logged its provider's error) is a failure at once.

The session's own interruptions reach the plugin's sink as ``clear_buffer()``. While the
avatar is joined that call is the plugin's own, run at once and unchanged (whatever its sink
does: an ``lk.clear_buffer`` RPC with its own bound and hold, or a queue's clear and its
events); the lifecycle only follows it (``clearing`` while it holds the sink). Only when the
avatar is not joined does the lifecycle step in: nothing is sent to a participant who is
not there, and pending playout is finished locally, so the session does not stall.

Route reporting knows the plugin's sink by identity (the one recorded after its start),
whatever its class. For the playout machine the lifecycle also reports what the sink is
given (``segment_flushed``: a segment's audio all pushed, with its duration) and each
``lk.playback_finished`` it accepts (``playback_finished``), from the identity the plugin's
own sink accepts it from: the sink's destination, which need not be the avatar participant
(avatartalk streams to ``listener``). A retry policy (``AvatarRetry``) may start the plugin
again after a transient loss, after a backoff spent on room audio.

The join signal depends on how the plugin delivers its audio (``join_signal``): an avatar
that is a participant of its own waits for it to be there with video (``video``); an
avatar that runs inside the agent's own process (its identity is the agent's own, as
bithuman's local mode) has nothing to wait for (``none``), so it is joined as soon as its
start returns and no ``join_timeout`` can fail it, and it is never removed from the room.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from livekit import api, rtc
from livekit.agents import get_job_context
from livekit.agents.voice.agent_session import AgentSession
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput
from livekit.agents.voice.io import AudioOutput
from livekit.agents.voice.room_io import AudioOutputOptions
from livekit.agents.voice.room_io._output import _ParticipantAudioOutput

from statemachines.avatar import AVATAR, PLUGIN_CLEARS

from . import livekit_compat as lk
from .actor import Actor, ActorClosed, Event, EventRejected, Handlers, StateChanged, effect_table
from .clock import AsyncioClock, Clock
from .emitter import Emitter
from .room_events import (
    RoomConnected,
    RoomEventAdapter,
    RoomFact,
)
from .routing import follow, guard_table
from .settings import AvatarRetry, avatar_retry, check_setting
from .trace import Tracer

logger = logging.getLogger("agent_runtime.avatar")

Route = Literal["avatar", "room", "none"]
RemoveParticipant = Callable[[str], Awaitable[object] | object]
# what the lifecycle waits for before the avatar counts as joined (see join_signal)
JoinSignal = Literal["video", "none"]

RPC_CLEAR_BUFFER = "lk.clear_buffer"
RPC_PLAYBACK_FINISHED = "lk.playback_finished"
_REMOVAL_TIMEOUT = 5.0


class AvatarPluginError(TypeError):
    """The object given as an avatar plugin is not a livekit-agents ``AvatarSession``
    (or its ``start()`` cannot take the options given); the message names the plugin."""


def plugin_name(obj: object) -> str:
    """``module.Class`` of a plugin object, or the name of a class or factory of one."""
    if isinstance(obj, functools.partial):
        return plugin_name(obj.func)
    target = obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}.{getattr(target, '__qualname__', type(obj).__qualname__)}"


def check_plugin(avatar: object) -> None:
    """``AvatarPluginError`` naming the plugin unless it is an ``AvatarSession``."""
    if not isinstance(avatar, AvatarSession):
        raise AvatarPluginError(
            f"avatar plugin {plugin_name(avatar)} is not a livekit-agents AvatarSession "
            f"(livekit.agents.voice.avatar.AvatarSession); it cannot be run"
        )


def check_start_options(avatar: AvatarSession, options: Mapping[str, Any]) -> None:  # type: ignore[type-arg]
    """``AvatarPluginError`` unless the plugin's ``start()`` takes these keyword options."""
    if not options:
        return
    try:
        inspect.signature(avatar.start).bind(None, None, **options)
    except TypeError as e:
        raise AvatarPluginError(
            f"avatar plugin {plugin_name(avatar)}: its start() does not take "
            f"{', '.join(sorted(options))} ({e})"
        ) from None


# -- the audio chain ---------------------------------------------------------------------


def audio_chain(session: AgentSession[Any] | None) -> list[AudioOutput]:
    """The session's audio outputs from the top (``output.audio``) to the tail."""
    out: list[AudioOutput] = []
    cur = session.output.audio if session is not None else None
    while cur is not None and len(out) < 64:  # a chain is short; never loop on a cycle
        out.append(cur)
        cur = cur.next_in_chain
    return out


def audio_tail(session: AgentSession[Any] | None) -> AudioOutput | None:
    chain = audio_chain(session)
    return chain[-1] if chain else None


def route_of(session: AgentSession[Any] | None, *avatar_sinks: AudioOutput | None) -> Route:
    """Where the agent's audio goes: an avatar (one of ``avatar_sinks``, the sinks avatar
    plugins installed, known by identity whatever their class; or any data stream to an
    avatar), the room's audio track, or neither."""
    tail = audio_tail(session)
    if tail is None:
        return "none"
    if any(tail is s for s in avatar_sinks) or isinstance(tail, DataStreamAudioOutput):
        return "avatar"
    if isinstance(tail, _ParticipantAudioOutput):
        return "room"
    return "none"


def _pending(out: AudioOutput) -> int:
    # segments captured and not yet reported finished; the base class keeps this count
    return out._pending_playback_count


def _finish_pending(chain: list[AudioOutput], position: float = 0.0) -> int:
    """Report every pending segment as interrupted, deepest output first.

    A wrapper can count a segment its sink never saw (the capture was cancelled while
    the sink waited for an avatar that never came); finishing from the bottom up lets
    each report travel upwards and only tops up what is still open.
    """
    finished = 0
    for out in reversed(chain):
        while _pending(out) > 0:
            before = _pending(out)
            out.on_playback_finished(playback_position=position, interrupted=True)
            if _pending(out) >= before:  # an output that does not count; do not spin
                break
            finished += 1
    return finished


def _finish_orphans(chain: list[AudioOutput]) -> None:
    """After the avatar's sink left the chain: end, as interrupted, what a wrapper still
    counts beyond the output below it. Only that sink could have reported it (a local clear
    while its capture waited for the avatar leaves the proxy below already done), and the
    session's playout would wait for it forever."""
    for upper, lower in reversed(list(itertools.pairwise(chain))):
        while _pending(upper) > _pending(lower):
            before = _pending(upper)
            upper.on_playback_finished(playback_position=0.0, interrupted=True)
            if _pending(upper) >= before:  # an output that does not count; do not spin
                break


# A bound of the runtime's own on incoming JSON: json's recursion limit differs between
# interpreters (3.11 refuses 2,000 levels, 3.13 parses them), and the answer must not.
_MAX_NESTING = 32
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    for ch in _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _parse_playback_finished(payload: str) -> tuple[float, bool]:
    """``{"playback_position": seconds >= 0, "interrupted": bool}`` or ``ValueError``."""
    if _nesting(payload) > _MAX_NESTING:
        raise ValueError(f"payload nests deeper than {_MAX_NESTING} levels")
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):  # nested past json's recursion limit
        raise ValueError("payload is not JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("payload is not a JSON object")
    pos = obj.get("playback_position")
    if isinstance(pos, bool) or not isinstance(pos, int | float):
        raise ValueError("playback_position must be a finite number")
    try:
        pos = float(pos)  # an integer of hundreds of digits overflows here
    except OverflowError:
        raise ValueError("playback_position must be a finite number") from None
    if not math.isfinite(pos):
        raise ValueError("playback_position must be a finite number")
    if pos < 0:
        raise ValueError("playback_position must be >= 0")
    interrupted = obj.get("interrupted")
    if not isinstance(interrupted, bool):
        raise ValueError("interrupted must be true or false")
    return pos, interrupted


def server_api_remover(room: rtc.Room) -> RemoveParticipant:
    """Removes a participant of ``room`` through the LiveKit server API of the job this runs
    in (``get_job_context().api``, credentials from the job's environment), as the plugins'
    own ``aclose()`` does; outside a job there is no server API to call, which is logged."""

    async def remove(identity: str) -> None:
        ctx = get_job_context(required=False)
        if ctx is None:
            logger.info("avatar %s left in the room: no job context, no server API", identity)
            return
        await ctx.api.room.remove_participant(
            api.RoomParticipantIdentity(room=room.name, identity=identity)
        )

    return remove


def _no_registration(*_: Any, **__: Any) -> None:
    """Stands in for the sink's own ``lk.playback_finished`` registration (see ``_adopt``)."""


# the room outputs handed to a still-running session at close, until that session closes
_HANDED_OFF: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class SegmentFlushed:
    """Emitted as ``segment_flushed``: the session ended a segment at the avatar's sink
    (its ``flush()``), so all of that segment's audio is pushed. On the lifecycle's clock."""

    started_at: float  # when its first frame was accepted by the sink
    pushed: float  # seconds of audio accepted


@dataclass(frozen=True, slots=True)
class PlaybackReport:
    """Emitted as ``playback_finished``: the avatar's own ``lk.playback_finished``,
    accepted (from the avatar, well formed)."""

    playback_position: float
    interrupted: bool


LifecycleEvents = Literal["state_changed", "segment_flushed", "playback_finished"]


class _PrevRoute(NamedTuple):
    """The route a plugin's start (or a reinstall) replaced, taken just before it."""

    top: AudioOutput | None
    tail: AudioOutput | None
    session_running: bool


class _Facts:
    """What the avatar's guards and room conditions read (``statemachines.glue``), live."""

    __slots__ = ("_lc",)
    simulators: frozenset[str] = frozenset()  # no route of the avatar's is about them

    def __init__(self, lifecycle: AvatarLifecycle) -> None:
        self._lc = lifecycle

    @property
    def avatar_identity(self) -> str | None:
        return self._lc._avatar.avatar_identity

    @property
    def avatar_present(self) -> bool:
        return self._lc._in_process() or self._lc._avatar_participant() is not None

    @property
    def avatar_has_video(self) -> bool:
        # an in-process avatar has no join signal: its start is its join
        return self._lc._in_process() or self._lc._avatar_has_video()

    @property
    def plugin_clear_in_flight(self) -> bool:
        return self._lc._plugin_clear_task() is not None

    @property
    def route_recorded(self) -> bool:
        return self._lc._installed is not None

    @property
    def attempts(self) -> int:
        return self._lc._attempts

    @property
    def last_cause(self) -> str:
        return self._lc._cause

    @property
    def retry(self) -> AvatarRetry:
        return self._lc._retry


class _Timeouts(Mapping[str, float | None]):
    """The actor's state-timeout settings: ``join_timeout``, and ``retry_backoff`` computed
    for the restart that comes next."""

    def __init__(self, lifecycle: AvatarLifecycle) -> None:
        self._lc = lifecycle

    def __getitem__(self, key: str) -> float | None:
        if key == "join_timeout":
            return self._lc._join_timeout
        if key == "retry_backoff":
            return self._lc._retry.backoff.delay(self._lc._attempts)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("join_timeout", "retry_backoff"))

    def __len__(self) -> int:
        return 2


class AvatarLifecycle(Emitter[LifecycleEvents]):
    """Runs the ``avatar`` machine around one ``AvatarSession``. Emits ``state_changed``
    (a ``StateChanged``), and what playout follows: ``segment_flushed`` (a
    ``SegmentFlushed``: the session's audio reached the plugin's sink) and
    ``playback_finished`` (a ``PlaybackReport``: the avatar said it played it).

    ``remove_participant(identity)`` removes the avatar participant on close, after the
    plugin's own ``aclose()`` (best effort; a not-found answer, the plugin having removed
    it, is fine; an in-process avatar is the agent itself and is never
    removed). ``server_api_remover(room)`` does it through the job's server API (what
    ``AgentJob`` uses unless given one). Leave it ``None`` to rely on the plugin alone.
    """

    def __init__(
        self,
        avatar: AvatarSession,  # type: ignore[type-arg]
        *,
        join_timeout: float = 30.0,
        retry: bool | AvatarRetry | Mapping[str, Any] = False,
        clock: Clock | None = None,
        tracer: Tracer | None = None,
        room_events: RoomEventAdapter | None = None,
        remove_participant: RemoveParticipant | None = None,
    ) -> None:
        super().__init__()
        check_plugin(avatar)
        join_timeout = check_setting("join_timeout", join_timeout)
        self._avatar = avatar
        self._join_timeout = float(join_timeout)
        self._retry: AvatarRetry = avatar_retry(retry)
        self._attempts = 0  # restarts made so far
        self._cause = ""  # what ended the last attempt
        self._plugin_options: dict[str, Any] = {}
        self._clock: Clock = clock or AsyncioClock()
        self._given_adapter = room_events
        self._remove_participant = remove_participant

        self._session: AgentSession[Any] | None = None
        self._room: rtc.Room | None = None
        self._adapter: RoomEventAdapter | None = None
        self._unsubscribe: Callable[[], None] | None = None
        # the route the plugin replaced (None until its start() began: then nothing of the
        # plugin's can be in the chain)
        self._prev: _PrevRoute | None = None
        self._installed: AudioOutput | None = None  # the sink the plugin installed
        self._adopted: AudioOutput | None = None  # the sink whose clear_buffer we follow
        self._own_clear: Callable[[], None] | None = None  # that sink's own clear_buffer
        # the segment the sink is taking: (first frame at, seconds pushed)
        self._segment: tuple[float, float] | None = None
        self._room_output: _ParticipantAudioOutput | None = None  # attached by a restore
        self._room_output_task: asyncio.Task[None] | None = None
        self._rpc_claimed = False
        self._agent_is_avatar = False  # the plugin's avatar runs in this process (once seen)
        self._swapping = False
        self._closing = False
        self._facts = _Facts(self)
        # the failed attempt's release, while it runs: the next start waits for it
        self._releasing: asyncio.Future[None] | None = None

        self._actor = Actor(
            AVATAR,
            instance=avatar.avatar_identity,
            effects=Handlers(self, _EFFECTS),
            # the shared guards (statemachines.glue), on the avatar's facts view
            guards=Handlers(self._facts, _GUARDS),
            # join_timeout bounds both the plugin's start() (starting) and the join
            # (routing); retry_backoff is the wait before the next restart
            settings=_Timeouts(self),
            clock=self._clock,
            tracer=tracer,
            # closing the plugin gets the same budget as starting it
            effect_timeout=self._join_timeout,
        )
        self._actor.on("state_changed", self._on_state_changed)

    # -- public ----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self._actor.state

    @property
    def avatar(self) -> AvatarSession:  # type: ignore[type-arg]
        return self._avatar

    @property
    def actor(self) -> Actor:
        return self._actor

    @property
    def installed_sink(self) -> AudioOutput | None:
        """The sink the plugin installed, once its ``start()`` has run."""
        return self._installed

    @property
    def retry(self) -> AvatarRetry:
        """The retry policy this lifecycle runs with."""
        return self._retry

    @property
    def attempts(self) -> int:
        """How many times the plugin was started again after a transient loss."""
        return self._attempts

    def audio_route(self) -> Route:
        """Where the agent's audio goes now: ``avatar`` (the plugin's sink, whatever its
        class), ``room`` or ``none``."""
        return route_of(self._session, self._installed)

    @property
    def join_signal(self) -> JoinSignal:
        """What the avatar must show before it counts as joined: ``video`` (a participant of
        its own, with a video track: every plugin whose avatar runs at its provider, whether
        its sink streams to the avatar or to another identity, or feeds a queue the plugin
        forwards over its own websocket) or ``none`` (the avatar runs in the agent's own
        process; its identity is the agent's). Known once the plugin's start has run."""
        return "none" if self._in_process() else "video"

    @property
    def report_identity(self) -> str:
        """Whose ``lk.playback_finished`` counts: the identity the plugin's own sink accepts
        it from (a data stream's destination), else the avatar's."""
        sink = self._installed
        if isinstance(sink, DataStreamAudioOutput):
            return sink._destination_identity
        return self._avatar.avatar_identity

    async def start(
        self, agent_session: AgentSession[Any], room: rtc.Room, **plugin_options: Any
    ) -> None:
        """Start the plugin with its route recorded; returns once the outcome of the start
        itself has been handled: ``routing`` (or further), ``restored`` (or ``backoff``)
        after a failed, routeless or timed-out start (not raised), or ``closed`` when
        ``aclose()`` cut it short.

        ``plugin_options`` go to the plugin's own ``start()`` as keyword arguments (e.g.
        ``livekit_url``, ``livekit_api_key``, ``livekit_api_secret``), on every attempt;
        options its ``start()`` does not take are refused here (``AvatarPluginError``, a
        ``TypeError``), before anything starts."""
        if self._closing or self._actor.closed:
            raise RuntimeError("this AvatarLifecycle is closed")
        if self.state != "idle":
            raise RuntimeError(f"this AvatarLifecycle is already started (state {self.state!r})")
        if not isinstance(agent_session, AgentSession):
            raise TypeError(f"agent_session must be an AgentSession, got {agent_session!r}")
        if not isinstance(room, rtc.Room):
            raise TypeError(f"room must be an rtc.Room, got {room!r}")
        adapter = self._given_adapter
        if adapter is not None and adapter.room is not room:
            raise ValueError("room_events must be an adapter of the same room")
        check_start_options(self._avatar, plugin_options)
        self._plugin_options = dict(plugin_options)
        self._session, self._room = agent_session, room
        if adapter is None:
            adapter = RoomEventAdapter(room)
        adapter.start()
        self._adapter = adapter
        self._unsubscribe = follow(
            adapter, "avatar", self._actor.post, facts=self._facts, after=self._after_fact
        )
        started = self._leaving("starting")
        try:
            await self._actor.send(Event("start"))
            await started
        finally:
            started.cancel()
        await self._actor.join()  # a failed start: on to restored

    def interrupt(self) -> None:
        """An interruption, as the session's own reaches the avatar's sink: while ``joined``
        the plugin's sink clears itself its own way (a data-stream avatar gets
        ``lk.clear_buffer`` when something is playing; a queue sink drops its audio and
        tells its plugin); in any other state the sink's pending playout is finished
        locally and nothing goes to a participant. Never raises."""
        if self._adopted is not None:
            self._on_sink_clear()
        else:
            self._actor.post(Event("interrupt", {"origin": "api"}))

    async def wait_for(self, state: str, *, timeout: float | None = None) -> None:
        """Wait until the machine is in ``state`` (at once if it is). ``TimeoutError`` after
        ``timeout`` seconds of the lifecycle's clock; ``ActorClosed`` if it closes first."""
        if state not in self._actor.states:
            raise ValueError(f"unknown avatar state {state!r}: one of {list(AVATAR.state_names)}")
        if self.state == state:
            return
        if self.state == "closed":
            raise ActorClosed(f"the avatar lifecycle is closed; it will never be {state!r}")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_change(ev: StateChanged) -> None:
            if fut.done():
                return
            if ev.dest == state:
                fut.set_result(None)
            elif ev.dest == "closed":
                fut.set_exception(ActorClosed(f"closed before reaching {state!r}"))

        self._actor.on("state_changed", on_change)
        try:
            await self._clock.wait_for(fut, timeout)
        finally:
            self._actor.off("state_changed", on_change)

    async def aclose(self) -> None:
        """From any state: the guarded restore, the avatar participant removed (best
        effort), the plugin closed, every listener unhooked and every task cancelled."""
        if self._closing:
            return
        self._closing = True
        if not self._actor.closed:
            # handled at once: a plugin still starting is a state task, cancelled as
            # starting is left, not awaited
            with contextlib.suppress(ActorClosed, EventRejected):
                await self._actor.send(Event("close"))
        await self._actor.aclose()

    def _leaving(self, state: str) -> asyncio.Future[None]:
        """Done when the machine next leaves ``state``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_change(ev: StateChanged) -> None:
            if ev.source == state and not fut.done():
                fut.set_result(None)

        self._actor.on("state_changed", on_change)
        fut.add_done_callback(lambda _: self._actor.off("state_changed", on_change))
        return fut

    # -- room facts (routed by statemachines.routing) ---------------------------------------
    def _after_fact(self, fact: RoomFact) -> None:
        if isinstance(fact, RoomConnected):
            self._start_room_output()  # a room output attached before the connection

    def _on_state_changed(self, ev: StateChanged) -> None:
        logger.debug("avatar %s: %s -> %s on %s", ev.instance, ev.source, ev.dest, ev.event)
        try:
            self.emit("state_changed", ev)
        except Exception:
            # the SDK's emitter lets a listener's TypeError through: it must not keep the
            # actor's later listeners (start() and wait_for() waiting on a state) from hearing
            logger.exception("avatar %s: a state_changed listener failed", ev.instance)

    def _in_process(self) -> bool:
        """The avatar is the agent itself (bithuman's local mode renders in this process and
        publishes from the agent's own participant): no participant of its own to wait for."""
        if self._agent_is_avatar:
            return True  # kept: a closed plugin may forget its room, and with it who it is
        room = self._room
        if room is None or self._installed is None:
            return False
        try:
            local = room.local_participant.identity
            self._agent_is_avatar = bool(local) and self._avatar.avatar_identity == local
        except Exception:  # not connected yet: no local participant to compare with
            return False
        return self._agent_is_avatar

    def _avatar_participant(self) -> rtc.RemoteParticipant | None:
        if self._room is None:
            return None
        return self._room.remote_participants.get(self._avatar.avatar_identity)

    def _avatar_has_video(self) -> bool:
        p = self._avatar_participant()
        return p is not None and any(
            pub.kind == rtc.TrackKind.KIND_VIDEO for pub in p.track_publications.values()
        )

    def _presence_event(self) -> Event | None:
        """An avatar already in the room produces no participant_connected for us (nor does
        one that runs in the agent's own process)."""
        if not self._facts.avatar_present:
            return None
        return Event("avatar_connected", {"identity": self._avatar.avatar_identity})

    def _session_running(self) -> bool:
        return self._session is not None and lk.session_started(self._session)

    def _plugin_clear_task(self) -> asyncio.Task[None] | None:
        """The plugin's own clear while it holds its sink (``DataStreamAudioOutput`` keeps
        it there; a sink set not to hold, or a queue's clear, has none)."""
        task = getattr(self._installed, "_clear_buffer_atask", None)
        return task if isinstance(task, asyncio.Task) and not task.done() else None

    def _take_prev_route(self) -> None:
        chain = audio_chain(self._session)
        self._prev = _PrevRoute(
            chain[0] if chain else None, chain[-1] if chain else None, self._session_running()
        )

    # -- effects ---------------------------------------------------------------------------
    async def _fx_start_plugin(self, ev: Event) -> Event:
        """The state task of ``starting``; cancelled when the state is left."""
        session, room = self._session, self._room
        assert session is not None and room is not None
        releasing, self._releasing = self._releasing, None
        if releasing is not None:
            # entering starting started this task before the row's release_attempt ran:
            # the plugin starts again only once the failed attempt is closed and forgotten
            # (the actor handles nothing else meanwhile: it awaits the release too)
            await asyncio.gather(releasing, return_exceptions=True)
        self._take_prev_route()
        # the sink is recorded right after the plugin's last line, in this task, before
        # anything the plugin scheduled runs (its sink registers an RPC on the next tick);
        # cut short (cancelled), the row that left starting records it instead
        try:
            await self._avatar.start(session, room, **self._plugin_options)
        except Exception:
            self._record_installed()  # a plugin failing late may have installed its route
            raise
        self._record_installed()
        if self._installed is None:
            # a plugin that caught its provider's error logs it and returns: no route is the
            # only sign, and waiting out join_timeout for it would help nobody
            logger.warning(
                "avatar %s (%s): the plugin's start() returned without installing an audio "
                "route; treating it as a failed start",
                self._avatar.avatar_identity,
                plugin_name(self._avatar),
            )
            return Event("no_route")
        return Event("plugin_started")

    def _fx_record_route(self, ev: Event) -> None:
        self._record_installed()

    def _fx_check_presence(self, ev: Event) -> Event | None:
        self._claim_playback_rpc()
        return self._presence_event()

    async def _fx_restore_route(self, ev: Event) -> Event:
        self._cause = ev.name  # kept first: the retry guard reads it if this effect fails
        outcome = self._guarded_restore()
        # the log policy: what the user hears changed; the cause's detail was logged with it
        retrying = self._retry.retries(ev.name, self._attempts)
        self._actor.report(
            logger,
            logging.WARNING,
            "the avatar is gone (%s, attempt %d of %d); the agent is on room audio%s",
            ev.name,
            self._attempts + 1,
            self._retry.attempts + 1,
            " until the next attempt" if retrying else " (gave up)" if self._attempts else "",
            event=ev.name,
        )
        if not self._retry.rejoin:
            # nothing will route to this avatar again: stop the SDK's waits for it now, or
            # they fail later (unretrieved) when the room goes away
            await self._retire_sink()
            join = getattr(self._avatar, "_wait_avatar_join_task", None)
            if isinstance(join, asyncio.Task) and not join.done():
                join.cancel()
                await asyncio.gather(join, return_exceptions=True)
        return Event("route_restored", {"outcome": outcome, "cause": ev.name})

    def _fx_release_attempt(self, ev: Event) -> asyncio.Future[None]:
        """Before the plugin starts again: the failed attempt's session closed (its avatar
        participant removed, so that two avatars never answer), its sink retired and
        forgotten. Bounded by the effect budget; a failure here is logged, not fatal.

        Not a coroutine function: this part runs as the actor calls the handler, before
        the task of ``starting`` (already created) first runs, so that task finds the
        release and waits for it."""
        self._releasing = asyncio.ensure_future(self._release_attempt())
        return self._releasing

    async def _release_attempt(self) -> None:
        self._attempts += 1
        logger.info(
            "avatar %s: starting the plugin again (attempt %d of %d) after %s",
            self._avatar.avatar_identity,
            self._attempts,
            self._retry.attempts,
            self._cause,
        )
        try:
            await self._avatar.aclose()
        except Exception:
            logger.warning("avatar plugin aclose() failed before a retry", exc_info=True)
        await self._retire_sink()
        self._unadopt()
        self._release_playback_rpc()
        await self._remove_avatar_participant()
        self._installed = None
        self._prev = None
        self._agent_is_avatar = False

    def _fx_reinstall_route(self, ev: Event) -> Event | None:
        session, sink = self._session, self._installed
        assert session is not None and sink is not None
        self._take_prev_route()
        session.output.replace_audio_tail(sink)
        self._claim_playback_rpc()
        logger.info("avatar %s is back: audio routed to it again", self._avatar.avatar_identity)
        return self._presence_event()

    async def _fx_follow_plugin_clear(self, ev: Event) -> Event:
        """The state task of ``clearing``: the plugin's own clear does the clear's work
        (its RPC, its wait for the avatar's report, its fallback); this waits for it to
        settle. Cancelled with the state, it leaves the plugin's task alone."""
        task = self._plugin_clear_task()
        if task is not None:
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)
        return Event("clear_buffer_done")

    def _fx_clear_local_buffer(self, ev: Event) -> None:
        # the avatar is not joined: its pending playout ends here, nothing goes to it
        if self._installed is not None:
            _finish_pending(self._chain_to_sink())

    def _fx_mark_playout_done(self, ev: Event) -> None:
        sink = self._installed
        if sink is not None and _pending(sink) > 0:
            sink.on_playback_finished(
                playback_position=float(ev.data.get("playback_position", 0.0)),
                interrupted=bool(ev.data.get("interrupted", False)),
            )

    def _fx_put_route_back(self, ev: Event) -> None:
        outcome = self._guarded_restore()
        logger.debug("avatar %s closing: route %s", self._avatar.avatar_identity, outcome)

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
        try:
            await self._avatar.aclose()
        except Exception:
            logger.warning("avatar plugin aclose() failed", exc_info=True)
        await self._retire_sink()
        await self._settle_room_output()
        # last: a server API that never answers (this effect's bound, join_timeout, can be
        # shorter than the removal's) must not keep the plugin and its sink open
        await self._remove_avatar_participant()

    # -- the route -------------------------------------------------------------------------
    def _record_installed(self) -> None:
        """Record the sink the plugin's start() put at the tail, once."""
        prev, tail = self._prev, audio_tail(self._session)
        if prev is None or self._installed is not None or tail is None or tail is prev.tail:
            return
        if isinstance(tail, _ParticipantAudioOutput):
            return  # RoomIO's own output (a session.start() ran meanwhile), not the plugin's
        self._installed = tail
        self._adopt(tail)

    def _guarded_restore(self) -> str:
        """Put the previous route back unless ours was replaced since. Only the rows out of
        the states where our route may be in call it, so it runs once per route."""
        session, sink, prev = self._session, self._installed, self._prev
        if session is None or sink is None or prev is None:
            return "nothing_installed"
        if audio_tail(session) is not sink:
            logger.info(
                "avatar %s: the audio route was replaced since; leaving it alone",
                self._avatar.avatar_identity,
            )
            return "left_alone"
        self._swapping = True
        try:
            if prev.tail is not None:
                session.output.replace_audio_tail(prev.tail)
                outcome = "previous"
            elif self._session_running() and not prev.session_running:
                # session.start() saw our route and turned RoomIO's audio output off
                session.output.replace_audio_tail(self._attach_room_output())
                outcome = "room_attached"
            else:
                # not started yet: with no route in place, session.start() makes room audio
                session.output.audio = prev.top
                outcome = "cleared"
            if outcome != "cleared":
                _finish_orphans(audio_chain(session))
        finally:
            self._swapping = False
        logger.info(
            "avatar %s: audio route restored (%s), now %s",
            self._avatar.avatar_identity,
            outcome,
            self.audio_route(),
        )
        return outcome

    def _attach_room_output(self) -> _ParticipantAudioOutput:
        """A room audio output like the one RoomIO builds (same defaults)."""
        assert self._room is not None
        if self._room_output is None:
            opts = AudioOutputOptions()
            self._room_output = _ParticipantAudioOutput(
                self._room,
                sample_rate=opts.sample_rate,
                num_channels=opts.num_channels,
                track_publish_options=opts.track_publish_options,
                track_name="roomio_audio",
            )
            self._start_room_output()
        return self._room_output

    def _start_room_output(self) -> None:
        out, room = self._room_output, self._room
        if out is None or room is None or self._room_output_task is not None:
            return
        if not room.isconnected():
            return  # publishing needs the connection; RoomConnected starts it
        self._room_output_task = asyncio.get_running_loop().create_task(
            out.start(), name="avatar:room_output"
        )

    async def _settle_room_output(self) -> None:
        """Close our room output unless it still carries a running session's audio; then it
        is the session's until it closes."""
        out, session = self._room_output, self._session
        if out is None:
            return
        self._room_output = None
        start_task, self._room_output_task = self._room_output_task, None
        if session is not None and self._session_running() and audio_tail(session) is out:

            def on_close(*_: Any) -> None:
                task = asyncio.ensure_future(_close_output(out, start_task))
                _HANDED_OFF.add(task)
                task.add_done_callback(_HANDED_OFF.discard)

            session.once("close", on_close)
            return
        await _close_output(out, start_task)

    def _chain_to_sink(self) -> list[AudioOutput]:
        """The outputs from the top down to the plugin's sink (just the sink when it is
        not in the chain any more)."""
        sink = self._installed
        if sink is None:
            return []
        chain = audio_chain(self._session)
        if sink in chain:
            return chain[: chain.index(sink) + 1]
        return [sink]

    # -- following the sink's clear, taking the playback_finished RPC ---------------------------
    def _adopt(self, sink: AudioOutput) -> None:
        """Follow, on this sink instance only, what would bypass the machine."""
        # the session's interruption reaches the sink as clear_buffer(): see it first, and
        # hand it to the sink's own clear where that is safe (_on_sink_clear)
        self._own_clear = sink.clear_buffer
        sink.clear_buffer = self._on_sink_clear  # type: ignore[method-assign]
        if isinstance(sink, DataStreamAudioOutput):
            # the sink registers its own lk.playback_finished handler when the room
            # connects, which would replace ours: keep it from doing so
            sink._register_playback_finished_rpc = _no_registration  # type: ignore[method-assign]
        # what the sink is given, for playout: the audio of each segment and its end
        own_capture, own_flush = sink.capture_frame, sink.flush

        async def capture_frame(frame: rtc.AudioFrame) -> None:
            await own_capture(frame)
            self._on_sink_frame(frame)

        def flush() -> None:
            own_flush()
            self._on_sink_flush()

        sink.capture_frame = capture_frame  # type: ignore[method-assign]
        sink.flush = flush  # type: ignore[method-assign]
        self._segment = None
        self._adopted = sink
        self._claim_playback_rpc()

    def _unadopt(self) -> None:
        sink, self._adopted, self._own_clear = self._adopted, None, None
        self._segment = None
        if sink is not None:
            for name in (
                "clear_buffer",
                "_register_playback_finished_rpc",
                "capture_frame",
                "flush",
            ):
                vars(sink).pop(name, None)

    def _on_sink_frame(self, frame: rtc.AudioFrame) -> None:
        started, pushed = self._segment or (self._clock.now(), 0.0)
        self._segment = (started, pushed + frame.duration)

    def _on_sink_flush(self) -> None:
        segment, self._segment = self._segment, None
        if segment is not None and self._adopted is not None:
            self._emit("segment_flushed", SegmentFlushed(*segment))

    def _emit(self, event: LifecycleEvents, value: object) -> None:
        try:
            self.emit(event, value)
        except Exception:
            # a listener's failure is its own: the sink's call that reported it goes on
            logger.exception("avatar %s: a %s listener failed", self._avatar.avatar_identity, event)

    def _on_sink_clear(self) -> None:
        """The session's clear (or ``interrupt()``). Joined: the plugin's own clear, here and
        now, exactly as without the lifecycle, then the machine is told (it follows the
        clear while it holds the sink). Otherwise nothing is sent to the avatar: a sink
        whose clear goes to no participant (a queue to the provider) still drops its audio
        its own way, and the machine finishes what is pending locally."""
        sink, own = self._adopted, self._own_clear
        if sink is None or own is None:
            return
        if self._swapping or self._actor.closed or self._closing:
            # our own swap detaching the sink: its segments end here, nothing is sent
            _finish_pending([sink])
            return
        if self._actor.state in PLUGIN_CLEARS:
            own()
            self._actor.post(Event("interrupt", {"origin": "session", "delivered": True}))
            return
        if not isinstance(sink, DataStreamAudioOutput):
            own()  # its clear sends nothing to a participant
        self._actor.post(Event("interrupt", {"origin": "session"}))

    def _claim_playback_rpc(self) -> None:
        room = self._room
        if room is None or not isinstance(self._installed, DataStreamAudioOutput):
            return  # only a data-stream avatar reports lk.playback_finished
        if not room.isconnected():
            return  # the local participant exists once connected; RoomConnected claims it
        room.local_participant.register_rpc_method(
            RPC_PLAYBACK_FINISHED, self._on_playback_finished_rpc
        )
        self._rpc_claimed = True

    def _release_playback_rpc(self) -> None:
        if not self._rpc_claimed or self._room is None:
            return
        self._rpc_claimed = False
        try:
            lp = self._room.local_participant
            # leave a handler someone registered after ours in place
            handlers = getattr(lp, "_rpc_handlers", None)
            current = handlers.get(RPC_PLAYBACK_FINISHED) if handlers is not None else None
            if handlers is None or current == self._on_playback_finished_rpc:
                lp.unregister_rpc_method(RPC_PLAYBACK_FINISHED)
        except Exception:
            logger.debug("could not unregister %s", RPC_PLAYBACK_FINISHED, exc_info=True)

    def _on_playback_finished_rpc(self, data: rtc.RpcInvocationData) -> str:
        # the plugin's sink names who reports its playback (its destination), whatever the
        # avatar participant is called
        identity = self.report_identity
        if data.caller_identity != identity:
            logger.warning(
                "%s refused from %r (the avatar's sink streams to %r)",
                RPC_PLAYBACK_FINISHED,
                data.caller_identity,
                identity,
            )
            raise rtc.RpcError(
                rtc.RpcError.ErrorCode.APPLICATION_ERROR,
                f"{RPC_PLAYBACK_FINISHED} is accepted only from the avatar",
            )
        try:
            position, interrupted = _parse_playback_finished(data.payload)
        except ValueError as e:
            logger.info("malformed %s from %r: %s", RPC_PLAYBACK_FINISHED, identity, e)
            raise rtc.RpcError(
                rtc.RpcError.ErrorCode.APPLICATION_ERROR,
                f"malformed {RPC_PLAYBACK_FINISHED} payload: {e}",
            ) from None
        self._actor.post(
            Event(
                "playback_finished",
                {"playback_position": position, "interrupted": interrupted},
            )
        )
        self._emit("playback_finished", PlaybackReport(position, interrupted))
        return "ok"

    # -- closing ---------------------------------------------------------------------------
    async def _remove_avatar_participant(self) -> None:
        """After the plugin's own close: remove its avatar participant, in case the plugin
        did not (or could not: spatialreal drops its room before its base class's removal)."""
        fn, room = self._remove_participant, self._room
        if fn is None or room is None or not room.isconnected():
            return
        if self._in_process():
            return  # the avatar is the agent itself
        # asked whether or not this room still lists it: the server may know an avatar that
        # is joining, and "not found" is the answer when the plugin removed it already
        identity = self._avatar.avatar_identity
        try:
            res = fn(identity)
            if inspect.isawaitable(res):
                await self._clock.wait_for(res, _REMOVAL_TIMEOUT)
        except Exception as e:
            if getattr(e, "code", None) == "not_found":
                logger.debug("avatar %s was not in the room any more", identity)
            else:
                logger.warning("could not remove the avatar participant %s: %s", identity, e)

    async def _retire_sink(self) -> None:
        """DataStreamAudioOutput has no close of its own: once it carries no audio, take
        back its room listener and its wait for the avatar."""
        sink = self._installed
        if not isinstance(sink, DataStreamAudioOutput) or sink in audio_chain(self._session):
            return
        if self._room is not None:
            self._room.off("connection_state_changed", sink._handle_connection_state_changed)
        # its wait for the avatar, and a clear of its own still holding it (it holds
        # nothing now: no audio reaches it)
        waits = [t for t in (sink._start_atask, sink._clear_buffer_atask) if t is not None]
        for task in waits:
            if not task.done():
                task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


# the avatar machine's handlers, shared by every instance (Handlers binds them)
_EFFECTS = effect_table(AvatarLifecycle, AVATAR)
_GUARDS = guard_table("avatar")  # their one definition: statemachines.glue


async def _close_output(out: _ParticipantAudioOutput, start: asyncio.Task[None] | None) -> None:
    if start is not None and not start.done():
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
    try:
        await out.aclose()
    except Exception:
        logger.debug("closing the attached room audio output failed", exc_info=True)
