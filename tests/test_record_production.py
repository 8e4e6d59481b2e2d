"""``agent-runtime record`` on production traces: the example agent's own entrypoint
(livekit's job context, the in-memory room, the scripted avatar standing in for the plugin,
livekit's ``RemoteSession`` as the simulator) on the virtual clock, traced as a deployed
job is (``AGENT_TRACE``), then recorded and checked (``--check`` runs the rebuilt scenario
on a loop of its own: from a thread here)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from livekit import rtc
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import read_trace
from agent_runtime.testing.clock import settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.tools.cli import main
from examples import agent
from tests.test_record import comments


async def record_check(trace: Path, recorded: Path) -> int:
    """``agent-runtime record TRACE -o RECORDED --check``, on a loop of its own (a thread)."""
    return await asyncio.to_thread(main, ["record", str(trace), "-o", str(recorded), "--check"])


@pytest.fixture
def example_env() -> Iterator[None]:
    keep = {k: os.environ.get(k) for k in ("AGENT_TRACE", "AGENT_AVATAR")}
    yield
    for k, v in keep.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


async def test_a_production_trace_of_the_example_agent_round_trips(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    simulator: RemoteSession,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = run_entrypoint.clock
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ["AGENT_AVATAR"] = "agent_runtime.testing.scripted_avatar:ScriptedAvatar"
    agent_room.add_participant("user")
    agent_room.add_participant("simulator", attributes={ATTRIBUTE_SIMULATOR: "1"})
    avatar = ScriptedAvatar(avatar_identity="avatar-7", clock=clock)
    job = await run_entrypoint(agent.server, simulation=True, avatar=avatar)
    await clock.advance(2)
    agent_room.add_participant("avatar-7", kind="agent")
    await clock.advance(0.5)
    agent_room.publish_track("avatar-7", "video")
    await clock.advance(3)
    agent_room.remove_participant("user", rtc.DisconnectReason.SIGNAL_CLOSE)
    await clock.advance(5)
    agent_room.add_participant("user")
    await clock.advance(5)
    job.session.shutdown()  # the agent hangs up
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()
    await clock.advance(7)
    await simulator.finalize_simulation(provisional_success=True)
    await held
    await settle()  # the job's own teardown releases what followed the room
    assert job.states == {
        "job": "closed",
        "session_host": "closed",
        "participant": "closed",
        "avatar": "closed",
        "playout": "closed",  # composed by default with an avatar
        "finalize": "closed",
        "room_deletion": "allowed",
        "session": "closed",
        "agent_job": "closed",
    }
    trace, recorded = tmp_path / "test-job.jsonl", tmp_path / "incident.yaml"
    assert "input" not in {r.kind for r in read_trace(trace)}  # a production trace

    assert await record_check(trace, recorded) == 0
    err = capsys.readouterr().err
    assert "reproduces the trace: every machine ends in the same state" in err
    steps = [line for line in recorded.read_text().splitlines() if "{at:" in line]
    assert steps == [
        "  - {at: 0.0, event: avatar.start}",
        "  - {at: 0.0, event: session.start}",
        "  - {at: 2.0, event: participant_connected, identity: avatar-7, kind: agent}",
        "  - {at: 2.5, event: track_published, identity: avatar-7, kind: video}",
        "  - {at: 5.5, event: participant_disconnected, identity: user, reason: SIGNAL_CLOSE}",
        "  - {at: 10.5, event: participant_connected, identity: user}",
        "  - {at: 15.5, event: session.close, reason: user_initiated}",
        "  - {at: 15.5, event: job.shutdown, reason: session ended}",
        "  - {at: 22.5, event: session_request, caller: simulator, request: "
        "finalize_simulation, payload: {provisional_success: true}}",
        "  - {at: 22.5, event: end}",
    ]
    # the avatar removed at the close, the room disconnected by the job: consequences
    assert "PARTICIPANT_REMOVED" not in recorded.read_text()
    assert "room.disconnected" not in recorded.read_text()


async def _silence(seconds: float) -> AsyncIterator[rtc.AudioFrame]:
    """``seconds`` of real audio frames (10 ms of silence each), as a TTS would push."""
    for _ in range(round(seconds * 100)):
        yield rtc.AudioFrame(b"\0\0" * 240, 24000, 1, 240)


@pytest.mark.virtual_time  # livekit's own bounds on the speech's end pass with the clock
@pytest.mark.parametrize("abort", ["job shutdown", "room gone", "user leaves"])
async def test_a_job_aborted_while_the_agent_speaks_through_the_avatar_is_reproduced(
    abort: str,
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example agent speaks 8 s through its joined avatar; 3 s in the job ends under
    it. The speech is rebuilt from what the playout machine followed (said at t=3, 8 s
    handed to the avatar); its interruption and the avatar's clear follow from the close
    (no step of their own), and ``--check`` reproduces every machine's transitions."""
    clock = run_entrypoint.clock
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ["AGENT_AVATAR"] = "agent_runtime.testing.scripted_avatar:ScriptedAvatar"
    agent_room.add_participant("user")
    avatar = ScriptedAvatar(avatar_identity="avatar-7", clock=clock)
    job = await run_entrypoint(agent.server, avatar=avatar)
    await clock.advance(1)
    agent_room.add_participant("avatar-7", kind="agent")
    await clock.advance(0.5)
    agent_room.publish_track("avatar-7", "video")
    await clock.advance(1.5)
    job.session.say("a long answer", audio=_silence(8))
    await clock.advance(3)
    assert job.states["playout"] == "remote_playout"  # the avatar is playing it
    if abort == "job shutdown":
        await run_entrypoint.session_end()
    elif abort == "room gone":
        agent_room.disconnect_locally(rtc.DisconnectReason.ROOM_DELETED)
    else:
        agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")
    await settle()
    trace, recorded = tmp_path / "test-job.jsonl", tmp_path / "incident.yaml"
    interrupted = [r for r in read_trace(trace) if r.event in ("interrupted", "interrupt")]
    assert {(r.machine, r.t) for r in interrupted} == {("playout", 6.0), ("avatar", 6.0)}

    assert await record_check(trace, recorded) == 0, capsys.readouterr().err
    assert "reproduces the trace" in capsys.readouterr().err
    steps = [
        s for s in load_scenario(recorded).steps if s.event in ("agent.say", "session.interrupt")
    ]
    assert [(s.at, s.event, getattr(s, "duration", None)) for s in steps] == [
        (3.0, "agent.say", 8.0)
    ]


