"""The example agent (examples/agent.py), run through its own entrypoint on virtual time.

Real: the ``AgentServer`` it registers with, livekit's fake ``JobContext`` (a real
``JobContext`` for a job with no worker), a real ``AgentSession`` with its RoomIO, the
runtime's machines, livekit's ``RemoteSession`` client as the simulator. Faked, because
they need a server: the room (``InMemoryRoom``: a real ``rtc.Room`` with no connection)
and, for the simulation, the transport's byte stream (a paired in-memory transport
carrying the real protobuf messages).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from livekit import rtc
from livekit.agents import AgentSession, CloseReason
from livekit.agents.job import JobContext
from livekit.agents.simulation import SimulationDispatch
from livekit.agents.testing import fake_job_context
from livekit.agents.types import ATTRIBUTE_SIMULATOR, ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob, SettingError, injected, on_session_end, read_trace
from agent_runtime.runtimes.avatar import route_of
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from examples import agent

ENV = ("AGENT_STT", "AGENT_LLM", "AGENT_TTS", "AGENT_AVATAR", "AGENT_TRACE")
SCRIPTED = "agent_runtime.testing.scripted_avatar:ScriptedAvatar"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


class Job:
    """A job in a connected in-memory room on a virtual clock."""

    def __init__(self, *participants: tuple[str, dict[str, str]]) -> None:
        self.clock = VirtualClock()
        self.room = InMemoryRoom(name="example-room", clock=self.clock)
        self.room.connect_locally()
        for identity, attributes in participants:
            self.room.add_participant(identity, attributes=attributes)

    @property
    def parts(self) -> AgentJob:
        job = AgentJob.for_job(self.ctx)
        assert job is not None, "the entrypoint built no AgentJob"
        return job

    async def run(self, transport: InMemorySessionTransport | None = None) -> None:
        """The example's entrypoint, unchanged, on this room's virtual clock."""
        parts: dict[str, Any] = {"clock": self.clock}
        if transport is not None:
            parts["transport"] = transport
        with injected(**parts):
            await agent.entrypoint(self.ctx)

    def __enter__(self) -> Job:
        self._cm = fake_job_context(room=self.room)
        self.ctx: JobContext = self._cm.__enter__()
        self.baseline = self.room.listener_count()  # the JobContext's own listener
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            assert AgentJob.for_job(self.ctx) is None, "the job outlived its close"
        self._cm.__exit__(*exc)
        self.ctx._tempdir.cleanup()  # upstream's job cleanup would; a fake job does not

    @staticmethod
    async def closed(parts: AgentJob) -> None:
        await asyncio.wait_for(parts.wait_closed(), 5)
        await settle()


def close_event(session: AgentSession[Any]) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    session.once("close", lambda ev: fut.done() or fut.set_result(ev))
    return fut


def test_the_server_registers_the_entrypoint_and_both_hooks() -> None:
    server = agent.server
    assert server._entrypoint_fnc is agent.entrypoint
    assert server._session_end_fnc is on_session_end
    assert server._simulation_end_fnc is agent.record_verdict
    # upstream's bound on on_session_end leaves room for the runtime's hold and close
    assert server._session_end_timeout > agent.SESSION_END_TIMEOUT + agent.CLOSE_TIMEOUT


async def test_user_linked_then_leaving_closes_the_session_and_the_job(tmp_path: Path) -> None:
    with Job(("user", {})) as job, pytest.MonkeyPatch.context() as mp:
        # a directory per job: made as the job opens its trace (it failed every call)
        mp.setenv("AGENT_TRACE", str(tmp_path / "traces" / "{job_id}" / "{room}.jsonl"))
        await job.run()
        await settle()
        parts = job.parts
        assert parts.link.state == "linked" and parts.link.linked_identity == "user"
        assert parts.session.room_io.linked_participant is not None
        assert parts.session.room_io.linked_participant.identity == "user"
        assert (parts.job.state, parts.job.host_state) == ("serving", "attached")
        assert route_of(parts.session) == "room" and parts.avatar is None

        await job.clock.advance(10)
        job.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        await job.closed(parts)
        assert parts.close_reason == "participant_disconnected"
        assert parts.closed_at == 10.0 and not job.room.isconnected()
        # upstream then calls on_session_end: nothing left to hold, it returns at once
        await asyncio.wait_for(agent.server._session_end_fnc(job.ctx), 5)
        assert AgentJob.for_job(job.ctx) is None
        assert job.room.listener_count() == job.baseline
        assert parts.link.state == "closed"

    # one file per job, closed with it
    trace = read_trace(tmp_path / "traces" / "fake-job" / "example-room.jsonl")
    path = {(r.machine, r.dest) for r in trace if r.kind == "transition"}
    assert {("participant", "linked"), ("participant", "closing"), ("job", "closed")} <= path
    assert ("session_host", "closed") in path


async def test_a_user_who_drops_is_given_the_grace_period() -> None:
    with Job(("user", {})) as job:
        await job.run()
        await settle()
        parts = job.parts
        job.room.remove_participant("user", rtc.DisconnectReason.CONNECTION_TIMEOUT)
        await job.clock.advance(14.9)
        assert parts.link.state == "grace" and parts.job.state == "serving"
        assert job.room.isconnected()
        await job.clock.advance(0.1)
        await job.closed(parts)
        assert parts.close_reason == "participant_disconnected"
        assert parts.closed_at == pytest.approx(15.0)
        await agent.server._session_end_fnc(job.ctx)


DISPATCH = SimulationDispatch(simulation_run_id="run-ex", job_id="simjob-ex")


@pytest.mark.parametrize(
    ("close_reason", "veto"),
    [(CloseReason.USER_INITIATED, None), (CloseReason.ERROR, "the session ended in an error")],
)
async def test_agent_hangs_up_in_a_simulation_and_its_verdict_reaches_the_simulator(
    close_reason: CloseReason, veto: str | None
) -> None:
    # the simulator's end: its requests come from the participant "simulator"
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    with Job(("simulator", {ATTRIBUTE_SIMULATOR: "1"})) as job:
        # what the dispatch and the job runner put on a simulated job
        job.ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(DISPATCH)
        job.ctx._simulation_end_fnc = agent.server._simulation_end_fnc
        await job.run(agent_end)
        await settle()
        parts = job.parts
        assert parts.link.linked_identity == "simulator"
        closed = close_event(parts.session)
        # the agent hangs up (an end-call tool's shutdown), or its session fails; the SDK's
        # own close path either way
        parts.session._close_soon(reason=close_reason)
        await asyncio.wait_for(closed, 5)
        await settle()
        assert parts.job.state == "awaiting_finalize"  # held for the simulator

        hook = asyncio.create_task(agent.server._session_end_fnc(job.ctx))
        await job.clock.advance(12)
        assert not hook.done() and job.room.isconnected()
        remote = RemoteSession(sim_end)
        await remote.start()
        fin = await remote.finalize_simulation(provisional_success=True)
        await asyncio.wait_for(hook, 5)  # returns once the verdict is out
        if veto is None:
            assert not fin.HasField("user_verdict")  # the simulator's verdict stands
        else:
            assert (fin.user_verdict.success, fin.user_verdict.reason) == (False, veto)
        assert parts.job.state == "closed" and parts.closed_at == 12.0
        assert not job.room.isconnected()
        await remote.aclose()


async def test_an_avatar_that_never_joins_leaves_the_agent_on_room_audio() -> None:
    with Job(("user", {})) as job, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENT_AVATAR", SCRIPTED)
        await job.run()
        await settle()
        parts = job.parts
        assert parts.avatar is not None and isinstance(parts.avatar.avatar, ScriptedAvatar)
        assert parts.avatar.state == "routing" and route_of(parts.session) == "avatar"
        await job.clock.advance(30)  # the lifecycle's default join timeout
        assert parts.avatar.state == "restored" and route_of(parts.session) == "room"

        job.room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        await job.closed(parts)
        assert parts.avatar.state == "closed"
        await agent.server._session_end_fnc(job.ctx)
        assert job.room.listener_count() == job.baseline


def test_settings_from_the_environment() -> None:
    s = agent.settings_from(
        {"AGENT_LLM": "openai/gpt-4.1-mini", "AGENT_AVATAR": "bey", "AGENT_TRACE": " "}
    )
    assert s["AGENT_LLM"] == "openai/gpt-4.1-mini" and s["AGENT_STT"] is None
    assert s["AGENT_AVATAR"] == "livekit.plugins.bey:AvatarSession" and s["AGENT_TRACE"] is None
    assert set(agent.settings_from({}).values()) == {None}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AGENT_AVATAR": "tavus"}, "AGENT_AVATAR='tavus': give one of"),
        ({"AGENT_AVATAR": ":factory"}, "package.module:factory"),
    ],
)
def test_malformed_settings_are_refused_naming_the_variable(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        agent.settings_from(env)


def test_an_avatar_factory_must_load_and_make_an_avatar_session() -> None:
    assert isinstance(agent.load_avatar(SCRIPTED), ScriptedAvatar)
    with pytest.raises(ValueError, match="cannot load it"):
        agent.load_avatar("no_such_module_here:AvatarSession")
    with pytest.raises(ValueError, match="cannot load it"):
        agent.load_avatar("agent_runtime.testing.scripted_avatar:NoSuchThing")
    with pytest.raises(TypeError, match="made a dict, not an AvatarSession"):
        agent.load_avatar("builtins:dict")


async def test_an_unwritable_trace_path_fails_the_job_before_anything_starts(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-file").write_text("")  # a directory that cannot be made
    with Job(("user", {})) as job, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENT_TRACE", str(tmp_path / "a-file" / "{room}.jsonl"))
        with pytest.raises(SettingError, match=r"trace_path: cannot write the trace to .*/a-file/"):
            await job.run()
        assert AgentJob.for_job(job.ctx) is None
        assert job.room.listener_count() == job.baseline and job.room.isconnected()
        mp.setenv("AGENT_TRACE", str(tmp_path / "{call}.jsonl"))
        with pytest.raises(SettingError, match=r"trace_path: only \{job_id\} and \{room\}"):
            await job.run()
        assert AgentJob.for_job(job.ctx) is None and job.room.listener_count() == job.baseline


async def test_a_simulated_run_with_a_joined_avatar_is_not_vetoed() -> None:
    """The avatar goes with the session, so by the verdict the route is torn down: the
    verdict looks at where the audio went while the session was live."""
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    with Job(("simulator", {ATTRIBUTE_SIMULATOR: "1"})) as job, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENT_AVATAR", SCRIPTED)
        job.ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(DISPATCH)
        job.ctx._simulation_end_fnc = agent.server._simulation_end_fnc
        await job.run(agent_end)
        parts = job.parts
        job.room.add_participant("avatar", kind="agent")
        job.room.publish_track("avatar", "video")
        await settle()
        assert parts.states["avatar"] == "joined" and parts.live_audio_route == "avatar"
        parts.session._close_soon(reason=CloseReason.USER_INITIATED)  # the agent hangs up
        await settle()
        assert parts.audio_route() == "none" and parts.live_audio_route == "avatar"
        hook = asyncio.create_task(agent.server._session_end_fnc(job.ctx))
        remote = RemoteSession(sim_end)
        await remote.start()
        fin = await remote.finalize_simulation(provisional_success=True)
        await asyncio.wait_for(hook, 5)
        assert not fin.HasField("user_verdict")  # no veto: the simulator's verdict stands
        await remote.aclose()
