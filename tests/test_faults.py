"""Whatever user code, a trace sink or a listener does, the machines keep going; every
option is checked before anything is touched; operators see every failure (issue 26).

One test per observation of the issue, each run through a whole ``AgentJob`` as a user
builds it. Real: livekit's fake ``JobContext``, ``AgentSession`` with its RoomIO, every
machine's runtime, the scripted avatar plugin (an ``AvatarSession`` doing what the published
plugins do), livekit's ``RemoteSession`` as the simulator. Faked, because they need a
server: the room (``InMemoryRoom``, a real ``rtc.Room`` with no connection) and the
transport's byte stream (a paired in-memory transport carrying the real protobuf messages).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.job import JobContext
from livekit.agents.simulation import SimulationContext, SimulationDispatch
from livekit.agents.types import ATTRIBUTE_SIMULATOR, ATTRIBUTE_SIMULATOR_DISPATCH
from livekit.agents.voice.remote_session import RemoteSession

from agent_runtime import AgentJob, MemorySink, SettingError, Tracer, TraceRecord, injected
from agent_runtime.actor import Actor, Event, StateChanged
from agent_runtime.settings import AvatarRetry, SettingTypeError
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from statemachines import Effect, MachineSpec, State, cells, row

DISPATCH = SimulationDispatch(simulation_run_id="run-26", job_id="simjob-26")
SIM = {ATTRIBUTE_SIMULATOR: "1"}


ROOM = "faults-room"  # the room the fixtures build (tests/conftest.py)


def _fds_open_on(path: Path) -> list[str]:
    """This process's file descriptors open on ``path`` (Linux: /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                out.append(fd)
        except OSError:
            continue
    return out


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level]


async def _user_leaves_and_job_closes(
    job: AgentJob, room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    await clock.advance(job.settings.close_timeout)
    assert job.states["job"] == "closed"
    # bounded in real time as a guard against the hang the issue saw; virtual time inside
    await asyncio.wait_for(job.aclose(), 5)


# -- 1. nothing is touched before every option passed ---------------------------------------


class _BadStartOptions(ScriptedAvatar):
    """A plugin whose factory runs at construction; ``start()`` takes no ``x``."""


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"clock": "bogus"}, id="clock"),
        pytest.param(
            {"avatar": _BadStartOptions, "avatar_start_options": {"x": 1}},
            id="factory-built-avatar-start-options",
        ),
    ],
)
async def test_a_refused_job_leaves_an_existing_trace_file_untouched_and_closed(
    room: InMemoryRoom, tmp_path: Path, bad: dict[str, Any]
) -> None:
    path = tmp_path / "incident.jsonl"
    path.write_text('{"the": "evidence of yesterday"}\n')
    listeners = room.listener_count()
    with pytest.raises((SettingError, TypeError)):
        AgentJob(room=room, session=AgentSession(), trace_path=path, **bad)
    assert path.read_text() == '{"the": "evidence of yesterday"}\n'
    assert _fds_open_on(path) == []
    assert room.listener_count() == listeners


# -- 2. a sink whose `active` raises; clock and tracer checked ---------------------------------


class _ActiveRaises:
    def __init__(self) -> None:
        self.asked = 0

    @property
    def active(self) -> bool:
        self.asked += 1
        raise RuntimeError("active exploded")

    def write(self, record: TraceRecord) -> None:
        raise AssertionError("never written: it said nothing")


