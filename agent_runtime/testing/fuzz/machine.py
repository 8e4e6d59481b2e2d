"""What can happen to a job, as a hypothesis rule-based state machine.

Each rule is one thing the room, the simulator, the avatar, the user or the agent's own code
can do, taken only when it can happen (a participant leaves only if present: a guard in the
rule, not a hypothesis precondition, which keeps hypothesis from shrinking the sequence);
each is one scenario step at the virtual time reached so far, and ``wait`` moves that time on. After
every step the ``during`` properties are checked; at the end the job is let run out, ended
as a test's end ends it, and the ``at_end`` properties and the user's are checked.
Hypothesis draws the sequences and shrinks a failing one; this module only says what the
steps are.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis import target
from hypothesis.errors import StopTest
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing import scenario as sc
from agent_runtime.testing.clock import VirtualTimeLoop
from agent_runtime.testing.fuzz import properties as props
from agent_runtime.testing.fuzz.harness import AVATAR, SIMULATOR, Harness
from agent_runtime.testing.fuzz.interrupt import Interrupts
from agent_runtime.testing.fuzz.properties import Check, FuzzOutcome, Problem
from statemachines.agent_job import STARTING

logger = logging.getLogger("agent_runtime.testing.fuzz")

USER, STRANGER = "user", "stranger"
GAPS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)


class FuzzFailure(AssertionError):
    """Properties that did not hold in one run: its problems and its scenario."""

    def __init__(self, problems: list[Problem], scenario: dict[str, Any], logs: list[str]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems
        self.scenario = scenario
        self.logs = logs  # the run's log lines kept for the report (Harness.log_lines)


class CheckStopped(BaseException):
    """A ``BadCheck`` in a run: the fuzz stops there (hypothesis shrinks what raises an
    ``Exception``, and a check that cannot read the outcome fails every run alike)."""

    def __init__(self, error: props.BadCheck) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Stats:
    """What every run so far showed: how many, which distinct paths (the machines'
    transitions, in order), the last failure's scenario."""

    examples: int = 0
    paths: set[int] = field(default_factory=set)
    failed: int = 0  # runs that showed a problem: past the first, hypothesis is shrinking
    on_example: Callable[[Stats], None] | None = None
    interrupts: Interrupts = field(default_factory=Interrupts)  # Ctrl-C, taken at a step


def scenario_of(
    config: sc.Config, participants: list[dict[str, Any]], steps: list[dict[str, Any]]
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"simulation": config.simulation}
    if config.avatar_identity is not None:
        cfg["avatar_identity"] = config.avatar_identity
    return {"config": cfg, "participants": participants, "steps": steps}


async def finish(h: Harness, checks: list[Check], steps: list[dict[str, Any]]) -> list[Problem]:
    """Let the job run out, end it as a test's end does, release it; every ``at_end``
    property, then the user's."""
    problems: list[Problem] = []
    await h.run_out(props.end_bound(h) + 1.0 if h.started else 0.0)
    problems += props.verdicts(h) + props.answered(h) + props.closes(h)
    await h.close()
    await asyncio.sleep(0)
    # the agent's own failure first: what it left running is often its consequence, and
    # a session whose close the agent's code held is left half closed, with its tasks
    problems += props.user_code(h)
    problems += props.released(h)
    outcome = FuzzOutcome(
        steps=steps,
        job=h.job,
        ctx=h.ctx,
        room=h.room,
        clock=h.clock,
        requests=list(h.sent.values()),
        shutdown_reason=h.process.reason if h.process is not None else None,
        shutdown_steps=list(h.process.steps) if h.process is not None else [],
        transitions=h.runner.transitions,
    )
    problems += props.run_checks(checks, outcome)
    never_started = h.job is not None and not any(
        t["machine"] == "agent_job" and t["dest"] in STARTING for t in h.runner.transitions
    )
    if never_started and problems and all(p.prop != "user code" for p in problems):
        # built, never started, nothing of the agent's failed: first, as the cause of the
        # rest (a start deferred to a room event is livekit's to allow: no refusal up front)
        problems.insert(
            0, Problem("started", "the entrypoint's AgentJob was never started (job.start)")
        )
    return problems


