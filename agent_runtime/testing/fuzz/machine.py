"""What can happen to a job, as a hypothesis rule-based state machine.

Each rule is one thing the room, the simulator, the avatar, the user or the agent's own code
can do, taken only when it can happen (a participant leaves only if present); each is one
scenario step at the virtual time reached so far, and ``wait`` moves that time on. After
every step the ``during`` properties are checked; at the end the job is let run out, ended
as a test's end ends it, and the ``at_end`` properties and the user's are checked.
Hypothesis draws the sequences and shrinks a failing one; this module only says what the
steps are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from livekit.agents.types import ATTRIBUTE_SIMULATOR

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing import scenario as sc
from agent_runtime.testing.fuzz import properties as props
from agent_runtime.testing.fuzz.harness import AVATAR, SIMULATOR, Harness
from agent_runtime.testing.fuzz.properties import Check, FuzzOutcome, Problem

USER, STRANGER = "user", "stranger"
GAPS = (0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
SHUTDOWN_REASONS = ("the agent hung up", "")


class FuzzFailure(AssertionError):
    """Properties that did not hold in one run: its problems and its scenario."""

    def __init__(self, problems: list[Problem], scenario: dict[str, Any]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems
        self.scenario = scenario


@dataclass
class Stats:
    """What every run so far showed: how many, which distinct paths (the machines'
    transitions, in order), the last failure's scenario."""

    examples: int = 0
    paths: set[int] = field(default_factory=set)
    on_example: Callable[[Stats], None] | None = None


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
    problems += props.released(h) + props.user_code(h)
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
    return problems + props.run_checks(checks, outcome)