async def test_a_sink_whose_active_raises_is_dropped_and_the_user_is_linked(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    bad, kept = _ActiveRaises(), MemorySink()
    room.add_participant("user")
    job = AgentJob(
        room=room, session=AgentSession(), clock=clock, tracer=Tracer(bad, kept), otel=False
    )
    with caplog.at_level(logging.INFO):
        await job.start(Agent(instructions="agent"))
        await settle()
        assert job.states["participant"] == "linked"
        await _user_leaves_and_job_closes(job, room, clock)
    assert bad.asked == 1  # asked once, then dropped
    failed = [r for r in _records(caplog, logging.WARNING) if "active exploded" in r.getMessage()]
    assert len(failed) == 1
    # the other sink kept every record, the job's close included
    assert any(r.machine == "job" and r.dest == "closed" for r in kept.records)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("clock", "bogus", "clock must be a Clock (with now, call_later, sleep and wait_for)"),
        ("tracer", "bogus", "tracer must be an agent_runtime Tracer"),
        ("trace_path", 123, "trace_path must be a file path (a str or an os.PathLike), not int"),
        ("trace_path", b"/nonexistent-dir/t.jsonl", "trace_path must be a file path"),
        ("transport", "bogus", "transport must be a livekit SessionTransport, not str"),
        ("simulation", "bogus", "simulation must be a livekit SimulationContext or"),
        ("on_simulation_end", "bogus", "on_simulation_end must be callable as"),
        ("delete_room", "bogus", "delete_room must be an async callable"),
        ("remove_avatar_participant", 3, "remove_avatar_participant must be an async callable"),
        ("otel", "yes", "otel must be True, False or an OtelSink, not str"),
        ("otel", None, "otel must be True, False or an OtelSink, not NoneType"),
        ("on_reprompt", 1, "on_reprompt must be callable as on_reprompt(session, attempt)"),
    ],
)
async def test_each_part_of_the_wrong_type_is_refused_naming_it(
    room: InMemoryRoom, tmp_path: Path, option: str, value: Any, message: str
) -> None:
    listeners = room.listener_count()
    path = tmp_path / "t.jsonl"
    others = {} if option == "trace_path" else {"trace_path": path}
    with pytest.raises(SettingTypeError) as e:
        AgentJob(room=room, session=AgentSession(), **others, **{option: value})
    assert str(e.value).startswith(message)
    assert isinstance(e.value, TypeError)  # as Python's own type errors
    assert not path.exists() and room.listener_count() == listeners


# -- 3. CancelledError from a listener or a sink ----------------------------------------------


def _raise_cancelled(*_: Any) -> None:
    raise asyncio.CancelledError()


class _WriteCancels:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, record: TraceRecord) -> None:
        self.writes += 1
        raise asyncio.CancelledError()


@pytest.mark.parametrize(
    "where", ["job-listener", "machine-listener", "closed-listener", "sink", "otel-parent"]
)
async def test_cancelled_error_from_observation_never_stops_a_machine(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    from agent_runtime import OtelSink

    room.add_participant("user")
    sink = _WriteCancels()
    calls: list[str] = []

    def listener(*_: Any) -> None:
        calls.append("called")
        raise asyncio.CancelledError()

    otel: Any = False
    if where == "otel-parent":
        otel = OtelSink(parent=lambda: _raise_cancelled())  # type: ignore[func-returns-value]
    job = AgentJob(
        room=room,
        session=AgentSession(),
        clock=clock,
        tracer=Tracer(sink) if where == "sink" else None,
        otel=otel,
    )
    if where == "job-listener":
        job.on("state_changed", listener)
    elif where == "machine-listener":
        job.link.actor.on("state_changed", listener)
    elif where == "closed-listener":
        job.job.actor.on("closed", listener)
        job.on("closed", listener)
    with caplog.at_level(logging.INFO):
        await job.start(Agent(instructions="agent"))
        await settle()
        assert job.states["participant"] == "linked"
        # the user's departure reaches the machines and the job closes
        await _user_leaves_and_job_closes(job, room, clock)
    assert job.states["participant"] == "closed"
    if where == "sink":
        assert sink.writes == 1  # dropped at its first failure
    elif where != "otel-parent":
        assert calls == ["called"] if where != "closed-listener" else len(calls) == 2
    failures = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and "CancelledError" in r.getMessage()
    ]
    # once per listener or sink: a listener removed is ERROR (a callback of the user's lost),
    # a sink or OTel disabled is WARNING (a trace lost)
    level = logging.WARNING if where in ("sink", "otel-parent") else logging.ERROR
    assert [r.levelno for r in failures] == [level] * (2 if where == "closed-listener" else 1)
    assert "Exception in callback" not in caplog.text


# -- 4. the log policy: what an operator sees --------------------------------------------------


class _Unauthorized(RuntimeError):
    pass


def _fields(rec: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(rec, k, None) for k in ("job_id", "room", "machine", "state", "event")}


