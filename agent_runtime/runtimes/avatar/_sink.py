"""The plugin's sink, adopted: what the lifecycle puts on that one instance, and the
``lk.playback_finished`` RPC it takes over from it.

The session's interruption reaches the sink as ``clear_buffer()``, and what the sink is
given (each segment's frames, then its ``flush()``) is what playout follows, and each end
of a segment (``on_playback_finished``) tells which segment the avatar's next report is
for: ``SinkAdoption`` wraps those four on the instance and ``release()`` takes the wrappers
off again. A data-stream sink would register its own ``lk.playback_finished`` handler when
the room connects, replacing the lifecycle's; the adoption keeps it from doing so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from livekit import rtc
from livekit.agents.voice.avatar import DataStreamAudioOutput
from livekit.agents.voice.io import AudioOutput

from agent_runtime.clock import Clock
from agent_runtime.sdk import livekit_compat as lk

logger = logging.getLogger("agent_runtime.avatar")

RPC_CLEAR_BUFFER = "lk.clear_buffer"
RPC_PLAYBACK_FINISHED = "lk.playback_finished"

LifecycleEvents = Literal["state_changed", "segment_flushed", "playback_finished"]


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


def _no_registration(*_: Any, **__: Any) -> None:
    """Stands in for the sink's own ``lk.playback_finished`` registration."""


