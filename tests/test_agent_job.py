"""``AgentJob``: one job assembled in one place, driven through livekit's own job context.

Real: livekit's fake ``JobContext`` (a real ``JobContext`` for a job with no worker), real
``AgentSession`` with its RoomIO, every machine's runtime, the scripted avatar plugin (an
``AvatarSession`` subclass doing what the published plugins do), livekit's ``RemoteSession``
as the simulator. Faked, because they need a server: the room (``InMemoryRoom``, a real
``rtc.Room`` with no connection), the transport's byte stream (a paired in-memory transport
carrying the real protobuf messages) and the avatar participant's removal.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import re
import tracemalloc
from collections.abc import Awaitable, Callable
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
from livekit.agents.voice.room_io import RoomOptions

from agent_runtime import (
    AgentJob,
    PlayoutOptions,
    SettingError,
    SettingTypeError,
    injected,
    on_session_end,
    session_end_hook,
)
from agent_runtime.observe.trace import MemorySink, Tracer
from agent_runtime.runtimes.avatar import audio_tail
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.inmemory import InMemoryRoom, InMemorySessionTransport
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from statemachines.machines import MACHINES
from tests.support.avatar_rig import SlowToolset

DISPATCH = SimulationDispatch(simulation_run_id="run-aj", job_id="simjob-aj")
SIM = {ATTRIBUTE_SIMULATOR: "1"}


ROOM = "aj-room"  # the room the fixtures build (tests/conftest.py)


def simulated(ctx: JobContext, on_simulation_end: Any) -> None:
    """What the dispatch and ``rtc_session(on_simulation_end=...)`` put on a real job."""
    ctx.job.attributes[ATTRIBUTE_SIMULATOR_DISPATCH] = json_format.MessageToJson(DISPATCH)
    ctx._simulation_end_fnc = on_simulation_end


async def test_from_job_context_holds_for_the_verdict_then_the_hook_returns(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.add_participant("simulator", attributes=SIM)
    sim_end, agent_end = InMemorySessionTransport.pair(identities=("simulator", "agent"))
    order: list[str] = []

    async def on_simulation_end(sim: SimulationContext) -> None:
        job = AgentJob.for_job(sim.job_context)
        assert job is not None  # the user's verdict reaches the job's parts
        order.append(f"on_simulation_end {sim.simulation_run_id} {job.close_reason}")
        sim.fail("veto")

    async def users_own_session_end(ctx: JobContext) -> None:
        # livekit runs it with the room still connected: so does the hook
        order.append(f"user's on_session_end connected={ctx.room.isconnected()}")

    simulated(ctx, on_simulation_end)
    with injected(clock=clock, transport=agent_end):
        job = AgentJob.from_job_context(ctx, session=AgentSession())
    assert AgentJob.for_job(ctx) is job
    await job.start(Agent(instructions="agent"))
    await settle()
    assert job.states == {
        "job": "serving",
        "session_host": "attached",
        "participant": "linked",
        "room_deletion": "kept",
        "finalize": "idle",
        "session": "started",
        "agent_job": "running",
    }
    await job.session.aclose()  # upstream: the session closes before on_session_end
    await settle()

    hook = asyncio.create_task(session_end_hook(users_own_session_end)(ctx))
    await clock.advance(12)
    assert not hook.done() and room.isconnected()  # the hold, room still connected
    remote = RemoteSession(sim_end)
    await remote.start()
    fin = await remote.finalize_simulation(provisional_success=True)
    await asyncio.wait_for(hook, 5)  # returns once the verdict is out
    assert fin.user_verdict.reason == "veto"
    assert order == [
        "user's on_session_end connected=True",
        "on_simulation_end run-aj user_initiated",
    ]
    assert job.states["job"] == "closed" and job.closed_at == 12.0
    assert AgentJob.for_job(ctx) is None  # released with the job
    # the safety net registered on the job context runs harmlessly once closed
    (safety_net,) = [
        cb for cb in ctx._shutdown_callbacks if cb.__module__ == "agent_runtime.system.livekit_job"
    ]
    await asyncio.wait_for(safety_net("done"), 5)
    await remote.aclose()
    await job.aclose()


async def test_a_failing_session_end_of_the_users_still_ends_the_job_then_raises(
    ctx: JobContext, clock: VirtualClock
) -> None:
    async def users_own_session_end(_ctx: JobContext) -> None:
        raise ValueError("the transcript store is gone")

    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession())
    await job.start(Agent(instructions="agent"))
    await job.session.aclose()
    await settle()
    with pytest.raises(ValueError, match="the transcript store is gone"):
        await asyncio.wait_for(session_end_hook(users_own_session_end)(ctx), 5)
    assert job.lifecycle == "closed" and job.states["job"] == "closed"


@pytest.mark.parametrize(
    ("then", "kind"),
    [
        (lambda: None, "function <lambda>()"),
        (lambda ctx, extra: None, "function <lambda>(ctx, extra)"),
        (5, "int"),
    ],
)
def test_a_session_end_of_the_users_that_cannot_take_the_ctx_is_refused_when_wrapped(
    then: Any, kind: str
) -> None:
    # a then() taking no ctx was accepted, then failed at every job's end (TypeError);
    # refused, it is named with what it takes ("not function" alone told nothing)
    with pytest.raises(SettingTypeError) as e:
        session_end_hook(then)
    assert str(e.value) == (
        "session_end_hook(then): then must be callable as then(ctx), with the livekit "
        f"JobContext, not {kind}"
    )


def test_session_end_hook_s_refusal_and_the_guide_name_its_parameter_as_its_signature() -> None:
    """The guide called the callback ``session_end_hook(yours)`` while the refusal said
    ``then must be ...`` (with no word of whose ``then``): both say the signature's name."""
    (name,) = inspect.signature(session_end_hook).parameters
    with pytest.raises(SettingTypeError) as e:
        session_end_hook(5)
    assert str(e.value).startswith(f"session_end_hook({name}): {name} must be callable as")
    guide = (Path(__file__).parents[1] / "docs" / "guide" / "embedding.md").read_text()
    assert set(re.findall(r"session_end_hook\((\w+)\)", guide)) == {name}


async def test_on_session_end_without_a_job_returns(ctx: JobContext) -> None:
    await asyncio.wait_for(on_session_end(ctx), 5)


