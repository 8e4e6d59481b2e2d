"""The room's audio track, played out on the loop's time: the harness's stand-in for what
needs a server.

RoomIO's own output hands its frames to livekit's FFI, which plays them on a thread of its
own in real time; on a ``VirtualTimeLoop`` nothing waits for that thread, so a reply on
room audio would never end. ``RoomSpeaker`` is a room audio output (the runtime's route
names it ``room``) whose segment plays from its first frame for as long as the audio
pushed, on the job's clock (a timer there, so time passing is an input that reaches its
end): its end, or a clear's cut, is reported as livekit's own output reports it, and the
SDK's playout wait ends there.
"""

from __future__ import annotations

import time

from livekit import rtc
from livekit.agents.voice.io import AudioOutput

from agent_runtime.clock import Clock, TimerHandle
from agent_runtime.sdk import livekit_compat as lk

SAMPLE_RATE = 24000


class RoomSpeaker(lk.RoomAudioOutput):
    """A room audio output that plays each segment on ``clock``."""

    def __init__(self, room: rtc.Room, clock: Clock) -> None:
        super().__init__(
            room,
            sample_rate=SAMPLE_RATE,
            num_channels=1,
            track_publish_options=rtc.TrackPublishOptions(),
        )
        self._clock = clock
        self._pushed = 0.0  # seconds of the segment under way
        self._began: float | None = None  # when its first frame came
        self._cut: float | None = None  # where a clear cut it, before its flush
        # the flushed segments still playing, in turn: (their end's timer, end, seconds)
        self._playing: list[tuple[TimerHandle, float, float]] = []

    async def start(self, **_: object) -> None:
        """Nothing to publish: no server listens."""

    async def aclose(self) -> None:
        for timer, _, _ in self._playing:
            timer.cancel()
        self._playing.clear()

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await AudioOutput.capture_frame(self, frame)
        if self._began is None:
            self._began = self._clock.now()
            self.on_playback_started(created_at=time.time())
        self._pushed += frame.duration

    def flush(self) -> None:
        AudioOutput.flush(self)
        if self._began is None:
            return
        pushed = self._pushed
        if self._cut is not None:  # cut while captured: it ends here, where it was cut
            position, self._cut = self._cut, None
            self.on_playback_finished(playback_position=position, interrupted=True)
        else:
            # played after what is still playing, from its first frame
            start = max([self._began, *(end for _, end, _ in self._playing)])
            ends = start + pushed
            timer = self._clock.call_later(max(0.0, ends - self._clock.now()), self._played)
            self._playing.append((timer, ends, pushed))
        self._pushed, self._began = 0.0, None

    def clear_buffer(self) -> None:
        now = self._clock.now()
        playing, self._playing = self._playing, []
        for timer, ends, seconds in playing:  # cut where each is
            timer.cancel()
            position = min(seconds, max(0.0, seconds - (ends - now)))
            self.on_playback_finished(playback_position=position, interrupted=True)
        if self._began is not None:  # still captured: its flush reports the cut
            self._cut = min(self._pushed, now - self._began)

    @property
    def can_pause(self) -> bool:
        """Not pausable (the SDK then interrupts instead)."""
        return False

    def pause(self) -> None:
        """Not pausable."""

    def resume(self) -> None:
        """Not pausable."""

    def _played(self) -> None:
        _, _, seconds = self._playing.pop(0)
        self.on_playback_finished(playback_position=seconds, interrupted=False)