class SinkAdoption:
    """The lifecycle's wrappers on one sink instance. ``on_clear(adoption)`` gets the
    sink's ``clear_buffer()`` (the adoption's ``own_clear`` is the sink's own);
    ``on_flushed`` gets each segment the sink was given, as it is flushed."""

    __slots__ = (
        "_clears",
        "_clock",
        "_ended",
        "_on_clear",
        "_on_flushed",
        "_own_capture",
        "_own_clear",
        "_own_finished",
        "_own_flush",
        "_segment",
        "late",
        "moved_to",
        "sink",
        "waiting",
    )

    def __init__(
        self,
        sink: AudioOutput,
        *,
        clock: Clock,
        on_clear: Callable[[SinkAdoption], None],
        on_flushed: Callable[[SegmentFlushed], None],
    ) -> None:
        self.sink = sink
        self._clock = clock
        self._on_clear, self._on_flushed = on_clear, on_flushed
        # a frame handed to the sink and not taken yet (a data stream's waits for its avatar)
        self.waiting = False
        # where that frame goes if the sink fails it: the route put back under the output
        # that carries the rest of its segment there (the lifecycle's restore sets it)
        self.moved_to: AudioOutput | None = None
        # the segment the sink is taking: (first frame at, seconds pushed, clears before it)
        self._segment: tuple[float, float, int] | None = None
        # the sink's own clears so far (each can send lk.clear_buffer, the only thing an
        # avatar answers with an interrupted report)
        self._clears = 0
        # the segments flushed and not finished, oldest first, as the sink counts them
        self._ended: list[_Ended] = []  # a few at most: a list (a deque is ~600 B a job)
        # segments playout's bound finished here whose report the avatar may still send
        self.late = 0
        # the session's interruption reaches the sink as clear_buffer(): the lifecycle sees
        # it first, and hands it to the sink's own clear where that is safe
        self._own_clear: Callable[[], None] = sink.clear_buffer
        self._own_capture, self._own_flush = sink.capture_frame, sink.flush
        self._own_finished = sink.on_playback_finished
        # bound methods of this object, not closures: smaller, and a job holds them all along
        sink.clear_buffer = self._clear_buffer  # type: ignore[method-assign]
        sink.capture_frame = self._capture_frame  # type: ignore[method-assign]
        sink.flush = self._flush  # type: ignore[method-assign]
        sink.on_playback_finished = self._finished  # type: ignore[method-assign]
        if isinstance(sink, DataStreamAudioOutput):
            lk.keep_sink_off_the_playback_rpc(sink, _no_registration)

    def catch_up(self) -> None:
        """What the sink took before it was adopted (while the plugin's start() ran): a
        segment it is taking is counted on from what it pushed so far; one that ended and
        was not reported is said as flushed now (when it began is not known: now)."""
        now, pushed = self._clock.now(), lk.pushed_seconds(self.sink)
        if lk.segment_open(self.sink):
            self._segment = (now, pushed, self._clears)
        elif (owed := lk.ended_unreported(self.sink)) > 0:
            self._ended.extend(_Ended(now, pushed, self._clears) for _ in range(owed))
            self._on_flushed(SegmentFlushed(now, pushed))

    def own_clear(self) -> None:
        """The sink's own ``clear_buffer()`` (for a data stream, its ``lk.clear_buffer``)."""
        self._clears += 1
        self._own_clear()

    def _clear_buffer(self) -> None:
        self._on_clear(self)

    async def _capture_frame(self, frame: rtc.AudioFrame) -> None:
        self.waiting = True
        try:
            await self._own_capture(frame)
        except (Exception, asyncio.CancelledError):
            task = asyncio.current_task()
            tail, self.moved_to = self.moved_to, None
            if tail is None or (task is not None and task.cancelling()):
                raise
            # the route moved off this sink while the frame waited for the avatar (it
            # never came, or left): the frame goes where the rest of its segment goes, not
            # lost with the reply
            await tail.capture_frame(frame)
            return
        finally:
            self.waiting, self.moved_to = False, None  # for this frame only
        started, pushed, clears = self._segment or (self._clock.now(), 0.0, self._clears)
        self._segment = (started, pushed + frame.duration, clears)

    def _flush(self) -> None:
        was_open = lk.segment_open(self.sink)
        self._own_flush()
        segment, self._segment = self._segment, None
        if segment is None and was_open:
            # a capture begun before the adoption (it waited for the sink's start): its
            # frames went past the wrapper
            segment = (self._clock.now(), lk.pushed_seconds(self.sink), self._clears)
        if segment is not None:
            if lk.ended_unreported(self.sink) > len(self._ended):  # not finished already
                self._ended.append(_Ended(*segment))
            self._on_flushed(SegmentFlushed(*segment[:2]))

    def _finished(self, **kw: Any) -> None:
        self._own_finished(**kw)
        # the sink's base class ended its oldest segment: a flushed one, if any was left
        del self._ended[: max(0, len(self._ended) - lk.ended_unreported(self.sink))]

    def finished_here(self, owed: int) -> None:
        """Playout's bound is finishing the ``owed`` oldest segments: their reports may
        still come, but for one whose report may have come already, taken for late."""
        self.late += sum(1 for seg in self._ended[:owed] if not seg.answered)

    def is_late(self, report: PlaybackReport, now: float, say: Callable[..., None]) -> bool:
        """Whether the avatar's report is one it owed for audio that playout's bound already
        finished here: it must not end the segment the sink holds now (the next reply, which
        it would leave unheard to the session: not speaking, not interruptible). A report
        can be the oldest segment's only if that segment began ``playback_position`` seconds
        ago; interrupted, only if the sink was cleared since it began (an avatar says
        ``interrupted`` only of an ``lk.clear_buffer``); played to its end, only if it is
        that long. A late one is logged through ``say`` (the avatar actor's ``report``)."""
        if not self.late:
            return False
        head = self._ended[0] if self._ended else None
        pos = report.playback_position
        # interrupted with no clear since the head began: not the head's own, not even sent
        # early, so the head still owes its report
        uncleared = head is not None and report.interrupted and self._clears == head.clears
        late = uncleared or head is None or now + _SLACK < head.started + pos
        if not late and head is not None and not report.interrupted:
            late = pos + _SLACK < head.pushed
        # a report of the audio held now: the avatar moved on, the owed ones will not come
        self.late = self.late - 1 if late else 0
        if late:
            if head is not None and not uncleared:  # unless this was its own, early: then
                head.answered = True  # not owed again
            say(
                logger,
                logging.INFO,
                "a late %s from %s for audio finished here; not taken for the audio it plays now",
                RPC_PLAYBACK_FINISHED,
                lk.sink_destination(self.sink)
                if isinstance(self.sink, DataStreamAudioOutput)
                else "the avatar",
            )
        return late

    def release(self) -> None:
        """Give the sink its own methods back (the class's)."""
        self._segment = None
        for name in ("clear_buffer", "capture_frame", "flush", "on_playback_finished"):
            vars(self.sink).pop(name, None)
        lk.let_sink_register_the_playback_rpc(self.sink)


