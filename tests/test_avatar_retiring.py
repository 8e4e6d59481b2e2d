"""An avatar attempt given up for good is retired: with no retry left and ``retry_avatar``'s
``rejoin`` off, the failed attempt's plugin session is closed and its avatar participant
removed (``retiring``, bounded as a retry's release), and one that joins late is removed
too, so no silent avatar video stays in the room, still billed by its provider, until the
job ends. With ``rejoin`` the attempt is kept as before: a late join gets the audio again.

Each test runs a whole ``AgentJob`` on an ``InMemoryRoom`` (a real ``rtc.Room`` with no
connection) with the scripted avatar plugin, on virtual time; the server API that removes
a participant is stood in (it needs a network), answering "not found" as the server does
for someone not in the room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentServer, AgentSession, JobContext
from livekit.api import TwirpError

from agent_runtime import AgentJob, on_session_end
from agent_runtime.settings import AvatarRetry, Backoff
from agent_runtime.testing.clock import VirtualClock, settle
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scripted_avatar import ScriptedAvatar

ROOM = "retiring-room"  # the room the fixtures build (tests/conftest.py)
AV = "av"
JOIN_TIMEOUT = 3.0


class _Provider(ScriptedAvatar):
    """The scripted plugin, counting its ``aclose()`` calls (its provider session's end);
    with ``close_hangs`` that call never returns (its provider's end-session call hangs)
    unless cut (``cuts`` counts those)."""

    def __init__(self, *, close_hangs: bool = False, cleans_up: bool = False) -> None:
        super().__init__(avatar_identity=AV)
        self.closes = 0
        self.cuts = 0
        self.close_hangs = close_hangs
        self.cleans_up = cleans_up  # cut, it cleans up first (protoface's finally does)
        self.cleaned = 0

    async def aclose(self) -> None:
        self.closes += 1
        try:
            if self.close_hangs:
                await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cuts += 1
            if self.cleans_up:
                for _ in range(3):
                    await asyncio.sleep(0)
                self.cleaned += 1
            raise
        await super().aclose()


class _Server:
    """The server API's removal, as the job is given it: what was asked (when, of whom),
    and who was in the room to remove; someone not there is "not found"."""

    def __init__(self, room: InMemoryRoom, clock: VirtualClock) -> None:
        self.room, self.clock = room, clock
        self.asked: list[tuple[float, str, bool]] = []  # (when, identity, was in the room)

    async def remove(self, identity: str) -> None:
        here = identity in self.room.remote_participants
        self.asked.append((self.clock.now(), identity, here))
        if not here:
            raise TwirpError("not_found", "participant not found", status=404)
        self.room.remove_participant(identity, rtc.DisconnectReason.PARTICIPANT_REMOVED)


def _job(
    room: InMemoryRoom,
    clock: VirtualClock,
    plugin: ScriptedAvatar,
    remove: Callable[[str], Awaitable[None]],
    **opts: Any,
) -> AgentJob:
    """The job of these tests, with a user in the room: ``remove`` is the server API's
    removal of a participant (``_Server.remove``, or a test's own)."""
    room.add_participant("user")
    return AgentJob(
        room=room,
        session=AgentSession(),
        avatar=plugin,
        clock=clock,
        otel=False,
        join_timeout=JOIN_TIMEOUT,
        remove_avatar_participant=remove,
        **opts,
    )


def _avatar_moves(job: AgentJob) -> list[str]:
    moves: list[str] = []
    job.on("state_changed", lambda sc: moves.append(sc.dest) if sc.machine == "avatar" else None)
    return moves


def _late_avatar(room: InMemoryRoom) -> None:
    """The provider's avatar worker joins, with its video, after the job gave up on it."""
    room.add_participant(AV, kind="agent")
    room.publish_track(AV, "video")


@pytest.mark.parametrize("close_hangs", [False, True], ids=["closes", "close-hangs"])
async def test_an_avatar_given_up_at_join_timeout_is_closed_and_removed(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, close_hangs: bool
) -> None:
    """No retry, no rejoin: the avatar's worker came into the room but never published its
    video. At join_timeout the agent goes back to room audio, and the attempt is closed:
    the plugin's aclose() runs (its provider session ended), the worker is removed from
    the room. A plugin whose aclose() hangs is cut at half of join_timeout (a WARNING),
    and the removal follows all the same. The job serves on, on room audio."""
    plugin, server = _Provider(close_hangs=close_hangs), _Server(room, clock)
    job = _job(room, clock, plugin, server.remove)
    moves = _avatar_moves(job)
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins, never publishes its video
    await settle()
    with caplog.at_level(logging.INFO, logger="agent_runtime.avatar"):
        await clock.advance(JOIN_TIMEOUT + 0.1)
        assert job.audio_route() == "room"  # the agent is heard at once
        await clock.advance(JOIN_TIMEOUT / 2)  # the hung close's cut, if it hangs
    assert plugin.closes == 1
    retired_at = JOIN_TIMEOUT + (JOIN_TIMEOUT / 2 if close_hangs else 0.0)
    assert [(t, who, here) for t, who, here in server.asked] == [
        (pytest.approx(retired_at), AV, True)
    ]
    assert AV not in room.remote_participants
    assert moves == ["starting", "routing", "failed", "retiring", "restored"]
    assert job.states["avatar"] == "restored" and job.states["job"] == "serving"
    assert job.audio_route() == "room"
    said = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.avatar"]
    assert any("given up after join_timeout" in m for m in said), said
    cut = [m for m in said if "aclose() did not return" in m]
    assert len(cut) == close_hangs
    assert all(m.endswith("_Provider: aclose() did not return within 1.5s as it is retired; cut")
               and m.startswith(f"room {ROOM}, avatar[av]: ") for m in cut)  # fmt: skip
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(job.settings.close_timeout)
    await closing
    assert plugin.closes == 1  # cut as it was retired, it is not called again


async def test_an_avatar_that_joins_after_it_was_given_up_is_removed(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The user's report: the provider's avatar joins after join_timeout (no retry, no
    rejoin). It used to stay in the room for the rest of the call, a silent video still
    billed by its provider; now it is removed as it arrives (the plugin, closed with the
    retirement, is not closed again: one attempt, one aclose()), the agent stays on room
    audio, and the job's close later asks its removal once more, which "not found" answers
    without a warning."""
    plugin, server = _Provider(), _Server(room, clock)
    job = _job(room, clock, plugin, server.remove)
    await job.start(Agent(instructions="agent"))
    await clock.advance(JOIN_TIMEOUT + 1)
    assert job.states["avatar"] == "restored"
    moves = _avatar_moves(job)
    with caplog.at_level(logging.INFO, logger="agent_runtime.avatar"):
        _late_avatar(room)
        await settle()
    said = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.avatar"]
    # one line per retirement, each saying what it does: the late one closes no session
    assert said[-1] == (
        f"room {ROOM}, avatar[{AV}]: the avatar joined after its attempt was given up "
        "(join_timeout), no rejoin: "
        "removing it from the room"
    )
    assert not [m for m in said if "closing its plugin session" in m], said
    assert AV not in room.remote_participants
    assert server.asked == [
        (pytest.approx(JOIN_TIMEOUT), AV, False),  # as it was given up: nobody there yet
        (pytest.approx(JOIN_TIMEOUT + 1), AV, True),  # as it joined late
    ]
    assert moves == ["retiring", "restored"] and plugin.closes == 1
    assert job.audio_route() == "room" and job.states["job"] == "serving"
    before = len(caplog.records)
    await job.aclose()
    assert job.states["avatar"] == "closed" and plugin.closes == 1
    assert [here for _, _, here in server.asked] == [False, True, False]
    assert not [r for r in caplog.records[before:] if r.levelno >= logging.WARNING]


async def test_with_rejoin_an_avatar_that_joins_late_gets_the_audio_again(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """``rejoin`` keeps the attempt given up: nothing is closed nor removed, and the
    avatar that joins late is routed to again (unchanged)."""
    plugin, server = _Provider(), _Server(room, clock)
    job = _job(room, clock, plugin, server.remove, retry_avatar=AvatarRetry(rejoin=True))
    moves = _avatar_moves(job)
    await job.start(Agent(instructions="agent"))
    await clock.advance(JOIN_TIMEOUT + 1)
    assert job.states["avatar"] == "restored" and job.audio_route() == "room"
    assert plugin.closes == 0 and server.asked == []
    _late_avatar(room)
    await settle()
    assert moves == ["starting", "routing", "failed", "restored", "routing", "joined"]
    assert job.audio_route() == "avatar" and AV in room.remote_participants
    assert plugin.closes == 0 and server.asked == []
    await job.aclose()
    assert plugin.closes == 1 and [here for _, _, here in server.asked] == [True]


@pytest.mark.parametrize("retries", [0, 1], ids=["given-up", "in-backoff"])
async def test_with_rejoin_an_avatar_there_without_video_gets_the_audio_once_it_publishes(
    room: InMemoryRoom, clock: VirtualClock, retries: int
) -> None:
    """The provider's avatar joined before ``join_timeout`` but published its video only
    after it (a slow worker): with ``rejoin``, its video is its late arrival and it gets
    the agent's audio, from ``restored`` (given up) as from ``backoff``. Only a join was
    heard: the agent stayed on room audio for good while the avatar showed its face (a
    review's repro)."""
    plugin, server = _Provider(), _Server(room, clock)
    retry = AvatarRetry(rejoin=True, attempts=retries, backoff=Backoff(initial=60, max=60))
    job = _job(room, clock, plugin, server.remove, retry_avatar=retry)
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins, its video not yet published
    await settle()
    await clock.advance(JOIN_TIMEOUT + 0.1)
    assert job.states["avatar"] == ("restored" if retries == 0 else "backoff")
    assert job.audio_route() == "room"
    room.publish_track(AV, "video")
    await settle()
    assert job.states["avatar"] == "joined" and job.audio_route() == "avatar"
    assert plugin.closes == 0 and server.asked == []  # the same attempt, kept
    await job.aclose()


async def _closing_attempt(
    room: InMemoryRoom, clock: VirtualClock, plugin: ScriptedAvatar, server: _Server, state: str
) -> AgentJob:
    """A job (close_timeout 10 s) whose avatar joined without its video and timed out: its
    failed attempt is being closed, 0.5 s into that close, in ``state`` (``retiring``: no
    retry; ``releasing``: one retry, after its 1 s backoff)."""
    retry = {"retry_avatar": AvatarRetry(attempts=1)} if state == "releasing" else {}
    job = _job(room, clock, plugin, server.remove, close_timeout=10, **retry)
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins, never publishes its video
    await settle()
    await clock.advance(JOIN_TIMEOUT + (1.0 if state == "releasing" else 0.0) + 0.5)
    assert job.states["avatar"] == state
    return job


def _close_tasks() -> list[asyncio.Task[Any]]:
    """The plugin closes still running (the runtime names each task it runs one in)."""
    return [t for t in asyncio.all_tasks() if not t.done() and "aclose()" in t.get_name()]


@pytest.mark.parametrize("state", ["retiring", "releasing"])
async def test_closing_the_job_while_the_attempt_is_closed_is_bounded_and_closes_it_once(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, state: str
) -> None:
    """The job closes while the failed attempt's close hangs (``retiring``, or
    ``releasing`` before a retry): the avatar goes straight to ``closed``, the job's close
    waits for that same aclose() (it is not called again) and cuts it at its own share
    (0.9 of the avatar step's 1.5 s: a WARNING), nothing of it runs on after the job, and
    the avatar participant is removed once, by the close."""
    plugin, server = _Provider(close_hangs=True), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, state)
    assert plugin.closes == 1 and plugin.cuts == 0 and server.asked == []
    moves = _avatar_moves(job)
    t0 = clock.now()
    with caplog.at_level(logging.WARNING, logger="agent_runtime.avatar"):
        closing = asyncio.ensure_future(job.aclose())
        await clock.advance(10)
    assert closing.done() and closing.exception() is None
    assert moves == ["closed"]  # straight from the attempt's close: nothing in between
    assert job.states["avatar"] == "closed" and job.lifecycle == "closed"
    assert [who for _, who, _ in server.asked] == [AV] and AV not in room.remote_participants
    assert server.asked[0][0] - t0 == pytest.approx(1.35)  # after the cut, within the bound
    assert plugin.closes == 1 and plugin.cuts == 1  # the attempt's one close, cut by the job's
    cut = [r.getMessage() for r in caplog.records if "aclose() did not return" in r.getMessage()]
    assert len(cut) == 1 and cut[0].endswith("aclose() did not return within 1.35s; cut"), cut
    assert _close_tasks() == []


class _ForgetfulProvider(ScriptedAvatar):
    """``aclose()`` as protoface's: the provider session's id forgotten, then its end call
    (1 s): a close cut halfway never ends the session. Each start is a session of its
    own (``sess-1``, ``sess-2``...)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(avatar_identity=AV)
        self.clock = clock
        self.session_id: str | None = None
        self.ended: list[str] = []
        self.closes = 0

    async def start(self, agent_session: AgentSession[Any], room: rtc.Room) -> None:
        self.session_id = f"sess-{self.start_calls + 1}"
        await super().start(agent_session, room)

    async def aclose(self) -> None:
        self.closes += 1
        sid, self.session_id = self.session_id, None
        try:
            if sid is not None:
                await self.clock.sleep(1.0)
                self.ended.append(sid)
        finally:
            await super().aclose()


async def test_an_avatar_joining_while_the_retirement_runs_does_not_cut_it_and_is_removed(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The provider's avatar arrives while the plugin's close is under way: the close runs
    to its end (entering ``retiring`` anew cut it, and the provider session was never
    ended), then the retirement's removal finds the late avatar in the room and removes it,
    once; a user's listener sees the retirement end and nothing more."""
    plugin = _ForgetfulProvider(clock)
    server = _Server(room, clock)
    job = _job(room, clock, plugin, server.remove)
    await job.start(Agent(instructions="agent"))
    await clock.advance(JOIN_TIMEOUT + 0.1)
    assert job.states["avatar"] == "retiring"
    moves = _avatar_moves(job)
    room.add_participant(AV, kind="agent")
    room.publish_track(AV, "video")
    await settle()
    assert moves == []  # the close under way goes on
    await clock.advance(5)
    assert plugin.ended == ["sess-1"]
    assert AV not in room.remote_participants and job.states["avatar"] == "restored"
    # the close ran to its end, then its removal found the late avatar there: removed, once
    assert moves == ["restored"]
    assert [(who, here) for _, who, here in server.asked] == [(AV, True)]
    assert job.audio_route() == "room"
    await job.aclose()


@pytest.mark.parametrize("state", ["retiring", "releasing"])
async def test_a_job_closed_while_the_attempt_is_closed_ends_its_provider_session(
    room: InMemoryRoom, clock: VirtualClock, state: str
) -> None:
    """The job closes (or the user leaves) 0.5 s into the failed attempt's close, as its
    plugin ends its provider session: that close runs to its end within the job's close
    (it used to be cut there, the session id already forgotten, and the job's own second
    aclose() found nothing to end: the session stayed billed). One aclose(), the session
    ended; no new attempt started under the close."""
    plugin, server = _ForgetfulProvider(clock), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, state)
    assert plugin.closes == 1 and plugin.ended == []
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(10)
    assert closing.done() and closing.exception() is None
    assert plugin.ended == ["sess-1"] and plugin.closes == 1
    assert plugin.start_calls == 1 and job.states["avatar"] == "closed"
    assert AV not in room.remote_participants and _close_tasks() == []


class _CloseFails(_ForgetfulProvider):
    """protoface's close whose end-session call fails after its 1 s (the provider answered
    an error): the session id forgotten all the same."""

    async def aclose(self) -> None:
        self.closes += 1
        self.session_id = None
        await self.clock.sleep(1.0)
        raise RuntimeError("the provider could not end the session")


async def test_a_failed_attempts_close_that_fails_under_the_jobs_close_is_logged_once(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The retirement's aclose() fails after the job's close began: its failure is a
    WARNING, once, naming the close it was (the retirement's), and the job's close does not
    call aclose() again; the avatar is removed all the same."""
    plugin, server = _CloseFails(clock), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, "retiring")
    with caplog.at_level(logging.WARNING, logger="agent_runtime.avatar"):
        closing = asyncio.ensure_future(job.aclose())
        await clock.advance(10)
    assert closing.done() and closing.exception() is None
    failed = [r.getMessage() for r in caplog.records if "aclose()" in r.getMessage()]
    assert len(failed) == 1 and failed[0].endswith(
        "aclose() failed as it is retired (RuntimeError: the provider could not end the session)"
    ), failed
    assert plugin.closes == 1 and job.states["avatar"] == "closed"
    assert [who for _, who, _ in server.asked] == [AV] and AV not in room.remote_participants


async def test_a_retry_after_a_finished_release_closes_its_new_attempt_with_the_job(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """One aclose() per attempt, not per plugin: the first attempt's release ended its
    session, the retry started a second one, and the job's close ends that one too."""
    plugin, server = _ForgetfulProvider(clock), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, "releasing")
    await clock.advance(1.0)  # the release's close ends: the plugin starts again
    assert plugin.ended == ["sess-1"] and plugin.start_calls == 2
    assert job.states["avatar"] == "routing"
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(10)
    assert closing.done() and closing.exception() is None
    assert plugin.ended == ["sess-1", "sess-2"] and plugin.closes == 2


async def test_an_avatar_whose_removal_fails_is_not_retired_over_and_over(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The removal answers but the avatar stays (a server that failed it): ``restored``
    looks for a late avatar, and this one is the one the retirement asked to remove, so
    the machine rests (it went back and forth between retiring and restored for good)."""
    plugin = _ForgetfulProvider(clock)
    asked: list[str] = []

    async def fails(identity: str) -> None:
        asked.append(identity)

    job = _job(room, clock, plugin, fails)
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins without its video: never joined
    await clock.advance(JOIN_TIMEOUT + 5)
    assert job.states["avatar"] == "restored" and asked == [AV]
    await job.aclose()


async def test_an_avatar_let_go_while_the_attempt_is_closed_leaves_no_close_running(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The avatar let go at once (``release_now``: the owner's last word, whatever its close
    is still doing), in the middle of a failed attempt's close that hangs: that aclose() is
    cut with it, never left running after the machine."""
    plugin, server = _Provider(close_hangs=True, cleans_up=True), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, "retiring")
    assert job.avatar is not None and len(_close_tasks()) == 1
    ending = job.avatar.release_now()
    assert ending is not None
    await ending  # the cut close's cleanup is part of what is left to wait for
    assert plugin.cuts == 1 and plugin.cleaned == 1 and _close_tasks() == []
    await job.aclose()


@pytest.mark.virtual_time
async def test_the_user_leaving_while_the_attempt_is_retired_leaves_no_task_running() -> None:
    """Through livekit's own job (the testing kit's runner, which fails a test on a task
    the job left running): the user leaves while the given-up attempt's close ends its
    provider session; the job's end waits for it, and livekit's shutdown then runs the
    plugin's own aclose() (its start() registered it), which has nothing left to end."""
    clock = VirtualClock()
    room = InMemoryRoom(name=ROOM, clock=clock)
    room.connect_locally()
    room.add_participant("user")
    plugin = _ForgetfulProvider(clock)
    server = AgentServer(session_end_timeout=315)

    @server.rtc_session(on_session_end=on_session_end)
    async def entrypoint(ctx: JobContext) -> None:
        job = AgentJob.from_job_context(
            ctx, session=AgentSession(), avatar=plugin, join_timeout=JOIN_TIMEOUT
        )
        await job.start(Agent(instructions="agent"))

    runner = EntrypointRunner(room=room, clock=clock)
    job = await runner(server)
    await clock.advance(JOIN_TIMEOUT + 0.5)
    assert job.states["avatar"] == "retiring" and plugin.ended == []
    room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    ended = asyncio.ensure_future(runner.wait_ended(timeout=60))
    await clock.advance(60)
    await ended
    await runner.aclose()  # raises TasksLeftRunning for a task the job left running
    assert plugin.ended == ["sess-1"]
    assert job.states["avatar"] == "closed"


async def test_the_room_reconnecting_while_the_attempt_is_retired_changes_nothing(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A network blip 0.5 s into the given-up attempt's close (its provider session being
    ended): the close is neither cut nor begun again, nothing starts; it runs once to its
    end, the avatar is removed once, and the agent stays on room audio throughout."""
    plugin, server = _ForgetfulProvider(clock), _Server(room, clock)
    job = await _closing_attempt(room, clock, plugin, server, "retiring")
    moves = _avatar_moves(job)
    with caplog.at_level(logging.INFO, logger="agent_runtime.avatar"):
        room.reconnect_locally()
        await settle()
        assert moves == [] and job.audio_route() == "room"
        await clock.advance(0.5)  # the provider's end-session call returns
        await settle()
    assert plugin.ended == ["sess-1"] and plugin.closes == 1 and plugin.start_calls == 1
    assert moves == ["restored"] and job.states["job"] == "serving"
    assert [(who, here) for _, who, here in server.asked] == [(AV, True)]
    assert AV not in room.remote_participants and job.audio_route() == "room"
    said = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.avatar"]
    assert not [m for m in said if "removing it from the room" in m], said  # one retirement
    await job.aclose()


async def test_a_retirement_that_outlives_join_timeout_ends_at_its_bound(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The given-up attempt's close hangs (cut at half of join_timeout) and the server
    API's removal is slow (4 s): at join_timeout the retirement gives up waiting, the
    lifecycle rests on room audio then, not when the removal would end, nothing starts
    again, and the job serves on; its close asks the removal once more."""
    plugin = _Provider(close_hangs=True)
    asked: list[float] = []

    async def slow_remove(identity: str) -> None:
        asked.append(clock.now())
        await clock.sleep(4.0)

    job = _job(room, clock, plugin, slow_remove, close_timeout=10)
    moves: list[tuple[float, str]] = []
    job.on(
        "state_changed",
        lambda sc: moves.append((clock.now(), sc.dest)) if sc.machine == "avatar" else None,
    )
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins, never publishes its video
    await settle()
    await clock.advance(JOIN_TIMEOUT + 0.1)
    began = next(t for t, state in moves if state == "retiring")
    assert asked == [] and job.audio_route() == "room"
    await clock.advance(JOIN_TIMEOUT)  # the close cut at 1.5 s, the removal still running
    assert asked == [pytest.approx(began + JOIN_TIMEOUT / 2)]
    assert [s for _, s in moves][-2:] == ["retiring", "restored"]
    assert moves[-1][0] == pytest.approx(began + JOIN_TIMEOUT)  # at its bound
    await clock.advance(10)
    assert [s for _, s in moves][-2:] == ["retiring", "restored"]  # and nothing after
    assert job.states["avatar"] == "restored" and job.states["job"] == "serving"
    assert plugin.start_calls == 1 and plugin.closes == 1 and job.audio_route() == "room"
    closing = asyncio.ensure_future(job.aclose())
    await clock.advance(10)
    assert closing.done() and closing.exception() is None
    assert len(asked) == 2 and plugin.closes == 1 and job.states["avatar"] == "closed"


@pytest.mark.parametrize("rejoin", [True, False], ids=["rejoin", "no-rejoin"])
async def test_an_avatar_leaving_after_the_job_fell_back_for_good_changes_nothing(
    room: InMemoryRoom, clock: VirtualClock, caplog: pytest.LogCaptureFixture, rejoin: bool
) -> None:
    """The avatar given up (it joined without its video and timed out) is still in the
    room once the agent is back on room audio for good: with ``rejoin`` it is kept, and
    without, its removal did not take (a server that answered but left it). Then it
    leaves: nothing is rerouted, started, closed nor removed, no WARNING is logged, and the
    job serves on, on room audio. With ``rejoin``, when it comes back with its video it
    gets the audio again."""
    plugin = _Provider()
    asked: list[str] = []

    async def remove(identity: str) -> None:  # the server answers, the avatar stays
        asked.append(identity)

    opts: dict[str, Any] = {"retry_avatar": AvatarRetry(rejoin=True)} if rejoin else {}
    job = _job(room, clock, plugin, remove, **opts)
    await job.start(Agent(instructions="agent"))
    room.add_participant(AV, kind="agent")  # joins, never publishes its video
    await settle()
    await clock.advance(JOIN_TIMEOUT + 1)
    assert job.states["avatar"] == "restored" and AV in room.remote_participants
    closes, removals = plugin.closes, len(asked)
    moves = _avatar_moves(job)
    before = len(caplog.records)
    with caplog.at_level(logging.INFO):
        room.remove_participant(AV)
        await settle()
        await clock.advance(JOIN_TIMEOUT * 2)
    assert moves == [] and job.states["avatar"] == "restored"
    assert job.states["job"] == "serving" and job.audio_route() == "room"
    assert plugin.start_calls == 1 and plugin.closes == closes and len(asked) == removals
    assert not [r for r in caplog.records[before:] if r.levelno >= logging.WARNING]
    if rejoin:
        _late_avatar(room)
        await settle()
        assert moves == ["routing", "joined"] and job.audio_route() == "avatar"
    await job.aclose()
