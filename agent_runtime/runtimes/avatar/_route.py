"""The session's audio chain, and the avatar's route in it.

``AudioRoute`` keeps what a plugin's start changed: the route it replaced (taken just
before), the sink it installed (recorded just after), and, when putting the route back
needs one, a room audio output of our own. Putting back is guarded by identity: only
while the chain's tail is still the plugin's sink.

Where the audio goes back to, when the plugin replaced no route, is read from the session's
RoomIO: ``session.start()`` builds it in its first step (before any await of its own), and
decides there whether RoomIO makes room audio. So a RoomIO built since the route was taken
is a start that has made its choice, finished or still running (its agent's tools may take
seconds to set up); no RoomIO yet is a start still to come, which makes room audio itself
when no route is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple

from livekit import rtc
from livekit.agents.voice.agent_session import AgentSession
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.agents.voice.io import AudioOutput
from livekit.agents.voice.room_io import RoomIO

from agent_runtime.observe.trace import describe
from agent_runtime.runtimes.avatar._sink import SinkAdoption, retire_sink
from agent_runtime.sdk import livekit_compat as lk

logger = logging.getLogger("agent_runtime.avatar")

Route = Literal["avatar", "room", "none"]
# what putting the route back did (reported with route_restored)
RestoreOutcome = Literal[
    "nothing_installed", "left_alone", "previous", "room_io_output", "room_attached", "cleared"
]

# the room outputs handed to a still-running session at close, until that session closes
_HANDED_OFF: set[asyncio.Task[None]] = set()


def audio_chain(session: AgentSession[Any] | None) -> list[AudioOutput]:
    """The session's audio outputs from the top (``output.audio``) to the tail."""
    out: list[AudioOutput] = []
    cur = session.output.audio if session is not None else None
    while cur is not None and len(out) < 64:  # a chain is short; never loop on a cycle
        out.append(cur)
        cur = cur.next_in_chain
    return out


def session_room_io(session: AgentSession[Any] | None) -> RoomIO | None:
    """The RoomIO the session's start() built (in its first step); None before that, for a
    session started without a room, and once it closed."""
    if session is None:
        return None
    try:
        return session.room_io
    except RuntimeError:
        return None


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
    if isinstance(tail, lk.RoomAudioOutput):
        return "room"
    return "none"


def finish_pending(chain: list[AudioOutput], position: float = 0.0) -> int:
    """Report every pending segment as interrupted, deepest output first.

    A wrapper can count a segment its sink never saw (the capture was cancelled while
    the sink waited for an avatar that never came); finishing from the bottom up lets
    each report travel upwards and only tops up what is still open.
    """
    finished = 0
    for out in reversed(chain):
        while lk.pending_playbacks(out) > 0:
            before = lk.pending_playbacks(out)
            out.on_playback_finished(playback_position=position, interrupted=True)
            if lk.pending_playbacks(out) >= before:  # an output that does not count; no spin
                break
            finished += 1
    return finished


def finish_orphans(chain: list[AudioOutput], *, carried_on: bool = True) -> None:
    """After the avatar's sink left the chain: end, as interrupted, what a wrapper still
    counts beyond the output below it. Only that sink could have reported it (a local clear
    while its capture waited for the avatar leaves the proxy below already done), and the
    session's playout would wait for it forever.

    A segment still being captured by the output just above the new tail goes on at the
    tail (livekit's proxy keeps it open across the swap; the tail counts it at its next
    frame), so it is no orphan, unless ``carried_on`` is false: the sink that left never
    started, and the frame in flight to it fails with it."""
    pending = lk.pending_playbacks
    pairs = list(itertools.pairwise(chain))
    for i, (upper, lower) in reversed(list(enumerate(pairs))):
        goes_on = (
            carried_on
            and i == len(pairs) - 1
            and lk.segment_open(upper)
            and pending(upper) > 0  # counted here (a local clear may have ended it already)
            and not lk.segment_open(lower)
        )
        while pending(upper) > pending(lower) + goes_on:
            before = pending(upper)
            upper.on_playback_finished(playback_position=0.0, interrupted=True)
            if pending(upper) >= before:  # an output that does not count; do not spin
                break
        if goes_on:
            _until_it_reaches(upper, lower, chain)


