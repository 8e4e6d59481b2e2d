"""The room's audio output on virtual time.

RoomIO's audio output (and the one the runtime puts back after an avatar) captures each
frame to livekit's native ``rtc.AudioSource``, which takes audio at the pace it plays, in
real seconds: a capture waits for the native queue (200 ms) to have room, answered from
livekit's FFI thread. A ``VirtualTimeLoop`` does not wait for that thread: it jumps to its
next timer (a test's ``wait_for`` bound) while the native side is still pacing, so a
greeting never finished under the ``virtual_time`` marker. On such a loop the kit puts a
``PacedAudioSource`` behind every room audio output of the job (the entrypoint runner's
and the scenario runner's): the same pacing on the loop's clock, the audio sent nowhere
(the in-memory room has no one to hear it). Only the native source is stood in for; the
output, its playout accounting, interruptions and the session are livekit's own. The real
source is kept for the track published with it, and closed with the stand-in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents import AgentSession

from agent_runtime.runtimes.avatar import audio_chain, session_room_io
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.room_audio import room_output_source, set_room_output_source
from agent_runtime.testing.clock import VirtualTimeLoop

if TYPE_CHECKING:
    from agent_runtime.testing.inmemory import InMemoryRoom

# RoomIO's rtc.AudioSource(queue_size_ms=200): how far ahead of the playhead it takes audio
ROOM_IO_QUEUE = 0.2


class PacedAudioSource:
    """What a room audio output uses of its ``rtc.AudioSource``, on the loop's clock: a
    capture returns once the queue (``queue`` seconds) has room for the frame, the audio
    plays out at one second per second of the loop, ``wait_for_playout`` returns once it
    has, ``clear_queue`` drops what has not played. ``captured`` counts the seconds
    taken."""

    def __init__(self, real: rtc.AudioSource, *, queue: float = ROOM_IO_QUEUE) -> None:
        self._real = real
        self._queue = queue
        self._loop = asyncio.get_running_loop()
        self._ends_at = 0.0  # the loop's time when what is queued has played
        self._join: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.captured = 0.0

    @property
    def sample_rate(self) -> int:
        return self._real.sample_rate

    @property
    def num_channels(self) -> int:
        return self._real.num_channels

    @property
    def queued_duration(self) -> float:
        return max(self._ends_at - self._loop.time(), 0.0)

    def clear_queue(self) -> None:
        self._ends_at = self._loop.time()
        self._release()

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        if frame.samples_per_channel == 0:
            return
        now = self._loop.time()
        self._ends_at = max(self._ends_at, now) + frame.duration
        self.captured += frame.duration
        if self._join is None:
            self._join = self._loop.create_future()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(self._ends_at, self._release)
        over = self._ends_at - now - self._queue
        if over > 0:  # the native queue is full: it takes the frame once there is room
            await asyncio.sleep(over)

    async def wait_for_playout(self) -> None:
        if self._join is not None:
            await asyncio.shield(self._join)

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._join is not None and not self._join.done():
            self._join.set_result(None)
        self._join = None

    async def aclose(self) -> None:
        self._release()
        await self._real.aclose()


def room_outputs(session: AgentSession[Any]) -> list[lk.RoomAudioOutput]:
    """The session's room audio outputs: RoomIO's own and any in its audio chain."""
    found: list[lk.RoomAudioOutput] = []
    room_io = session_room_io(session)
    own = lk.room_io_audio_output(room_io) if room_io is not None else None
    for out in [own, *audio_chain(session)]:
        if isinstance(out, lk.RoomAudioOutput) and out not in found:
            found.append(out)
    return found


def pace_room_audio(session: AgentSession[Any]) -> None:
    """Put a ``PacedAudioSource`` behind each of the session's room audio outputs that has
    none yet. Before its first capture: an output publishes its track before it takes any
    audio, and the in-memory room calls this as it publishes."""
    for out in room_outputs(session):
        source = room_output_source(out)
        if isinstance(source, rtc.AudioSource):
            set_room_output_source(out, PacedAudioSource(source))


def pace_as_published(
    room: InMemoryRoom, sessions: Callable[[], Iterable[AgentSession[Any]]]
) -> bool:
    """On a ``VirtualTimeLoop``, have each track the agent publishes in ``room`` put the
    stand-in behind the room audio outputs of ``sessions()``; whether it does (on another
    loop livekit's native source plays in real time, as the loop does)."""
    if not isinstance(asyncio.get_running_loop(), VirtualTimeLoop):
        return False

    def published(_: Any) -> None:
        for session in sessions():
            pace_room_audio(session)

    room.local_participant.on_publish.append(published)
    return True