def make_machine(
    server: Any, config: sc.Config, checks: list[Check], stats: Stats
) -> type[RuleBasedStateMachine]:
    """The state machine class for ``server``'s entrypoint under ``config`` (its avatar and
    simulation switches say which rules exist)."""
    simulation = config.simulation
    avatar = config.avatar_identity
    people = (USER, STRANGER, *((SIMULATOR,) if simulation else ()))

    class JobFuzz(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            # the room (an rtc.Room) takes the current loop when it is made
            asyncio.set_event_loop(self.loop)
            self.h = Harness(server, config)
            self.steps: list[dict[str, Any]] = []
            self.participants: list[dict[str, Any]] = []
            self.video = False
            self.failed: list[Problem] = []

        # -- running a step -------------------------------------------------------------
        def _do(self, event: str, **fields: Any) -> None:
            raw = {"at": round(self.h.clock.now(), 3), "event": event, **fields}
            self.steps.append(raw)
            step = sc.parse_scenario({"name": "step", "steps": [raw]}).steps[0]
            self.loop.run_until_complete(self.h.step(step))

        def _present(self, identity: str) -> bool:
            return identity in self.h.room.remote_participants

        def _live(self) -> bool:
            job = self.h.job
            return job is not None and lk.session_live(job.session)

        def _fail(self, problems: list[Problem]) -> None:
            if problems:
                self.failed = problems
                raise FuzzFailure(problems, self.scenario())

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
            self.loop.run_until_complete(self.h.open(parsed.participants))
            if avatar_fails:
                self._do("avatar.start_error")
            self._do("session.start")

        # -- people ---------------------------------------------------------------------
        @rule(data=st.data())
        def join(self, data: st.DataObject) -> None:
            absent = [p for p in people if not self._present(p)]
            if not absent:
                return self.wait(1.0)
            who = data.draw(st.sampled_from(absent), label="who")
            attributes = {ATTRIBUTE_SIMULATOR: "true"} if who == SIMULATOR else {}
            self._do("participant_connected", identity=who, attributes=attributes)
            return None

        @rule(data=st.data())
        def leave(self, data: st.DataObject) -> None:
            present = [p for p in people if self._present(p)]
            if not present:
                return self.wait(1.0)
            who = data.draw(st.sampled_from(present), label="who")
            reason = data.draw(st.sampled_from(sc.DISCONNECT_REASONS), label="reason")
            self._do("participant_disconnected", identity=who, reason=reason)
            return None

        # -- the avatar -----------------------------------------------------------------
        if avatar is not None:

            @precondition(lambda self: not self._present(AVATAR))
            @rule()
            def avatar_joins(self) -> None:
                self.video = False
                self._do("participant_connected", identity=AVATAR, kind="agent")

            @precondition(lambda self: self._present(AVATAR) and not self.video)
            @rule()
            def avatar_video(self) -> None:
                self.video = True
                self._do("track_published", identity=AVATAR, kind="video")

            @precondition(lambda self: self._present(AVATAR))
            @rule(reason=st.sampled_from(sc.DISCONNECT_REASONS))
            def avatar_leaves(self, reason: str) -> None:
                self._do("participant_disconnected", identity=AVATAR, reason=reason)

            @precondition(lambda self: self._present(AVATAR))
            @rule(interrupted=st.booleans())
            def avatar_reports_playback(self, interrupted: bool) -> None:
                payload = {"playback_position": 1.0, "interrupted": interrupted}
                self._do("rpc", method="lk.playback_finished", caller=AVATAR, payload=payload)

        # -- the simulator and strangers --------------------------------------------------
        if simulation:

            @rule(caller=st.sampled_from((SIMULATOR, SIMULATOR, USER, STRANGER)))
            def finalize(self, caller: str) -> None:
                self._do(
                    "session_request",
                    caller=caller,
                    request="finalize_simulation",
                    payload={"provisional_success": True},
                )

        @rule(method=st.sampled_from(("lk.playback_finished", "lk.clear_buffer", "unknown")))
        def stranger_rpc(self, method: str) -> None:
            self._do("rpc", method=method, caller=STRANGER, payload="{}")

        @precondition(lambda self: self.h.room.isconnected())
        @rule()
        def room_deleted(self) -> None:
            self._do("room.disconnected", reason="ROOM_DELETED")

        # -- the user and the agent speaking ----------------------------------------------
        @precondition(lambda self: self._live())
        @rule(duration=st.sampled_from((0.5, 2.0, 6.0)))
        def user_speaks(self, duration: float) -> None:
            self._do("user.speech", duration=duration)

        @precondition(lambda self: self._live())
        @rule(duration=st.sampled_from((1.0, 3.0)))
        def agent_says(self, duration: float) -> None:
            self._do("agent.say", duration=duration)

        @precondition(lambda self: self._live())
        @rule()
        def interrupt(self) -> None:
            self._do("session.interrupt")

        # -- the agent's own code ---------------------------------------------------------
        @precondition(lambda self: self.h.job is not None)
        @rule(graceful=st.booleans())
        def aclose(self, graceful: bool) -> None:
            self._do("job.aclose", graceful=graceful)

        @precondition(lambda self: self.h.started)
        @rule(reason=st.sampled_from(SHUTDOWN_REASONS))
        def shutdown(self, reason: str) -> None:
            self._do("job.shutdown", reason=reason)

        # -- time ---------------------------------------------------------------------------
        @rule(seconds=st.sampled_from(GAPS))
        def wait(self, seconds: float) -> None:
            target = self.h.clock.now() + seconds
            self.loop.run_until_complete(self.h.advance_to(target))

        # -- the properties -------------------------------------------------------------------
        @invariant()
        def holds(self) -> None:
            if self.steps:
                self._fail([p for check in props.DURING for p in check(self.h)])

        def teardown(self) -> None:
            try:
                if not self.failed:
                    self.steps.append({"at": round(self.h.clock.now(), 3), "event": "end"})
                    problems = self.loop.run_until_complete(finish(self.h, checks, self.steps))
                else:
                    problems = []
                    self.loop.run_until_complete(self.h.close())
                stats.examples += 1
                stats.paths.add(
                    hash(tuple((t["machine"], t["dest"]) for t in self.h.runner.transitions))
                )
                if stats.on_example is not None:
                    stats.on_example(stats)
                self._fail(problems)
            finally:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()
                asyncio.set_event_loop(None)

    JobFuzz.__name__ = JobFuzz.__qualname__ = "JobFuzz"
    return JobFuzz
