"""``agent-runtime record``: the settings of timers read from a trace, where the trace shows
them only partly.

- the playout bound's ``margin``, when the agent spoke before the avatar joined: the bound
  counts the audio from the join (docs/guide/playout.md), so the margin is what it waited
  past the audio played from then;

Each case is a scenario written here, simulated with ``--trace``, recorded with
``--check``: the rebuilt scenario gives the same transitions, at the same times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.testing.scenario import load_scenario
from agent_runtime.tools.cli import main


def round_trip(
    scenario: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], Path]:
    """The scenario simulated with a trace, and the file ``record --check`` rebuilt from it
    (the check passing)."""
    path, trace, recorded = tmp_path / "s.yaml", tmp_path / "run.jsonl", tmp_path / "r.yaml"
    path.write_text(json.dumps(scenario))
    assert main(["simulate", str(path), "--json", "--trace", str(trace)]) == 0
    original: dict[str, Any] = json.loads(capsys.readouterr().out)
    code = main(["record", str(trace), "-o", str(recorded), "--check"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "the rebuilt scenario reproduces the trace" in err
    return original, recorded


# how the avatar came in after the agent began a 3 s speech at t=0.5: with its video at
# once, or into the room first and its video later (audio its sink took before either is
# awaited from the join on)
JOINS: dict[str, list[dict[str, Any]]] = {
    "joins-with-video": [
        {"at": 2.5, "event": "participant_connected", "identity": "av", "kind": "agent"},
        {"at": 2.5, "event": "track_published", "identity": "av", "kind": "video"},
    ],
    "video-after-joining": [
        {"at": 1, "event": "participant_connected", "identity": "av", "kind": "agent"},
        {"at": 2, "event": "track_published", "identity": "av", "kind": "video"},
    ],
}


@pytest.mark.parametrize("margin", [0.5, 1.5])
@pytest.mark.parametrize("join", list(JOINS))
def test_the_margin_of_a_bound_on_audio_taken_before_the_avatar_joined_is_counted_from_the_join(
    join: str, margin: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The avatar never reports: the bound fired its audio plus the margin after the join.
    The rebuilt margin is the scenario's (it was counted from the speech: the join's delay
    was taken for margin, and the replay's bound fired late)."""
    scenario = {
        "name": "spoke before the avatar joined",
        "config": {"avatar_identity": "av", "join_timeout": 10, "playout": {"margin": margin}},
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 0.2, "event": "avatar.start"},
            {"at": 0.5, "event": "agent.say", "duration": 3},
            *JOINS[join],
            {"at": 20, "event": "end"},
        ],
    }
    original, recorded = round_trip(scenario, tmp_path, capsys)
    fired = [t for t in original["transitions"] if t["event"] == "playout_timeout"]
    assert len(fired) == 1  # the bound, not the avatar, ended the playout
    playout = load_scenario(recorded).config.playout
    assert playout is not None and playout.margin == margin