async def test_the_session_runs_with_the_jobs_host_and_the_machines_close_rules(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock
) -> None:
    room.add_participant("user")
    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), participant_identity="user")
    await job.start(Agent(instructions="agent"), room_options=RoomOptions(text_output=False))
    await settle()
    opts = job.session.room_io._options
    # RoomIO's own close rules are off: the participant machine and the job decide
    assert (opts.close_on_disconnect, opts.delete_room_on_close) == (False, False)
    assert opts.participant_identity == "user" and opts.text_output is False
    assert job.session._session_host is None and job.system.host.session is job.session
    assert job.link.linked_identity == "user"
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await asyncio.wait_for(job.wait_closed(), 5)
    assert job.close_reason == "participant_disconnected"
    await job.aclose()


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda s: {"session": s, "grace_period": -1}, SettingError, "grace_period"),
        # a trial: it was accepted, and the link waited for a participant nobody is
        (
            lambda s: {"session": s, "participant_identity": "  "},
            SettingError,
            r"^participant_identity: string should have at least 1 character other than "
            r"whitespace \(got '  '\)$",
        ),
        (lambda s: {"session": s, "join_timeout": "30"}, TypeError, "join_timeout"),
        (
            lambda s: {"session": s, "avatar": object()},
            TypeError,
            "is not a livekit-agents AvatarSession",
        ),
        (lambda s: {"session": "agent"}, TypeError, "session must be an AgentSession"),
        (lambda s: {"session": s, "nope": 1}, TypeError, "nope"),
        (
            lambda s: {"session": s, "trace_path": "/dev/null/{job_id}.jsonl"},
            SettingError,
            "trace_path: cannot write the trace",
        ),
        (lambda s: {"session": s, "trace_path": "{call}.jsonl"}, SettingError, "job_id"),
        # each refusal is a SettingError (SettingTypeError for a type), as the guide says
        (
            lambda s: {"session": s, "participant_kinds": "sip"},
            SettingTypeError,
            "participant_kinds must be a collection of kinds, not a single kind",
        ),
        (
            lambda s: {"session": s, "closing_reasons": "CLIENT_INITIATED"},
            SettingTypeError,
            "closing_reasons must be a collection of reasons, not a single one",
        ),
        # it was read as its keys, the values dropped: {"sip": False} linked SIP callers
        (
            lambda s: {"session": s, "participant_kinds": {"standard": 1, "sip": False}},
            SettingTypeError,
            r"^participant_kinds must be a collection of kinds, not a mapping "
            r"\(\{'standard': 1, 'sip': False\}\)$",
        ),
        (
            lambda s: {"session": s, "closing_reasons": {"CLIENT_INITIATED": True}},
            SettingTypeError,
            "closing_reasons must be a collection of reasons, not a mapping",
        ),
        (
            lambda s: {"session": s, "avatar_start_options": {"x": 1}},
            SettingError,
            "avatar_start_options given without an avatar",
        ),
        # it was accepted, a policy for an avatar the job never has
        (lambda s: {"session": s, "retry_avatar": True}, SettingError, "retry_avatar given"),
        (
            lambda s: {"session": s, "retry_avatar": {"attempts": 2}},
            SettingError,
            "retry_avatar given without an avatar",
        ),
        (
            lambda s: {"session": s, "on_reprompt": lambda _s, _n: None},
            SettingError,
            "on_reprompt given, but the watchdog is off",
        ),
        # a trial: accepted, and the link waited for a user who is the avatar (kind agent,
        # on the agent's behalf: never followed), as the plugin's or a factory's
        (
            lambda s: {"session": s, "avatar": ScriptedAvatar(), "participant_identity": "avatar"},
            SettingError,
            r"^participant_identity 'avatar' is the avatar's identity \(avatar_identity "
            r"'avatar'\): the link never follows the avatar",
        ),
        (
            lambda s: {
                "session": s,
                "avatar": lambda: ScriptedAvatar(avatar_identity="tavus-avatar"),
                "participant_identity": "tavus-avatar",
            },
            SettingError,
            r"^participant_identity 'tavus-avatar' is the avatar's identity",
        ),
        # a callable the job would call with the wrong arguments, deep in a step
        (
            lambda s: {
                "session": s,
                "playout": PlayoutOptions(reprompt=True),
                "on_reprompt": lambda: None,
            },
            SettingTypeError,
            r"on_reprompt must be callable as on_reprompt\(session, attempt\)",
        ),
        (
            lambda s: {"session": s, "delete_room": lambda room_name: None},
            SettingTypeError,
            "delete_room must be an async callable taking no arguments",
        ),
        (
            lambda s: {"session": s, "on_simulation_end": lambda: None},
            SettingTypeError,
            "on_simulation_end must be callable as on_simulation_end",
        ),
        # a new user's tries: each raised Python's own error, naming no option
        # ("sequence item 0: expected str instance", "embedded null byte", "Exceeds the
        # limit (4300 digits) for integer string conversion")
        (
            lambda s: {"session": s, "avatar": ScriptedAvatar(), "avatar_start_options": {1: 2}},
            SettingTypeError,
            r"^avatar_start_options: the plugin's start\(\) takes keyword names \(str\), not 1$",
        ),
        (
            lambda s: {"session": s, "trace_path": "a\x00b.jsonl"},
            SettingError,
            r"^trace_path: 'a\\x00b.jsonl' has a NUL character: no file name can have one$",
        ),
        (
            lambda s: {"session": s, "grace_period": 10**5000},
            SettingError,
            r"^grace_period: input should be a valid number \(got an integer of more than 4300 "
            r"digits\)$",
        ),
    ],
)
async def test_bad_options_are_refused_and_change_nothing(
    ctx: JobContext, room: InMemoryRoom, make: Any, error: type[Exception], match: str
) -> None:
    before = room.listener_count()
    session: AgentSession[Any] = AgentSession()
    with pytest.raises(error, match=match):
        AgentJob.from_job_context(ctx, **make(session))
    assert AgentJob.for_job(ctx) is None and room.listener_count() == before
    assert not session._events.get("close")


