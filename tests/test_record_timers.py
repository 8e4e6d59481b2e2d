"""``agent-runtime record``: the settings of timers read from a trace, where the trace shows
them only partly.

- the playout bound's ``margin``, when the agent spoke before the avatar joined: the bound
  counts the audio from the join (docs/guide/playout.md), so the margin is what it waited
  past the audio played from then;
- the avatar's retry backoff, when a wait never ended on its timer (the session closed
  while the avatar waited): the rebuilt wait must outlast it, not end with it (a timer due
  at the instant of the event that ended the wait fires first in the replay).

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


# the avatar never joins (join_timeout 1.5): the first wait for a restart begins at 1.5;
# with a second restart (its start at 1.5 + the first wait), the second wait begins 1.5
# after that; the user leaves during the last wait, which never ends on its timer
BACKOFFS: dict[str, tuple[dict[str, Any], float]] = {
    # the user leaves 1 s into the first wait: as long as the default backoff (1 s)
    "held-as-long-as-the-default": ({"attempts": 1, "backoff": {"initial": 5}}, 2.5),
    # the user leaves 3.5 s into it: longer than the default
    "held-past-the-default": ({"attempts": 1, "backoff": {"initial": 8}}, 5),
    # the first wait (1 s) ended on its timer; the second (1 * 5) is left 3 s into it,
    # longer than the default growth (x2) makes it
    "a-later-wait-held-past-the-growth": (
        {"attempts": 2, "backoff": {"initial": 1, "multiplier": 5}},
        7,
    ),
}


@pytest.mark.parametrize("case", list(BACKOFFS))
def test_a_backoff_wait_the_session_close_cut_is_rebuilt_longer_than_it_was_held(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user left while the avatar waited to restart: the wait never ended on its timer,
    so the rebuilt wait is longer than it was held (the default 1 s, as long as the first
    case's wait, fired at the departure's instant, before it, and restarted the avatar)."""
    policy, leaves = BACKOFFS[case]
    scenario = {
        "name": "the user left while the avatar waited to restart",
        "config": {"avatar_identity": "av", "join_timeout": 1.5, "retry_avatar": policy},
        "participants": [{"identity": "user"}],
        "steps": [
            {"at": 0, "event": "session.start"},
            {"at": 0, "event": "avatar.start"},
            {
                "at": leaves,
                "event": "participant_disconnected",
                "identity": "user",
                "reason": "CLIENT_INITIATED",
            },
            {"at": 30, "event": "end"},
        ],
    }
    original, recorded = round_trip(scenario, tmp_path, capsys)
    avatar = [t for t in original["transitions"] if t["machine"] == "avatar"]
    assert avatar[-1]["source"] == "backoff" and avatar[-1]["event"] == "close"
    rebuilt = load_scenario(recorded).config.retry_avatar
    assert rebuilt.attempts == policy["attempts"]
