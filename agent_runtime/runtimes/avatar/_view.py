"""What an ``AvatarLifecycle`` tells without moving its machine: its plugin, the sink that
plugin installed, its retry policy and how often it started the plugin again, where the
agent's audio goes, what counts as the avatar's join, and whose playback reports count."""

from __future__ import annotations

from livekit.agents.voice.avatar import AvatarSession
from livekit.agents.voice.io import AudioOutput

from agent_runtime.runtimes.avatar._attempts import Attempts
from agent_runtime.runtimes.avatar._facts import Facts, JoinSignal
from agent_runtime.runtimes.avatar._route import AudioRoute, Route, route_of
from agent_runtime.runtimes.avatar._sink import report_identity
from agent_runtime.settings import AvatarRetry


class AvatarView:
    """The lifecycle's read side, over the parts its machine runs with."""

    _avatar: AvatarSession  # type: ignore[type-arg]
    _route: AudioRoute
    _retry: AvatarRetry
    _tries: Attempts
    _facts: Facts

    @property
    def avatar(self) -> AvatarSession:  # type: ignore[type-arg]
        return self._avatar

    @property
    def installed_sink(self) -> AudioOutput | None:
        """The sink the plugin installed, once its ``start()`` has run."""
        return self._route.installed

    @property
    def retry(self) -> AvatarRetry:
        """The retry policy this lifecycle runs with."""
        return self._retry

    @property
    def attempts(self) -> int:
        """How many times the plugin was started again after a transient loss."""
        return self._tries.made

    def audio_route(self) -> Route:
        """Where the agent's audio goes now: ``avatar`` (the plugin's sink), ``room``, ``none``."""
        return route_of(self._route.session, self._route.installed)

    @property
    def join_signal(self) -> JoinSignal:
        """What the avatar must show before it counts as joined: ``video`` (a participant of
        its own with a video track: every avatar running at its provider, however its sink
        sends) or ``none`` (it runs in the agent's own process, under the agent's identity).
        Known once the plugin's start has run."""
        return "none" if self._facts.in_process else "video"

    @property
    def report_identity(self) -> str:
        """Whose ``lk.playback_finished`` counts: the identity the plugin's own sink accepts
        it from (a data stream's destination), else the avatar's."""
        identity = report_identity(self._route.installed)
        return self._avatar.avatar_identity if identity is None else identity