async def test_a_listener_that_cannot_be_called_or_a_misspelt_event_is_refused(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """Both were accepted: the first failed at the job's first transition (an ERROR with a
    traceback), the second was never called."""
    job = AgentJob(room=room, session=AgentSession(), clock=clock)
    with pytest.raises(TypeError, match="a listener must be callable, not int"):
        job.on("state_changed", 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="AgentJob emits no 'state_chnaged' event"):
        job.on("state_chnaged", print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="graceful must be True or False, not 'no'"):
        await job.aclose(graceful="no")  # type: ignore[arg-type]
    assert job.lifecycle == "new"  # none of them changed the job
    seen: list[str] = []
    job.on("state_changed", lambda sc: seen.append(sc.machine))
    await job.aclose(graceful=False)
    assert seen and job.lifecycle == "closed"


@pytest.mark.parametrize("given", ["x", None])
async def test_on_session_end_given_no_job_context_is_refused(given: Any) -> None:
    with pytest.raises(TypeError, match="ctx must be a livekit-agents JobContext"):
        await on_session_end(given)


@pytest.mark.parametrize("given", [None, "ctx", 7], ids=["None", "a-str", "an-int"])
async def test_a_job_context_that_is_not_one_is_refused_naming_it(
    room: InMemoryRoom, given: Any
) -> None:
    """``from_job_context(None, ...)`` was an AttributeError on ``simulation_context``; it
    is a TypeError naming the argument, before anything is built."""
    before = room.listener_count()
    session: AgentSession[Any] = AgentSession()
    with pytest.raises(TypeError) as raised:
        AgentJob.from_job_context(given, session=session)
    assert str(raised.value) == (
        f"ctx must be a livekit-agents JobContext, not {type(given).__name__}"
    )
    assert room.listener_count() == before and not session._events.get("close")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (RoomOptions(delete_room_on_close=True), "pass delete_room_on_close=True to AgentJob"),
        (RoomOptions(close_on_disconnect=False), "pass close_on_disconnect=False to AgentJob"),
        (RoomOptions(participant_identity="bob"), "pass participant_identity= to AgentJob"),
    ],
)
async def test_room_options_that_would_lose_a_guarantee_are_refused_before_anything_starts(
    room: InMemoryRoom, clock: VirtualClock, options: RoomOptions, match: str
) -> None:
    job = AgentJob(room=room, session=AgentSession(), clock=clock)
    before = room.listener_count()
    with pytest.raises(ValueError, match=match):
        await job.start(Agent(instructions="agent"), room_options=options)
    assert not job.session._started and job.states["session_host"] == "new"
    assert room.listener_count() == before
    await job.aclose(graceful=False)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        (None, "agent must be a livekit.agents.Agent, not NoneType"),
        ("be helpful", "agent must be a livekit.agents.Agent, not str"),
        (Agent, "agent must be an Agent instance, not the class Agent"),
    ],
    ids=["none", "instructions", "the-class"],
)
async def test_a_start_without_an_agent_is_refused_and_changes_nothing(
    room: InMemoryRoom, clock: VirtualClock, given: Any, match: str
) -> None:
    """It used to be an ``AttributeError`` from deep in the start, and the job closed: a
    second start with a real ``Agent`` was refused as "closed"."""
    job = AgentJob(room=room, session=AgentSession(), clock=clock)
    before = room.listener_count()
    for start in (job.start, job.start_session):
        with pytest.raises(TypeError, match=match):
            await start(given)
    assert job.lifecycle == "new" and room.listener_count() == before
    await job.start(Agent(instructions="agent"))
    assert job.lifecycle == "running" and job.session._started
    await job.aclose()


async def test_a_started_session_is_refused(room: InMemoryRoom) -> None:
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions="agent"))
    with pytest.raises(ValueError, match="already started: pass it unstarted"):
        AgentJob(room=room, session=session)
    await session.aclose()


def test_only_known_parts_can_be_injected() -> None:
    with pytest.raises(TypeError, match="cannot inject room"), injected(room=None):
        pass


