"""User-style agents whose entrypoint does not simply return once its job started, as
livekit allows: it waits for the room to go, or for ever, or before it builds its job; one
that builds no ``AgentJob`` at all, one that builds it and never starts it. For the
runner's and the fuzzer's tests."""

from __future__ import annotations

import asyncio

from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end


def waits_for_disconnect_server() -> AgentServer:
    """After the start, the entrypoint waits for the room's ``disconnected`` event."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        gone = asyncio.Event()
        ctx.room.on("disconnected", lambda *_: gone.set())
        await job.start(Agent(instructions="test"))
        await gone.wait()

    return server


def waits_forever_server() -> AgentServer:
    """After the start, the entrypoint never returns (livekit cancels it 15 s into the
    job's end). Given ``on_session_end`` as the README's agent is: without it a simulator's
    verdict asked after the hang-up is dropped, which the fuzzer rightly finds."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))
        await asyncio.Event().wait()

    return server


def waits_before_its_job_server() -> AgentServer:
    """The entrypoint waits for something that never happens before it builds its job."""
    server = AgentServer()

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        await asyncio.Event().wait()
        AgentJob.from_job_context(ctx, session=AgentSession())

    return server


def no_job_server() -> AgentServer:
    """The entrypoint connects and returns: no ``AgentJob``."""
    server = AgentServer()

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        await ctx.connect()

    return server


def unstarted_job_server() -> AgentServer:
    """The entrypoint builds its ``AgentJob`` and returns without starting it."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        AgentJob.from_job_context(ctx, session=AgentSession())

    return server


WAITS_FOR_DISCONNECT = waits_for_disconnect_server()
WAITS_FOREVER = waits_forever_server()
NO_JOB = no_job_server()
WAITS_BEFORE_ITS_JOB = waits_before_its_job_server()
UNSTARTED = unstarted_job_server()
