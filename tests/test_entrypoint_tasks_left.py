"""A task the agent's entrypoint starts and never stops outlives its job: livekit's job
process cancels what is left only as the process exits, so in production it is a task that
runs on after the call, unseen. ``agent-runtime fuzz`` reported it (``released``) while
``run_entrypoint`` passed the same agent: both now read one check, the runner's, which names
the task's coroutine.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext

from agent_runtime import AgentJob
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.fuzz import FuzzOptions, fuzz, replay
from agent_runtime.testing.fuzz.properties import RELEASE_HINT
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.user_code import UserCodeError
from tests.support import planted

ROOT = Path(__file__).resolve().parents[1]
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
    assert report.problems == [
        f"released: tasks still running after the job ended: {HEARTBEAT}{RELEASE_HINT}"
    ]


@pytest.mark.virtual_time
async def test_the_tests_own_task_is_not_the_agents() -> None:
    """A test that drives a simulated user with a task of its own, started after the run:
    that task was named as one the agent left running."""
    runner = _runner()
    await runner(planted.leaky_task_server(False))

    async def user_simulator() -> None:
        await asyncio.Event().wait()

    mine = asyncio.create_task(user_simulator())
    await asyncio.sleep(0)
    await runner.aclose()  # no failure: the task is the test's
    mine.cancel()


def _cancels_without_waiting() -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        async def recorder() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # its file closed: cleanup that takes a moment
                raise

        task = asyncio.create_task(recorder())

        async def stop(_: str) -> None:
            task.cancel()  # not awaited

        ctx.add_shutdown_callback(stop)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.virtual_time
async def test_a_task_the_agent_cancelled_is_not_left_running() -> None:
    """Cancelled without waiting for it, as many agents do: livekit's process loop lets it
    end; it was named as left running, by run_entrypoint and by the fuzzer alike."""
    runner = _runner()
    await runner(_cancels_without_waiting())
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()
    await runner.aclose()


def test_the_fuzzer_does_not_report_a_task_the_agent_cancelled(tmp_path: Path) -> None:
    report = fuzz(_cancels_without_waiting(), FuzzOptions(seed=1, examples=10), out=tmp_path)
    assert report.problems == []


@pytest.mark.virtual_time
async def test_the_tests_own_failure_is_not_the_agents() -> None:
    """The agent's room handler raises (its bug, reported once) while the test's own task
    emits the event; that task then fails on the test's own assertion, which was reported
    as "the agent's task raised AssertionError" beside the agent's error."""
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        ctx.room.on("participant_disconnected", lambda p: {}["missing"])
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    runner = _runner()
    await runner(server)

    async def my_check() -> None:
        runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        raise AssertionError("my test's own assertion")

    with pytest.raises(AssertionError, match="my test's own assertion"):
        await asyncio.create_task(my_check())
    with pytest.raises(UserCodeError) as caught:
        await runner.aclose()
    assert "KeyError" in str(caught.value)
    assert "more" not in str(caught.value) and not getattr(caught.value, "__notes__", [])


async def _forever() -> None:
    while True:
        await asyncio.sleep(3600)


def _leaks_in(where: str) -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        session: AgentSession[None] = AgentSession()
        if where == "session close":
            session.on("close", lambda _: asyncio.create_task(_forever()))
        else:
            ctx.room.on("disconnected", lambda *_: asyncio.create_task(_forever()))
        job = AgentJob.from_job_context(ctx, session=session)
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.virtual_time
@pytest.mark.parametrize("where", ["session close", "room disconnected"])
async def test_a_task_started_in_a_handler_of_the_jobs_close_is_the_jobs(where: str) -> None:
    """The user leaves (the test removes them): the job's close, and the handlers it runs,
    came from the test's call, so what they started was taken for the test's own. The
    room's events come in the job's context now, as a real room's come from its task."""
    runner = _runner()
    await runner(_leaks_in(where))
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()
    with pytest.raises(UserCodeError, match="left a task running after it ended: _forever"):
        await runner.aclose()


def _swallows_its_cancel() -> AgentServer:
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        async def worker() -> None:
            while True:
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    if stop.is_set():
                        return
                    continue  # "interrupted": on to the next item

        task = asyncio.create_task(worker())

        async def cancel(_: str) -> None:
            task.cancel()

        ctx.add_shutdown_callback(cancel)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    stop = asyncio.Event()
    server.stop = stop  # type: ignore[attr-defined]
    return server


@pytest.mark.virtual_time
async def test_a_task_that_takes_no_for_an_answer_is_named_though_cancelled() -> None:
    runner = _runner()
    server = _swallows_its_cancel()
    await runner(server)
    runner.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await runner.wait_ended()
    with pytest.raises(UserCodeError, match=r"left a task running after it ended: .*worker"):
        await runner.aclose()
    server.stop.set()  # type: ignore[attr-defined]
    await asyncio.sleep(61)