async def test_a_job_ending_on_its_own_closes_session_and_avatar_before_the_room_goes(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The simulator leaving while the session is live ends the job: the session closes
    (job_shutdown) and the avatar is removed while the room is still connected."""
    room.add_participant("user")
    room.add_participant("simulator", attributes=SIM)
    removed: list[tuple[str, bool]] = []

    async def remove(identity: str) -> None:
        removed.append((identity, room.isconnected()))
        room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    simulated(ctx, None)
    plugin = ScriptedAvatar(avatar_identity="avatar-1")
    with injected(clock=clock, remove_avatar_participant=remove):
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), avatar=plugin, participant_identity="user"
        )
    await job.start(Agent(instructions="agent"))
    room.add_participant("avatar-1", kind="agent")
    room.publish_track("avatar-1", "video")
    await settle()
    assert job.states["avatar"] == "joined" and job.audio_route() == "avatar"
    baseline = room.listener_count()
    # the job's end as a user hears it: the job machine's change, then "closed" once
    heard: list[tuple[str, object]] = []
    job.on("state_changed", lambda sc: heard.append((sc.machine, sc.dest)))
    job.on("closed", lambda t: heard.append(("closed", t)))
    job.system.on("closed", lambda t: heard.append(("system closed", t)))

    room.remove_participant("simulator", rtc.DisconnectReason.CLIENT_INITIATED)
    await asyncio.wait_for(job.wait_closed(), 5)
    await settle()
    assert job.close_reason == "job_shutdown"
    closed_at = job.job.closed_at
    assert closed_at is not None
    at = heard.index(("job", "closed"))
    assert heard[at + 1 : at + 3] == [("closed", closed_at), ("system closed", closed_at)]
    assert [h for h in heard if h[0] in ("closed", "system closed")] == heard[at + 1 : at + 3]
    assert removed == [("avatar-1", True)]  # while the room was still connected
    assert job.states == {
        "job": "closed",
        "session_host": "closed",
        "participant": "closed",
        "avatar": "closed",
        "playout": "closed",  # composed by default with an avatar
        "room_deletion": "allowed",  # allowed once the hold ended; nobody asked for it
        "finalize": "closed",
        "session": "closed",  # its own session ended, then let go with the job
        "agent_job": "closed",  # every follower released with the job
    }
    assert not room.isconnected()
    await job.aclose()
    assert room.listener_count() < baseline  # the adapter's listeners are gone
    assert AgentJob.for_job(ctx) is None


@pytest.mark.parametrize(
    ("how", "hangs"),
    [("simulator-left", False), ("simulator-left", True), ("aborted", False)],
    ids=["closes", "hangs", "aborted"],
)
async def test_the_session_closes_before_the_avatar_goes_and_holds_it_at_most_its_share(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, how: str, hangs: bool
) -> None:
    """The job's close asks the session to close before the avatar's (livekit's order: its
    speech ends on the route it has, and the avatar's restore builds no room track for a
    session going away), whether the job ends on its own or is aborted (the lifecycle
    releases the avatar only once the job machine closed); a session whose close hangs
    holds the avatar's step back only for the session step's share of close_timeout, and
    the room still disconnects in time."""
    from agent_runtime.sdk import livekit_compat as lk

    room.add_participant("user")
    room.add_participant("simulator", attributes=SIM)
    session: AgentSession[Any] = AgentSession()
    closed: list[float] = []  # when the session's close ended
    session.on("close", lambda _: closed.append(clock.now()))
    order: list[str] = []  # the session's close and the avatar's leaving, as they happen
    session.on("close", lambda _: order.append("session closed"))
    # when, room connected, session live, session closed
    removed: list[tuple[float, bool, bool, bool]] = []

    async def remove(identity: str) -> None:
        now = clock.now()
        removed.append((now, room.isconnected(), lk.session_live(session), bool(closed)))
        room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)

    simulated(ctx, None)
    with injected(clock=clock, remove_avatar_participant=remove):
        job = AgentJob.from_job_context(
            ctx,
            session=session,
            avatar=ScriptedAvatar(avatar_identity="avatar-1"),
            participant_identity="user",
            close_timeout=10,
        )
    await job.start(Agent(instructions="agent"))
    room.add_participant("avatar-1", kind="agent")
    room.publish_track("avatar-1", "video")
    await settle()
    assert job.states["avatar"] == "joined"
    job.on(
        "state_changed",
        lambda sc: order.append(f"avatar left {sc.source}") if sc.machine == "avatar" else None,
    )
    if hangs:

        async def hang(**_: Any) -> None:
            await asyncio.get_running_loop().create_future()

        session._aclose_impl = hang  # type: ignore[method-assign]
    t0 = clock.now()
    aborting = None
    if how == "aborted":
        aborting = asyncio.ensure_future(job.aclose(graceful=False))
    else:
        room.remove_participant("simulator", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    # the session step: 0.15 of close_timeout; the avatar's step then waits its own share
    await clock.advance(1.5 + 1.5 + 0.5)
    assert len(removed) == 1
    at, connected, session_live, session_closed = removed[0]
    assert connected and not session_live  # the session was asked first, the room is there
    assert session_closed is not hangs  # ... and its close waited for, unless it hangs
    if not hangs:  # the avatar leaves joined only once the session's close has ended
        assert order[:2] == ["session closed", "avatar left joined"], order
    assert at - t0 == (pytest.approx(1.5) if hangs else 0)
    assert job.states["job"] == "closed" and not room.isconnected()
    if hangs:
        assert session._closing_task is not None
        session._closing_task.cancel()
    if aborting is not None:
        await asyncio.wait_for(aborting, 5)
    await job.aclose()


def test_a_trace_path_may_say_s_as_format_does(ctx: JobContext, tmp_path: Path) -> None:
    job = AgentJob.from_job_context(
        ctx, session=AgentSession(), trace_path=str(tmp_path / "{job_id!s}-{room:s}.jsonl")
    )
    assert [p.name for p in tmp_path.iterdir()] == ["fake-job-aj-room.jsonl"]
    del job


async def test_a_production_trace_records_every_machine(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, tmp_path: Path
) -> None:
    from agent_runtime import read_trace

    room.add_participant("user")
    with injected(clock=clock):
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), trace_path=str(tmp_path / "{job_id}-{room}.jsonl")
        )
    await job.start(Agent(instructions="agent"))
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await asyncio.wait_for(job.wait_closed(), 5)
    await job.aclose()
    trace = read_trace(tmp_path / "fake-job-aj-room.jsonl")
    machines = {r.machine for r in trace if r.kind == "transition"}
    assert machines == {
        "job",
        "session_host",
        "participant",
        "room_deletion",
        "finalize",
        "session",
        "agent_job",
    }


@pytest.mark.parametrize(
    ("room_name", "file_name"),
    [
        ("../victim", ".._victim.jsonl"),
        ("team/standup", "team_standup.jsonl"),
        ("..", "__.jsonl"),
        ("{job_id}", "{job_id}.jsonl"),  # filled in once: a name is no template
        # 128 characters of 3 bytes each: past the system's 255 bytes, so no trace at all
        pytest.param("会議室" * 60, "会議室" * 14 + ".jsonl", id="non-latin-long"),
    ],
)
async def test_a_room_name_filled_into_the_trace_path_stays_one_file_name(
    clock: VirtualClock, tmp_path: Path, room_name: str, file_name: str
) -> None:
    # room names come from clients: "../victim" truncated a file outside the trace
    # directory, "team/standup" failed the job's construction
    from livekit.agents.testing import fake_job_context

    traces = tmp_path / "traces"
    traces.mkdir()
    victim = tmp_path / "victim.jsonl"
    victim.write_text("keep\n", encoding="utf-8")
    room = InMemoryRoom(name=room_name, clock=clock)
    room.connect_locally()
    with fake_job_context(room=room) as ctx, injected(clock=clock):
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), trace_path=str(traces / "{room}.jsonl")
        )
        await job.aclose()
        ctx._tempdir.cleanup()
    assert [p.name for p in traces.iterdir()] == [file_name]
    assert victim.read_text(encoding="utf-8") == "keep\n"


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("{room.name}.jsonl", "{room.name}"),  # an AttributeError came out of str.format
        ("{room.__class__}.jsonl", "{room.__class__}"),  # wrote "<class 'str'>.jsonl"
        ("{job_id:>300}.jsonl", "{job_id:>300}"),  # a 300-character name, past the clean-up
        ("{jobid}.jsonl", "{jobid}"),
        ("{room!r}.jsonl", "{room!r}"),
        ("trace{.jsonl", "expected '}' before end of string"),
    ],
)
def test_a_trace_path_field_that_cannot_be_filled_in_is_a_setting_error(
    ctx: JobContext, tmp_path: Path, template: str, named: str
) -> None:
    with pytest.raises(SettingError, match=r"^trace_path: ") as refused:
        AgentJob.from_job_context(ctx, session=AgentSession(), trace_path=str(tmp_path / template))
    assert named in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


async def test_a_job_built_directly_fills_in_its_rooms_name_in_the_trace_path(
    room: InMemoryRoom, clock: VirtualClock, tmp_path: Path
) -> None:
    # it was left literal: every job wrote (truncated) one file under a directory "{room}"
    job = AgentJob(
        room=room, session=AgentSession(), clock=clock, trace_path=str(tmp_path / "{room}/t.jsonl")
    )
    await job.aclose()
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jsonl")] == [f"{ROOM}/t.jsonl"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{room}/{job_id}.jsonl",
            "trace_path: {job_id} is filled in only inside a livekit job "
            "(AgentJob.from_job_context); a job built with AgentJob(...) has no job id",
        ),
        ("{jobid}.jsonl", "trace_path: only {job_id} and {room} can be filled in, not {jobid}"),
        ("{room.name}.jsonl", "trace_path: only {job_id} and {room} can be filled in, not"),
    ],
)
def test_a_job_built_directly_refuses_a_trace_path_field_it_cannot_fill_in(
    room: InMemoryRoom, tmp_path: Path, template: str, message: str
) -> None:
    with pytest.raises(SettingError) as refused:
        AgentJob(room=room, session=AgentSession(), trace_path=str(tmp_path / template))
    assert str(refused.value).startswith(message)
    assert list(tmp_path.iterdir()) == []  # nothing written


async def test_a_job_built_directly_over_a_room_with_no_name_yet_refuses_room_in_its_trace_path(
    tmp_path: Path,
) -> None:
    with pytest.raises(SettingError, match=r"^trace_path: \{room\} is the room's name, and"):
        AgentJob(room=rtc.Room(), session=AgentSession(), trace_path=str(tmp_path / "{room}.t"))
    assert list(tmp_path.iterdir()) == []


async def test_a_session_close_that_hangs_still_ends_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The user leaves, the session's close never returns: after session_close_timeout the
    participant machine gives up and the job shuts down on its own (nothing lingers)."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, session_close_timeout=20)
    await job.start(Agent(instructions="agent"))
    await settle()

    async def hang(**_: Any) -> None:
        await asyncio.get_running_loop().create_future()

    session._aclose_impl = hang  # type: ignore[method-assign]
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    assert job.states["participant"] == "closing" and job.states["job"] == "serving"
    await clock.advance(19.9)
    assert job.states["job"] == "serving"
    await clock.advance(0.1 + 10)  # the give-up, then the job's own bounded close
    assert job.states["participant"] == "closed" and job.states["job"] == "closed"
    assert job.job.reason == "the session did not close within 20s after participant user left"
    assert session._closing_task is not None
    session._closing_task.cancel()
    await job.aclose()
    # released, every machine of the job is in a final state (the session never said it
    # closed: its machine is let go from started)
    assert job.states["session"] == "closed"
    assert all(MACHINES[m].state(s).final for m, s in job.states.items()), job.states


async def test_a_session_close_that_fails_still_ends_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The user leaves and the session's close fails (a plugin raises in its teardown:
    livekit then never emits ``close``). The participant link gives up on the close as it
    ends and the job shuts down at once, saying why; it used to close the link at once and
    leave the job serving, with nobody there, for good (and then waited for
    ``session_close_timeout``)."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, session_close_timeout=20)
    await job.start(Agent(instructions="agent"))
    await settle()

    async def failing(**_: Any) -> None:
        raise RuntimeError("a plugin failed while closing")  # fault injection

    session._teardown_activity = failing  # type: ignore[method-assign]
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    left_at = clock.now()
    assert job.states["participant"] == "closed" and job.states["job"] != "serving"
    await clock.advance(10)  # the job's own bounded close
    assert job.states["job"] == "closed"
    closed_at = job.job.closed_at
    assert closed_at is not None and closed_at - left_at < 20  # not session_close_timeout
    assert job.job.reason == (
        "the session's close failed after participant user left "
        "(RuntimeError: a plugin failed while closing)"
    )
    await job.aclose()
    assert all(MACHINES[m].state(s).final for m, s in job.states.items()), job.states


async def test_the_participant_link_hears_the_sessions_close_once(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The user leaves, the link closes the session: the session machine hears livekit's
    ``close`` and the links tell the participant machine. The link also followed the
    session's closing task and told itself when it ended, so its trace showed the close
    twice (the second ignored in ``closed``, with a made-up reason ``close_finished``)."""
    room.add_participant("user")
    sink = MemorySink()
    job = AgentJob(room=room, session=AgentSession(), clock=clock, tracer=Tracer(sink))
    await job.start(Agent(instructions="agent"))
    await settle()
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await asyncio.wait_for(job.wait_closed(), 5)
    await job.aclose()
    heard = [
        (r.kind, r.source, r.dest, r.data.get("reason"))
        for r in sink.records
        if r.machine == "participant" and r.event == "session_closed"
    ]
    assert heard == [("transition", "closing", "closed", "participant_disconnected")]
    # nor is the close it asked, which ended well, taken for a failure after it
    assert not [r for r in sink.records if r.event == "close_failed"]


async def test_a_user_who_leaves_after_the_sessions_own_close_failed_ends_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The session's close failed once (a plugin raised in its teardown: livekit stops the
    session and never emits ``close``), then the user leaves. The link asks the session to
    close again; livekit returns at once for a session that is not started, again with no
    ``close``. The link took the end of that close for the session's close and went
    ``closed``, and the job served an empty room for good; now the link gives up on the
    close as it ends (no ``close`` came) and the job shuts down at once, saying why."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, session_close_timeout=20)
    await job.start(Agent(instructions="agent"))
    await settle()
    teardown = session._teardown_activity

    async def failing(**_: Any) -> None:
        raise RuntimeError("a plugin failed while closing")  # fault injection

    session._teardown_activity = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a plugin failed while closing"):
        await session.aclose()
    session._teardown_activity = teardown  # type: ignore[method-assign]
    assert not lk.session_started(session) and job.states["job"] == "serving"
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await settle()
    left_at = clock.now()
    assert job.states["participant"] == "closed" and job.states["job"] != "serving"
    await clock.advance(10)  # the job's own bounded close
    assert job.states["job"] == "closed"
    closed_at = job.job.closed_at
    assert closed_at is not None and closed_at - left_at < 20  # not session_close_timeout
    assert job.job.reason == (
        "the session's close failed after participant user left "
        "(the session had stopped without closing: an earlier close failed)"
    )
    await job.aclose()
    assert all(MACHINES[m].state(s).final for m, s in job.states.items()), job.states


