"""The fuzzer draws only what can reach the agent under test: an agent whose entrypoint gives
its job no avatar is drawn no avatar steps (its provider joining, publishing video, leaving,
reporting its playback, its plugin's start failing, ``lk.*`` avatar RPCs), which no code of
that agent can hear. Before, such an agent had about a sixth of its steps spent on an
avatar it does not have (examples that test nothing more, paths counted for nothing), and a
failure found for it was written as a scenario saying ``avatar_identity: avatar``, a
replay of which stands in a scripted avatar for an avatar plugin that agent never had.

Real: livekit's fake ``JobContext``, ``AgentSession``, ``AgentServer``, the runtime,
hypothesis. Faked, because they need a server: the room and the session transport.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_runtime.testing.fuzz import FuzzOptions, FuzzOutcome, fuzz
from agent_runtime.testing.fuzz.harness import AVATAR
from tests.support import planted


def _avatar_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        s
        for s in steps
        if AVATAR in (s.get("identity"), s.get("caller"))
        or s["event"] == "avatar.start_error"
        or str(s.get("method", "")).startswith("lk.")
    ]


def _drawn(server: Any, examples: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []

    def record(outcome: FuzzOutcome) -> None:
        steps.extend(outcome.steps)

    report = fuzz(server, FuzzOptions(seed=1, examples=examples), checks=[record])
    assert report.ok, report.summary()
    return steps


def test_an_agent_without_an_avatar_is_drawn_no_avatar_steps() -> None:
    steps = _drawn(planted.simulator_lookup_server(False), 40)
    assert len(steps) > 40  # the runs drew steps, not one of them the avatar's
    assert _avatar_steps(steps) == []


def test_an_agent_with_an_avatar_is_still_drawn_its_avatar_steps() -> None:
    steps = _drawn(planted.avatar_mute_server(False), 40)
    events = {s["event"] for s in _avatar_steps(steps)}
    assert {"participant_connected", "avatar.start_error"} <= events


def test_a_failure_of_an_agent_without_an_avatar_is_written_without_one(tmp_path: Path) -> None:
    report = fuzz(planted.leaky_task_server(True), FuzzOptions(seed=1), out=tmp_path)
    assert not report.ok and report.scenario is not None and report.written is not None
    assert "avatar_identity" not in report.scenario["config"]
    assert "avatar" not in Path(report.written).read_text()