async def test_a_provider_401_at_avatar_start_is_a_warning_naming_job_machine_and_cause(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    avatar = ScriptedAvatar(start_error=_Unauthorized("HTTP 401: invalid API key"))
    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), avatar=avatar)
    with caplog.at_level(logging.DEBUG):
        await job.start(Agent(instructions="agent"))
        await settle()
    assert job.states["avatar"] == "restored"
    warnings = [r for r in _records(caplog, logging.WARNING) if "401" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    rec = warnings[0]
    assert "fake-job" in rec.getMessage() and "avatar" in rec.getMessage()
    assert _fields(rec) == {
        "job_id": "fake-job",
        "room": "faults-room",
        "machine": "avatar",
        "state": "starting",
        "event": "start",
    }
    # the consequence for the user, once: the agent is on room audio
    heard = [r for r in _records(caplog, logging.WARNING) if "room audio" in r.getMessage()]
    assert len(heard) == 1 and getattr(heard[0], "machine", None) == "avatar"
    await job.aclose(graceful=False)


async def test_a_retry_policy_that_fails_every_attempt_warns_each_time_and_when_it_gives_up(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    avatar = ScriptedAvatar(start_error="HTTP 503")
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=avatar,
        clock=clock,
        otel=False,
        retry_avatar=AvatarRetry(attempts=100),
    )
    with caplog.at_level(logging.INFO):
        await job.start(Agent(instructions="agent"))
        for _ in range(101):
            await settle()
            await clock.advance(30)
        await settle()
    assert avatar.start_calls == 101 and job.states["avatar"] == "restored"
    warned = [r for r in _records(caplog, logging.WARNING) if "HTTP 503" in r.getMessage()]
    assert len(warned) == 101
    gave_up = [r for r in _records(caplog, logging.WARNING) if "gave up" in r.getMessage()]
    assert len(gave_up) == 1 and "101" in gave_up[0].getMessage()
    await job.aclose(graceful=False)


async def test_a_verdict_lost_to_the_hold_s_end_is_a_warning_and_the_close_stays_info(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    room.add_participant("simulator", attributes=SIM)
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))

    async def hangs(_: SimulationContext) -> None:
        await asyncio.get_running_loop().create_future()

    ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(DISPATCH)
    ctx._simulation_end_fnc = hangs
    with injected(clock=clock, transport=agent_end):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), session_end_timeout=60)
    await job.start(Agent(instructions="agent"))
    await settle()
    remote = RemoteSession(sim_end)
    await remote.start()
    with caplog.at_level(logging.DEBUG):
        job.shutdown("done")
        asking = asyncio.ensure_future(remote.finalize_simulation(provisional_success=True))
        await settle()
        await clock.advance(60)  # the hold ends with on_simulation_end still running
        await clock.advance(job.settings.close_timeout)
        await settle()
    assert job.states["job"] == "closed" and job.verdict is None
    lost = [r for r in _records(caplog, logging.WARNING) if "verdict" in r.getMessage()]
    assert len(lost) == 1, [(r.levelname, r.getMessage()) for r in caplog.records]
    assert _fields(lost[0])["job_id"] == "fake-job" and _fields(lost[0])["room"] == "faults-room"
    assert "session_end_timeout" in lost[0].getMessage()
    closed = [r for r in caplog.records if r.getMessage().startswith("job closed")]
    assert [r.levelno for r in closed] == [logging.INFO]
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)
    await remote.aclose()
    await job.aclose()