async def test_a_user_who_leaves_when_the_session_cannot_be_asked_to_close_ends_the_job(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The user leaves and asking livekit to close the session raises (fault injected:
    ``AgentSession._close_soon`` fails). The link took its own failure for the session's
    close, went ``closed`` and told nobody: the job served an empty room for good. Now the
    link gives up on the close at once, says why, and the job shuts down."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, session_close_timeout=20)
    await job.start(Agent(instructions="agent"))
    await settle()
    close_soon = session._close_soon

    def broken(**_: Any) -> None:
        raise RuntimeError("no loop to close on")  # fault injection

    session._close_soon = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="agent_runtime.participant"):
        room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
        await settle()
    left_at = clock.now()
    await clock.advance(3600)  # an hour on: the job had been serving an empty room since
    assert job.states["participant"] == "closed" and job.states["job"] == "closed"
    closed_at = job.job.closed_at
    assert closed_at is not None and closed_at - left_at <= 10  # the job's own bounded close
    reason = (
        "the session could not be asked to close after participant user left "
        "(RuntimeError: no loop to close on)"
    )
    assert job.job.reason == reason
    assert f"{reason}; the link gives up on it" in [r.getMessage() for r in caplog.records]
    await job.aclose()  # the job's own close could not ask the session either: bounded
    assert all(MACHINES[m].state(s).final for m, s in job.states.items()), job.states
    session._close_soon = close_soon  # type: ignore[method-assign]


