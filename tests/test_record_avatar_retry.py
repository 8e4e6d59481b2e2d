"""``agent-runtime record`` on a trace whose avatar retry was still starting when the job
closed: the retry's plugin start had begun and never ended. The rebuilt scenario holds the
avatar's starts and ends each one that did end where the trace shows it, so ``--check``
replays it to the same trace (it was a scenario whose every start raised at once: the
retry failed instead of being cut by the close).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from livekit.agents import Agent, AgentSession

from agent_runtime import AgentJob, MemorySink, Tracer
from agent_runtime.settings import AvatarRetry
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from agent_runtime.tools.cli import main
from agent_runtime.tools.record import record

CONFIG = {
    "avatar_identity": "avatar-1",
    "join_timeout": 2,
    "retry_avatar": {"attempts": 2, "backoff": {"initial": 1, "max": 2}},
    "hold": ["avatar_start"],
}
HELD = {"event": "held.end", "call": "avatar_start"}
CASES: dict[str, list[dict[str, Any]]] = {
    # the first start raised at t=1; its retry starts at t=2 and is cut by the close at 3
    "after-a-start-that-raised": [
        {"at": 1, **HELD, "result": "error"},
        {"at": 3, "event": "job.shutdown", "reason": "done"},
    ],
    # the first start returned at t=1 but the avatar never joined: failed at 3, retried at
    # 4, and the job closed at 5 while that start was still running
    "after-a-start-that-never-joined": [
        {"at": 1, **HELD, "result": "routed"},
        {"at": 1, **HELD, "result": "ok"},
        {"at": 5, "event": "job.shutdown", "reason": "done"},
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_retry_still_starting_at_the_close_is_rebuilt_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    scenario = tmp_path / "incident.yaml"
    steps = [
        {"at": 0, "event": "avatar.start"},
        {"at": 0.5, "event": "session.start"},
        *CASES[case],
        {"at": 20, "event": "end"},
    ]
    scenario.write_text(
        yaml.safe_dump(
            {"name": case, "config": CONFIG, "participants": [{"identity": "user"}], "steps": steps}
        )
    )
    trace, recorded = tmp_path / "run.jsonl", tmp_path / "recorded.yaml"
    assert main(["simulate", str(scenario), "--trace", str(trace)]) == 0
    assert '"source": "releasing"' in trace.read_text()  # a retry began
    capsys.readouterr()

    code = main(["record", str(trace), "-o", str(recorded), "--check"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the rebuilt scenario reproduces the trace" in err
    rebuilt = load_scenario(recorded)
    assert "avatar_start" in rebuilt.config.hold
    held = [(s.at, getattr(s, "result", None)) for s in rebuilt.steps if s.event == "held.end"]
    assert held == [(float(s["at"]), s["result"]) for s in CASES[case] if s["event"] == "held.end"]


RELEASE_CASES: dict[str, list[dict[str, Any]]] = {
    # the avatar joined without its video: the join timed out at 3.1, the retry's release
    # at 5.1 removed it, and the user left while the new attempt waited
    "removed-then-the-user-left": [
        {"at": 1, "event": "participant_connected", "identity": "av", "kind": "agent"},
        {"at": 6, "event": "participant_disconnected", "identity": "user"},
    ],
    # removed at 5.1 as above, it came back with its video and the job closed (the close
    # removed it again)
    "removed-then-back": [
        {"at": 1, "event": "participant_connected", "identity": "av", "kind": "agent"},
        {"at": 6, "event": "participant_connected", "identity": "av", "kind": "agent"},
        {"at": 6.5, "event": "track_published", "identity": "av", "kind": "video"},
        {"at": 8, "event": "job.shutdown", "reason": "done"},
    ],
}


@pytest.mark.parametrize("case", list(RELEASE_CASES))
def test_the_avatar_a_retry_removed_is_not_a_departure_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A retry's release removes the failed attempt's avatar participant: the departure
    that follows is the runtime's own, so the rebuilt scenario leaves it to its avatar
    (as a step, it came as a stranger's departure during the new attempt and failed it)."""
    scenario = tmp_path / "incident.yaml"
    config = {
        "avatar_identity": "av",
        "join_timeout": 3,
        "retry_avatar": {"attempts": 2, "backoff": {"initial": 2, "max": 5}},
    }
    steps = [
        {"at": 0, "event": "session.start"},
        {"at": 0.1, "event": "avatar.start"},
        *RELEASE_CASES[case],
        {"at": 30, "event": "end"},
    ]
    scenario.write_text(
        yaml.safe_dump(
            {"name": case, "config": config, "participants": [{"identity": "user"}], "steps": steps}
        )
    )
    trace, recorded = tmp_path / "run.jsonl", tmp_path / "recorded.yaml"
    assert main(["simulate", str(scenario), "--trace", str(trace)]) == 0
    assert "PARTICIPANT_REMOVED" in trace.read_text()  # the release removed it
    capsys.readouterr()

    code = main(["record", str(trace), "-o", str(recorded), "--check"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the rebuilt scenario reproduces the trace" in err
    assert "PARTICIPANT_REMOVED" not in recorded.read_text()
    rebuilt = load_scenario(recorded)
    joins = [s.at for s in rebuilt.steps if s.event == "participant_connected"]
    assert joins == [float(s["at"]) for s in steps if s["event"] == "participant_connected"]


def test_an_attempt_given_up_and_kept_for_a_rejoin_is_rebuilt_with_rejoin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An avatar that never joins, with ``retry_avatar: {rejoin: true}`` and nobody coming
    back: the trace shows the attempt kept (``failed -> restored``, its rejoin guard read
    true) rather than retired. The rebuilt scenario has rejoin on, so ``--check`` replays
    it to the same transitions (without it, the attempt would be retired)."""
    scenario = tmp_path / "kept.yaml"
    config = {"avatar_identity": "avatar-1", "join_timeout": 2, "retry_avatar": {"rejoin": True}}
    steps = [
        {"at": 0, "event": "avatar.start"},
        {"at": 0.5, "event": "session.start"},
        {"at": 5, "event": "end"},
    ]
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "kept",
                "config": config,
                "participants": [{"identity": "user"}],
                "steps": steps,
            }
        )
    )
    trace, recorded = tmp_path / "run.jsonl", tmp_path / "recorded.yaml"
    assert main(["simulate", str(scenario), "--trace", str(trace)]) == 0
    assert '"dest": "retiring"' not in trace.read_text()
    capsys.readouterr()
    code = main(["record", str(trace), "-o", str(recorded), "--check"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the rebuilt scenario reproduces the trace" in err
    assert load_scenario(recorded).config.retry_avatar.rejoin


class _Unclosable(ScriptedAvatar):
    """A plugin whose first start raises and whose aclose() never returns (its provider's
    end-session call hangs, after the base class's close)."""

    def __init__(self) -> None:
        super().__init__(avatar_identity="avatar-1", start_error="the provider failed")
        self.start_errors = 1

    async def aclose(self) -> None:
        await super().aclose()
        await asyncio.get_running_loop().create_future()


async def test_a_release_cut_at_its_bound_tells_join_timeout(
    room: InMemoryRoom, clock: VirtualClock
) -> None:
    """The failed attempt's release hangs (its plugin's close and the participant's removal
    never end) until ``release_timeout``, after ``join_timeout`` (3 s): the only timeout
    of that setting the trace shows, as the job closes before the next attempt's join
    timeout. The rebuilt config has ``join_timeout: 3`` (two states time out with
    ``release_timeout``: releasing and retiring, each read as its own)."""

    async def hangs(identity: str) -> None:
        await asyncio.get_running_loop().create_future()

    sink = MemorySink()
    room.add_participant("user")
    job = AgentJob(
        room=room,
        session=AgentSession(),
        avatar=_Unclosable(),
        clock=clock,
        otel=False,
        tracer=Tracer(sink),
        join_timeout=3,
        retry_avatar=AvatarRetry(attempts=1, backoff={"initial": 1}),
        remove_avatar_participant=hangs,
    )
    await job.start(Agent(instructions="agent"))
    await clock.advance(4.5)  # start_error at 0, backoff 1 s, released by its bound at 4
    assert [(r.source, r.t) for r in sink.records if r.event == "release_timeout"] == [
        ("releasing", 4.0)
    ]
    assert job.states["avatar"] == "routing"
    closing = asyncio.ensure_future(job.aclose(graceful=False))
    await clock.advance(30)
    await closing
    assert record(sink.records, name="cut").scenario["config"]["join_timeout"] == 3.0