async def test_expected_lifecycle_transitions_log_nothing_above_info(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    with caplog.at_level(logging.DEBUG, logger="agent_runtime"):
        await job.start(Agent(instructions="agent"))
        await settle()
        await _user_leaves_and_job_closes(job, room, clock)
    runtime = [r for r in caplog.records if r.name.startswith("agent_runtime")]
    assert runtime and max(r.levelno for r in runtime) <= logging.INFO


# -- 6. a plugin start() raising CancelledError -------------------------------------------------


async def test_a_plugin_start_raising_cancelled_error_is_a_failure_at_once(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    avatar = ScriptedAvatar(start_error=asyncio.CancelledError())
    job = AgentJob(room=room, session=AgentSession(), avatar=avatar, clock=clock, otel=False)
    with caplog.at_level(logging.INFO):
        # bounded in real time: before the fix this waited for virtual seconds that never pass
        await asyncio.wait_for(job.start(Agent(instructions="agent")), 5)
        await settle()
    # no virtual second passed: not taken as start_timeout after join_timeout
    assert job.states["avatar"] == "restored" and clock.now() == 0
    assert job.audio_route() == "room"
    warned = [r for r in _records(caplog, logging.WARNING) if "CancelledError" in r.getMessage()]
    assert len(warned) == 1 and getattr(warned[0], "machine", None) == "avatar"
    await job.aclose(graceful=False)


# -- 6b. a plugin's aclose() that hangs or raises CancelledError; a retry's release --------------


class _CloseHangs(ScriptedAvatar):
    """A plugin whose aclose() never returns (its provider's teardown call hangs)."""

    async def aclose(self) -> None:
        await asyncio.get_running_loop().create_future()


class _CloseRaisesCancelled(ScriptedAvatar):
    """A plugin whose aclose() raises CancelledError of its own (nothing cancelled it)."""

    async def aclose(self) -> None:
        raise asyncio.CancelledError


class _SlowClose(ScriptedAvatar):
    """A plugin whose start() takes 1 s and whose aclose() takes ``close_takes`` seconds
    (None: it never returns); records when each start() began and how it ended."""

    def __init__(self, clock: VirtualClock, close_takes: float | None) -> None:
        super().__init__(avatar_identity="av", start_delay=1.0, clock=clock)
        self.starts: list[tuple[float, str]] = []
        self.close_calls = 0
        self.closes_ended: list[float] = []  # when each aclose() returned
        self._close_takes = close_takes
        self._virtual = clock

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        began = self._virtual.now()
        try:
            await super().start(agent_session, room)
        except asyncio.CancelledError:
            self.starts.append((began, f"cut after {self._virtual.now() - began:g}s"))
            raise
        self.starts.append((began, "returned"))

    async def aclose(self) -> None:
        self.close_calls += 1
        if self._close_takes is None:
            await asyncio.get_running_loop().create_future()
        await self._virtual.sleep(self._close_takes)
        await super().aclose()
        self.closes_ended.append(self._virtual.now())


def _remover(room: InMemoryRoom, clock: VirtualClock, removed: list[tuple[float, bool]]) -> Any:
    async def remove(identity: str) -> None:
        removed.append((clock.now(), room.isconnected()))
        if identity in room.remote_participants:
            room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    return remove


@pytest.mark.parametrize(
    ("plugin", "join_timeout"),
    [(_CloseHangs, 1.0), (_CloseHangs, 30.0), (_CloseRaisesCancelled, 30.0)],
    # the close's budget is the effect's bound (join_timeout 1 s), or the avatar step's
    # share of close_timeout (1.5 s of 10 s) when that is shorter
    ids=["hangs-effect-bound", "hangs-step-share", "raises-cancelled"],
)
async def test_a_plugin_close_that_hangs_or_raises_cancelled_error_still_removes_the_avatar(
    room: InMemoryRoom,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
    plugin: type[ScriptedAvatar],
    join_timeout: float,
) -> None:
    """The avatar participant is removed (while the room is connected) whether or not the
    plugin's own aclose() returned: left in the room, it is still billed by its provider.
    The plugin's close is cut at its own bound, and the hang or the failure is a WARNING."""
    room.add_participant("user")
    removed: list[tuple[float, bool]] = []
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=plugin(avatar_identity="av"),
        clock=clock,
        otel=False,
        join_timeout=join_timeout,
        close_timeout=10,
        remove_avatar_participant=_remover(room, clock, removed),
    )
    await job.start(Agent(instructions="agent"))
    room.add_participant("av", kind="agent")
    room.publish_track("av", "video")
    await settle()
    assert job.states["avatar"] == "joined"
    with caplog.at_level(logging.INFO):
        closing = asyncio.ensure_future(job.aclose())
        await clock.advance(12)
        await settle()
    assert closing.done() and closing.exception() is None
    assert [connected for _, connected in removed] == [True]
    assert "av" not in room.remote_participants
    warned = [r for r in _records(caplog, logging.WARNING) if "aclose()" in r.getMessage()]
    assert len(warned) == 1 and getattr(warned[0], "machine", None) == "avatar"
    if plugin is _CloseHangs:
        # cut at most of the close's budget, so the removal begins in the rest
        assert removed[0][0] == pytest.approx(min(join_timeout, 1.5) * 0.9)


class _CloseFails(ScriptedAvatar):
    """A plugin whose aclose() fails: its provider's "end session" call answered an error."""

    async def aclose(self) -> None:
        await super().aclose()
        raise RuntimeError("HTTP 500: could not end the session")


@pytest.mark.parametrize("fails", ["start", "aclose"])
async def test_a_plugin_that_fails_at_its_start_or_its_close_is_one_warning_naming_the_cause(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, fails: str
) -> None:
    """A provider's failure is a fault of the run either way: one WARNING line with its
    cause, its traceback at DEBUG. The close's was a WARNING with a traceback where the
    start's was one line."""
    plugin = (
        ScriptedAvatar(avatar_identity="av", start_error="HTTP 500: could not start")
        if fails == "start"
        else _CloseFails(avatar_identity="av")
    )
    room.add_participant("user")
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock, otel=False)
    with caplog.at_level(logging.DEBUG):
        await job.start(Agent(instructions="agent"))
        await settle()
        closing = asyncio.ensure_future(job.aclose())
        await clock.advance(12)
        await settle()
    assert closing.done() and closing.exception() is None
    cause = f"Error: HTTP 500: could not {'start' if fails == 'start' else 'end'}"
    warned = [r for r in _records(caplog, logging.WARNING) if "HTTP 500" in r.getMessage()]
    assert [(cause in r.getMessage(), r.exc_info) for r in warned] == [(True, None)]
    assert getattr(warned[0], "machine", None) == "avatar"
    assert "\n" not in warned[0].getMessage()
    # the traceback's line carries the machine's fields too (the close's had none), so a
    # log filtered by job or machine keeps it
    traced = [
        r
        for r in _records(caplog, logging.DEBUG)
        if r.exc_info and "HTTP 500" in str(r.exc_info[1])
    ]
    fields = ("job_id", "room", "machine", "instance", "state")
    assert len(traced) == 1
    assert {f: getattr(traced[0], f, None) for f in fields} == {
        f: getattr(warned[0], f) for f in fields
    }