async def start_while(
    room: InMemoryRoom, clock: VirtualClock, during: Callable[[], None]
) -> AgentJob:
    """A job whose avatar plugin takes 5 s to start; ``during`` runs 2 s into it."""
    plugin = ScriptedAvatar(avatar_identity="avatar-1", start_delay=5, clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock)
    start = asyncio.ensure_future(job.start(Agent(instructions="agent")))
    await clock.advance(2)
    during()
    await settle()
    assert not start.done() and job.states["participant"] == "waiting"  # still starting
    await clock.advance(3)
    await start
    await settle()
    return job


@pytest.mark.parametrize("present", [True, False], ids=["was-there", "joined-during"])
async def test_a_user_who_leaves_while_the_avatar_starts_ends_the_job_once_it_started(
    room: InMemoryRoom, clock: VirtualClock, present: bool
) -> None:
    """The session's room input exists only once the session started, after the avatar's
    start: what the user did meanwhile is heard then, in order, and their leaving closes
    the session at once (it did not: the job served an empty room)."""
    if present:
        room.add_participant("user")

    def comes_and_goes() -> None:
        if not present:
            room.add_participant("user")
        room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)

    job = await start_while(room, clock, comes_and_goes)
    await asyncio.wait_for(job.wait_closed(), 5)
    assert job.close_reason == "participant_disconnected"
    assert job.states["participant"] == "closed" and job.states["job"] == "closed"
    await job.aclose()