def _until_it_reaches(upper: AudioOutput, tail: AudioOutput, chain: list[AudioOutput]) -> None:
    """A segment ``upper`` carried over to ``tail`` is an orphan after all if its capture
    ends (``upper``'s flush reaching ``tail``) before a frame of it reached ``tail``: all of
    it was pushed before the swap, or the frame in flight failed with the sink that left.
    The look is taken at the first flush or clear of ``tail`` that ``upper`` no longer
    captures through, or once ``upper`` moved on to another output; the tail's own methods
    are back after it. The segment is ended in the loop's next turn, once the flush that
    ended its capture has returned (livekit's transcript synchronizer marks its input done
    only after it)."""
    earlier = tail.__dict__.get("flush")
    if callable(getattr(earlier, "carried_unhook", None)):
        earlier.carried_unhook()  # type: ignore[union-attr]  # one look per tail: the latest
    counted = tail.captured_playout_segments
    own = {name: tail.__dict__.get(name) for name in ("flush", "clear_buffer")}
    originals = {name: getattr(tail, name) for name in own}

    def unhook() -> None:
        for name, mine in own.items():
            if mine is None:
                tail.__dict__.pop(name, None)
            else:
                tail.__dict__[name] = mine

    def ending(name: str) -> Callable[[], None]:
        def call() -> None:
            originals[name]()
            if upper.next_in_chain is tail and lk.segment_open(upper):
                return  # a clear, or upper detaching it: the capture has not ended yet
            unhook()
            if upper.next_in_chain is tail and tail.captured_playout_segments == counted:
                asyncio.get_running_loop().call_soon(
                    lambda: finish_orphans(chain, carried_on=False)
                )

        call.carried_unhook = unhook  # type: ignore[attr-defined]
        return call

    for name in own:
        setattr(tail, name, ending(name))


def keep_to_its_rate(out: AudioOutput, sink: AudioOutput) -> None:
    """Have ``out``, put back in place of ``sink``, resample a frame of another rate to its
    own (once per instance, where the rates may differ). A segment carried across a swap
    keeps the rate its forwarder gave the sink that left (livekit's forwarding task picks
    its resampler at a segment's first frame, for the tail of then; none for a sink that
    declares no rate): a 16 kHz avatar sink's frames pushed as they are into a 24 kHz room
    output played 1.5x fast, a 48 kHz TTS's at half speed."""
    rate = out.sample_rate
    if rate is None or sink.sample_rate == rate or "capture_frame" in vars(out):
        return
    own_capture = out.capture_frame
    resampling: dict[int, rtc.AudioResampler] = {}
    began = False  # a resampled frame reached the segment under way

    async def capture_frame(frame: rtc.AudioFrame) -> None:
        nonlocal began
        if frame.sample_rate == rate:
            await own_capture(frame)
            return
        if began and not lk.segment_open(out):  # that segment ended: the next one afresh
            resampling.clear()
            began = False
        resampler = resampling.get(frame.sample_rate)
        if resampler is None:
            # quick: its output comes at once (medium holds ~30 ms, and nothing flushes it
            # here: a short carried reply came out empty)
            resampler = resampling[frame.sample_rate] = rtc.AudioResampler(
                input_rate=frame.sample_rate,
                output_rate=rate,
                num_channels=frame.num_channels,
                quality=rtc.AudioResamplerQuality.QUICK,
            )
        for f in resampler.push(frame):
            await own_capture(f)
            began = True

    out.capture_frame = capture_frame  # type: ignore[method-assign]


@contextlib.contextmanager
def _unasked(out: AudioOutput) -> Iterator[None]:
    """``out``'s part in being detached (its flush, clear and detach) does nothing for the
    while; its own methods, or what stood in for them, are back after it."""
    names = ("flush", "clear_buffer", "on_detached")
    held = getattr(out, "__dict__", {})
    own = {name: held.get(name) for name in names}
    try:
        for name in names:  # one that cannot be stood in for leaves none stood in for
            setattr(out, name, lambda: None)
        yield
    finally:
        for name, mine in own.items():
            if mine is None:
                held.pop(name, None)
            else:
                setattr(out, name, mine)


class PrevRoute(NamedTuple):
    """The route a plugin's start (or a reinstall) replaced, taken just before it."""

    top: AudioOutput | None
    tail: AudioOutput | None
    room_io: RoomIO | None  # the session's then: a later one is a start that saw our route


