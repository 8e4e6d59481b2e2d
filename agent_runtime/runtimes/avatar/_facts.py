"""What the avatar machine reads from its lifecycle: the facts its guards and room
conditions test (``statemachines.glue``), and the settings its state timeouts take."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Literal

from livekit import rtc

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.settings import AvatarRetry

if TYPE_CHECKING:
    from agent_runtime.runtimes.avatar._lifecycle import AvatarLifecycle
    from agent_runtime.runtimes.avatar._route import AudioRoute

# what the lifecycle waits for before the avatar counts as joined (its join_signal)
JoinSignal = Literal["video", "none"]


class Facts:
    """The avatar's facts, read live from its lifecycle and the room."""

    __slots__ = ("_agent_is_avatar", "_lc", "_route")
    simulators: frozenset[str] = frozenset()  # no route of the avatar's is about them

    def __init__(self, lifecycle: AvatarLifecycle, route: AudioRoute) -> None:
        self._lc = lifecycle
        self._route = route
        self._agent_is_avatar = False  # the plugin's avatar runs in this process (once seen)

    @property
    def avatar_identity(self) -> str | None:
        return self._lc.avatar.avatar_identity

    @property
    def in_process(self) -> bool:
        """The avatar is the agent itself (bithuman's local mode renders in this process and
        publishes from the agent's own participant): no participant of its own to wait for."""
        if self._agent_is_avatar:
            return True  # kept: a closed plugin may forget its room, and with it who it is
        room = self._route.room
        if room is None or self._route.installed is None:
            return False
        try:
            local = room.local_participant.identity
        except Exception:  # not connected yet: no local participant to compare with
            return False
        self._agent_is_avatar = bool(local) and self._lc.avatar.avatar_identity == local
        return self._agent_is_avatar

    @property
    def agent_identity(self) -> bool:
        """The avatar is named as the agent's own participant (an in-process avatar, even one
        whose start failed before it installed anything): never removed from the room."""
        room = self._route.room
        try:
            local = room.local_participant.identity if room is not None else None
        except Exception:  # not connected yet
            return False
        return bool(local) and self._lc.avatar.avatar_identity == local

    def forget(self) -> None:
        """A released attempt: the next start says again where its avatar runs."""
        self._agent_is_avatar = False

    def _participant(self) -> rtc.RemoteParticipant | None:
        room = self._route.room
        return (
            None if room is None else room.remote_participants.get(self._lc.avatar.avatar_identity)
        )

    @property
    def avatar_present(self) -> bool:
        return self.in_process or self._participant() is not None

    @property
    def avatar_has_video(self) -> bool:
        # an in-process avatar has no join signal: its start is its join
        if self.in_process:
            return True
        p = self._participant()
        return p is not None and any(
            pub.kind == rtc.TrackKind.KIND_VIDEO for pub in p.track_publications.values()
        )

    def plugin_clear_task(self) -> asyncio.Task[None] | None:
        """The plugin's own clear while it holds its sink (``DataStreamAudioOutput`` keeps
        it there; a sink set not to hold, or a queue's clear, has none)."""
        sink = self._route.installed
        return lk.sink_clear_task(sink) if sink is not None else None

    @property
    def plugin_clear_in_flight(self) -> bool:
        return self.plugin_clear_task() is not None

    @property
    def agent_speaking(self) -> bool:
        session = self._route.session
        return session is not None and session.agent_state == "speaking"

    @property
    def route_recorded(self) -> bool:
        return self._route.installed is not None

    @property
    def attempts(self) -> int:
        return self._lc.attempts

    @property
    def last_cause(self) -> str:
        return self._lc._tries.cause

    @property
    def retry(self) -> AvatarRetry:
        return self._lc.retry


class Timeouts(Mapping[str, float | None]):
    """The actor's state-timeout settings: ``join_timeout``, and ``retry_backoff`` computed
    for the restart that comes next."""

    __slots__ = ("_join_timeout", "_lc")

    def __init__(self, lifecycle: AvatarLifecycle, join_timeout: float) -> None:
        self._lc = lifecycle
        self._join_timeout = join_timeout

    def __getitem__(self, key: str) -> float | None:
        if key == "join_timeout":
            return self._join_timeout
        if key == "retry_backoff":
            return self._lc.retry.backoff.delay(self._lc.attempts)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("join_timeout", "retry_backoff"))

    def __len__(self) -> int:
        return 2
