"""A scripted avatar plugin for tests and scenarios.

It behaves like the upstream plugins (tavus, bey, ...) where it matters: its ``start()``
runs the base class's ``start()`` and then points the session's audio at the avatar with
``agent_session.output.replace_audio_tail(DataStreamAudioOutput(...))``. What the real
plugins do over the network (asking a provider to send an avatar into the room) is left to
the script: the test or the scenario adds the avatar participant to the room, or does not.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from livekit import rtc
from livekit.agents.voice.avatar import AvatarSession, DataStreamAudioOutput

from agent_runtime.clock import Clock
from agent_runtime.parts import check_part
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.held import Gate

if TYPE_CHECKING:
    from livekit.agents.voice.agent_session import AgentSession


# the plugin's own logger, as each upstream plugin has (livekit.plugins.NAME)
logger = logging.getLogger("livekit.plugins.scripted_avatar")


class ScriptedAvatarError(RuntimeError):
    """The scripted failure of ``ScriptedAvatar.start()``."""


class ScriptedAvatar(AvatarSession):  # type: ignore[type-arg]
    """An ``AvatarSession`` whose provider side is a script.

    ``start_error`` makes ``start()`` raise it (a string becomes a ``ScriptedAvatarError``),
    on every call or, with ``start_errors`` set, on that many calls from then on;
    with ``error_after_route`` the route is installed first, as a plugin failing late would.
    ``swallow_error``: the provider's error is caught and logged and ``start()`` returns
    with no route installed, as livekit-plugins-simli does. ``start_delay`` (seconds on
    ``clock``) stands for the provider's API call. ``sample_rate``, ``wait_remote_track``
    and ``clear_buffer_timeout`` are the installed ``DataStreamAudioOutput``'s own options
    (``None`` for the last: the sink does not hold the next reply after a clear).

    ``held``: the provider is the test's, each ``start()`` waits on ``gate`` (``waits``
    says where) for its word: before the route (``waits == "start"``) ``routed``,
    ``no_route`` (return with no route, as simli does) or ``error``; after it
    (``"routed"``) ``ok`` or ``error``; ``hang`` at either, never. Once ``released`` is
    set, every wait ends at once with that word.
    """

    def __init__(
        self,
        *,
        avatar_identity: str = "avatar",
        start_error: BaseException | str | None = None,
        error_after_route: bool = False,
        swallow_error: bool = False,
        start_delay: float = 0.0,
        clock: Clock | None = None,
        sample_rate: int | None = None,
        wait_remote_track: rtc.TrackKind.ValueType | None = rtc.TrackKind.KIND_VIDEO,
        clear_buffer_timeout: float | None = 2.0,
        held: bool = False,
    ) -> None:
        check_part("clock", clock)
        super().__init__()
        if start_delay < 0:
            raise ValueError(f"start_delay must be >= 0, got {start_delay!r}")
        if start_delay and clock is None:
            raise ValueError("start_delay needs a clock")
        self.avatar_identity = avatar_identity
        self.start_error: BaseException | None = (
            ScriptedAvatarError(start_error) if isinstance(start_error, str) else start_error
        )
        self.start_errors: int | None = None  # the starts left that raise; None: every one
        self.error_after_route = error_after_route
        self.swallow_error = swallow_error
        self._clear_buffer_timeout = clear_buffer_timeout
        self.start_delay = start_delay
        self._clock = clock
        self._sample_rate = sample_rate
        self._wait_remote_track = wait_remote_track
        self.start_calls = 0
        self.installed: DataStreamAudioOutput | None = None
        self.held = held
        self.gate = Gate()
        self.waits: str | None = None  # where a held start() waits: "start", "routed"
        self.released: str | None = None

    @property
    def avatar_identity(self) -> str:
        return self._identity

    @avatar_identity.setter
    def avatar_identity(self, identity: str) -> None:
        if not isinstance(identity, str) or not identity:
            raise ValueError(f"avatar_identity must be a non-empty string, got {identity!r}")
        self._identity = identity

    @property
    def provider(self) -> str:
        return "scripted"

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        self.start_calls += 1
        await super().start(agent_session, room)
        if self.start_delay and self._clock is not None:
            await self._clock.sleep(self.start_delay)
        if self.held:
            await self._held_start(agent_session, room)
            return
        if self.swallow_error:
            logger.error("scripted avatar: the provider failed; no avatar will come")
            return
        error = self.start_error
        if error is not None and self.start_errors is not None:
            if self.start_errors <= 0:
                error = None  # the scripted failures are used up: this start succeeds
            else:
                self.start_errors -= 1
        if error is not None and not self.error_after_route:
            raise error
        self._route(agent_session, room)
        if error is not None:
            raise error

    async def aclose(self) -> None:
        """livekit's close, but for the participant's removal through the server API, which
        a test has none of (a warning and a traceback at every test's end): the provider
        side is the test's, and under the runtime the job removes the participant itself
        (the kit's removal, on the in-memory room)."""
        await lk.outside_job_context(super().aclose())

    async def _held_start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        word = await self._told("start")
        if word == "error":
            raise ScriptedAvatarError("the provider failed")
        if word == "no_route":
            logger.error("scripted avatar: the provider failed; no avatar will come")
            return
        self._route(agent_session, room)
        if await self._told("routed") == "error":
            raise ScriptedAvatarError("the provider failed after the route was in")

    def _route(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        # exactly what the upstream plugins do at the end of their start()
        self.installed = DataStreamAudioOutput(
            room,
            destination_identity=self.avatar_identity,
            sample_rate=self._sample_rate,
            wait_remote_track=self._wait_remote_track,
            clear_buffer_timeout=self._clear_buffer_timeout,
        )
        agent_session.output.replace_audio_tail(self.installed)

    async def _told(self, where: str) -> str:
        if self.released is not None:
            return self.released
        self.waits = where
        try:
            return await self.gate.outcome()
        finally:
            self.waits = None

    def release(self, word: str = "error") -> None:
        """From now on every held wait ends at once with ``word``, the waiting one too."""
        self.released = word
        self.gate.release(word)

    def tell(self, word: str) -> None:
        """End the held start's wait with ``word``, or raise saying it waits elsewhere."""
        allowed = {"start": ("routed", "no_route", "error", "hang"),
                   "routed": ("ok", "error", "hang")}.get(self.waits or "", ())  # fmt: skip
        if not allowed:  # not begun, or ended (a shutdown cut it): as Held.end says it
            raise RuntimeError("no avatar_start call waits to be ended")
        if word not in allowed:
            where = "before its route" if self.waits == "start" else "after its route"
            raise RuntimeError(
                f"the avatar's start, held {where}, ends with {', '.join(allowed[:-1])} or "
                f"{allowed[-1]}, not {word!r}"
            )
        self.gate.open(word)
