"""The playout machine explored exhaustively (``verification.explore.playout``): its
guarantees hold in every world its inputs reach, and a spec that breaks one is caught with
the inputs that show it."""

from __future__ import annotations

import pytest

from statemachines import Cell, MachineSpec, Row, State
from statemachines.glue import GUARDS
from statemachines.playout import PLAYOUT
from verification.explore.playout import Report, explore_playout


@pytest.mark.parametrize("watchdog", [True, False])
@pytest.mark.parametrize("max_reprompts", [0, 1, 2])
def test_every_world_keeps_the_guarantees(watchdog: bool, max_reprompts: int) -> None:
    report = explore_playout(watchdog=watchdog, max_reprompts=max_reprompts)
    assert report.ok, [str(p) for p in report.problems]
    assert report.worlds > 20


def test_with_the_watchdog_on_every_row_is_taken_somewhere() -> None:
    """But one: the model hands audio off only to a joined avatar, so none waits for its
    join; the real job takes that row (test_playout's
    ``test_audio_the_avatar_took_before_it_joined_is_awaited_from_its_join``)."""
    report = explore_playout(watchdog=True, max_reprompts=1)
    missing = [r for k, r in enumerate(PLAYOUT.rows) if k not in report.rows_taken]
    assert [(r.source, r.event, r.dest) for r in missing] == [
        ("agent_turn", "avatar_joined", "remote_playout")
    ]


def _ignoring(state: str, event: str) -> MachineSpec:
    """The spec with the cell (state, event) turned into an ignore."""
    fields = PLAYOUT.model_dump(exclude={"rows", "ignore"})
    rows = tuple(r for r in PLAYOUT.rows if (r.source, r.event) != (state, event))
    return MachineSpec(
        **fields, rows=rows, ignore=(*PLAYOUT.ignore, Cell(state=state, event=event))
    )


def _problems(report: Report) -> dict[str, list[str]]:
    return {p.check: list(p.path) for p in report.problems}


def test_waiting_on_after_the_avatar_left_is_caught() -> None:
    found = _problems(explore_playout(_ignoring("remote_playout", "avatar_left")))
    assert found["avatar_gone"] == ["handed_off", "avatar_leaves"]


def test_a_watchdog_deaf_to_the_user_re_prompts_over_them() -> None:
    found = _problems(explore_playout(_ignoring("watching", "user_speaking")))
    assert "reprompt_over_audio" in found
    assert "user_speaks" in found["reprompt_over_audio"]


def test_audio_handed_off_while_watching_must_disarm_the_watchdog() -> None:
    found = _problems(explore_playout(_ignoring("watching", "handed_off")))
    assert "armed_over_audio" in found and found["armed_over_audio"][-1] == "handed_off"


def test_re_prompts_without_their_count_are_caught() -> None:
    at = ("watching", "reprompt_timeout")
    rows = tuple(
        r.model_copy(update={"guards": ()}) if (r.source, r.event) == at else r
        for r in PLAYOUT.rows
        if not ((r.source, r.event) == at and not r.guards)  # the hand-over row goes
    )
    # model_copy skips validation: with the hand-over gone, exhausted is unreachable
    found = _problems(explore_playout(PLAYOUT.model_copy(update={"rows": rows}), max_reprompts=1))
    assert "reprompt_count" in found


def test_a_wait_for_the_avatar_without_its_bound_is_caught() -> None:
    states = tuple(
        State(name=s.name, description=s.description) if s.name == "remote_playout" else s
        for s in PLAYOUT.states
    )
    fields = PLAYOUT.model_dump(exclude={"states"})
    found = _problems(explore_playout(MachineSpec(**fields, states=states)))
    assert found["unbounded_wait"] == ["handed_off"]


def test_a_count_deaf_to_a_user_answering_over_the_agent_is_caught() -> None:
    found = _problems(
        explore_playout(_ignoring("remote_playout", "user_speaking"), max_reprompts=1)
    )
    path = found["watchdog_silent"]
    assert path[path.index("reprompt_timeout") :][:3] == [
        "reprompt_timeout",
        "handed_off",
        "user_speaks",
    ]


def test_a_close_that_does_not_close_is_caught() -> None:
    found = _problems(explore_playout(_ignoring("watching", "close")))
    assert found["not_closed"][-1] == "close"


def test_a_stray_report_that_disarms_the_watchdog_is_caught() -> None:
    spec = PLAYOUT.model_copy(
        update={
            "rows": (*PLAYOUT.rows, Row(source="watching", event="playback_finished", dest="idle")),
            "ignore": tuple(
                c for c in PLAYOUT.ignore if (c.state, c.event) != ("watching", "playback_finished")
            ),
        }
    )
    found = _problems(explore_playout(spec))
    assert found["moved_by_noise"][-1] == "playback_finished"


@pytest.mark.parametrize(
    ("cell", "check", "last"),
    [
        (("settling", "speech_created"), "turn_not_followed", "speech_created"),
        (("agent_turn", "agent_listening"), "turn_not_ended", "agent_listening"),
        (("agent_turn", "handed_off"), "unwatched_audio", "handed_off"),
    ],
)
def test_each_documented_behaviour_broken_is_caught(
    cell: tuple[str, str], check: str, last: str
) -> None:
    found = _problems(explore_playout(_ignoring(*cell)))
    assert found[check][-1] == last


def test_a_watchdog_that_never_arms_is_caught() -> None:
    at = ("agent_turn", "agent_listening")
    rows = tuple(r for r in PLAYOUT.rows if not ((r.source, r.event) == at and r.guards))
    found = _problems(explore_playout(PLAYOUT.model_copy(update={"rows": rows})))
    assert found["watchdog_misarmed"][-1] == "agent_listening"


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="max_reprompts must be >= 0"):
        explore_playout(max_reprompts=-1)


def test_the_explorer_decides_with_the_runtime_s_own_guards() -> None:
    """A guard the runtime would get wrong is caught: the watchdog's ``user_listening``
    read as "linked" alone, a speaking user would be re-prompted over."""
    broken = dict(GUARDS["playout"], user_listening=lambda f, data: f.user_linked)
    found = _problems(explore_playout(guards=broken))
    assert "reprompt_over_audio" in found
    assert "user_speaks" in found["reprompt_over_audio"]
    assert explore_playout(guards=GUARDS["playout"]).ok