@pytest.mark.parametrize("takes", [0.8, 1.3])
async def test_a_slow_plugin_close_that_ends_within_the_avatar_step_is_not_cut(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, takes: float
) -> None:
    """At the defaults (close_timeout 10 s: the avatar step's share is 1.5 s) a plugin's
    aclose() that takes over a second (a provider's "end session" call) runs to its end,
    then the avatar participant is removed, the room still connected; nothing is warned.
    A first cut of the hang fix stopped such a close at 0.75 s."""
    room.add_participant("user")
    removed: list[tuple[float, bool]] = []
    plugin = _SlowClose(clock, close_takes=takes)
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=plugin,
        clock=clock,
        otel=False,
        remove_avatar_participant=_remover(room, clock, removed),
    )
    starting = asyncio.ensure_future(job.start(Agent(instructions="agent")))
    await clock.advance(1.5)  # the plugin's start takes 1 s
    await starting
    room.add_participant("av", kind="agent")
    room.publish_track("av", "video")
    await clock.advance(0.5)
    assert job.states["avatar"] == "joined"
    t0 = clock.now()
    with caplog.at_level(logging.INFO):
        closing = asyncio.ensure_future(job.aclose())
        await clock.advance(12)
    assert closing.done() and closing.exception() is None
    assert plugin.closes_ended == [pytest.approx(t0 + takes)]  # returned: it was not cut
    assert [(round(t - t0, 6), connected) for t, connected in removed] == [(takes, True)]
    assert not [r for r in _records(caplog, logging.WARNING) if "aclose()" in r.getMessage()]


def _retrying_job(room: InMemoryRoom, clock: VirtualClock, plugin: Any, remove: Any) -> AgentJob:
    """A job whose avatar is started again once after a failure (join_timeout 3 s)."""
    return AgentJob(
        room=room,
        session=AgentSession(),
        avatar=plugin,
        clock=clock,
        otel=False,
        join_timeout=3,
        retry_avatar=AvatarRetry(attempts=2),
        remove_avatar_participant=remove,
    )


async def _in_release(
    room: InMemoryRoom, clock: VirtualClock
) -> tuple[AgentJob, _SlowClose, list[tuple[float, bool]], list[str]]:
    """A job whose avatar's first attempt timed out (it joined without video) and whose
    release of it (a plugin close of 1 s) is under way: the job, its plugin, the removals
    and the avatar's moves from here on."""
    room.add_participant("user")
    removed: list[tuple[float, bool]] = []
    plugin = _SlowClose(clock, close_takes=1.0)
    job = _retrying_job(room, clock, plugin, _remover(room, clock, removed))
    starting = asyncio.ensure_future(job.start(Agent(instructions="agent")))
    await clock.advance(1.5)  # the plugin's start takes 1 s
    await starting
    room.add_participant("av", kind="agent")  # joins without video, never publishes
    await settle()
    await clock.advance(3.1 + 1.0 - 1.5 + 1.0 + 0.2)  # join_timeout, backoff, the release
    assert job.states["avatar"] == "releasing"
    moves: list[str] = []
    job.on("state_changed", lambda sc: moves.append(sc.dest) if sc.machine == "avatar" else None)
    return job, plugin, removed, moves


