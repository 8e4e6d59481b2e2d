"""The composed job with the playout machine in it (``Config.playout``), explored.

Playout is composed as ``AgentJob`` composes it: the session's close and its own
``finish_playout`` reach the other machines through the declared links
(``statemachines.glue.LINKS``), the avatar's and the participant link's state changes reach
it through the declared watches (``statemachines.system.WATCHES``), both delivered by the
functions the runtime delivers them with. Its other inputs (the agent's turns, the hand-off
to the avatar's sink, the avatar's report, the SDK's own report, the user's speech) are
abstracted among the avatar's inputs. Invariant 9 says what a user relies on: the session's
close ends playout, playout never waits on an avatar that left nor times the silence of a
user who is gone, and no agent audio stays unreported at the avatar (the agent never stays
"speaking"). Each part is shown to bite: a link or a watch left out of the shared tables, or
one cell of the playout table changed, is reported with the shortest sequence to it.
"""

from __future__ import annotations

import pytest
from verification.explore.model import Inputs, Mailboxes, World

from statemachines import MachineSpec
from statemachines.glue import LINKS, Link, without
from statemachines.machines import MACHINES
from statemachines.system import WATCHES, Watch
from verification.explore import (
    PLAYOUT_CONFIGS,
    Config,
    Model,
    Plan,
    Report,
    explore,
    explore_plans,
)
from verification.mutation.cells import set_cell

PLAYOUT = MACHINES["playout"]
# the example agent in a simulation, with playout's defaults (no watchdog)
DEFAULTS = PLAYOUT_CONFIGS[0]
# nobody there yet, the watchdog on: it hands over by closing the session
WATCHDOG = PLAYOUT_CONFIGS[1]
assert DEFAULTS.watchdog == "off" and WATCHDOG.watchdog == "close"


@pytest.mark.parametrize("config", range(len(PLAYOUT_CONFIGS)), ids=lambda i: f"p{i}")
def test_every_invariant_holds_with_playout_composed(config: int) -> None:
    # as the default tier does for the job without playout: the avatar's inputs (which
    # carry playout's) until nothing new appears, the job's to three inputs
    c = PLAYOUT_CONFIGS[config]
    report = explore_plans([Plan(c, "avatar", None), Plan(c, "job", 3)])
    assert report.ok, report.summary()
    assert all(r.closed for r in report.results if r.plan.inputs == "avatar")


@pytest.mark.exhaustive
def test_every_invariant_holds_with_playout_composed_whole_space() -> None:
    # the job's inputs until nothing new appears (the avatar's are whole in the default
    # tier): about 1,011,000 states and 280 s of CPU (measured on a shared machine), most
    # of it the first config
    report = explore(None, configs=PLAYOUT_CONFIGS, inputs=["job"], workers=2)
    print("\n" + report.summary())
    assert report.ok, report.summary()
    assert all(r.closed for r in report.results)


def _finer(
    inputs: Inputs, mailboxes: Mailboxes, depth: int, configs: tuple[int, ...], *, deep: bool
) -> list[object]:
    marks = [pytest.mark.exhaustive] if deep else []
    return [
        pytest.param(
            inputs, mailboxes, depth, i, marks=marks, id=f"{inputs}-{mailboxes}-{depth}-p{i}"
        )
        for i in configs
    ]


# measured (load 3, 1 CPU each): all/settle/3 1 s (p1) and 5 s (p0), avatar/any/1 under
# 1 s, all/any/1 1 s (p1) and 59 s (p0), avatar/turns/3 44 to 79 s: the large ones are in
# the exhaustive tier (with the whole space, about 7 minutes there)
FINER = [
    *_finer("all", "settle", 3, (1,), deep=False),
    *_finer("all", "settle", 3, (0,), deep=True),
    *_finer("avatar", "any", 1, (0, 1), deep=False),
    *_finer("all", "any", 1, (1,), deep=False),
    *_finer("all", "any", 1, (0,), deep=True),
    *_finer("avatar", "turns", 3, (0, 1), deep=True),
]


@pytest.mark.parametrize(("inputs", "mailboxes", "depth", "config"), FINER)
def test_finer_interleavings_hold_with_playout_too(
    inputs: Inputs, mailboxes: Mailboxes, depth: int, config: int
) -> None:
    c = PLAYOUT_CONFIGS[config]
    report = explore(depth, configs=[c], inputs=[inputs], mailboxes=mailboxes, count=False)
    assert report.ok, report.summary()


# -- what the composed playout does, move by move ---------------------------------------------


def _walk(model: Model, *actions: str) -> list[World]:
    """The worlds after each of ``actions`` (each move settles its mail), from the start."""
    w = model.initial()
    out = []
    for action in actions:
        moves = [mv for mv in model.successors(w) if mv.action == action]
        assert moves, f"{action!r} cannot happen in {w}"
        w = moves[0].world
        out.append(w)
    return out


AVATAR_JOINED = ("avatar_start", "plugin_routed", "plugin_returns", "avatar_joins", "avatar_video")


