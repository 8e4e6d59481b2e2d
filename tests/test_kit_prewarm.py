"""The server's prewarm (``AgentServer(setup_fnc=...)``, livekit's docs' ``prewarm``) under
the testing kit: livekit's job process runs it on the job's ``JobProcess`` before the
entrypoint, so an agent that loads its VAD there and reads ``ctx.proc.userdata["vad"]``
runs under ``run_entrypoint`` and the fuzzer as it runs deployed.

Real: livekit's fake ``JobContext``, ``AgentServer``, ``AgentSession``, the runtime. Faked:
the room (``InMemoryRoom``) and the session transport.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext, JobProcess
from livekit.agents.job import get_job_context

from agent_runtime import AgentJob, on_session_end
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.fuzz import FuzzOptions, fuzz
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.user_code import PrewarmFailed, UserCodeError


def prewarmed(prewarm: Any) -> AgentServer:
    """An agent whose entrypoint reads what ``prewarm`` left in the process's userdata."""
    server = AgentServer(session_end_timeout=315, setup_fnc=prewarm)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        vad = ctx.proc.userdata["vad"]
        job = AgentJob.from_job_context(ctx, session=AgentSession(), grace_period=5)
        await job.start(Agent(instructions=f"test, {vad}"))

    return server


def load_vad(proc: JobProcess) -> None:
    # livekit runs it in the job's process before the job: there is no job context yet
    proc.userdata["vad"] = "vad" if get_job_context(required=False) is None else "in a job"


async def test_the_servers_prewarm_fills_the_jobs_userdata_before_the_entrypoint(
    agent_room: InMemoryRoom, run_entrypoint: EntrypointRunner
) -> None:
    agent_room.add_participant("user")
    job = await run_entrypoint(prewarmed(load_vad))
    assert run_entrypoint.ctx.proc.userdata == {"vad": "vad"}
    assert job.states["participant"] == "linked"
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()


async def test_each_job_gets_a_process_prewarmed_for_it() -> None:
    # livekit's job process serves one job: what a job leaves in userdata is not the next's
    runs: list[dict[str, Any]] = []

    def counting(proc: JobProcess) -> None:
        runs.append(proc.userdata)
        proc.userdata["vad"] = f"vad {len(runs)}"

    server = prewarmed(counting)
    for n in (1, 2):
        clock = VirtualClock()
        room = InMemoryRoom(name=f"room-{n}", clock=clock)
        room.add_participant("user")
        runner = EntrypointRunner(room=room, clock=clock)
        await runner(server)
        assert runner.ctx.proc.userdata == {"vad": f"vad {n}"}
        await runner.aclose()
    assert runs[0] is not runs[1]


