"""Stateful property tests: random event sequences, with faults, against the real runtime.

Each example is one job (``test_properties_world.World``: the four machines, real
``AgentSession``s, an ``InMemoryRoom``, virtual time, the simulator on a paired transport)
driven by hypothesis through participants joining and leaving for every
``rtc.DisconnectReason``, the avatar joining/publishing/leaving, attribute changes, the room
disconnecting, speech and interruptions, scripted ``lk.clear_buffer`` outcomes (every
``rtc.RpcError`` the in-memory room produces), finalize and other session requests (well
formed or not), duplicated, reordered and stranger events, garbage on the wire, time passing,
session closes, job shutdown; with room deletion, shutdown callbacks, ``on_simulation_end``,
the plugin's start and the avatar's removal raising or hanging forever.

After every step, the invariants the explorer checks (``explore.checks``, written once over
the job's ``JobView``; ``World.view`` builds it as the explorer does): the agent's
audio never points at an avatar outside the states where its route may be in;
``lk.clear_buffer`` goes out only while joined; the room is never deleted while the job is
``serving`` or ``awaiting_finalize``, nor twice; at most one session's events are forwarded;
no request gets two replies, the verdict goes to the simulator once; no timer or task
outlives its state; the hold ends when it is no longer needed. Besides, for the runtime
alone: a finalize sent before the hold ended reached the host; once the job left ``serving``
it is ``closed`` within ``session_end_timeout + close_timeout``; a state's declared timeout is
armed; nothing escaped a room callback, a task or a logger at ERROR (unless an injected
fault explains it). At the end: shutdown is asked and time passes, the job is ``closed`` and
the explorer's ``eventual`` checks hold; every request the host took in was answered exactly
once, with the reply its kind and payload call for; after closing everything no listener,
task or timer is left; every decision in the example's trace, replayed through the
``transitions`` machines compiled from the specs, is the one the actors took.

50 examples in the default tier, 200 in the exhaustive one (a fixed seed);
``AGENT_RUNTIME_DEEP=1`` runs many more and longer examples with fresh randomness.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from livekit import rtc
from livekit.agents import CloseReason
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime.runtimes.session_host import (
    FINALIZE_UNFINISHED,
    HOST_CLOSING,
    NO_ACTIVE_SESSION,
    NOT_THE_SIMULATOR,
)
from agent_runtime.testing.inmemory import quiet_sdk_logs
from agent_runtime.testing.invariants.checks import BY_NUMBER, eventual, safety, settled
from agent_runtime.tools.replay import format_report, replay_records
from tests.support.world import (
    AVATAR,
    PEOPLE,
    SIMULATOR,
    USER,
    VETO,
    Config,
    Faults,
    World,
    frames,
    stranger,
    stranger_track,
)

T = TypeVar("T")

DEEP = os.environ.get("AGENT_RUNTIME_DEEP", "") not in ("", "0")
# the mutation tool judges hundreds of mutants with this test and may ask for fewer examples
EXAMPLES = int(os.environ.get("AGENT_RUNTIME_PROPS_EXAMPLES") or (2000 if DEEP else 50))
# the exhaustive tier's run of the same machine, with four times the examples
EXHAUSTIVE_EXAMPLES = 2000 if DEEP else 200

REASONS = [rtc.DisconnectReason.Name(v) for v in rtc.DisconnectReason.values()]
CLOSE_REASONS = [r.value for r in CloseReason]
RPC_RESULTS = ["ok", "timeout", "error", "disconnected", "not_found"]
VALID_PLAYBACK = [
    '{"playback_position": 0.5, "interrupted": false}',
    '{"playback_position": 0, "interrupted": true}',
]
GARBAGE_PLAYBACK = [
    "",
    "not json",
    "[]",
    '{"interrupted": false}',
    '{"playback_position": "1", "interrupted": false}',
    '{"playback_position": -1, "interrupted": true}',
    '{"playback_position": 1e999, "interrupted": true}',
    '{"playback_position": 1.0, "interrupted": "no"}',
]
GOOD_FINALIZE: list[dict[str, Any]] = [
    {},
    {"provisional_success": True},
    {"provisional_success": False, "provisional_reason": "the caller hung up"},
]
BAD_FINALIZE: dict[str, dict[str, Any]] = {
    "provisional_success": {"provisional_success": "yes"},
    "provisional_reason": {"provisional_reason": 7},
}
OTHER_KINDS = [
    "ping",
    "get_chat_history",
    "get_agent_info",
    "get_session_state",
    "get_session_usage",
    "get_framework_info",
]
UNKNOWN_KIND = "launch_rockets"


def mostly_ok(*failures: str, healthy: str = "ok") -> st.SearchStrategy[str]:
    """A fault mode, healthy half of the time: a fault that always fires would keep the
    examples from reaching what comes after it."""
    return st.sampled_from([healthy] * len(failures) + list(failures))


faults = st.builds(
    Faults,
    delete_room=mostly_ok("raise", "hang"),
    shutdown_callback=mostly_ok("ok", "raise", "hang", healthy="none"),
    simulation_end=mostly_ok("ok", "raise", "hang", healthy="veto"),
    plugin_start=mostly_ok("raise", "raise_after_route", "swallow", "hang"),
    remove_avatar=mostly_ok("not_found", "raise", "hang"),
    state_listener=mostly_ok("raise"),
)
configs = st.builds(
    Config,
    simulation=st.booleans(),
    avatar=st.booleans(),
    connected=st.booleans(),
    delete_room_on_close=st.booleans(),
    close_on_disconnect=st.booleans(),
    participant_identity=st.sampled_from([None, USER]),
    retry_avatar=st.sampled_from(
        [
            False,
            True,
            {"attempts": 2, "backoff": {"initial": 1.0, "max": 2.0}},
            {"attempts": 1, "rejoin": True, "transient": ["avatar_left", "join_timeout"]},
        ]
    ),
    grace_period=st.sampled_from([0.0, 3.0, 15.0]),
    session_end_timeout=st.sampled_from([0.0, 10.0, 60.0]),
    close_timeout=st.sampled_from([1.0, 5.0]),
    join_timeout=st.sampled_from([2.0, 10.0]),
    faults=faults,
)


# for the rules that can end the job (see `patience`)
patient = precondition(lambda self: len(self.world.steps) >= self.patience)


class ComposedJob(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # the last example's garbage collected, then everything older frozen: each
        # example's own collection (see teardown) walks only what the example built, not
        # the heap every earlier test of the worker left (a full walk of that cost about
        # 0.2 s an example inside the whole tier, against 0.02 s alone). Never unfrozen: what
        # was alive here and dies later is not collected in this worker (its unread task
        # failures go unreported), a price the tier's time pays for; the heap peaked the same
        gc.collect()
        gc.freeze()
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.quiet = quiet_sdk_logs()
        self.quiet.__enter__()
        self.w: World | None = None
        self.avatar_started = False
        self.connected_once = False
        self.session_started = False
        self.patience = 0

    # -- plumbing ----------------------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @property
    def world(self) -> World:
        assert self.w is not None
        return self.w

    def act(self, action: Callable[[], Any] | None = None) -> None:
        """Run ``action`` inside the loop (awaiting what it returns), then let it settle."""

        self.world.steps.append(sys._getframe(1).f_code.co_name)

        async def go() -> None:
            if action is not None:
                res = action()
                if inspect.isawaitable(res):
                    await res
            await self.world.quiesce()

        self.run(go())

    # -- set-up ------------------------------------------------------------------------------
    @initialize(
        config=configs,
        present=st.sets(st.sampled_from(sorted(PEOPLE))),
        session_now=st.booleans(),
        avatar_now=st.booleans(),
        patience=st.sampled_from([0, 8, 16]),
    )
    def setup(
        self, config: Config, present: set[str], session_now: bool, avatar_now: bool, patience: int
    ) -> None:
        # what ends the job waits `patience` steps, so examples also reach the states a
        # live session goes through, not only the ways it ends
        self.patience = patience

        async def go() -> None:
            self.w = w = World(config)
            w.install_loop_handler(self.loop)
            for identity in sorted(present):
                kind, attributes = PEOPLE[identity]
                w.room.add_participant(identity, kind=kind, attributes=attributes)
            await w.start()
            await w.quiesce()
            if session_now:
                self.session_started = True
                await w.start_session()
            if avatar_now and w.avatar is not None:
                self.avatar_started = True
                w.bg(self.start_avatar(w), "avatar.start")
            await w.quiesce()

        self.run(go())

    async def start_avatar(self, w: World) -> None:
        assert w.avatar is not None
        try:
            await w.start_avatar()
        except RuntimeError as e:
            assert "closed" in str(e), e  # closed before it could start: refused
            w.refused.append(f"avatar.start: {e}")

    # -- the session ---------------------------------------------------------------------------
    @precondition(lambda self: not self.session_started)
    @rule()
    def start_session(self) -> None:
        self.session_started = True  # once: a closed AgentSession is not started again
        self.act(self.world.start_session)

    @rule()
    def attach_another_session(self) -> None:
        if len(self.world.sessions) < 3:
            self.act(self.world.attach_other)

    @rule(i=st.integers(0, 2))
    def detach_a_session(self, i: int) -> None:
        sessions = self.world.sessions
        self.act(lambda: self.world.job.detach(sessions[i % len(sessions)]))

    @patient
    @rule(reason=st.sampled_from(CLOSE_REASONS), i=st.integers(0, 2))
    def session_closes(self, reason: str, i: int) -> None:
        sessions = self.world.sessions
        s = sessions[i % len(sessions)]
        if s._started:
            self.act(lambda: s._close_soon(reason=CloseReason(reason)))

    @rule(n=st.sampled_from([5, 50]))
    def agent_speaks(self, n: int) -> None:
        w = self.world
        s = w.primary
        if s._started and s._closing_task is None and s._activity is not None:
            self.act(lambda: w.speech.append(s.say("hi", audio=frames(n), add_to_chat_ctx=False)))

    @rule(via_avatar=st.booleans())
    def interrupt(self, via_avatar: bool) -> None:
        w = self.world

        def go() -> None:
            if via_avatar and w.avatar is not None:
                w.avatar.interrupt()
            elif w.primary._started and w.primary._activity is not None:
                w.primary.interrupt().add_done_callback(_retrieve)

        self.act(go)

    # -- the job -------------------------------------------------------------------------------
    @patient
    @rule(reason=st.sampled_from(["", "done", "end_call"]), primary_first=st.booleans())
    def job_shutdown(self, reason: str, primary_first: bool) -> None:
        w = self.world

        def go() -> None:
            if primary_first and w.primary._started:
                # livekit's order: the primary session closes, then on_session_end (the hold)
                w.primary._close_soon(reason=CloseReason.JOB_SHUTDOWN)
            w.job.shutdown(reason)

        self.act(go)

    @rule()
    def end_call_deletes_the_room(self) -> None:
        self.act(self.world.job.request_room_deletion)

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0, 15.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.run(self.world.advance(seconds))

    # -- the room ------------------------------------------------------------------------------
    @rule(identity=st.sampled_from(sorted(PEOPLE)))
    def participant_joins(self, identity: str) -> None:
        room = self.world.room
        if identity not in room.remote_participants:
            kind, attributes = PEOPLE[identity]
            self.act(lambda: room.add_participant(identity, kind=kind, attributes=attributes))

    @patient
    @rule(identity=st.sampled_from([*sorted(PEOPLE), AVATAR]), reason=st.sampled_from(REASONS))
    def participant_leaves(self, identity: str, reason: str) -> None:
        room = self.world.room
        if identity not in room.remote_participants:  # nobody to leave: nothing happens
            return
        self.act(lambda: room.remove_participant(identity, rtc.DisconnectReason.Value(reason)))

    @patient
    @rule(identity=st.sampled_from(sorted(PEOPLE)), simulator=st.booleans())
    def attributes_change(self, identity: str, simulator: bool) -> None:
        room = self.world.room
        p = room.remote_participants.get(identity)
        if p is None:
            return

        def go() -> None:
            assert p is not None
            if simulator:
                room.set_participant_attributes(identity, {ATTRIBUTE_SIMULATOR: "1"})
            elif ATTRIBUTE_SIMULATOR in p.attributes:
                # the SFU reports a removed attribute as changed to ""
                del p._info.attributes[ATTRIBUTE_SIMULATOR]
                room.emit("participant_attributes_changed", {ATTRIBUTE_SIMULATOR: ""}, p)
            else:
                room.set_participant_attributes(identity, {"mood": "curious"})

        self.act(go)

    @patient
    @rule(reason=st.sampled_from(REASONS))
    def room_disconnects(self, reason: str) -> None:
        room = self.world.room
        self.act(lambda: room.disconnect_locally(rtc.DisconnectReason.Value(reason)))

    @precondition(lambda self: not self.world.config.connected)
    @rule()
    def room_connects(self) -> None:
        room = self.world.room
        if not self.connected_once:  # an rtc.Room connects once; it never comes back
            self.connected_once = True
            self.act(room.connect_locally)

    @rule(event=st.sampled_from(["reconnecting", "reconnected"]))
    def room_reconnects(self, event: str) -> None:
        self.act(lambda: self.world.room.emit(event))

    # -- the avatar ------------------------------------------------------------------------------
    @precondition(lambda self: self.world.avatar is not None and not self.avatar_started)
    @rule()
    def avatar_start(self) -> None:
        w = self.world
        self.avatar_started = True

        self.act(lambda: w.bg(self.start_avatar(w), "avatar.start"))

    @precondition(lambda self: self.world.avatar is not None)
    @rule()
    def avatar_close(self) -> None:
        w = self.world
        assert w.avatar is not None
        avatar = w.avatar
        self.act(lambda: w.bg(avatar.aclose(), "avatar.aclose"))

    @rule()
    def avatar_joins(self) -> None:
        room = self.world.room
        if AVATAR not in room.remote_participants:
            self.act(lambda: room.add_participant(AVATAR, kind="agent"))

    @rule()
    def avatar_arrives_with_video(self) -> None:
        room = self.world.room

        def go() -> None:
            if AVATAR not in room.remote_participants:
                room.add_participant(AVATAR, kind="agent")
            room.publish_track(AVATAR, "video")

        self.act(go)

    @rule(kind=st.sampled_from(["video", "audio"]))
    def avatar_publishes(self, kind: str) -> None:
        room = self.world.room

        def go() -> None:
            if AVATAR in room.remote_participants:
                room.publish_track(AVATAR, kind)
            else:  # reordered: the track arrives before the participant
                room.emit("track_published", stranger_track(kind), stranger(AVATAR))

        self.act(go)

    @rule(result=st.sampled_from(RPC_RESULTS))
    def next_clear_buffer_ends(self, result: Any) -> None:
        self.world.room.local_participant.rpc_script["lk.clear_buffer"].append(result)

    @rule(
        caller=st.sampled_from([AVATAR, USER]),
        payload=st.sampled_from(VALID_PLAYBACK + GARBAGE_PLAYBACK),
    )
    def playback_finished_rpc(self, caller: str, payload: str) -> None:
        w = self.world
        handler = w.room.local_participant.rpc_handlers.get("lk.playback_finished")
        ours = w.avatar is not None and handler == w.avatar._on_playback_finished_rpc
        outcome: list[tuple[str | None, rtc.RpcError | None]] = []

        async def call() -> None:
            try:
                outcome.append(
                    (await w.room.invoke_rpc("lk.playback_finished", caller, payload), None)
                )
            except rtc.RpcError as e:
                outcome.append((None, e))

        self.act(call)
        ((reply, err),) = outcome
        if handler is None:
            assert err is not None and err.code == rtc.RpcError.ErrorCode.UNSUPPORTED_METHOD
        else:
            assert ours, f"someone else's lk.playback_finished handler: {handler!r}"
            if caller != AVATAR:
                assert err is not None and err.code == rtc.RpcError.ErrorCode.APPLICATION_ERROR
                assert err.message == "lk.playback_finished is accepted only from the avatar"
            elif payload in GARBAGE_PLAYBACK:
                assert err is not None and err.code == rtc.RpcError.ErrorCode.APPLICATION_ERROR
                assert err.message.startswith("malformed lk.playback_finished payload: ")
            else:
                assert (reply, err) == ("ok", None)

    # -- the simulator -----------------------------------------------------------------------
    @rule(payload=st.sampled_from(GOOD_FINALIZE + list(BAD_FINALIZE.values())))
    def finalize_request(self, payload: dict[str, Any]) -> None:
        self.act(lambda: self.world.request("finalize_simulation", payload))

    @rule(caller=st.sampled_from(sorted(p for p in PEOPLE if p != SIMULATOR)))
    def finalize_from_someone_else(self, caller: str) -> None:
        # only the simulator participant may decide the job's fate
        payload = {"provisional_success": True}
        self.act(lambda: self.world.request("finalize_simulation", payload, caller=caller))

    @rule(kind=st.sampled_from([*OTHER_KINDS, UNKNOWN_KIND]))
    def other_session_request(self, kind: str) -> None:
        self.act(lambda: self.world.request(kind))

    @rule(data=st.sampled_from([b"\xff\xff\xff", b"\x0a\x05abc", b"garbage"]))
    def garbage_on_the_wire(self, data: bytes) -> None:
        end = self.world.agent_end
        if not end.closed:
            # bytes that are no AgentSessionMessage, straight into the agent's end
            self.act(lambda: end._inbox.put_nowait(data))

    # -- duplicated, reordered, stranger and ill-typed events ------------------------------------
    @rule(identity=st.sampled_from([*sorted(PEOPLE), AVATAR]))
    def duplicate_join(self, identity: str) -> None:
        room = self.world.room
        p = room.remote_participants.get(identity)
        if p is not None:
            self.act(lambda: room.emit("participant_connected", p))

    @patient
    @rule(
        identity=st.sampled_from([*sorted(PEOPLE), AVATAR, "ghost"]),
        reason=st.sampled_from(REASONS),
    )
    def leave_of_someone_not_here(self, identity: str, reason: str) -> None:
        room = self.world.room
        if identity in room.remote_participants:
            return
        p = stranger(identity, attributes=PEOPLE.get(identity, ("", {}))[1])
        p._info.disconnect_reason = rtc.DisconnectReason.Value(reason)  # type: ignore[assignment]
        self.act(lambda: room.emit("participant_disconnected", p))

    @rule()
    def stranger_becomes_a_simulator(self) -> None:
        p = stranger("ghost", attributes={ATTRIBUTE_SIMULATOR: "1"})
        room = self.world.room
        self.act(lambda: room.emit("participant_attributes_changed", {ATTRIBUTE_SIMULATOR: "1"}, p))

    @rule(
        event=st.sampled_from(
            [
                ("participant_connected", ("garbage",)),
                ("participant_disconnected", (42,)),
                ("participant_disconnected", ()),
                ("track_published", ("a", "b")),
                ("track_muted", (None,)),
                ("participant_attributes_changed", (["x"], None)),
                ("connection_state_changed", ()),
                ("disconnected", ("not a reason",)),
            ]
        )
    )
    def ill_typed_room_event(self, event: tuple[str, tuple[Any, ...]]) -> None:
        name, args = event
        room = self.world.room
        self.act(lambda: room.emit(name, *args))

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def the_shared_invariants_hold(self) -> None:
        # the explorer's own checks (explore.checks), over the job's view: the audio route,
        # replies to finalize, the deletion after the hold, one session forwarded, no timer
        # or task outliving its state, the hold ended when it is no longer needed
        if self.w is not None:
            view = self.w.view()
            found = [*safety(view), *settled(view)]
            assert not found, [f"invariant {n} ({BY_NUMBER[n].name}): {d}" for n, d in found]

    @invariant()
    def finalize_taken_in_and_answered_once(self) -> None:
        w = self.w
        if w is None:
            return
        answered = w.records("job", "finalize_answered")
        assert len(answered) <= 1, answered
        received = w.received()
        lost = [
            rid
            for rid, s in w.sent.items()
            if s.delivered
            and s.job_state in ("serving", "awaiting_finalize")
            and rid not in received
        ]
        assert not lost, f"requests sent before the hold ended never reached the host: {lost}"

    @invariant()
    def shutdown_is_bounded(self) -> None:
        w = self.w
        if w is None or w.left_serving_at is None:
            return
        bound = w.left_serving_at + w.config.shutdown_bound
        if w.job.closed_at is not None:
            assert w.job.closed_at <= bound + 1e-9, (w.left_serving_at, w.job.closed_at)
        elif w.clock.now() >= bound:
            raise AssertionError(
                f"job {w.job.state} at t={w.clock.now()}, left serving at {w.left_serving_at}"
            )

    @invariant()
    def a_declared_timeout_is_armed(self) -> None:
        # the other half of scoped timers (invariant 6 is that none outlives its state):
        # a machine waiting in a state with a timeout has its timer running
        if self.w is None:
            return
        for a in self.w.actors():
            spec = a.spec.state(a.state)
            if not (a.closed or spec.final) and a.started and a.idle and spec.timeout:
                seconds = a._settings.get(spec.timeout.setting, spec.timeout.default)
                assert (seconds is None) != a.timer_armed, f"{a.spec.name} in {a.state}"

    @invariant()
    def nothing_escaped(self) -> None:
        if self.w is None:
            return
        p = self.w.problems
        assert not p.escaped_callbacks, p.escaped_callbacks
        assert not p.loop_errors, p.loop_errors
        unexpected = self.w.unexpected_errors()
        assert not unexpected, unexpected

    # -- the end ---------------------------------------------------------------------------------
    def teardown(self) -> None:
        # called from a `finally:` — a step that failed is the failure to report, not
        # whatever the end checks say after it
        failing = sys.exc_info()[1] is not None
        try:
            if self.w is not None and failing:
                with _suppress_all():
                    self.run(self.w.aclose())
            elif self.w is not None:
                try:
                    self.run(self.finish(self.w))
                except AssertionError as e:
                    # hypothesis prints the steps it drew; these are the ones that ran
                    raise AssertionError(f"{e}\n{self.w.config}\nafter: {self.w.steps}") from e
                gc.collect()  # a task whose exception nobody retrieved reports it now
                self.run(asyncio.sleep(0))
                assert not self.w.problems.loop_errors, self.w.problems.loop_errors
        finally:
            self.quiet.__exit__(None, None, None)
            with _suppress_all():
                # after a failed (or abandoned) example: nothing may run on into the next one
                pending = asyncio.all_tasks(self.loop)
                for t in pending:
                    t.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.wait(pending, timeout=5.0))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()
            asyncio.set_event_loop(None)

    async def finish(self, w: World) -> None:
        await w.drain_background()
        report_coverage(w)  # before teardown's own shutdown adds its states
        # shutdown is asked and time passes the bounds: the job is closed
        w.job.shutdown("teardown")
        await w.quiesce()
        waited = 0.0
        # the job machine's close, then the lifecycle's release (each of its steps bounded)
        while (w.job.state != "closed" or w.agent_job.lifecycle != "closed") and (
            waited <= w.config.shutdown_bound + 1
        ):
            await w.advance(1.0)
            waited += 1.0
        assert w.job.state == "closed", f"job still {w.job.state} after {waited}s"
        self.shutdown_is_bounded()
        check_replies(w)
        found = eventual(w.view())  # the explorer's checks once every bound has passed
        assert not found, [f"invariant {n} ({BY_NUMBER[n].name}): {d}" for n, d in found]
        await w.aclose()
        self.nothing_escaped()
        left = w.leftovers()
        assert not left, "\n".join(left)
        # every decision the actors took with `step`, taken again by the `transitions`
        # machines compiled from the same specs
        replayed = replay_records(enumerate(w.trace.records, 1), path="<this example>")
        assert replayed.ok, format_report(replayed)


def report_coverage(w: World) -> None:
    """What the example reached (``--hypothesis-show-statistics``): the invariants are only
    worth what the examples reach."""
    for r in w.trace.records:
        if r.kind == "transition" and r.source != r.dest:
            event(f"{r.machine}: {r.source} -> {r.dest}")
    if any(m == "lk.clear_buffer" for m, _, _ in w.rpc_log):
        event("lk.clear_buffer sent")
    if w.job.finalize_answered:
        event("finalize answered with the verdict")
    if w.deletions:
        event("room deletion attempted")


def check_replies(w: World) -> None:
    """Every request the host took in got exactly one reply, the one it calls for."""
    received = w.received()
    # read while the host was closing: answered with that, whatever the request
    records = w.records("session_host", "request", "finalize", "bad_request")
    closing = {str(r.data["request_id"]) for r in records if r.source == "closing"}
    # a finalize whose sender was not (or no longer) a simulator participant
    stranger = {
        str(r.data["request_id"]) for r in records if r.guards.get("from_simulator") is False
    }
    for rid, took in received.items():
        sent = w.sent[rid]
        replies = w.replies.get(rid, [])
        assert len(replies) == 1, f"{rid} ({sent.kind} {sent.payload}): {len(replies)} replies"
        (resp,) = replies
        error = resp.error if resp.HasField("error") else None
        if rid in closing:
            assert error == HOST_CLOSING, error
        elif rid in stranger:
            assert error == NOT_THE_SIMULATOR, error
        elif sent.kind == UNKNOWN_KIND:
            assert error == "unknown request kind"
        elif took == "bad_request":
            (field_name,) = (f for f, p in BAD_FINALIZE.items() if p == sent.payload)
            assert error == f"malformed finalize_simulation: {field_name} has the wrong type"
        elif took == "finalize":
            if not w.config.simulation:
                assert error == "this job is not a simulation"
            else:  # the first and each asked again: the one verdict (or its one error)
                expect_verdict(w, resp, error)
        elif error is not None:
            assert error == NO_ACTIVE_SESSION, (sent.kind, error)


def expect_verdict(w: World, resp: Any, error: str | None) -> None:
    mode = w.config.faults.simulation_end
    fs = resp.finalize_simulation
    if mode == "veto":
        assert error is None
        assert (fs.user_verdict.success, fs.user_verdict.reason) == (False, VETO)
        assert w.job.verdict == {"success": False, "reason": VETO}
    elif mode == "ok":
        assert error is None and not fs.HasField("user_verdict")
    elif mode == "raise":
        assert error == "on_simulation_end failed: InjectedFault: on_simulation_end"
    else:  # hang: the job gave up on it at close
        assert error == FINALIZE_UNFINISHED, error


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class _suppress_all:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


ComposedJob.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60 if DEEP else 40,
    deadline=None,
    derandomize=not DEEP,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
    **({"phases": [Phase.explicit, Phase.generate]} if os.environ.get("PROPS_DEV") else {}),
)
TestComposedJob = ComposedJob.TestCase


@pytest.mark.exhaustive
def test_the_composed_job_at_length() -> None:
    run_state_machine_as_test(
        ComposedJob, settings=settings(TestComposedJob.settings, max_examples=EXHAUSTIVE_EXAMPLES)
    )


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