def test_audio_at_an_avatar_that_never_reports_is_finished_through_the_avatar() -> None:
    model = Model(DEFAULTS, inputs="avatar")
    *_, joined, turn, handed, timed_out = _walk(
        model, *AVATAR_JOINED, "turn:agent_speaking", "handed_off", "timeout:playout"
    )
    assert (joined.avatar, joined.route) == ("joined", "avatar")
    assert turn.play == "agent_turn"
    assert (handed.play, handed.t_play, handed.pending) == (
        "remote_playout",
        "remote_playout",
        True,
    )
    # the bound ran out: finish_playout's link made the avatar end its sink's segment
    assert (timed_out.play, timed_out.pending, timed_out.avatar) == ("idle", False, "joined")


def test_an_avatar_leaving_ends_the_wait_for_its_report_through_the_watch() -> None:
    model = Model(DEFAULTS, inputs="avatar")
    *_, left = _walk(model, *AVATAR_JOINED, "turn:agent_speaking", "handed_off", "avatar_leaves")
    assert left.avatar not in ("joined", "clearing")
    assert (left.play, left.t_play, left.pending, left.route) == ("idle", "", False, "room")


def test_the_watchdog_hands_over_by_closing_the_session_whose_close_ends_playout() -> None:
    model = Model(WATCHDOG, inputs="avatar")
    worlds = _walk(
        model,
        "user_joins",
        "turn:agent_speaking",
        "turn:agent_listening",
        "timeout:playout",  # the safety window: the watchdog arms
        "timeout:playout",  # silence: the re-prompt
        "timeout:playout",
        "timeout:playout",  # silence again, none left: the hand-over
        "a_closed",
    )
    assert [w.play for w in worlds] == [
        "idle",
        "agent_turn",
        "settling",
        "watching",
        "settling",
        "watching",
        "exhausted",
        "closed",
    ]
    assert worlds[4].reprompts == 1
    assert worlds[6].sess_a == "closing"  # hand_over asked the session to close
    assert (worlds[7].sess_a, worlds[7].part) == ("closed", "closed")


def test_without_playout_in_the_config_the_model_is_the_one_the_replay_compares() -> None:
    # the conformance replay runs a real job with playout=False beside this model
    model = Model(Config(), inputs="avatar")
    assert "playout" not in model.view(model.initial()).states
    assert not any(mv.action == "turn:agent_speaking" for mv in model.successors(model.initial()))


# -- each part of invariant 9 bites -------------------------------------------------------------


def _first(report: Report, number: int) -> tuple[str, list[str]]:
    found = {v.invariant: v for v in report.violations}
    assert number in found, f"invariant {number} not reported:\n{report.summary()}"
    return found[number].detail, list(found[number].steps)


def _fault(
    config: Config,
    *,
    links: tuple[Link, ...] = LINKS,
    watches: tuple[Watch, ...] = WATCHES,
    specs: dict[str, MachineSpec] | None = None,
) -> tuple[str, list[str]]:
    report = explore(
        None,
        configs=[config],
        inputs=["avatar"],
        links=links,
        watches=watches,
        specs=specs,
        stop_at=9,
        count=False,
    )
    return _first(report, 9)


def test_9_a_session_close_that_does_not_reach_playout_is_reported() -> None:
    detail, steps = _fault(DEFAULTS, links=without(LINKS, "session", "close", "playout"))
    assert detail == "the session closed but playout is still idle"
    assert "session A finishes closing" in steps


def test_9_a_finish_that_does_not_reach_the_avatar_is_reported() -> None:
    detail, steps = _fault(DEFAULTS, links=without(LINKS, "playout", "finish_playout", "avatar"))
    assert detail == (
        "after every bound the agent's audio still waits at the avatar, unreported "
        "(avatar joined, playout idle)"
    )
    assert steps[-2:] == ["time passes: playout_timeout", "  -> playout handles playout_timeout"]


def test_9_an_avatar_departure_playout_does_not_hear_of_is_reported() -> None:
    watches = tuple(w for w in WATCHES if (w.source, w.target) != ("avatar", "playout"))
    detail, steps = _fault(DEFAULTS, watches=watches)
    assert detail == "playout waits for the report of an avatar that is restored"
    assert "avatar leaves" in steps
    assert not any("playout handles avatar_left" in s for s in steps)


def test_9_a_user_departure_the_watchdog_does_not_hear_of_is_reported() -> None:
    watches = tuple(w for w in WATCHES if (w.source, w.target) != ("participant", "playout"))
    detail, steps = _fault(WATCHDOG, watches=watches)
    assert detail == "the watchdog is settling with the participant link grace"
    assert steps[-2:] == [
        "user leaves (SIGNAL_CLOSE)",
        "  -> participant handles participant_disconnected(reason=SIGNAL_CLOSE, who=user)",
    ]


def test_9_a_playout_table_that_ignores_the_avatar_leaving_is_reported() -> None:
    spec = set_cell(PLAYOUT, "remote_playout", "avatar_left", kind="ignore")
    detail, steps = _fault(DEFAULTS, specs={"playout": spec})
    assert detail == "playout waits for the report of an avatar that is restored"
    assert "  -> playout handles avatar_left(avatar=failed)" in steps
