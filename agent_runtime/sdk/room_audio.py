"""The audio source behind RoomIO's audio output to the room, read and replaced through one
typed accessor (it is a private attribute of livekit's ``_ParticipantAudioOutput``): the
testing kit puts a stand-in there under virtual time (``agent_runtime.testing.room_audio``).
"""

from __future__ import annotations

from typing import Any

from agent_runtime.sdk.livekit_compat import RoomAudioOutput


def room_output_source(out: RoomAudioOutput) -> Any:
    """The ``rtc.AudioSource`` (or its stand-in) the output captures its frames to."""
    return out._audio_source


def set_room_output_source(out: RoomAudioOutput, source: Any) -> None:
    """Make ``source`` the one the output captures to, waits on and clears (the output
    calls ``capture_frame``, ``wait_for_playout``, ``clear_queue``, ``queued_duration``
    and ``aclose`` on it)."""
    out._audio_source = source
