"""Shared wiring for the avatar tests (no tests here).

Everything is the SDK's own: a real ``AgentSession`` started on an ``InMemoryRoom`` (a real
``rtc.Room`` with no connection), the real ``DataStreamAudioOutput`` the plugin installs,
real ``rtc.RpcError``s. Faked, because they need a network: the byte stream that carries
audio to the avatar (``stream_bytes``), and the SFU itself (the in-memory room).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, llm
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
from livekit.api import TwirpError

from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.runtimes.avatar import AvatarLifecycle, audio_chain
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

AVATAR = "avatar"
USER = "user"


def make_room(clock: VirtualClock, *, connected: bool = True, user: bool = True) -> InMemoryRoom:
    room = InMemoryRoom(clock=clock)
    if connected:
        room.connect_locally()
    if user:
        room.add_participant(USER)
    return room


def add_active(room: InMemoryRoom, identity: str, *, kind: str = "standard") -> Any:
    """A participant joins (the in-memory room reports it active too, as the SFU does)."""
    return room.add_participant(identity, kind=kind)


def session_listeners(session: AgentSession[Any]) -> int:
    return sum(len(v) for v in session._events.values())


def route_names(session: AgentSession[Any]) -> list[str]:
    return [type(o).__name__ for o in audio_chain(session)]


async def frames(n: int = 10, *, rate: int = 24000) -> AsyncIterator[rtc.AudioFrame]:
    per = rate // 100
    for _ in range(n):
        yield rtc.AudioFrame(b"\0\0" * per, rate, 1, per)


def playback_finished(position: float = 0.5, interrupted: bool = False) -> str:
    return json.dumps({"playback_position": position, "interrupted": interrupted})


class StuckAvatar(ScriptedAvatar):
    """A plugin whose ``start()`` never returns (a provider that never answers), before or
    (``route_first``) after it has installed its route; it records being cancelled."""

    def __init__(self, *, route_first: bool = False) -> None:
        super().__init__(avatar_identity=AVATAR)
        self.route_first = route_first
        self.cancelled = False

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        try:
            if self.route_first:
                await super().start(agent_session, room)  # the base start, then the route
            else:
                self.start_calls += 1
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class SlowToolset(llm.Toolset):
    """An agent's tools whose setup takes ``seconds`` on ``clock`` (an MCP server or a
    realtime model connecting): ``session.start()`` awaits it, RoomIO already built."""

    def __init__(self, clock: VirtualClock, seconds: float) -> None:
        super().__init__(id="slow")
        self._clock, self._seconds = clock, seconds

    async def setup(self) -> SlowToolset:
        await self._clock.sleep(self._seconds)
        return self


class OtherSink(AudioOutput):
    """Someone else's route (say, a recorder or another avatar): the smallest real output,
    whose segments the SDK's base class counts."""

    def __init__(self) -> None:
        super().__init__(label="other", capabilities=AudioOutputCapabilities(pause=False))

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)

    def flush(self) -> None:
        super().flush()

    def clear_buffer(self) -> None:
        pass


class Rig:
    """One agent, one room, one scripted avatar, one lifecycle, on a virtual clock."""

    def __init__(
        self,
        *,
        connected: bool = True,
        avatar: Any = None,
        **options: Any,
    ) -> None:
        self.clock = VirtualClock()
        self.room = make_room(self.clock, connected=connected)
        self.session: AgentSession[Any] = AgentSession()
        self.avatar = avatar if avatar is not None else ScriptedAvatar(avatar_identity=AVATAR)
        self.trace = MemorySink()
        self.removed: list[str] = []
        options.setdefault("remove_participant", self._remove)
        self.lifecycle = AvatarLifecycle(
            self.avatar, clock=self.clock, tracer=Tracer(self.trace), **options
        )

    async def _remove(self, identity: str) -> None:
        # the in-memory room has no server API: do what the server would, answer included
        self.removed.append(identity)
        if identity not in self.room.remote_participants:
            raise TwirpError("not_found", "participant not found", status=404)
        self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    async def start_session(self) -> None:
        await self.session.start(Agent(instructions="test"), room=self.room)
        await settle()

    async def start_session_aside(self, tools_setup: float) -> asyncio.Future[None]:
        """Start the session without waiting for its start(), whose agent's tools take
        ``tools_setup`` seconds to set up."""
        agent = Agent(instructions="test", tools=[SlowToolset(self.clock, tools_setup)])
        started = asyncio.ensure_future(self.session.start(agent, room=self.room))
        await settle()
        return started

    async def start_avatar(self) -> None:
        await self.lifecycle.start(self.session, self.room)
        await settle()

    async def start_avatar_aside(self) -> asyncio.Future[None]:
        """Start the avatar without waiting for its start() (which may never return)."""
        started = asyncio.ensure_future(self.lifecycle.start(self.session, self.room))
        await settle()
        return started

    def join(self, *, video: bool = True) -> None:
        identity = self.avatar.avatar_identity
        add_active(self.room, identity, kind="agent")
        if video:
            self.room.publish_track(identity, "video")

    async def join_and_leave(self) -> None:
        """The session and the avatar started, the avatar joined with its video, then left."""
        await self.start_session()
        await self.start_avatar()
        self.join()
        await settle()
        self.room.remove_participant(self.avatar.avatar_identity)
        await settle()

    async def hold_clear(self) -> Any:
        """While joined: the agent speaks and is interrupted; the avatar never answers the
        plugin's clear, so the clear holds the sink (``clearing``) until its own bound.
        Returns the interrupted speech's handle."""
        handle = self.session.say("hello", audio=frames(50), add_to_chat_ctx=False)
        await settle()
        self.room.local_participant.rpc_script["lk.clear_buffer"].append("timeout")
        self.session.interrupt()
        await settle()
        return handle

    def rpcs(self, method: str = "lk.clear_buffer") -> list[Any]:
        return [c for c in self.room.local_participant.rpc_calls if c.method == method]

    def watch(self) -> list[tuple[str, str, str]]:
        """What a user's ``state_changed`` listener sees from now on: (from, to, on)."""
        seen: list[tuple[str, str, str]] = []
        self.lifecycle.on("state_changed", lambda ev: seen.append((ev.source, ev.dest, ev.event)))
        return seen

    def decided(self, event: str) -> list[str]:
        """The states in which the machine decided ``event``: a test's check that it
        reached the cell it means to (how it decided is for the behaviour to show)."""
        return [
            r.source or ""
            for r in self.trace.records
            if r.event == event and r.kind in ("transition", "ignore", "reject")
        ]

    def transitions(self) -> list[tuple[float, str, str | None, str | None]]:
        return [
            (r.t, r.event or "", r.source, r.dest)
            for r in self.trace.records
            if r.kind == "transition" and r.source != r.dest
        ]

    async def aclose(self) -> None:
        await self.lifecycle.aclose()
        await self.session.aclose()
        await settle()