@pytest.mark.virtual_time
async def test_two_runners_count_their_own_jobs_tasks_and_leave_no_factory() -> None:
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    first, second = _runner(), _runner()
    await first(planted.leaky_task_server(False))
    await second(planted.leaky_task_server(False))
    await first.aclose()  # the second's job still runs: its tasks are not the first's
    await second.aclose()
    assert loop.get_task_factory() is before


# -- an entrypoint that swallows every cancel: the run ends, naming it ----------------------
# Before, the kit named nothing: the test (or the fuzzer's first run) hung for ever in the
# loop's own close, which cancels and awaits every task left. A subprocess bounds the hang.
SWALLOWS = (
    "deaf_entrypoint_server.<locals>.entrypoint (agent code), which swallowed its cancellation"
)


def test_a_test_whose_entrypoint_swallows_every_cancel_ends_and_names_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_deaf="""
        import pytest
        from livekit import rtc
        from tests.support import planted

        @pytest.mark.virtual_time
        async def test_user_leaves(agent_room, run_entrypoint):
            agent_room.add_participant("user")
            await run_entrypoint(planted.DEAF_ENTRYPOINT)
            agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        """
    )
    # the subprocess imports the project's tests package: from the clone, whatever the
    # caller's environment (sys.path alone does not reach a subprocess)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", timeout=60
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([f"*left a task running after it ended: {SWALLOWS}*"])


def test_the_fuzzer_on_such_an_entrypoint_ends_and_reports_it(tmp_path: Path) -> None:
    args = ["fuzz", "tests/support/planted.py:DEAF_ENTRYPOINT", "--examples", "3", "--seed", "1"]
    cli = [sys.executable, "-m", "agent_runtime.tools.cli", *args, "--out", str(tmp_path)]
    done = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"released: tasks still running after the job ended: {SWALLOWS}" in done.stdout


async def _greet(identity: str) -> None:
    raise RuntimeError(f"could not greet {identity}")


def _keeps_its_failed_task(where: str) -> AgentServer:
    """A room handler starts a greeting task the agent keeps (in a set, never looked at
    again): in the job's context, or with a context of its own (as from a thread)."""
    server = AgentServer(session_end_timeout=315)
    kept: set[asyncio.Task[None]] = set()

    @server.rtc_session()
    async def entrypoint(ctx: JobContext) -> None:
        def joined(p: rtc.RemoteParticipant) -> None:
            own = contextvars.Context() if where == "own context" else None
            kept.add(asyncio.create_task(_greet(p.identity), context=own))

        ctx.room.on("participant_connected", joined)
        job = AgentJob.from_job_context(ctx, session=AgentSession())
        await job.start(Agent(instructions="test"))

    return server


@pytest.mark.virtual_time
@pytest.mark.parametrize("where", ["job's context", "own context"])
async def test_a_failed_task_the_agent_keeps_is_its_failure(where: str) -> None:
    """asyncio reports a task's failure nobody took only as the task is collected: one the
    agent keeps never is during the run, and the test passed, as did the fuzzer's run. (So
    did one the agent dropped, under this suite's conftest, which holds every failed task
    until the test's end.)"""
    runner = _runner()
    await runner(_keeps_its_failed_task(where))
    runner.room.add_participant("caller")
    await settle()
    with pytest.raises(UserCodeError) as caught:
        await runner.aclose()
    assert str(caught.value) == (
        "the agent's task _greet raised RuntimeError: could not greet caller"
    )


@pytest.mark.parametrize("where", ["job's context", "own context"])
def test_the_fuzzer_reports_a_failed_task_the_agent_keeps(tmp_path: Path, where: str) -> None:
    path = tmp_path / "caller.yaml"
    steps = [
        {"at": 0, "event": "session.start"},
        {"at": 1, "event": "participant_connected", "identity": "caller"},
        {"at": 2, "event": "end"},
    ]
    path.write_text(yaml.safe_dump({"name": "a caller joins", "steps": steps}))
    report = replay(_keeps_its_failed_task(where), path)
    assert report.problems == [
        "user code: the agent's task _greet raised RuntimeError: could not greet caller"
    ]


@pytest.mark.virtual_time
async def test_a_failed_task_is_named_by_its_coroutine() -> None:
    # one the test started and never read fails the run too: its name says whose it is
    runner = _runner()
    await runner(_keeps_its_failed_task("job's context"))

    async def probe() -> None:
        raise AssertionError("the test's own probe failed")

    asyncio.create_task(probe())  # noqa: RUF006
    await settle()
    with pytest.raises(UserCodeError, match=r"task .*probe raised AssertionError"):
        await runner.aclose()