async def test_a_user_who_leaves_while_another_joins_during_the_start_leaves_the_other_linked(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """What happened during the start decides only when nobody is left to follow: with
    another user there once the session started, the link follows the room as it is, as
    RoomIO picks (it closed the session on the first user's leaving, the second there)."""
    room.add_participant("alice")

    def alice_leaves_bob_joins() -> None:
        room.remove_participant("alice", rtc.DisconnectReason.CLIENT_INITIATED)
        room.add_participant("bob")

    job = await start_while(room, clock, alice_leaves_bob_joins)
    assert job.states["participant"] == "linked" and job.link.linked_identity == "bob"
    assert job.states["job"] == "serving"
    assert job.session.room_io.linked_participant is room.remote_participants["bob"]
    await job.aclose()


async def test_a_user_already_in_a_room_that_connects_after_the_jobs_start_is_linked(
    clock: VirtualClock,
) -> None:
    """A room handed over before it connected: rtc.Room fills its participants from the
    join response with no participant_connected. The link reads the room when the session
    starts, and follows the user out."""
    room = InMemoryRoom(name="late-connect", clock=clock)
    job = AgentJob(room=room, session=AgentSession(), clock=clock)
    await job.start_runtime()
    donor = InMemoryRoom(name="join-response", clock=clock)  # builds the participant
    lk.room_participants(room)["user"] = donor.add_participant("user")
    room.connect_locally()
    await job.start_session(Agent(instructions="agent"))
    await settle()
    assert job.states["participant"] == "linked" and job.link.linked_identity == "user"
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await asyncio.wait_for(job.wait_closed(), 5)
    assert job.close_reason == "participant_disconnected"
    await job.aclose()


async def test_a_user_who_drops_and_rejoins_while_the_avatar_starts_stays_linked(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """A departure that is not a closing reason, then the same identity back, both during
    the start: the session ends up linked to the participant who is in the room."""
    room.add_participant("user")

    def drops_and_rejoins() -> None:
        room.remove_participant("user", rtc.DisconnectReason.SIGNAL_CLOSE)
        room.add_participant("user")

    job = await start_while(room, clock, drops_and_rejoins)
    assert job.states["participant"] == "linked" and job.states["job"] == "serving"
    assert job.session.room_io.linked_participant is room.remote_participants["user"]
    await clock.advance(60)  # no grace timer left running from the drop
    assert job.states["participant"] == "linked" and job.states["job"] == "serving"
    await job.aclose()


@pytest.mark.parametrize("last", ["CLIENT_INITIATED", "SIGNAL_CLOSE"], ids=["leaves", "drops"])
async def test_a_room_churning_through_a_long_start_holds_bounded_memory_and_decides_alike(
    room: InMemoryRoom, clock: VirtualClock, last: str
) -> None:
    """Until the session started, the link holds what the room's participants did, for the
    machine to hear then. A room whose people come and go all through a long start (the
    user dropping and rejoining, another user and a stranger coming and going) held every
    event: memory grew with each. What it holds now is bounded, and the start decides as
    the whole story would: the first user linked, then their last leaving heard."""
    plugin = ScriptedAvatar(avatar_identity="avatar-1", start_delay=5, clock=clock)
    job = AgentJob(room=room, session=AgentSession(), avatar=plugin, clock=clock)
    room.add_participant("user")
    start = asyncio.ensure_future(job.start(Agent(instructions="agent")))
    await clock.advance(2)

    def churn(times: int) -> None:
        for _ in range(times):
            room.remove_participant("user", rtc.DisconnectReason.SIGNAL_CLOSE)
            room.add_participant("user")
            room.add_participant("bob")
            room.remove_participant("bob", rtc.DisconnectReason.CLIENT_INITIATED)
            room.add_participant("bot", kind="agent")
            room.remove_participant("bot", rtc.DisconnectReason.CLIENT_INITIATED)

    churn(50)  # every identity and reason seen once: whatever is kept of them is kept
    await settle()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        churn(2_000)
        await settle()
        gc.collect()  # what is still held, not garbage not yet collected
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # every event held: about 5 MB; what can still decide: a few kB
    assert grown < 200_000, f"{grown:,} bytes held for 12,000 events of a churning room"
    room.remove_participant("user", getattr(rtc.DisconnectReason, last))
    await settle()
    assert not start.done() and job.states["participant"] == "waiting"  # still starting
    await clock.advance(3)
    await start
    await settle()
    if last == "CLIENT_INITIATED":  # a closing reason: the session closes at once
        await asyncio.wait_for(job.wait_closed(), 5)
        assert job.close_reason == "participant_disconnected"
        assert job.states["participant"] == "closed"
    else:  # a drop: the grace period, then the close
        assert job.states["participant"] == "grace" and job.link.linked_identity == "user"
        await clock.advance(15)
        await asyncio.wait_for(job.wait_closed(), 5)
        assert job.close_reason == "participant_disconnected"
    await job.aclose()


async def test_without_an_avatar_a_hung_session_close_holds_the_close_only_its_share(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A job with no avatar has no avatar step to wait for: a session whose close hangs is
    cut at the session step's share (0.15 of close_timeout), the shutdown callbacks run
    then, and no warning names an avatar. The avatar step used to wait on the session's
    close once more and warn that "the avatar had not closed"."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, clock=clock, close_timeout=4)
    ran: list[float] = []
    job.add_shutdown_callback(lambda: ran.append(clock.now()))
    await job.start(Agent(instructions="agent"))
    await settle()

    async def hang(**_: Any) -> None:
        await asyncio.get_running_loop().create_future()

    session._aclose_impl = hang  # type: ignore[method-assign]
    t0 = clock.now()
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(5)
    assert closing.done() and job.states["job"] == "closed"
    assert ran == [pytest.approx(t0 + 0.6)]
    warned = [r.getMessage() for r in caplog.records if "took longer" in r.getMessage()]
    assert len(warned) == 1 and "closing session took longer than 0.6s" in warned[0], warned
    assert session._closing_task is not None
    session._closing_task.cancel()


async def test_a_close_cut_at_its_bound_names_the_job_as_every_warning_does(
    ctx: JobContext, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # the teardown's warning began "job aj-room:" (a room presented as a job; "job job:"
    # when the room had no name yet), where every other warning names the job and its room
    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), close_timeout=4)
    await job.start(Agent(instructions="agent"))
    await settle()

    async def hang(**_: Any) -> None:
        await asyncio.get_running_loop().create_future()

    job.session._aclose_impl = hang  # type: ignore[method-assign]
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(5)
    assert closing.done()
    (record,) = [r for r in caplog.records if "took longer" in r.getMessage()]
    warned = record.getMessage()
    assert warned.startswith(
        f"job {ctx.job.id} (room {ROOM}), job[{ROOM}]: closing session took longer than 0.6s"
    ), warned
    # and its structured fields, as every warning's (the log policy)
    fields = {k: getattr(record, k, None) for k in ("job_id", "room", "machine", "instance")}
    assert fields == {"job_id": ctx.job.id, "room": ROOM, "machine": "job", "instance": ROOM}
    assert job.session._closing_task is not None
    job.session._closing_task.cancel()


class OptionsAvatar(ScriptedAvatar):
    """A plugin whose ``start()`` takes the credentials keywords the published plugins do."""

    def __init__(self) -> None:
        super().__init__(avatar_identity="avatar")
        self.options: dict[str, Any] = {}

    async def start(
        self, agent_session: Any, room: rtc.Room, *, livekit_url: str = "", **kw: Any
    ) -> None:
        self.options = {"livekit_url": livekit_url, **kw}
        await super().start(agent_session, room)


async def test_avatar_start_options_reach_the_plugins_start(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    plugin = OptionsAvatar()
    session: AgentSession[Any] = AgentSession()
    with pytest.raises(TypeError, match=r"ScriptedAvatar: its start\(\) does not take x"):
        AgentJob(room=room, session=session, avatar=ScriptedAvatar(), avatar_start_options={"x": 1})
    job = AgentJob(
        room=room,
        session=session,
        avatar=plugin,
        avatar_start_options={"livekit_url": "wss://lk.invalid", "livekit_api_key": "k"},
        clock=clock,
    )
    await job.start(Agent(instructions="test"))
    assert plugin.options == {"livekit_url": "wss://lk.invalid", "livekit_api_key": "k"}
    await job.aclose(graceful=False)
    await session.aclose()


async def test_an_avatar_that_fails_while_the_session_starts_leaves_the_agent_on_room_audio(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The agent's tools take 3 s to set up (an MCP server connecting): ``session.start()``
    has seen the avatar's route (RoomIO's audio output off) and waits for them when the
    avatar's join_timeout (2 s) runs out. Once the session is up, the agent is heard in the
    room, as with a session that starts at once."""
    room.add_participant("user")
    session: AgentSession[Any] = AgentSession()
    job = AgentJob(
        room=room,
        session=session,
        avatar=ScriptedAvatar(avatar_identity="avatar-1"),
        join_timeout=2,
        clock=clock,
    )
    started = asyncio.ensure_future(
        job.start(Agent(instructions="test", tools=[SlowToolset(clock, 3)]))
    )
    await clock.advance(2)
    assert job.states["avatar"] == "restored" and not started.done()
    await clock.advance(1)
    assert started.done() and started.exception() is None
    assert job.audio_route() == "room" and job.live_audio_route == "room"
    assert isinstance(audio_tail(session), lk.RoomAudioOutput)
    assert len(room.local_participant.track_publications) == 1  # the agent's track
    await job.aclose(graceful=False)
    await session.aclose()


async def test_a_plugin_that_cannot_be_built_is_logged_and_the_job_runs_on_room_audio(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    def no_key() -> ScriptedAvatar:
        raise RuntimeError("PROVIDER_API_KEY must be set")

    session: AgentSession[Any] = AgentSession()
    job = AgentJob(room=room, session=session, avatar=no_key, clock=clock)
    assert job.avatar is None
    assert job.avatar_error is not None and "no_key" in job.avatar_error
    assert "PROVIDER_API_KEY must be set" in caplog.text
    await job.start(Agent(instructions="test"))
    assert job.audio_route() == "room"
    await job.aclose(graceful=False)
    await session.aclose()
    # a factory building the plugin: the job runs it
    built = AgentJob(room=room, session=AgentSession(), avatar=ScriptedAvatar, clock=clock)
    assert built.avatar is not None and isinstance(built.avatar.avatar, ScriptedAvatar)
    assert built.avatar_error is None


async def test_the_system_holds_the_job_machines_parts_and_forwards_each_change_once(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The session host, its finalize answer and the room deletion are the system's own
    (built there, beside the job machine, not inside it): a tool reads them from
    ``job.system``, and each of their changes reaches a listener once."""
    job = AgentJob(room=room, session=AgentSession(), clock=clock, otel=False)
    system = job.system
    seen: list[tuple[str, str, str, str]] = []
    system.on("state_changed", lambda sc: seen.append((sc.machine, sc.source, sc.dest, sc.event)))
    await job.start(Agent(instructions="hi"))
    await job.aclose()
    assert system.host is system.job.host and system.deletion is system.job.deletion
    assert system.finalize is system.host.finalize
    for machine in ("session_host", "finalize", "room_deletion", "job"):
        changes = [c for c in seen if c[0] == machine]
        assert changes and len(changes) == len(set(changes)), machine
    assert {"session_host", "finalize", "room_deletion"} <= {a.spec.name for a in system.actors}


async def _joined_avatar_job(
    ctx: JobContext,
    room: InMemoryRoom,
    clock: VirtualClock,
    remove: Callable[[str], Awaitable[None]],
) -> AgentJob:
    """A started job whose avatar joined, its participant removal ``remove``; the close
    bound (2 s) far shorter than the avatar's own (join_timeout, 30 s)."""
    with injected(clock=clock, remove_avatar_participant=remove):
        job = AgentJob.from_job_context(
            ctx,
            session=AgentSession(),
            avatar=ScriptedAvatar(avatar_identity="avatar-1"),
            close_timeout=2,
            join_timeout=30,
        )
    await job.start(Agent(instructions="agent"))
    room.add_participant("avatar-1", kind="agent")
    room.publish_track("avatar-1", "video")
    await settle()
    return job


async def test_aclose_lets_an_avatar_go_whose_removal_hangs_once_its_bound_passed(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The avatar's participant removal (a server call) never answers, and the avatar's
    own effect bound (join_timeout) is longer than the job's close: ``aclose()`` returns
    within close_timeout with the avatar released and its hung call cancelled, as a
    supervisor stops a child past its shutdown bound, not left running after the job.
    The server API is stood in (it needs a network); everything else is the real job."""
    room.add_participant("user")
    calls: list[str] = []

    async def remove(identity: str) -> None:
        calls.append("asked")
        try:
            await asyncio.get_running_loop().create_future()  # never answers
        except asyncio.CancelledError:
            calls.append("cancelled")
            raise

    job = await _joined_avatar_job(ctx, room, clock, remove)
    assert job.states["avatar"] == "joined"
    t0 = clock.now()
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(2.5)  # past close_timeout, far short of the avatar's 30 s
    assert closing.done(), "aclose() still waits on the avatar's hung removal"
    await closing
    assert clock.now() - t0 <= 2.5
    assert calls == ["asked", "cancelled"]
    avatar = next(a for a in job.actors if a.spec.name == "avatar")
    assert avatar.closed and avatar.live_tasks == 0
    assert job.states["agent_job"] == "closed"


async def test_aclose_returns_when_a_hung_removal_swallows_its_cancellation(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, but the hung call takes its cancellation back and goes on waiting (a
    plugin that catches ``CancelledError``): RELEASE's last step (``let_go``) has a share
    of close_timeout too, so ``aclose()`` still returns and says what it gave up on. The
    server API is stood in (it needs a network); everything else is the real job."""
    room.add_participant("user")
    forever = asyncio.get_running_loop().create_future()

    async def remove(identity: str) -> None:
        while not forever.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(forever)

    job = await _joined_avatar_job(ctx, room, clock, remove)
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(3.0)  # past close_timeout plus let_go's share (0.1 of it)
    try:
        assert closing.done(), "aclose() waits forever on a call that swallows cancellation"
        await closing
        assert job.states["agent_job"] == "closed"
        assert "let_go" in caplog.text
    finally:
        forever.set_result(None)
        closing.cancel()
        await settle()


async def test_the_trace_path_names_the_jobs_room_before_the_room_connects(
    clock: VirtualClock, tmp_path: Path
) -> None:
    # livekit's runner gives the entrypoint an unconnected rtc.Room(), named only once it
    # connects: every job wrote "_.jsonl", each truncating the one before
    from livekit.agents.testing import fake_job_context

    with fake_job_context(room=rtc.Room(), job_id="AJ_abc") as ctx, injected(clock=clock):
        ctx.job.room.name = "team-standup"
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), trace_path=str(tmp_path / "{room}-{job_id}.jsonl")
        )
        await job.aclose()
        ctx._tempdir.cleanup()
    assert [p.name for p in tmp_path.iterdir()] == ["team-standup-AJ_abc.jsonl"]


async def test_an_avatar_start_with_no_route_and_a_failed_removal_are_logged_naming_the_job(
    ctx: JobContext, room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The log policy: a warning names the job, its room and the machine, with its
    structured fields. These two said only "avatar avatar-1 (...)" and "could not remove
    the avatar participant avatar-1": an operator could not tell which job of a worker."""

    async def remove(identity: str) -> None:
        raise RuntimeError("the server API answered 500")

    plugin = ScriptedAvatar(avatar_identity="avatar-1", swallow_error=True)
    with injected(clock=clock, remove_avatar_participant=remove):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), avatar=plugin)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.avatar"):
        await job.start(Agent(instructions="agent"))
        await settle()
        await job.aclose()
    place = f"job {ctx.job.id} (room {room.name}), avatar[avatar-1]: "
    lines = {r.getMessage(): r for r in caplog.records if r.name == "agent_runtime.avatar"}
    no_route = place + "the plugin's start() (agent_runtime.testing.scripted_avatar.ScriptedAvatar)"
    removal = place + "could not remove the avatar participant avatar-1: the server API"
    for head in (no_route, removal):
        (line,) = [m for m in lines if m.startswith(head)]
        assert lines[line].job_id == ctx.job.id and lines[line].machine == "avatar"  # type: ignore[attr-defined]


async def test_a_log_filter_failing_on_the_jobs_close_line_loses_none_of_its_changes(
    ctx: JobContext,
    room: InMemoryRoom,
    clock: VirtualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A log filter of the user's that raises on the "job closed" line is logged as a
    listener's failure is; the job's lifecycle still closes and is heard closing (its
    trace file and OTel spans are closed there)."""

    class Broken(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.getMessage().startswith("job closed"):
                raise RuntimeError("a user's log filter broke")
            return True

    room.add_participant("user")
    room.add_participant("simulator", attributes=SIM)
    simulated(ctx, None)
    with injected(clock=clock):
        job = AgentJob.from_job_context(ctx, session=AgentSession(), participant_identity="user")
    await job.start(Agent(instructions="agent"))
    await settle()
    heard: list[str] = []
    job.on("state_changed", lambda sc: heard.append(f"{sc.machine}->{sc.dest}"))
    broken = Broken()
    lg = logging.getLogger("agent_runtime.agent_job")
    lg.addFilter(broken)
    try:
        with caplog.at_level(logging.INFO):
            room.remove_participant("simulator", rtc.DisconnectReason.CLIENT_INITIATED)
            await asyncio.wait_for(job.wait_closed(), 5)
            await settle()
    finally:
        lg.removeFilter(broken)
    assert job.states["agent_job"] == "closed"
    assert heard[heard.index("job->closed") :][-1] == "agent_job->closed"
    failed = [r for r in caplog.records if "a closed listener failed" in r.getMessage()]
    assert len(failed) == 1 and "a user's log filter broke" in failed[0].getMessage()


@pytest.mark.parametrize("wrong", ["job-1", None, object()])
def test_for_job_refuses_what_is_not_a_job_context(wrong: Any) -> None:
    # None would read as "its job closed already": a wrong argument is the caller's bug
    with pytest.raises(TypeError, match=f"for_job takes a JobContext, not {type(wrong).__name__}"):
        AgentJob.for_job(wrong)