async def test_a_close_while_the_failed_attempt_is_released_ends_the_avatar_once(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The job closes while the avatar is ``releasing`` (the failed attempt's plugin close
    still running): no new attempt starts, the avatar ends ``closed``, its participant is
    removed once, and the job closes within its bound. The plugin's aclose() under way
    runs to its end (0.7 s later): the job's close waits for it rather than cutting it and
    calling aclose() again."""
    job, plugin, removed, moves = await _in_release(room, clock)
    t0 = clock.now()
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(12)
    assert closing.done() and closing.exception() is None
    assert moves == ["closed"]  # straight from releasing: nothing else in between
    assert job.states["avatar"] == "closed" and job.lifecycle == "closed"
    assert plugin.start_calls == 1  # no attempt started under the close
    assert len(removed) == 1 and "av" not in room.remote_participants
    assert plugin.close_calls == 1 and plugin.closes_ended == [pytest.approx(t0 + 0.7)]


async def test_the_old_avatar_seen_during_the_release_is_not_the_new_attempts_join(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """While the failed attempt is released, the old avatar's facts (its video, the room
    reconnecting, the avatar participant connecting) change nothing: the release runs once
    to its end, then the new attempt starts and decides on presence itself."""
    job, plugin, _removed, moves = await _in_release(room, clock)
    room.publish_track("av", "video")
    room.remove_participant("av")
    room.add_participant("av", kind="agent")
    room.reconnect_locally()
    await settle()
    assert job.states["avatar"] == "releasing" and moves == []
    await clock.advance(1.0)  # the old plugin's close ends, the old avatar is removed
    assert moves[:1] == ["starting"] and len(plugin.closes_ended) == 1
    assert plugin.start_calls == 2
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(12)
    assert closing.done()


async def test_a_release_that_outlives_join_timeout_starts_the_next_attempt_at_its_bound(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The old plugin's close hangs (cut at half of join_timeout) and the server API's
    removal is slow: at join_timeout the release gives up waiting and the next attempt's
    start begins then, not when the removal ends."""
    room.add_participant("user")
    removed: list[tuple[float, bool]] = []

    async def slow_remove(identity: str) -> None:
        removed.append((clock.now(), room.isconnected()))
        await clock.sleep(4.0)

    plugin = _CloseHangs(avatar_identity="av")
    job = _retrying_job(room, clock, plugin, slow_remove)
    moves: list[tuple[float, str]] = []
    job.on(
        "state_changed",
        lambda sc: moves.append((clock.now(), sc.dest)) if sc.machine == "avatar" else None,
    )
    await job.start(Agent(instructions="agent"))
    room.add_participant("av", kind="agent")  # joins without video, never publishes
    await settle()
    await clock.advance(3.1 + 1.0)  # join_timeout, then backoff: into the release
    began = next(t for t, state in moves if state == "releasing")
    await clock.advance(3.5)
    assert (began + 3.0, "starting") in [(pytest.approx(t), s) for t, s in moves]
    assert plugin.start_calls == 2
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(20)
    assert closing.done()


async def test_a_retry_whose_old_close_hangs_removes_the_old_avatar_and_starts_again(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """With retry_avatar, the failed attempt's release removes its avatar participant (two
    avatars never answer) and the plugin starts again, though the old plugin's aclose()
    never returns."""
    room.add_participant("user")
    removed: list[tuple[float, bool]] = []
    plugin = _CloseHangs(avatar_identity="av")
    job = _retrying_job(room, clock, plugin, _remover(room, clock, removed))
    await job.start(Agent(instructions="agent"))
    room.add_participant("av", kind="agent")  # joins without video, never publishes
    await settle()
    await clock.advance(3.1)  # join_timeout: backoff (1 s), then the release
    assert job.states["avatar"] == "backoff"
    await clock.advance(1.0 + 1.5)  # the old close cut at its bound, the avatar removed
    await settle()
    assert [t for t, _ in removed] == [5.5] and "av" not in room.remote_participants
    assert plugin.start_calls == 2 and job.states["avatar"] == "routing"
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(20)  # its close hangs again: cut at its bound
    await closing


@pytest.mark.parametrize("close_takes", [2.5, None], ids=["slow", "hangs"])
async def test_each_retry_s_start_gets_its_whole_join_timeout_after_the_release(
    room: InMemoryRoom,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
    close_takes: float | None,
) -> None:
    """The failed attempt's release (the old plugin's aclose(), 2.5 s or never returning)
    is bounded on its own, before the next attempt: each retry's start() (1 s) runs to its
    end instead of being cut by a join_timeout (3 s) the release used up, and no attempt is
    reported as a start_timeout."""
    room.add_participant("user")
    plugin = _SlowClose(clock, close_takes)
    job = _retrying_job(room, clock, plugin, lambda _: None)
    with caplog.at_level(logging.INFO):
        started = asyncio.ensure_future(job.start(Agent(instructions="agent")))
        await clock.advance(1.5)
        await started
        await clock.advance(60)  # the avatar never joins: join_timeout, then two retries
        await settle()
    assert [how for _, how in plugin.starts] == ["returned"] * 3
    assert job.states["avatar"] == "restored"
    gone = [
        r.getMessage() for r in _records(caplog, logging.WARNING) if "is gone" in r.getMessage()
    ]
    assert len(gone) == 3 and not [m for m in gone if "start_timeout" in m]
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(20)  # its close is slow again: cut at its bound
    await closing


# -- 7. durations: sane upper bounds ------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "bound"),
    [
        ("grace_period", 3600),
        ("session_close_timeout", 600),
        ("join_timeout", 600),
        ("session_end_timeout", 3600),
        ("close_timeout", 600),
    ],
)
@pytest.mark.parametrize("too_long", ["just-over", "1e308"])
async def test_a_duration_past_its_sane_bound_is_refused_naming_it(
    room: InMemoryRoom, option: str, bound: float, too_long: str
) -> None:
    value = bound + 0.5 if too_long == "just-over" else 1e308
    with pytest.raises(SettingError) as e:
        AgentJob(room=room, session=AgentSession(), **{option: value})
    assert str(e.value) == (
        f"{option}: input should be less than or equal to {bound} (got {value!r})"
    )
    # the bound itself is accepted
    job = AgentJob(room=room, session=AgentSession(), **{option: float(bound)})
    await job.aclose(graceful=False)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "initial",
            1e308,
            "retry_avatar.backoff.initial: input should be less than or equal to 600",
        ),
        ("max", 601.0, "retry_avatar.backoff.max: input should be less than or equal to 600"),
    ],
)
def test_a_backoff_past_its_sane_bound_is_refused_naming_it(
    field: str, value: float, message: str
) -> None:
    from agent_runtime.settings import job_settings

    with pytest.raises(SettingError, match=message.replace(".", r"\.")):
        job_settings(retry_avatar={"attempts": 1, "backoff": {field: value}})


