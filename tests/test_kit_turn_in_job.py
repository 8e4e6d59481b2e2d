"""A turn the test starts itself, run as livekit runs every turn: in the job's context.

A user's test drove a turn from its own task (``job.session.generate_reply(user_input=
"bye")``); the model answered with a call to the agent's end-call tool, which calls
``get_job_context()``, as livekit's examples do. Deployed, that works: every turn runs
inside the job. From the test's task it raised livekit's "no job context found", and the
kit failed the test with "the agent's code raised RuntimeError", with no way to run the turn
where it runs in production. ``EntrypointRunner.in_job`` is that way, and the failure names
it.

Real: livekit's ``AgentSession`` (its turn, its tool execution), the fake ``JobContext``,
the runtime. Faked: the model (it answers every user turn with a call to ``end_call``: no
provider here) and the room.
"""

from __future__ import annotations

from typing import Any

import pytest
from livekit.agents import (
    Agent,
    AgentServer,
    AgentSession,
    JobContext,
    RunContext,
    function_tool,
    get_job_context,
    llm,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.user_code import UserCodeError

pytestmark = pytest.mark.virtual_time


class _HangsUpModel(llm.LLM[Any]):
    """Answers a user's turn with one call to ``end_call``."""

    def chat(self, *, chat_ctx: llm.ChatContext, **kw: Any) -> llm.LLMStream:
        return _HangUp(
            self,
            chat_ctx=chat_ctx,
            tools=kw.get("tools") or [],
            conn_options=kw.get("conn_options", DEFAULT_API_CONNECT_OPTIONS),
        )


class _HangUp(llm.LLMStream):
    async def _run(self) -> None:
        last = self._chat_ctx.items[-1] if self._chat_ctx.items else None
        if getattr(last, "role", None) == "user":
            call = llm.FunctionToolCall(name="end_call", arguments="{}", call_id="c1")
            delta = llm.ChoiceDelta(role="assistant", tool_calls=[call])
            self._event_ch.send_nowait(llm.ChatChunk(id="c", delta=delta))


class _Concierge(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="a concierge")

    @function_tool
    async def end_call(self, ctx: RunContext[Any]) -> None:
        """End the call."""
        get_job_context().shutdown("the user said bye")


def _server() -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(ctx, session=AgentSession(llm=_HangsUpModel()))
        await job.start(_Concierge())

    return server


async def test_a_turn_the_test_starts_in_the_job_reaches_the_job_as_in_production(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    job = await run_entrypoint(_server())
    run_entrypoint.in_job(job.session.generate_reply, user_input="bye")
    await virtual_clock.advance(5)
    await run_entrypoint.wait_ended()  # the tool's shutdown ended the job: nothing failed
    assert run_entrypoint.process.reason == "the user said bye"
    assert job.states["agent_job"] == "closed"


async def test_a_turn_the_test_starts_from_its_own_task_is_told_where_to_run(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    job = await run_entrypoint(_server())
    job.session.generate_reply(user_input="bye")  # the test's own task: no job context
    await virtual_clock.advance(5)
    with pytest.raises(UserCodeError, match=r"no job context found.*run_entrypoint\.in_job"):
        run_entrypoint.raise_failures()
    await job.aclose()


async def test_an_async_tool_the_test_awaits_through_in_job_runs_in_the_job(
    agent_room: InMemoryRoom, virtual_clock: VirtualClock, run_entrypoint: EntrypointRunner
) -> None:
    # a user's test awaited the agent's own async end-call tool through in_job, as the guide
    # says to run the agent's code: the call made a coroutine in the job's context, but its
    # body ran where the test awaited it, and get_job_context() raised "no job context found"
    agent_room.add_participant("user")
    job = await run_entrypoint(_server())
    agent = job.session.current_agent
    assert isinstance(agent, _Concierge)
    await run_entrypoint.in_job(agent.end_call, None)  # the tool, called as the model would
    await run_entrypoint.wait_ended()
    assert run_entrypoint.process.reason == "the user said bye"
    assert job.states["agent_job"] == "closed"
