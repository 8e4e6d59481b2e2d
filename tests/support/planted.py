"""User-style agents with planted order-dependent bugs, for the fuzzer's tests. Each module
level ``*_server(buggy)`` returns an ``AgentServer`` whose entrypoint is an ordinary agent;
with ``buggy=False`` the same agent written correctly."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext, room_io
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime import AgentJob, PlayoutOptions, on_session_end

logger = logging.getLogger("planted")


def session_end_server(session_end: Callable[[JobContext], Awaitable[None]]) -> AgentServer:
    """An ordinary agent: its entrypoint builds and starts its job; ``session_end`` is its
    server's ``on_session_end`` (the runtime's, or the agent's own that awaits it)."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def simulator_lookup_server(buggy: bool = True) -> AgentServer:
    """on_session_end finds the simulator in the room to log its identity: the simulator
    that left first (which itself ends the job) is not there any more."""

    async def session_end(ctx: JobContext) -> None:
        sims = [
            p for p in ctx.room.remote_participants.values() if ATTRIBUTE_SIMULATOR in p.attributes
        ]
        if buggy:
            simulator = sims[0]  # the bug: assumes the simulator is still there
            logger.info("session over for simulator %s", simulator.identity)
        elif sims:
            logger.info("session over for simulator %s", sims[0].identity)
        await on_session_end(ctx)

    return session_end_server(session_end)


def waits_for_participant_server(buggy: bool = False) -> AgentServer:
    """The usual livekit entrypoint: connect, wait for the user, then build and start the
    job (the wait is no bug: the fuzzer must not flag it). Buggy: it reads an attribute
    the user does not have, after the wait."""
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        await ctx.connect()
        participant = await ctx.wait_for_participant()
        if buggy:
            logger.info("language %s", participant.attributes["language"])
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions=f"talk with {participant.identity}"))

    return server


def rejoin_greeting_server(buggy: bool = True) -> AgentServer:
    """The agent greets a participant who comes back. Its handler says hello on the session
    without asking whether the session still runs: one who left and comes back after the
    agent hung up, while the job holds for the simulator's verdict, makes ``session.say``
    raise in the room's event handler. Several steps, in that order: the participant leaves,
    the agent hangs up (the simulator still there), the participant comes back."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        session: AgentSession = AgentSession()
        job = AgentJob.from_job_context(ctx, session=session)
        seen: set[str] = set()

        def on_joined(p: rtc.RemoteParticipant) -> None:
            if ATTRIBUTE_SIMULATOR in p.attributes or p.identity in ("stranger", "avatar"):
                return
            # fixed: greet only while the session runs (its close reason is not in yet)
            if p.identity in seen and (buggy or job.close_reason is None):
                session.say("welcome back", audio=_silence())
            seen.add(p.identity)

        for p in ctx.room.remote_participants.values():
            on_joined(p)
        ctx.room.on("participant_connected", on_joined)
        await job.start(Agent(instructions="test"))

    return server


def avatar_mute_server(buggy: bool = True) -> AgentServer:
    """The agent has an avatar (the scripted one stands in for its plugin in the fuzz) and
    "stops sending audio to the avatar" when the avatar leaves by clearing the session's
    audio output: the runtime had just put the room's audio back, so the agent goes silent.
    Two steps in order: the avatar joins, then leaves while the session runs."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        session: AgentSession = AgentSession()
        job = AgentJob.from_job_context(ctx, session=session, avatar=_ProviderAvatar())

        def on_left(p: rtc.RemoteParticipant) -> None:
            if p.identity == "avatar" and buggy:
                session.output.audio = None  # the bug: the room's audio was the fallback

        ctx.room.on("participant_disconnected", on_left)
        await job.start(Agent(instructions="test"))

    return server


def no_hook_server(buggy: bool = True, *, own_hook: bool = False) -> AgentServer:
    """The agent's server is not given ``on_session_end`` (``own_hook``: given one of the
    agent's own that does not await the runtime's): livekit's shutdown disconnects the
    room before the job hears of it, so the simulator that asks for its verdict after the
    hang-up gets no answer. Fixed: ``rtc_session(on_session_end=on_session_end)``."""
    server = AgentServer()

    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    async def log_the_end(ctx: JobContext) -> None:
        logger.info("session over")

    if buggy:
        server.rtc_session(on_session_end=log_the_end if own_hook else None)(entrypoint)
    else:
        server.rtc_session(on_session_end=on_session_end)(entrypoint)
    return server


def short_hold_server() -> AgentServer:
    """A correct agent whose job holds 30 s for the verdict and waits 10 s for a user who
    dropped (no bug planted: the fuzzer must not owe a verdict past the job's own hold)."""
    server = AgentServer(session_end_timeout=100)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), grace_period=10, session_end_timeout=30
        )
        await job.start(Agent(instructions="test"))

    return server


def leaky_task_server(buggy: bool = True) -> AgentServer:
    """The agent starts a heartbeat task in its entrypoint and never stops it: in a worker
    that runs jobs in one process, it outlives the job. Fixed: a shutdown callback stops it."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())

        async def heartbeat() -> None:
            while True:
                await asyncio.sleep(3600)

        task = asyncio.create_task(heartbeat(), name="heartbeat")
        if not buggy:

            async def stop(_: str) -> None:
                task.cancel()

            ctx.add_shutdown_callback(stop)
        await job.start(Agent(instructions="test"))

    return server


def hung_callback_server(buggy: bool = True) -> AgentServer:
    """The agent flushes its metrics in a shutdown callback that waits for a reply that
    never comes: livekit's worker kills the job's process at its shutdown deadline. Fixed:
    the flush has its own bound."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        never = asyncio.Event()  # the metrics endpoint's reply

        async def flush_metrics(_: str) -> None:
            if buggy:
                await never.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(never.wait(), 2.0)

        ctx.add_shutdown_callback(flush_metrics)
        await job.start(Agent(instructions="test"))

    return server


