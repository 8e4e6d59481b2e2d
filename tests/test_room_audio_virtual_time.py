"""A greeting on the room's audio output under the ``virtual_time`` marker: livekit's
native audio source paces the audio in real seconds, answered from its FFI thread, which a
``VirtualTimeLoop`` does not wait for: it jumped past the test's ``wait_for`` bound, and a
"greet, then hang up" test failed with "the job has not ended after 5s" (it passed without
the marker). The kit puts a stand-in paced on the loop's clock behind the room's audio
output (``agent_runtime/testing/room_audio.py``).

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, RoomIO and its audio
output, the runtime. Faked, because they need a server or the native runtime's real-time
pacing: the room, the session transport, the native audio source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob, on_session_end
from agent_runtime.sdk.room_audio import room_output_source
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.room_audio import PacedAudioSource, room_outputs

GREETING = 2.0  # seconds of audio


async def _audio(seconds: float) -> AsyncIterator[rtc.AudioFrame]:
    for _ in range(round(seconds * 100)):
        yield rtc.AudioFrame(b"\0\0" * 480, 48000, 1, 480)


def greeter(said_at: list[float]) -> AgentServer:
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))
        await job.session.say("hello", audio=_audio(GREETING))
        said_at.append(asyncio.get_running_loop().time())
        ctx.shutdown("greeted")

    return server


@pytest.mark.virtual_time
async def test_greet_then_hang_up_ends_the_job_after_the_greeting_played(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    began = asyncio.get_running_loop().time()
    said_at: list[float] = []
    job = await run_entrypoint(greeter(said_at))
    await run_entrypoint.wait_ended()
    assert job.lifecycle == "closed" and run_entrypoint.process.reason == "greeted"
    # the greeting took its own length of the loop's (virtual) time, no more
    assert said_at and GREETING - 0.01 <= said_at[0] - began < GREETING + 0.5


@pytest.mark.virtual_time
async def test_a_greeting_interrupted_halfway_stops_there(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    server = AgentServer()

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    job = await run_entrypoint(server)
    handle = job.session.say("a long story", audio=_audio(10.0))
    await virtual_clock.advance(1.0)
    (out,) = room_outputs(job.session)
    source = room_output_source(out)
    assert isinstance(source, PacedAudioSource) and not handle.done()
    handle.interrupt()
    await asyncio.wait_for(handle.wait_for_playout(), 10)
    assert handle.interrupted and source.captured < 10.0