def _sdk_failures_at_debug(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # the SDK's own tasks failing as a run cuts them (a room gone under a data stream) are
    # the run's ordinary end; the agent's own failures are caught before this (UserFailures)
    logger.debug("background task ended: %s", context.get("exception") or context.get("message"))


async def _harness(server: Any, config: sc.Config, keep_logs: bool) -> Harness:
    return Harness(server, config, keep_logs=keep_logs)


async def _gathered(tasks: set[asyncio.Task[Any]]) -> None:
    # on the run's loop, even with no task (gather() alone would take the thread's loop)
    await asyncio.gather(*tasks, return_exceptions=True)


def make_machine(
    server: Any, config: sc.Config, checks: list[Check], stats: Stats, *, keep_logs: bool = True
) -> type[RuleBasedStateMachine]:
    """The state machine class for ``server``'s entrypoint under ``config`` (its avatar and
    simulation switches say which rules exist); ``keep_logs``: each run's log is kept for
    a failure's report rather than printed (``Harness``)."""
    simulation = config.simulation
    avatar = config.avatar_identity
    # the user twice: most of what goes wrong in a job's life is the user's comings and
    # goings, and a bug that needs several of them in a row is found far sooner this way
    people = (USER, USER, STRANGER, *((SIMULATOR,) if simulation else ()))

    class JobFuzz(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            stats.interrupts.check()  # a Ctrl-C between runs: no other
            # virtual time, the SDK's own timers included: none of them fires early or late
            # with the machine's speed
            self.loop = VirtualTimeLoop()
            self.loop.set_exception_handler(_sdk_failures_at_debug)
            # made on the loop: the room (an rtc.Room) takes the running loop, and the
            # caller's thread (the main one, where the entrypoint runs as under livekit's
            # job process) keeps its own current loop
            self.h = self.loop.run_until_complete(_harness(server, config, keep_logs))
            self.steps: list[dict[str, Any]] = []
            self.participants: list[dict[str, Any]] = []
            self.video = False
            self.failed: list[Problem] = []
            self.in_the_end = 0  # steps taken after the session ended, the room still there

        # -- running a step -------------------------------------------------------------
        def _do(self, event: str, **fields: Any) -> None:
            job = self.h.job
            if job is not None and not self._live() and self._room_up():
                self.in_the_end += 1
            raw = {"at": round(self.h.clock.now(), 3), "event": event, **fields}
            self.steps.append(raw)
            step = sc.parse_scenario({"name": "step", "steps": [raw]}).steps[0]
            self._run(self.h.step(step))

        def _run(self, aw: Any) -> Any:
            if stats.interrupts.asked:  # a Ctrl-C between runs or steps: before this one
                aw.close()
                raise KeyboardInterrupt
            return self.loop.run_until_complete(aw)

        def _present(self, identity: str) -> bool:
            return identity in self.h.room.remote_participants

        def _room_up(self) -> bool:
            # a room the agent left hears nothing more from the server
            return self.h.room.isconnected()

        def _live(self) -> bool:
            job = self.h.job
            return job is not None and lk.session_live(job.session)

        def _fail(self, problems: list[Problem]) -> None:
            if problems:
                self.failed = problems
                raise FuzzFailure(problems, self.scenario(), self.h.log_lines())

        def scenario(self) -> dict[str, Any]:
            return scenario_of(config, self.participants, self.steps)

        # -- the start ------------------------------------------------------------------
        @initialize(user=st.booleans(), avatar_fails=st.booleans() if avatar else st.just(False))
        def start(self, user: bool, avatar_fails: bool) -> None:
            if simulation:
                self.participants.append(
                    {"identity": SIMULATOR, "attributes": {ATTRIBUTE_SIMULATOR: "true"}}
                )
            if user:
                self.participants.append({"identity": USER})
            parsed = sc.parse_scenario(
                {
                    "name": "start",
                    "participants": self.participants,
                    "steps": [{"at": 0, "event": "end"}],
                }
            )
            self._run(self.h.open(parsed.participants))
            if avatar_fails:
                self._do("avatar.start_error")
            self._do("session.start")

        # -- people ---------------------------------------------------------------------
        # who is drawn from everyone, not from who can act now: a step then means the same
        # whatever came before it, and hypothesis can delete the steps before it
        @rule(who=st.sampled_from(people))
        def join(self, who: str) -> None:
            if self._present(who) or not self._room_up():
                return
            attributes = {ATTRIBUTE_SIMULATOR: "true"} if who == SIMULATOR else {}
            self._do("participant_connected", identity=who, attributes=attributes)

        @rule(who=st.sampled_from(people), reason=st.sampled_from(sc.DISCONNECT_REASONS))
        def leave(self, who: str, reason: str) -> None:
            if not self._present(who) or not self._room_up():
                return
            self._do("participant_disconnected", identity=who, reason=reason)

        # -- the avatar (one rule: what its provider does) ---------------------------------
        if avatar is not None:

            @rule(
                what=st.sampled_from(("joins", "video", "leaves", "reports")),
                reason=st.sampled_from(sc.DISCONNECT_REASONS),
                interrupted=st.booleans(),
            )
            def avatar_does(self, what: str, reason: str, interrupted: bool) -> None:
                if not self._room_up():
                    return
                here = self._present(AVATAR)
                if what == "joins" and not here:
                    self.video = False
                    self._do("participant_connected", identity=AVATAR, kind="agent")
                elif what == "video" and here and not self.video:
                    self.video = True
                    self._do("track_published", identity=AVATAR, kind="video")
                elif what == "leaves" and here:
                    self._do("participant_disconnected", identity=AVATAR, reason=reason)
                elif what == "reports" and here:
                    payload = {"playback_position": 1.0, "interrupted": interrupted}
                    self._do("rpc", method="lk.playback_finished", caller=AVATAR, payload=payload)

        # -- requests: the simulator's finalize (or someone else's), strangers' RPCs -------
        # the avatar's RPCs reach an agent only through its avatar's sink
        avatar_rpcs = ("rpc:lk.playback_finished", "rpc:lk.clear_buffer") if avatar else ()

        @rule(
            what=st.sampled_from(("finalize", "finalize", *avatar_rpcs, "rpc:unknown")),
            caller=st.sampled_from((SIMULATOR, USER, STRANGER)),
        )
        def request(self, what: str, caller: str) -> None:
            # a finalize is asked once the agent left too (the room not deleted): one that
            # a hold was owed to then goes unanswered
            if self.h.room_gone or (what != "finalize" and not self._room_up()):
                return
            if what == "finalize":
                if simulation:
                    self._do(
                        "session_request",
                        caller=caller,
                        request="finalize_simulation",
                        payload={"provisional_success": True},
                    )
            else:
                self._do("rpc", method=what.removeprefix("rpc:"), caller=STRANGER, payload="{}")

        # -- the user and the agent speaking (one rule: speech is one kind of thing) ------
        @rule(
            what=st.sampled_from(("user", "agent", "interrupt")),
            seconds=st.sampled_from((0.5, 2.0, 6.0)),
        )
        def speech(self, what: str, seconds: float) -> None:
            if not self._live():
                return
            if what == "user":
                self._do("user.speech", duration=seconds)
            elif what == "agent":
                self._do("agent.say", duration=min(seconds, 3.0))
            else:
                self._do("session.interrupt")

        # -- the job ended from the agent's side or the server's (one rule: each of them
        # ends the run's interesting part, so together they are drawn as often as one) ------
        @rule(how=st.sampled_from(("ctx", "shutdown", "aclose", "abort", "room_deleted")))
        def hang_up(self, how: str) -> None:
            job = self.h.job
            if how == "room_deleted":
                if self.h.room.isconnected():
                    self._do("room.disconnected", reason="ROOM_DELETED")
            elif how == "ctx":
                # once: a second ctx.shutdown() is ignored by livekit
                if self.h.process is not None and not self.h.process.begun:
                    self._do("ctx.shutdown", reason="the agent hung up")
            elif how == "shutdown":  # job.shutdown(reason): an end-call tool's
                if job is not None and job.lifecycle in (*STARTING, "running"):
                    self._do("job.shutdown", reason="the agent hung up")
            elif how == "aclose":
                if job is not None and job.lifecycle in (*STARTING, "running"):
                    self._do("job.aclose", graceful=True)
            elif job is not None and job.lifecycle != "closed":
                self._do("job.aclose", graceful=False)

        # -- time ---------------------------------------------------------------------------
        @rule(seconds=st.sampled_from(GAPS))
        def wait(self, seconds: float) -> None:
            until = self.h.clock.now() + seconds
            self._run(self.h.advance_to(until))

        # -- the properties -------------------------------------------------------------------
        @invariant()
        def holds(self) -> None:
            if self.steps:
                self._fail(props.during(self.h))

        def teardown(self) -> None:
            try:
                if stats.interrupts.asked:
                    return  # the fuzz stops: nothing of this run is checked or counted
                if isinstance(sys.exc_info()[1], StopTest):
                    # hypothesis cut the run short (an overrun: it drew more than a run
                    # may) and draws another in its place: not one of the --examples,
                    # neither checked nor counted (--examples 50 reported 55 runs)
                    self.loop.run_until_complete(self.h.close())
                    return
                if not self.failed:
                    self.steps.append({"at": round(self.h.clock.now(), 3), "event": "end"})
                    try:
                        problems = self.loop.run_until_complete(finish(self.h, checks, self.steps))
                    except props.BadCheck as e:
                        raise CheckStopped(e) from None
                else:
                    problems = []
                    self.loop.run_until_complete(self.h.close())
                # hypothesis steers its drawing towards runs with more happening in the
                # job's end (the session over, the room still there): where orders go wrong
                target(float(self.in_the_end), label="steps in the job's end")
                stats.examples += 1
                stats.failed += bool(self.failed or problems)
                stats.paths.add(
                    hash(tuple((t["machine"], t["dest"]) for t in self.h.runner.transitions))
                )
                if stats.on_example is not None:
                    stats.on_example(stats)
                self._fail(problems)
            finally:
                self.h.release_log()
                # what the run left (found above, or cut by a failure) goes with its loop
                left = asyncio.all_tasks(self.loop)
                for task in left:
                    task.cancel()
                self.loop.run_until_complete(_gathered(left))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

    JobFuzz.__name__ = JobFuzz.__qualname__ = "JobFuzz"
    return JobFuzz