class AudioRoute:
    """The avatar's route in one session's audio chain (the session and room are set when
    the lifecycle starts)."""

    __slots__ = (
        "_room_audio",
        "_room_output",
        "_room_output_task",
        "installed",
        "prev",
        "room",
        "session",
    )

    def __init__(self, room_audio: Callable[[], bool] | None = None) -> None:
        self._room_audio = room_audio  # whether the session's start asked for room audio
        self.session: AgentSession[Any] | None = None
        self.room: rtc.Room | None = None
        # the route the plugin replaced: None until its start() began (nothing of the
        # plugin's can be in the chain), and once put back (its sink is out, or being
        # swapped out: ``detaching``)
        self.prev: PrevRoute | None = None
        self.installed: AudioOutput | None = None  # the sink the plugin installed
        self._room_output: lk.RoomAudioOutput | None = None  # attached by a restore
        self._room_output_task: asyncio.Task[None] | None = None

    def session_running(self) -> bool:
        return self.session is not None and lk.session_started(self.session)

    def sid_of(self, identity: str) -> str:
        """The sid of the participant ``identity`` in the room, or ``""`` if absent."""
        p = self.room.remote_participants.get(identity) if self.room else None
        return p.sid if p is not None else ""

    def take_prev(self) -> None:
        chain = audio_chain(self.session)
        if self.prev is not None and chain and chain[-1] is self.installed:
            return  # our sink is still in (its put-back failed): the route it replaced stands
        self.prev = PrevRoute(
            chain[0] if chain else None,
            chain[-1] if chain else None,
            session_room_io(self.session),
        )

    def record_installed(self) -> AudioOutput | None:
        """Record the sink the plugin's start() put at the tail, once; returns it when it
        was recorded now."""
        prev, tail = self.prev, audio_tail(self.session)
        if prev is None or self.installed is not None or tail is None or tail is prev.tail:
            return None
        if isinstance(tail, lk.RoomAudioOutput):
            return None  # RoomIO's own output (a session.start() ran meanwhile), not the plugin's
        self.installed = tail
        return tail

    def forget(self) -> None:
        """A released attempt: nothing of it is in the chain any more."""
        self.installed = None
        self.prev = None

    def moved_from(self, sink: AudioOutput) -> AudioOutput | None:
        """Where the session's audio goes now, if the route moved off ``sink`` below an
        output that stays (livekit's proxy: it sends the rest of a segment and its flush
        there). A chain that was the sink alone was replaced whole: None."""
        chain = audio_chain(self.session)
        return chain[-1] if len(chain) > 1 and sink not in chain else None

    def chain_to_sink(self) -> list[AudioOutput]:
        """The outputs from the top down to the plugin's sink (just the sink when it is
        not in the chain any more)."""
        sink = self.installed
        if sink is None:
            return []
        chain = audio_chain(self.session)
        if sink in chain:
            return chain[: chain.index(sink) + 1]
        return [sink]

    def left_silent(self) -> bool:
        """The session runs with no audio output (none before the avatar's either: a text
        simulation, a text-only agent), or will: a text simulation's session not started
        yet (an avatar that failed before it) gets none from livekit."""
        session = self.session
        if session is None:
            return False
        if lk.session_text_only(session):
            return True
        return lk.session_started(session) and audio_tail(session) is None

    def put_back(
        self,
        report: Callable[..., None],
        waiting: SinkAdoption | None = None,
    ) -> RestoreOutcome:
        """Put the previous route back unless ours was replaced since (logged through
        ``report``, the avatar actor's: the line names its job). The previous route is
        used up first: the SDK clears the sink it detaches, and that clear is the swap's
        (``detaching``); a put-back that fails gets it back, for the next one (a rejoin's
        reinstall keeps it). Only the rows out of the states where our route may be in ask
        for it, so it runs once per route (or again after a failed one). ``waiting``: the
        adoption of a sink a frame waits at; that frame goes on to the route put back."""
        session, sink, prev = self.session, self.installed, self.prev
        if session is None or sink is None or prev is None:
            return "nothing_installed"
        if audio_tail(session) is not sink:
            report(logger, logging.INFO, "the audio route was replaced since; leaving it alone")
            return "left_alone"
        self.prev = None
        try:
            back, outcome = self._route_back(prev)
            if back is not None:
                keep_to_its_rate(back, sink)  # a segment carried over keeps the sink's rate
            self._swap_out(sink, back, prev.top, report)
        except BaseException:
            # not put back (no route to put back, or refused), the sink still in: its later
            # clears are the session's (``detaching``), and a later put-back may try again
            self.prev = prev
            raise
        if back is not None:
            if waiting is not None:
                waiting.moved_to = self.moved_from(sink)
            carried = waiting is not None or lk.sink_takes_frames(sink)
            finish_orphans(audio_chain(session), carried_on=carried)
        if sink not in audio_chain(session):
            # a chain that was the sink alone is replaced whole: no proxy clears it, and a
            # speech may wait on the sink itself (kept for a rejoin, it is not retired)
            finish_pending([sink])
        now = route_of(session, sink)
        report(logger, logging.INFO, "audio route restored (%s), now %s", outcome, now)
        return outcome

    def _swap_out(
        self,
        sink: AudioOutput,
        back: AudioOutput | None,
        top: AudioOutput | None,
        report: Callable[..., None],
    ) -> None:
        """Put ``back`` at the tail in place of ``sink`` (or ``top`` as the whole chain).
        A sink that refuses to be let go part-way through livekit's swap (its flush, clear
        or detach raising) is let go anyway, the swap made again without asking it: left
        in, it takes the session's audio to an avatar that is gone, and never reports the
        end of what it held (a speech hangs)."""
        session = self.session
        assert session is not None

        def swap() -> None:
            if back is not None:
                session.output.replace_audio_tail(back)
            else:
                session.output.audio = top

        try:
            swap()
        except Exception as e:
            if sink not in audio_chain(session):
                raise  # the sink is out: what failed is not its refusal
            msg = "the avatar's sink refused to be let go (%s); put back without asking it"
            report(logger, logging.WARNING, msg, describe(e))
            with _unasked(sink):
                swap()

    def detaching(self, sink: AudioOutput) -> bool:
        """Whether a clear of ``sink`` is our own put-back detaching it: the previous
        route is back (none left to put back) and the sink is still in the chain, as it
        is only while the SDK swaps it out (it clears a sink before it lets it go)."""
        return self.prev is None and sink in audio_chain(self.session)

    def _route_back(self, prev: PrevRoute) -> tuple[AudioOutput | None, RestoreOutcome]:
        """The output to put back at the tail, or None to put the previous top back."""
        if prev.tail is not None:
            return prev.tail, "previous"
        room_io = session_room_io(self.session)
        if room_io is None or room_io is prev.room_io:
            # no start yet (with no route in, it makes room audio), or the session ran with
            # no audio route before ours: nothing to put back
            return None, "cleared"
        # a start since the route was taken, finished or not
        if lk.session_text_only(self.session):
            # a text simulation turned RoomIO's audio off, not our route: none to put back
            return None, "cleared"
        if self._room_audio is not None and not self._room_audio():
            # the agent turned it off (RoomOptions(audio_output=False)): none to put back
            return None, "cleared"
        own = lk.room_io_audio_output(room_io)
        if own is not None:
            return own, "room_io_output"  # it began before the plugin put its sink over it
        # it saw our route and turned RoomIO's audio output off
        return self._attach_room_output(), "room_attached"

    async def retire_sink(self) -> None:
        """Once the plugin's data-stream sink carries no audio: its listener and waits go,
        and what it still counts ends here, interrupted: the avatar's reports are no longer
        taken, and a speech may wait on this sink itself (a chain with no wrapper above
        it is replaced whole)."""
        sink = self.installed
        if isinstance(sink, DataStreamAudioOutput) and sink not in audio_chain(self.session):
            await retire_sink(sink, self.room)
            finish_pending([sink])

    async def stop_start_wait(self) -> None:
        """Once the plugin's data-stream sink carries no audio but is kept for a rejoin: its
        wait for the avatar goes, so a reply captured to it before the avatar joined ends
        instead of waiting for good (the reinstall lets a cut start begin again)."""
        sink = self.installed
        if isinstance(sink, DataStreamAudioOutput) and sink not in audio_chain(self.session):
            start = lk.sink_start_wait(sink)
            if start is not None:
                start.cancel()
                await asyncio.gather(start, return_exceptions=True)

    def _attach_room_output(self) -> lk.RoomAudioOutput:
        """A room audio output like the one RoomIO builds (same defaults)."""
        assert self.room is not None
        if self._room_output is None:
            self._room_output = lk.new_room_audio_output(self.room)
            self.start_room_output()
        return self._room_output

    def start_room_output(self) -> None:
        out, room = self._room_output, self.room
        if out is None or room is None or self._room_output_task is not None:
            return
        if not room.isconnected():
            return  # publishing needs the connection; RoomConnected starts it
        self._room_output_task = asyncio.get_running_loop().create_task(
            out.start(), name="avatar:room_output"
        )

    async def settle_room_output(self) -> None:
        """Close our room output unless it still carries a running session's audio; then it
        is the session's until it closes."""
        out, session = self._room_output, self.session
        if out is None:
            return
        self._room_output = None
        start_task, self._room_output_task = self._room_output_task, None
        if session is not None and self.session_running() and audio_tail(session) is out:

            def on_close(*_: Any) -> None:
                task = asyncio.ensure_future(_close_output(out, start_task))
                _HANDED_OFF.add(task)
                task.add_done_callback(_HANDED_OFF.discard)

            session.once("close", on_close)
            return
        await _close_output(out, start_task)


async def _close_output(out: lk.RoomAudioOutput, start: asyncio.Task[None] | None) -> None:
    if start is not None and not start.done():
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
    try:
        await out.aclose()
    except Exception:
        logger.debug("closing the attached room audio output failed", exc_info=True)