async def test_an_avatar_join_seen_with_its_video_is_named_as_not_reproducible(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The avatar joined and published at one instant, and its machine saw both at once
    (``has_video`` true on the join). A scenario applies one step at a time, so the run
    reaches ``joined`` on the video instead: ``--check`` says so, the file says why."""
    clock = run_entrypoint.clock
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ["AGENT_AVATAR"] = "agent_runtime.testing.scripted_avatar:ScriptedAvatar"
    agent_room.add_participant("user")
    job = await run_entrypoint(
        agent.server, avatar=ScriptedAvatar(avatar_identity="a", clock=clock)
    )
    agent_room.add_participant("a", kind="agent")
    agent_room.publish_track("a", "video")
    await clock.advance(1)
    assert job.states["avatar"] == "joined"
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")

    recorded = tmp_path / "incident.yaml"
    assert await record_check(tmp_path / "test-job.jsonl", recorded) == 1
    err = capsys.readouterr().err
    assert (
        "avatar: transition 3 differs: trace routing -> joined on avatar_connected, "
        "run routing -> routing on avatar_connected"
    ) in err
    assert "the avatar machine saw a's join with its video already published" in comments(recorded)


async def test_a_simulator_that_gained_its_attribute_after_joining_still_gets_the_verdict(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    simulator: RemoteSession,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The simulator joins as a plain participant and is given ``lk.simulator`` later: no
    machine handles that change, so the trace does not hold it. Its finalize was answered
    as the simulator's, so the rebuilt scenario gives it the attribute right after its join
    (the job then holds for it, as it did) and says so."""
    clock = run_entrypoint.clock
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ.pop("AGENT_AVATAR", None)
    agent_room.add_participant("user")
    job = await run_entrypoint(agent.server, simulation=True)
    await clock.advance(1)
    agent_room.add_participant("simulator")
    await clock.advance(1)
    agent_room.set_participant_attributes("simulator", {ATTRIBUTE_SIMULATOR: "1"})
    await clock.advance(1)
    job.session.shutdown()
    await run_entrypoint.wait_for("job", "awaiting_finalize")
    held = run_entrypoint.session_end()
    await clock.advance(2)
    await simulator.finalize_simulation(provisional_success=True)
    await held
    assert job.states["finalize"] == "closed" and job.finalize_answered

    recorded = tmp_path / "incident.yaml"
    assert await record_check(tmp_path / "test-job.jsonl", recorded) == 0, capsys.readouterr().err
    steps = [line for line in recorded.read_text().splitlines() if "{at:" in line]
    assert steps[1:3] == [
        "  - {at: 1.0, event: participant_connected, identity: simulator}",
        "  - {at: 1.0, event: attributes_changed, identity: simulator, attributes: "
        "{lk.simulator: 'true'}}",
    ]
    assert "caller: simulator, request: finalize_simulation" in steps[-2]
    assert (
        "simulator sent finalize_simulation as the simulator; the trace does not show it "
        "gaining lk.simulator, so it carries it from t=1"
    ) in comments(recorded)


async def test_a_deletion_the_agent_asked_for_itself_is_a_step_and_reproduced(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An end-call tool asks for the room's deletion mid-session (``request_room_deletion``);
    ``delete_room_on_close`` is off. It is the step ``job.request_room_deletion`` at its
    time, not ``delete_room_on_close`` (whose request would come at the close instead).
    No step did that: ``--check`` failed on every trace of an agent with such a tool."""
    clock = run_entrypoint.clock
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ.pop("AGENT_AVATAR", None)
    agent_room.add_participant("user")
    job = await run_entrypoint(agent.server)
    await clock.advance(2)
    job.request_room_deletion()
    await clock.advance(2)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")
    assert job.states["room_deletion"] == "deleted"

    recorded = tmp_path / "incident.yaml"
    assert await record_check(tmp_path / "test-job.jsonl", recorded) == 0, capsys.readouterr()
    scenario = load_scenario(recorded)
    assert [(s.at, s.event) for s in scenario.steps][:2] == [
        (0, "session.start"),
        (2, "job.request_room_deletion"),
    ]
    assert "delete_room_on_close" not in scenario.config.model_fields_set
    assert "request_room_deletion" not in comments(recorded)


async def test_a_job_aborted_by_its_code_is_recorded_and_reproduced(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``job.aclose(graceful=False)``: ``aclose()`` closes the room deletion after the
    lifecycle, and the job's trace file closes with the lifecycle; ``--check`` found the
    trace ending in ``allowed`` and the rebuilt file failed its own ``expect``."""
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    agent_room.add_participant("user")
    job = await run_entrypoint(agent.server)
    await run_entrypoint.clock.advance(5)
    await job.aclose(graceful=False)
    await run_entrypoint.wait_ended()
    trace, recorded = tmp_path / "test-job.jsonl", tmp_path / "incident.yaml"
    assert await record_check(trace, recorded) == 0, capsys.readouterr().err
    assert "room deletion's close by aclose()" in comments(recorded)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["simulate", str(recorded)]) == 0
    assert "all held" in capsys.readouterr().out


async def test_a_plugin_start_that_returned_without_a_route_is_recorded_and_reproduced(
    tmp_path: Path,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    example_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A plugin that catches its provider's error and returns with no route (simli on a
    401, at once): the start was rebuilt as a plain ``avatar.start``, whose scripted
    avatar routes, so ``--check`` of the job's own trace said it does not reproduce."""
    os.environ["AGENT_TRACE"] = str(tmp_path / "{job_id}.jsonl")
    os.environ["AGENT_AVATAR"] = "agent_runtime.testing.scripted_avatar:ScriptedAvatar"
    agent_room.add_participant("user")
    quiet = ScriptedAvatar(avatar_identity="a", swallow_error=True)
    job = await run_entrypoint(agent.server, avatar=quiet)
    assert job.states["avatar"] == "restored"
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_for("job", "closed")

    trace, recorded = tmp_path / "test-job.jsonl", tmp_path / "incident.yaml"
    assert await record_check(trace, recorded) == 0, capsys.readouterr().err
    ends = [(s.at, getattr(s, "result", None)) for s in load_scenario(recorded).steps]
    assert (0.0, "no_route") in ends
