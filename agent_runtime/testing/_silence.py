"""The audio a scenario's or a fuzz run's speech says: real frames of silence."""

from __future__ import annotations

from collections.abc import AsyncIterator

from livekit import rtc

_RATE = 24000  # the speech's sample rate (10 ms frames)


async def silence(seconds: float) -> AsyncIterator[rtc.AudioFrame]:
    """``seconds`` of silence, at least one frame: what ``session.say(..., audio=...)``
    plays through the session's real audio chain."""
    per = _RATE // 100
    for _ in range(max(1, round(seconds * 100))):
        yield rtc.AudioFrame(b"\0\0" * per, _RATE, 1, per)
