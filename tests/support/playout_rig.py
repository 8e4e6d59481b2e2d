"""One composed job with the playout machine, for its tests.

The real ``AgentJob`` over an ``InMemoryRoom`` (a real ``rtc.Room`` with no server) on a
``VirtualClock``, a real ``AgentSession``, the avatar lifecycle around a ``ScriptedAvatar``
(a plugin-style ``DataStreamAudioOutput``), the participant link. The agent speaks through
the SDK's own ``session.say(text, audio=...)`` with real frames; the user's voice activity
is the session's own user state, set with the method its VAD path calls. Stood in for: the
SFU and the avatar's side of the network (the in-memory room), and the LLM.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentSession, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions

from agent_runtime import AgentJob, MemorySink, Tracer
from agent_runtime.runtimes.playout import PlayoutTracker
from agent_runtime.settings import PlayoutOptions
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

AVATAR = "avatar"
USER = "user"
RATE = 24000


async def frames(seconds: float, *, gate: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """``seconds`` of silence in 10 ms frames; with ``gate``, the last frame waits for it
    (the speech is still being produced: no hand-off yet)."""
    per = RATE // 100
    n = max(1, round(seconds * 100))
    for k in range(n):
        if gate is not None and k == n - 1:
            await gate.wait()
        yield rtc.AudioFrame(b"\0\0" * per, RATE, 1, per)


class AskedLLM(llm.LLM):
    """An LLM that records what it is asked and answers nothing (a real one needs a
    network)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[llm.ChatContext] = []

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: Any = NOT_GIVEN,
        tool_choice: Any = NOT_GIVEN,
        extra_kwargs: Any = NOT_GIVEN,
    ) -> llm.LLMStream:
        self.asked.append(chat_ctx.copy())
        return _Silent(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _Silent(llm.LLMStream):
    async def _run(self) -> None:
        return None


class PlayoutRig:
    """The job, its avatar joined on ``start()``; ``reprompts`` records the re-prompts
    (unless ``default_reprompt``: then the job's own, ``generate_reply``, runs)."""

    def __init__(
        self,
        *,
        avatar: bool = True,
        plugin: ScriptedAvatar | None = None,
        default_reprompt: bool = False,
        session: AgentSession[Any] | None = None,
        **options: Any,
    ) -> None:
        self.clock = VirtualClock()
        self.room = InMemoryRoom(clock=self.clock)
        self.room.connect_locally()
        self.room.add_participant(USER)
        self.session: AgentSession[Any] = session or AgentSession()
        self.plugin = plugin or (ScriptedAvatar(avatar_identity=AVATAR) if avatar else None)
        self.sink = MemorySink()
        self.reprompts: list[tuple[float, int]] = []
        self.transport, _ = InMemorySessionTransport.pair()
        options.setdefault("reprompt", True)
        options.setdefault("safety_window", 1.0)
        options.setdefault("reprompt_after", 5.0)
        options.setdefault("max_reprompts", 1)
        self.options = PlayoutOptions(**options)
        self.job = AgentJob(
            room=self.room,
            session=self.session,
            avatar=self.plugin,
            playout=self.options,
            on_reprompt=None if default_reprompt or not self.options.reprompt else self._reprompt,
            clock=self.clock,
            tracer=Tracer(self.sink),
            transport=self.transport,
            otel=False,
            remove_avatar_participant=self._remove,
        )

    def _reprompt(self, session: AgentSession[Any], attempt: int) -> None:
        self.reprompts.append((self.clock.now(), attempt))

    async def _remove(self, identity: str) -> None:
        if identity in self.room.remote_participants:  # the server's "not found" is fine
            self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    @property
    def playout(self) -> PlayoutTracker:
        assert self.job.playout is not None
        return self.job.playout

    async def start(self, *, join: bool = True) -> None:
        await self.job.start_runtime()
        if self.plugin is not None:
            await self.job.start_avatar()
            if join:
                self.join()
        await self.job.start_session(Agent(instructions="test"))
        await self.settle()

    def join(self) -> None:
        self.room.add_participant(AVATAR, kind="agent")
        self.room.publish_track(AVATAR, "video")

    def say(self, seconds: float, *, gate: asyncio.Event | None = None) -> Any:
        return self.session.say("...", audio=frames(seconds, gate=gate))

    async def report(self, position: float = 1.0, *, interrupted: bool = False) -> str:
        """The avatar's lk.playback_finished."""
        payload = json.dumps({"playback_position": position, "interrupted": interrupted})
        return await self.room.invoke_rpc("lk.playback_finished", AVATAR, payload)

    def user(self, state: str) -> None:
        self.session._update_user_state(state)  # type: ignore[arg-type]

    async def settle(self) -> None:
        for _ in range(3):
            await settle()

    async def advance(self, seconds: float) -> None:
        await self.clock.advance(seconds)
        await self.settle()

    def path(self) -> list[tuple[float, str, str, str]]:
        return [
            (r.t, r.event, r.source, r.dest)
            for r in self.sink.records
            if r.machine == "playout" and r.kind == "transition"
        ]

    def decided(self, event: str) -> list[str]:
        """The states in which the playout machine decided ``event``: a test's check that
        it reached the cell it means to (how it decided is for the behaviour to show)."""
        return [
            r.source or ""
            for r in self.sink.records
            if r.machine == "playout" and r.event == event and r.kind in ("transition", "ignore")
        ]

    def rpcs(self) -> list[str]:
        return [c.method for c in self.room.local_participant.rpc_calls]

    async def aclose(self) -> None:
        await self.job.aclose(graceful=False)
        if self.session._started and self.session._closing_task is None:
            await self.session.aclose()
        await self.transport.close()
