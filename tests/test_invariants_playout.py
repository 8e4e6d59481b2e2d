"""Invariant 12: the playout machine's decisions judged as the real job makes them
(``agent_runtime.testing.invariants.playout``), on the machine as written and on changed
tables swapped into the real job (what the explorer of the real job judges mutants with)."""

from __future__ import annotations

import pytest

from agent_runtime.testing.invariants.playout import Facts, decision
from statemachines.playout import PLAYOUT
from verification.explore.config import CONFIGS
from verification.explore.real import run
from verification.mutation.mutants import mutant
from verification.mutation.swap import swapped

ON = Facts(watchdog=True, listening=True, joined=True, left=True)
SPEAKING = Facts(watchdog=True, listening=False, joined=True, left=True)
OFF = Facts(watchdog=False, listening=True, joined=False, left=True)


@pytest.mark.parametrize(
    ("state", "event", "after", "facts", "check"),
    [
        ("idle", "close", "idle", ON, "not_closed"),
        ("settling", "window_elapsed", "closed", ON, "not_closed"),
        ("idle", "agent_speaking", "idle", ON, "turn_not_followed"),
        ("remote_playout", "agent_listening", "remote_playout", ON, "turn_not_ended"),
        ("remote_playout", "playback_finished", "remote_playout", ON, "turn_not_ended"),
        ("agent_turn", "agent_listening", "idle", ON, "watchdog_misarmed"),
        ("agent_turn", "agent_listening", "settling", SPEAKING, "watchdog_misarmed"),
        ("agent_turn", "agent_listening", "settling", OFF, "watchdog_misarmed"),
        ("watching", "user_speaking", "watching", SPEAKING, "watchdog_misarmed"),
        ("idle", "handed_off", "settling", OFF, "moved_by_noise"),
        ("watching", "reprompt_timeout", "remote_playout", ON, "waits_for_nothing"),
        ("agent_turn", "handed_off", "remote_playout", OFF, "waits_for_nothing"),
        ("watching", "speech_done", "watching", ON, "moved_by_noise"),  # its timer restarted
    ],
)
def test_a_decision_against_the_documented_behaviour_is_named(
    state: str, event: str, after: str, facts: Facts, check: str
) -> None:
    assert check in [p.split(":")[0] for p in decision(state, event, after, facts)]


@pytest.mark.parametrize(
    ("state", "event", "after", "facts"),
    [
        ("agent_turn", "agent_listening", "settling", ON),
        ("agent_turn", "agent_listening", "idle", SPEAKING),
        ("agent_turn", "handed_off", "remote_playout", ON),
        ("remote_playout", "handed_off", "remote_playout", ON),
        ("watching", "user_speaking", "idle", SPEAKING),
        ("watching", "reprompt_timeout", "settling", ON),
        ("idle", "close", "closed", ON),
        ("closed", "agent_speaking", "closed", ON),
        # staying armed while the user's change is on its way: judged between inputs
        ("settling", "window_elapsed", "watching", SPEAKING),
    ],
)
def test_a_decision_the_guide_describes_is_not_named(
    state: str, event: str, after: str, facts: Facts
) -> None:
    assert decision(state, event, after, facts) == []


# the avatar joined, the user there, a reply played and reported: the watchdog arms, times
# the silence (watching), and the user speaks
WATCHING = [
    "avatar_start",
    "plugin_routed",
    "plugin_returns",
    "avatar_joins",
    "avatar_video",
    "user_joins",
    "agent_says",
    "avatar_reports",
    "time",
]


def test_the_machine_as_written_holds_on_the_watchdog_path() -> None:
    r = run(CONFIGS["watchdog"], [*WATCHING, "user_speaks"], inputs="playout")
    assert r.violation is None
    assert [s[0][6][2] for s in r.snapshots[-3:]] == ["settling", "watching", "idle"]


@pytest.mark.parametrize(
    ("label", "check"),
    [
        ("(watching, user_speaking) -> ignore", "watchdog_misarmed"),
        ("(watching, user_speaking) -> internal", "watchdog_misarmed"),
        ("(watching, user_speaking) -> settling", "moved_by_noise"),
        ("(watching, user_speaking) -> agent_turn", "moved_by_noise"),
        ("(watching, user_speaking) -> reject", "rejected"),
    ],
)
def test_a_changed_cell_is_caught_on_the_real_job(label: str, check: str) -> None:
    m = mutant(PLAYOUT, f"playout {label}")
    assert m.spec is not None
    with swapped(PLAYOUT, m.spec):
        r = run(CONFIGS["watchdog"], [*WATCHING, "user_speaks"], inputs="playout")
    assert r.violation is not None and r.violation.invariant == 12
    assert r.violation.detail.startswith(f"{check}:")


def test_an_armed_watchdog_whose_timers_say_nothing_is_caught_once_time_passes() -> None:
    """Armed (settling) with nothing coming but time: under a table whose re-prompt leaves
    the watchdog spent, the silent user gets one re-prompt and never the hand-over."""
    armed = WATCHING[:-1]  # played and reported: settling
    assert run(CONFIGS["watchdog"], armed, inputs="playout").violation is None
    m = mutant(PLAYOUT, "playout (watching, reprompt_timeout) [reprompts_left] -> exhausted")
    assert m.spec is not None
    with swapped(PLAYOUT, m.spec):
        r = run(CONFIGS["watchdog"], armed, inputs="playout")
    assert r.violation is not None and r.violation.invariant == 12
    assert r.violation.detail.startswith("watchdog_silent:"), r.violation
