"""A task the agent's entrypoint starts and never stops outlives its job: livekit's job
process cancels what is left only as the process exits, so in production it is a task that
runs on after the call, unseen. ``agent-runtime fuzz`` reported it (``released``) while
``run_entrypoint`` passed the same agent: both now read one check, the runner's, which names
the task's coroutine.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from livekit import rtc

from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.fuzz import FuzzOptions, fuzz
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.user_code import UserCodeError
from tests.support import planted

HEARTBEAT = "leaky_task_server.<locals>.entrypoint.<locals>.heartbeat (agent code)"


def _runner() -> EntrypointRunner:
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    room.add_participant("user")
    return EntrypointRunner(room=room, clock=clock)


@pytest.mark.virtual_time
async def test_run_entrypoint_fails_on_a_task_the_agent_leaves_running_naming_it() -> None:
    runner = _runner()
    await runner(planted.leaky_task_server(True))
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()  # the job ended; the heartbeat goes on
    with pytest.raises(UserCodeError) as caught:
        await runner.aclose()
    assert str(caught.value) == (
        f"the agent's job left a task running after it ended: {HEARTBEAT} (livekit's job "
        "process cancels it only as the process exits)"
    )


@pytest.mark.virtual_time
async def test_the_same_agent_stopping_its_task_passes() -> None:
    runner = _runner()
    await runner(planted.leaky_task_server(False))
    await runner.aclose()
    assert runner.tasks_left() == []


def test_the_fuzzer_reports_the_same_check(tmp_path: Path) -> None:
    report = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=1), out=tmp_path)
    assert report.problems == [f"released: tasks still running after the job ended: {HEARTBEAT}"]