def hung_verdict_server() -> AgentServer:
    """The agent's ``on_simulation_end`` waits for a grading service that never answers:
    livekit does not bound it, so the simulator's finalize gets no reply while the job
    serves on."""
    server = AgentServer(session_end_timeout=315)

    async def grade(_: Any) -> None:
        await asyncio.Event().wait()  # the grading service's reply

    @server.rtc_session(on_session_end=on_session_end, on_simulation_end=grade)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def failing_reprompt_server() -> AgentServer:
    """The agent's re-prompt reads a prompt table that has no entry for the attempt: the
    runtime's watchdog calls it, and it raises (the runtime logs it and goes on)."""
    server = AgentServer(session_end_timeout=315)
    prompts = {0: "Are you still there?"}

    async def reprompt(session: AgentSession[Any], attempt: int) -> None:
        session.generate_reply(instructions=prompts[attempt])

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(
            ctx,
            session=AgentSession(),
            playout=PlayoutOptions(reprompt=True, reprompt_after=2),
            on_reprompt=reprompt,
        )
        await job.start(Agent(instructions="test"))

    return server


class SummaryAgent(Agent):
    """Saves a summary as it leaves; the save fails (livekit logs it and goes on)."""

    def __init__(self) -> None:
        super().__init__(instructions="test")

    async def on_exit(self) -> None:
        raise ValueError("could not save the summary")


def on_exit_server() -> AgentServer:
    """An agent whose ``on_exit`` raises: livekit catches and logs it as the session
    closes, saying only "error" of its own, not whose code it called."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(SummaryAgent())

    return server


def raises_before_its_job_server() -> AgentServer:
    """An entrypoint that connects, then fails reading its configuration."""
    server = AgentServer(session_end_timeout=315)
    config: dict[str, str] = {}

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        await ctx.connect()
        logger.info("voice %s", config["voice"])
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


def text_only_server() -> AgentServer:
    """A correct text-only agent: its session has no audio output to the room, as it asked
    (no bug planted: the fuzzer must not find its audio "going nowhere")."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        text_only = room_io.RoomOptions(audio_input=False, audio_output=False)
        await job.start(Agent(instructions="test"), room_options=text_only)

    return server


class ForeverExit(Agent):
    """Waits in ``on_exit`` for a CRM that never answers."""

    def __init__(self) -> None:
        super().__init__(instructions="test")

    async def on_exit(self) -> None:
        await asyncio.Event().wait()


_LEFT: list[asyncio.Task[None]] = []  # the heartbeats left running, kept from collection


def hung_on_exit_server(leak: bool = False) -> AgentServer:
    """An agent whose ``on_exit`` never returns: livekit's job process cuts the session's
    close at 60 s, logs it and goes on. ``leak``: its entrypoint also starts a heartbeat
    task it never stops."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        if leak:

            async def heartbeat() -> None:
                while True:
                    await asyncio.sleep(3600)

            _LEFT.append(asyncio.create_task(heartbeat(), name="heartbeat"))
        await job.start(ForeverExit())

    return server


def _ProviderAvatar() -> Any:
    # the avatar plugin this agent deploys with; the kit's scripted avatar stands in for it
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

    return ScriptedAvatar(avatar_identity="avatar")


async def _silence() -> AsyncIterator[rtc.AudioFrame]:
    # what a TTS would say, with no TTS to ask: 0.2 s of silence
    for _ in range(20):
        yield rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)


def deaf_entrypoint_server() -> AgentServer:
    """The entrypoint polls after its start and swallows every cancel (an ``except
    CancelledError: pass`` around its sleep): livekit's job end waits for it, until the
    worker kills the process. Nothing else stops it."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))
        while True:
            try:  # noqa: SIM105 (as an agent writes it)
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                pass

    return server


# for `agent-runtime fuzz tests/support/planted.py:NAME`
BUGGY_SIMULATOR_LOOKUP = simulator_lookup_server(True)
FIXED_SIMULATOR_LOOKUP = simulator_lookup_server(False)
BUGGY_REJOIN_GREETING = rejoin_greeting_server(True)
FIXED_REJOIN_GREETING = rejoin_greeting_server(False)
BUGGY_AVATAR_MUTE = avatar_mute_server(True)
FIXED_AVATAR_MUTE = avatar_mute_server(False)
BUGGY_LEAKY_TASK = leaky_task_server(True)
FIXED_LEAKY_TASK = leaky_task_server(False)
DEAF_ENTRYPOINT = deaf_entrypoint_server()


def lazy_plugin_server() -> AgentServer:
    """An agent that imports its plugin inside its entrypoint (as ``my_agent`` imports bey
    when ``BEY_API_KEY`` is set): livekit's job process runs the entrypoint on its main
    thread, where a plugin may register."""
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        importlib.import_module("tests.support.lazy_plugin")  # registers its Plugin

        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server