# -- the actor's drain: what escapes a step never stops the mailbox -----------------------------

GATE = MachineSpec(
    name="gate",
    initial="shut",
    states=(State(name="shut"), State(name="open")),
    events=("push", "pull"),
    guards=("allowed",),
    effects=(Effect(name="swing"),),
    rows=(
        *row("shut", "push", "open", guards=["allowed"], effects=["swing"]),
        *row("shut", "push", None),
        *row("open", "pull", "shut", effects=["swing"]),
    ),
    ignore=(*cells("shut", "pull"), *cells("open", "push")),
)


@pytest.mark.parametrize("swing", ["returns", "awaits"])
async def test_a_guard_raising_cancelled_error_fails_its_event_and_the_mailbox_goes_on(
    swing: str,
) -> None:
    raising = [True]

    def allowed(_: Event) -> bool:
        if raising[0]:
            raise asyncio.CancelledError()
        return True

    async def swing_later(_: Event) -> None:
        await asyncio.sleep(0)

    actor = Actor(
        GATE,
        effects={"swing": swing_later if swing == "awaits" else (lambda _: None)},
        guards={"allowed": allowed},
        clock=VirtualClock(),
    )
    # the sender gets an error it cannot take for its own cancellation
    with pytest.raises(RuntimeError, match="handling 'push' raised CancelledError"):
        # bounded in real time: before the fix the drain died and this never returned
        await asyncio.wait_for(actor.send(Event("push")), 5)
    raising[0] = False
    await actor.send(Event("push"))
    assert actor.state == "open"
    # a fire-and-forget event whose step fails is logged; the ones behind it are handled
    raising[0] = True
    await actor.send(Event("pull"))
    actor.post(Event("push"))
    raising[0] = True
    await actor.join()
    raising[0] = False
    actor.post(Event("push"))
    await actor.join()
    assert actor.state == "open"
    await actor.aclose()


async def test_a_machine_listener_raising_cancelled_error_mid_task_drain_is_removed() -> None:
    """The drain running as a task (an effect awaited): the listener's CancelledError is
    not taken for the drain's own cancellation."""
    seen: list[str] = []

    def listener(change: StateChanged) -> None:
        seen.append(change.dest)
        raise asyncio.CancelledError()

    async def swing(_: Event) -> None:
        await asyncio.sleep(0)

    actor = Actor(GATE, effects={"swing": swing}, guards={"allowed": lambda _: True})
    actor.on("state_changed", listener)
    # bounded in real time: before the fix the drain died and this never returned
    await asyncio.wait_for(actor.send(Event("push")), 5)
    await actor.send(Event("pull"))
    await actor.send(Event("push"))
    assert actor.state == "open" and seen == ["open"]  # removed at its first failure
    await actor.aclose()