def finish_segments(sink: AudioOutput, adoption: SinkAdoption | None, data: Any) -> None:
    """The avatar's report ends one segment; playout's bound, once it ran out, ends every
    ended one the avatar still owes (the SDK's wait counts them all), whose reports may
    still come (``SinkAdoption.is_late``)."""
    if lk.pending_playbacks(sink) == 0:
        return
    owed = lk.ended_unreported(sink) if data.get("origin") == "playout" else 0
    if owed and adoption is not None:
        adoption.finished_here(owed)
    for _ in range(max(owed, 1)):
        sink.on_playback_finished(
            playback_position=float(data.get("playback_position", 0.0)),
            interrupted=bool(data.get("interrupted", False)),
        )


@dataclass(slots=True)
class _Ended:
    """A segment the sink was given in full and the avatar has not reported."""

    started: float  # when its first frame was accepted by the sink
    pushed: float  # seconds of audio
    clears: int  # the sink's own clears before it began
    answered: bool = False  # a report was taken for an earlier segment's, late, meanwhile


# how far a report may be off the segment it is for: frames rounded, the clock's steps
_SLACK = 0.25


def report_identity(sink: AudioOutput | None) -> str | None:
    """Whose ``lk.playback_finished`` the plugin's own sink accepts: a data stream's
    destination; None for a sink that takes no report."""
    return lk.sink_destination(sink) if isinstance(sink, DataStreamAudioOutput) else None


async def retire_sink(sink: DataStreamAudioOutput, room: rtc.Room | None) -> None:
    """DataStreamAudioOutput has no close of its own: once it carries no audio, take back
    its room listener, its wait for the avatar, and a clear of its own still holding it
    (it holds nothing now: no audio reaches it)."""
    if room is not None:
        room.off("connection_state_changed", lk.sink_connection_listener(sink))
    waits = lk.sink_waits(sink)
    for task in waits:
        if not task.done():
            task.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


# -- the playback RPC -------------------------------------------------------------------------
def claim_playback_rpc(room: rtc.Room, handler: Callable[[rtc.RpcInvocationData], str]) -> None:
    """Register ``handler`` for ``lk.playback_finished`` once the room is connected (the
    local participant exists only then; the lifecycle claims it again on connection)."""
    if room.isconnected():
        room.local_participant.register_rpc_method(RPC_PLAYBACK_FINISHED, handler)


def release_playback_rpc(room: rtc.Room, handler: Callable[[rtc.RpcInvocationData], str]) -> None:
    """Unregister ``lk.playback_finished`` if ``handler`` is what is registered: a handler
    someone registered after it stays in place."""
    try:
        lp = room.local_participant
    except Exception:
        return  # never connected: nothing was registered
    try:
        if lk.rpc_handler(lp, RPC_PLAYBACK_FINISHED) == handler:
            lp.unregister_rpc_method(RPC_PLAYBACK_FINISHED)
    except Exception:
        logger.debug("could not unregister %s", RPC_PLAYBACK_FINISHED, exc_info=True)


def accept_playback_report(
    data: rtc.RpcInvocationData, identity: str, report: Callable[..., None]
) -> PlaybackReport:
    """The report in an ``lk.playback_finished`` call from ``identity``; ``rtc.RpcError``
    (the caller's answer) for a malformed payload or a call from anyone else (logged
    through ``report``, the avatar actor's: the line names its job)."""
    if data.caller_identity != identity:
        report(
            logger,
            logging.WARNING,
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
        return PlaybackReport(*parse_playback_finished(data.payload))
    except ValueError as e:
        report(logger, logging.INFO, "malformed %s from %r: %s", RPC_PLAYBACK_FINISHED, identity, e)
        raise rtc.RpcError(
            rtc.RpcError.ErrorCode.APPLICATION_ERROR,
            f"malformed {RPC_PLAYBACK_FINISHED} payload: {e}",
        ) from None


# A bound of the runtime's own on incoming JSON: json's recursion limit differs between
# interpreters (3.11 refuses 2,000 levels, 3.13 parses them), and the answer must not.
MAX_NESTING = 32
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


def parse_playback_finished(payload: str) -> tuple[float, bool]:
    """``{"playback_position": seconds >= 0, "interrupted": bool}`` or ``ValueError``."""
    if _nesting(payload) > MAX_NESTING:
        raise ValueError(f"payload nests deeper than {MAX_NESTING} levels")
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