async def test_a_prewarm_that_raises_fails_before_the_entrypoint_runs_naming_it(
    run_entrypoint: EntrypointRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []

    class Noted(tempfile.TemporaryDirectory[str]):
        def __init__(self) -> None:
            super().__init__()
            made.append(self.name)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", Noted)  # the job context's folder

    def broken(proc: JobProcess) -> None:
        raise OSError("the VAD model file is missing")

    ran: list[JobContext] = []

    async def entrypoint(ctx: JobContext) -> None:
        ran.append(ctx)

    server = AgentServer(setup_fnc=broken)
    server.rtc_session()(entrypoint)
    with pytest.raises(UserCodeError, match=r"the agent's setup_fnc .*broken raised OSError"):
        await run_entrypoint(server)
    assert ran == []  # as livekit's process, whose initialization failed: no job
    # the job context made for it is released (its temporary folder was left behind)
    assert made and not any(Path(name).exists() for name in made)


async def test_a_prewarm_runs_before_any_event_loop_as_livekits_process_runs_it(
    run_entrypoint: EntrypointRunner,
) -> None:
    # livekit calls it before the job's loop exists: a prewarm may run a loop of its own,
    # and one that reaches for a running loop fails there as it fails deployed
    async def load() -> str:
        return "vad"

    def own_loop(proc: JobProcess) -> None:
        proc.userdata["vad"] = asyncio.run(load())

    def jobs_loop(proc: JobProcess) -> None:
        proc.userdata["vad"] = asyncio.get_running_loop()

    run_entrypoint.room.add_participant("user")
    await run_entrypoint(prewarmed(own_loop))
    assert run_entrypoint.ctx.proc.userdata == {"vad": "vad"}
    await run_entrypoint.aclose()
    with pytest.raises(UserCodeError, match="jobs_loop raised RuntimeError: no running"):
        await EntrypointRunner(room=InMemoryRoom(name="again"))(prewarmed(jobs_loop))


def test_a_prewarm_that_raises_is_reported_as_the_prewarms_by_the_fuzzer() -> None:
    def broken(proc: JobProcess) -> None:
        raise OSError("the VAD model file is missing")

    report = fuzz(prewarmed(broken), FuzzOptions(examples=1, seed=1))
    assert report.problems[0].startswith("user code: the agent's setup_fnc ")
    assert "broken raised OSError: the VAD model file is missing" in report.problems[0]
    assert 'raise OSError("the VAD model file is missing")' in report.details[0]  # its traceback


def test_a_prewarm_that_fails_stops_the_fuzz_at_its_first_run() -> None:
    # it fails before any step, so every draw fails alike: shrinking ran it some twenty
    # times more (a hung one for its whole bound each time: minutes) to end on t=0 start
    calls: list[int] = []

    def broken(proc: JobProcess) -> None:
        calls.append(1)
        raise OSError("the VAD model file is missing")

    report = fuzz(prewarmed(broken), FuzzOptions(examples=50, seed=1))
    assert len(calls) == 1 and report.examples == 1
    assert "broken raised OSError" in report.problems[0]
    assert report.scenario is not None
    assert [s["event"] for s in report.scenario["steps"]] == ["session.start", "end"]


def test_an_agent_with_a_prewarm_is_fuzzed_as_it_runs_deployed() -> None:
    # its entrypoint raised KeyError: 'vad' in every run, reported as the agent's failure
    report = fuzz(prewarmed(load_vad), FuzzOptions(examples=5, seed=1))
    assert report.ok, report.summary()


def noting_job_folders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The temporary folders the job contexts make (each released with its context)."""
    made: list[str] = []

    class Noted(tempfile.TemporaryDirectory[str]):
        def __init__(self) -> None:
            super().__init__()
            made.append(self.name)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", Noted)
    return made


async def test_a_prewarm_that_hangs_fails_at_the_servers_initialize_process_timeout(
    run_entrypoint: EntrypointRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # livekit's worker gives the process initialize_process_timeout (10 s by default) to
    # finish its prewarm, then gives up on it: the kit did wait forever
    made = noting_job_folders(monkeypatch)
    loading = threading.Event()

    def hangs(proc: JobProcess) -> None:
        loading.wait()  # a model download that never ends (released after the check)

    ran: list[JobContext] = []

    async def entrypoint(ctx: JobContext) -> None:
        ran.append(ctx)

    server = AgentServer(setup_fnc=hangs, initialize_process_timeout=0.05)
    server.rtc_session()(entrypoint)
    try:
        with pytest.raises(
            PrewarmFailed,
            match=r"setup_fnc .*hangs had not returned after 0.05s \(the server's "
            r"initialize_process_timeout\)",
        ):
            await run_entrypoint(server)
        assert ran == []
        assert made and not any(Path(name).exists() for name in made)  # released
    finally:
        loading.set()


@pytest.mark.parametrize("error", [SystemExit(3), KeyboardInterrupt()], ids=repr)
async def test_a_prewarm_that_raises_a_base_exception_fails_naming_it(
    run_entrypoint: EntrypointRunner, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    # livekit's process fails its initialization then too (it exits): the kit's thread let
    # it escape, printed by threading, and the entrypoint ran without its userdata
    made = noting_job_folders(monkeypatch)

    def exits(proc: JobProcess) -> None:
        raise error

    with pytest.raises(PrewarmFailed, match=f"exits raised {type(error).__name__}") as caught:
        await run_entrypoint(prewarmed(exits))
    assert caught.value.__cause__ is error
    assert made and not any(Path(name).exists() for name in made)


def test_a_prewarm_that_hangs_is_reported_as_the_prewarms_by_the_fuzzer() -> None:
    loading = threading.Event()

    def hangs(proc: JobProcess) -> None:
        loading.wait()

    server = prewarmed(hangs)
    server.update_options(initialize_process_timeout=0.05)
    try:
        report = fuzz(server, FuzzOptions(examples=1, seed=1))
    finally:
        loading.set()
    assert report.problems[0].startswith("user code: the agent's setup_fnc ")
    assert "hangs had not returned after 0.05s" in report.problems[0]