async def test_a_job_runtime_refuses_a_trace_path_of_the_wrong_type_before_opening_anything(
    room: InMemoryRoom,
) -> None:
    from agent_runtime.runtimes.job import JobRuntime

    listeners = room.listener_count()
    with pytest.raises(SettingTypeError, match="trace_path must be a file path"):
        JobRuntime(room=room, trace_path=123)  # type: ignore[arg-type]
    with pytest.raises(SettingTypeError, match="transport must be a livekit SessionTransport"):
        JobRuntime(room=room, transport="bogus")  # type: ignore[arg-type]
    assert room.listener_count() == listeners


async def test_a_job_runtime_whose_trace_file_cannot_be_written_says_so_and_subscribes_nothing(
    room: InMemoryRoom, tmp_path: Path
) -> None:
    """The same trace setup as AgentJob's (one place turns a trace path into a sink)."""
    from agent_runtime.runtimes.job import JobRuntime
    from agent_runtime.settings import SettingError

    listeners = room.listener_count()
    (tmp_path / "a-file").write_text("")
    missing = tmp_path / "a-file" / "trace.jsonl"  # a directory that cannot be made
    with pytest.raises(SettingError, match=r"trace_path: cannot write the trace to .*a-file"):
        JobRuntime(room=room, trace_path=missing)
    assert room.listener_count() == listeners and not missing.parent.is_dir()


async def test_a_trace_path_through_a_link_loop_is_refused_as_a_link_loop(
    room: InMemoryRoom, tmp_path: Path
) -> None:
    """It was refused as "[Errno 17] File exists": the directory mkdir found was the loop."""
    from agent_runtime.runtimes.job import JobRuntime
    from agent_runtime.settings import SettingError

    listeners = room.listener_count()
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "self.jsonl").symlink_to("self.jsonl")  # its warning said no file was written
    for path, loop in (("loop/x.jsonl", "loop"), ("loop/a/x.jsonl", "loop"), ("self.jsonl",) * 2):
        with pytest.raises(SettingError) as refused:
            JobRuntime(room=room, trace_path=tmp_path / path)
        assert str(refused.value) == (
            f"trace_path: cannot write the trace to {str(tmp_path / path)!r}: "
            f"{str(tmp_path / loop)!r} is a symbolic link loop"
        )
    assert room.listener_count() == listeners


# -- 9. the room's own disconnect fails or hangs -------------------------------------------------


class _DisconnectFails(InMemoryRoom):
    """A room whose ``disconnect()`` fails (the SDK's request to its native side) or never
    returns; it stays connected, as a real room would."""

    hangs = False

    async def disconnect(self, *, reason: Any = rtc.DisconnectReason.CLIENT_INITIATED) -> None:
        if self.hangs:
            await asyncio.get_running_loop().create_future()
        raise RuntimeError("the native side did not answer the disconnect")


@pytest.mark.parametrize("hangs", [False, True], ids=["fails", "hangs"])
async def test_a_room_whose_disconnect_fails_or_hangs_is_one_warning_and_the_close_goes_on(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture, hangs: bool
) -> None:
    """The close's ``disconnect`` step is the room's own call, as a room deletion is the
    server's: a fault of the run, one WARNING with its cause (a hang: cut at the step's
    share), and the steps after it run. A failure was an ERROR with a traceback, the log
    policy's level for a bug in code. livekit alone awaits the same call in its shutdown,
    with nothing after it run if it raises."""
    room = _DisconnectFails(name=ROOM, clock=clock)
    room.hangs = hangs
    room.connect_locally()
    room.add_participant("user")
    heard: list[str] = []
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False, close_timeout=10)
    job.add_shutdown_callback(heard.append)
    await job.start(Agent(instructions="agent"))
    with caplog.at_level(logging.INFO):
        job.shutdown("done")
        closing = asyncio.ensure_future(job.wait_closed())
        await clock.advance(10)
        await settle()
    assert closing.done() and closing.exception() is None
    assert job.lifecycle == "closed" and heard == ["done"]
    assert room.listener_count() == 0
    runtime = [r for r in caplog.records if r.name.startswith("agent_runtime")]
    warned = [r for r in runtime if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.exc_info) for r in warned] == [(logging.WARNING, None)]
    cause = "took longer than 1s" if hangs else "RuntimeError: the native side did not answer"
    assert "closing disconnect" in warned[0].getMessage() and cause in warned[0].getMessage()
    assert getattr(warned[0], "machine", None) == "job"
    await job.aclose()
