"""Exhaustive exploration of the composed job (every machine, as AgentJob composes them).

The exhaustive tier explores every config until nothing new appears and must find nothing
(the default tier: the job's inputs to three of them). Then
each check is shown to bite: a copy of one spec with one cell changed, one link left out of
the shared glue (``statemachines.glue.LINKS``), or one of the model's own abstractions
broken (``abstract.Glue``) must be reported as the matching invariant, with the shortest
event sequence that leads to it. ``AGENT_RUNTIME_DEEP=1`` makes the first test run the deep
plans instead.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from verification.explore.model import Inputs, Mailboxes

from statemachines import MachineSpec, Row
from statemachines.glue import LINKS, Link, without
from statemachines.machines import MACHINES
from verification.explore import (
    DEFAULT_CONFIGS,
    DEFAULT_DEPTH,
    DEFAULT_GLUE,
    Config,
    Glue,
    Model,
    Plan,
    Report,
    deep_plans,
    explore,
    explore_plans,
)
from verification.mutation.cells import set_cell, set_dest

AVATAR, JOB, HOST, PART = (MACHINES[n] for n in ("avatar", "job", "session_host", "participant"))
DELETION, FINALIZE = MACHINES["room_deletion"], MACHINES["finalize"]
# the example agent in a simulation: the simulator is in the room, and is who it links
SIM = Config.example()
# not a simulation, nobody there yet: the user who joins is linked
PLAIN = Config(simulation=False, present=())


@pytest.mark.parametrize("config", range(len(DEFAULT_CONFIGS)), ids=lambda i: f"c{i}")
def test_every_invariant_holds_within_three_inputs(config: int) -> None:
    # the default tier's share: every config (one test each, so the workers share them
    # out), the avatar's inputs until nothing new appears, the job's and participant's to
    # three inputs (the exhaustive tier: all)
    c = DEFAULT_CONFIGS[config]
    report = explore_plans([Plan(c, "avatar", None), Plan(c, "job", 3)])
    assert report.ok, report.summary()
    assert all(r.closed for r in report.results if r.plan.inputs == "avatar")
    assert all(r.depth == 3 and r.states > 1_000 for r in report.results if r.plan.inputs == "job")


@pytest.mark.exhaustive
def test_every_invariant_holds_in_the_composed_job() -> None:
    if os.environ.get("AGENT_RUNTIME_DEEP"):
        report = explore_plans(deep_plans(), workers=os.cpu_count() or 1)
    else:
        report = explore(DEFAULT_DEPTH, workers=2)
    print("\n" + report.summary())
    assert report.ok, report.summary()
    # the default goes layer after layer until nothing new appears: every world the model
    # can reach under each config and group of inputs was checked
    default = [r for r in report.results if r.plan.depth is None]
    assert default and all(r.closed for r in default)
    assert all(r.depth >= 10 for r in default if r.plan.inputs == "job")
    assert all(r.states > 100 and r.sequences > r.states for r in report.results)


def _only(
    report: Report, number: int
) -> tuple[str, list[str]]:  # the detail and the steps of that invariant's violation
    found = {v.invariant: v for v in report.violations}
    assert number in found, f"invariant {number} not reported:\n{report.summary()}"
    v = found[number]
    return v.detail, list(v.steps)


def _run(
    depth: int,
    *,
    specs: dict[str, MachineSpec] | None = None,
    links: tuple[Link, ...] = LINKS,
    glue: Glue = DEFAULT_GLUE,
    config: Config = SIM,
    inputs: Inputs = "job",
    mailboxes: Mailboxes = "settle",
    stop_at: int | None = None,
) -> Report:
    # a check that a fault is reported stops at its first counterexample: the search order
    # is a whole run's, so it is the shortest one, the one a whole run reports
    return explore(
        depth,
        configs=[config],
        inputs=[inputs],
        specs=specs,
        links=links,
        glue=glue,
        mailboxes=mailboxes,
        stop_at=stop_at,
        count=False,
    )


def test_1_audio_left_on_a_failed_avatar_is_reported() -> None:
    detail, steps = _only(_run(2, glue=Glue(restore_route=False), inputs="avatar", stop_at=1), 1)
    assert detail == "audio goes to the avatar while it is failed"
    assert steps == [
        "avatar.start",
        # AgentJob.start_avatar(): the lifecycle hears of the part first
        "  -> agent_job handles start_part",
        "  -> avatar handles start",
        "avatar plugin puts its route in",
        "avatar plugin start() fails late",
        "  -> avatar handles start_error",
    ]


def test_1_an_avatar_that_never_joins_keeping_the_audio_is_reported() -> None:
    broken = set_cell(AVATAR, "routing", "join_timeout", kind="ignore")
    detail, steps = _only(_run(2, specs={"avatar": broken}, inputs="avatar", stop_at=1), 1)
    assert detail == "after every bound the audio still goes to an avatar in routing"
    assert steps == [
        "avatar.start",
        # AgentJob.start_avatar(): the lifecycle hears of the part first
        "  -> agent_job handles start_part",
        "  -> avatar handles start",
        "avatar plugin puts its route in",
        "avatar plugin start() returns",
        "  -> avatar handles plugin_started",
        "time passes: join_timeout",
        "  -> avatar handles join_timeout",
    ]


def test_1_a_plugin_start_that_never_returns_keeping_the_audio_is_reported() -> None:
    broken = set_cell(AVATAR, "starting", "start_timeout", kind="ignore")
    detail, steps = _only(_run(2, specs={"avatar": broken}, inputs="avatar", stop_at=1), 1)
    assert detail == "after every bound the audio still goes to an avatar in starting"
    assert steps == [
        "avatar.start",
        # AgentJob.start_avatar(): the lifecycle hears of the part first
        "  -> agent_job handles start_part",
        "  -> avatar handles start",
        "avatar plugin puts its route in",
        "avatar plugin start() hangs, its route in",
        "time passes: start_timeout",
        "  -> avatar handles start_timeout",
    ]


def test_1_a_close_during_starting_that_misses_the_plugins_route_is_reported() -> None:
    # without record_route, the restore does not know the route the plugin had put in
    close = Row(source="starting", event="close", dest="closed", effects=("put_route_back",))
    broken = set_cell(AVATAR, "starting", "close", rows=[close])
    detail, steps = _only(_run(2, specs={"avatar": broken}, inputs="avatar", stop_at=1), 1)
    assert detail == "audio goes to the avatar while it is closed"
    assert steps == [
        "avatar.start",
        # AgentJob.start_avatar(): the lifecycle hears of the part first
        "  -> agent_job handles start_part",
        "  -> avatar handles start",
        "avatar plugin puts its route in",
        "avatar.close",
        "  -> avatar handles close",
    ]


def test_1_an_avatar_leaving_during_a_clear_unnoticed_is_reported() -> None:
    broken = set_cell(AVATAR, "clearing", "avatar_left", kind="ignore")
    detail, steps = _only(_run(5, specs={"avatar": broken}, inputs="avatar", stop_at=1), 1)
    assert detail == "after every bound the audio still goes to an avatar that left"
    assert steps[-7:] == [
        "interrupt",
        "  -> avatar handles interrupt(delivered=True, playing=True)",
        "avatar leaves",
        # the declared follow order (statemachines.system.FOLLOW_ORDER): the avatar first
        "  -> avatar handles avatar_left(reason=CLIENT_INITIATED, who=avatar)",
        "  -> participant handles participant_disconnected(reason=CLIENT_INITIATED, who=avatar)",
        "the plugin's own clear settles",
        "  -> avatar handles clear_buffer_done",
    ]


def test_2_a_finalize_never_answered_is_reported() -> None:
    broken = set_cell(HOST, "attached", "finalize", kind="ignore")
    detail, steps = _only(_run(1, specs={"session_host": broken}, stop_at=2), 2)
    assert detail == "finalize request #1 was never answered"
    assert steps == [
        "finalize_simulation request",
        "  -> session_host handles finalize(caller=simulator, req=0)",
    ]


def test_2_a_verdict_delivered_twice_is_reported() -> None:
    # answering again once answered: a second request computes and sends a second verdict
    again = Row(source="answered", event="request", dest="answering", effects=("take_request",))
    broken = set_cell(FINALIZE, "answered", "request", rows=[again])
    detail, steps = _only(_run(4, specs={"finalize": broken}, stop_at=2), 2)
    assert detail == "the verdict was delivered 2 times"
    assert steps.count("finalize_simulation request") == 2


def test_2_a_host_closing_over_a_verdict_in_flight_is_reported() -> None:
    # the host's close does not wait for the finalize: its cut answer finds the transport
    # closed
    detail, steps = _only(_run(4, glue=Glue(drain_finalize_on_close=False), stop_at=2), 2)
    assert detail == "finalize request #1 was never answered"
    assert steps[0] == "finalize_simulation request"
    assert "on_simulation_end never returns for request #1" in steps


def test_2_a_cut_answer_the_host_never_tells_the_finalize_is_reported() -> None:
    # the link from the host's close to the finalize left out: its answer is cancelled
    # with its actor, and the simulator hears nothing
    links = without(LINKS, "session_host", "close_finalize", "finalize")
    detail, steps = _only(
        _run(4, links=links, glue=Glue(drain_finalize_on_close=False), stop_at=2), 2
    )
    assert detail == "finalize request #1 was never answered"
    assert "  -> finalize handles close" not in steps
    assert "run_close: the session host closed" in steps


def test_2_a_cut_answer_left_without_its_error_reply_is_reported() -> None:
    cut = Row(source="answering", event="close", dest="closed")  # reply_unfinished left out
    broken = set_cell(FINALIZE, "answering", "close", rows=[cut])
    detail, steps = _only(_run(3, specs={"finalize": broken}, stop_at=2), 2)
    assert detail == "finalize request #1 was never answered"
    assert "on_simulation_end never returns for request #1" in steps
    assert steps[-1] == "  -> session_host handles drain_timeout"


def test_2_a_host_that_waits_forever_for_a_hung_verdict_is_reported() -> None:
    broken = set_cell(HOST, "closing", "drain_timeout", kind="ignore")
    detail, steps = _only(_run(3, specs={"session_host": broken}, stop_at=2), 2)
    assert detail == "finalize request #1 was never answered"
    assert "on_simulation_end never returns for request #1" in steps


def test_2_a_verdict_given_to_someone_not_the_simulator_is_reported() -> None:
    # the from_simulator row left out: anyone's finalize reaches the finalize machine
    anyone = Row(source="attached", event="finalize", dest=None, effects=("forward_finalize",))
    broken = set_cell(HOST, "attached", "finalize", rows=[anyone])
    detail, steps = _only(_run(1, specs={"session_host": broken}, stop_at=2), 2)
    assert detail == "finalize request #1, not from the simulator, got the verdict"
    assert steps[0] == "finalize_simulation from someone not the simulator"


def test_3_a_room_deleted_while_the_job_serves_is_reported() -> None:
    detail, steps = _only(_run(1, glue=Glue(defer_room_deletion=False), stop_at=3), 3)
    assert detail == "the room was deleted while the job is serving"
    assert steps == [
        "end-call tool asks for room deletion",
        "  -> room_deletion handles request",
        "  -> room_deletion handles allow",
    ]


def test_3_a_job_that_goes_back_to_holding_after_closing_is_reported() -> None:
    broken = set_dest(JOB, "closing", "close_done", "awaiting_finalize")
    config = Config(simulation=True, delete_room_on_close=True)
    detail, steps = _only(_run(2, specs={"job": broken}, config=config, stop_at=3), 3)
    assert detail == "the room was deleted while the job is awaiting_finalize"
    assert "  -> job handles close_done" in steps


def test_3_a_deletion_that_does_not_wait_for_the_job_is_reported() -> None:
    broken = set_dest(DELETION, "kept", "request", "deleting")
    detail, steps = _only(_run(1, specs={"room_deletion": broken}, stop_at=3), 3)
    assert detail == "the room was deleted while the job is serving"
    assert steps == ["end-call tool asks for room deletion", "  -> room_deletion handles request"]


def test_3_a_deletion_that_runs_twice_is_reported() -> None:
    # the release re-entering deleting instead of waiting for it: a second server call
    again = Row(source="deleting", event="close", dest="deleting")
    broken = set_cell(DELETION, "deleting", "close", rows=[again])
    detail, steps = _only(_run(3, specs={"room_deletion": broken}, config=PLAIN, stop_at=3), 3)
    assert detail == "the room deletion ran 2 times"
    assert steps[-2:] == [
        "JobRuntime.aclose(): the deletion released",
        "  -> room_deletion handles close",
    ]


def test_5_a_deletion_the_job_never_allows_is_reported() -> None:
    broken = set_cell(DELETION, "requested", "allow", kind="ignore")
    detail, steps = _only(_run(2, specs={"room_deletion": broken}, config=PLAIN, stop_at=5), 5)
    assert detail == (
        "the job closed without its close work (session_host closed, room disconnected)"
    )
    assert "end-call tool asks for room deletion" in steps


def test_5_a_close_that_never_allows_the_deletion_is_reported() -> None:
    # the link from run_close's room step to the deletion left out
    links = tuple(k for k in LINKS if not (k.step == "room" and k.event == "allow"))
    detail, steps = _only(_run(2, links=links, config=PLAIN, stop_at=5), 5)
    assert detail == (
        "the job closed without its close work (session_host closed, room disconnected)"
    )
    assert "end-call tool asks for room deletion" in steps


def test_4_two_sessions_forwarded_is_reported() -> None:
    detail, steps = _only(_run(1, glue=Glue(unsubscribe_on_replace=False), stop_at=4), 4)
    assert detail == "sessions A, B are all forwarded"
    assert steps == ["session B attaches", "  -> session_host handles attach(session=B)"]


def test_4_a_host_attached_to_nothing_is_reported() -> None:
    broken = set_dest(HOST, "attached", "session_closed", "attached", guards=["is_current"])
    detail, steps = _only(_run(2, specs={"session_host": broken}, stop_at=4), 4)
    assert detail == "session_host is attached with no session forwarded"
    assert steps[:2] == ["session A closes", "session A finishes closing"]


def test_5_a_hold_that_never_ends_is_reported() -> None:
    broken = set_cell(JOB, "awaiting_finalize", "hold_timeout", kind="ignore")
    detail, steps = _only(_run(2, specs={"job": broken}, stop_at=5), 5)
    assert detail == "after every bound the job is still awaiting_finalize"
    assert steps[-2:] == ["time passes: hold_timeout", "  -> job handles hold_timeout"]


def test_5_a_job_that_skips_its_close_work_is_reported() -> None:
    broken = set_dest(JOB, "awaiting_finalize", "hold_timeout", "closed")
    detail, steps = _only(_run(2, specs={"job": broken}, stop_at=5), 5)
    assert detail == "the job closed without its close work (session_host detached, room connected)"
    assert "  -> job handles hold_timeout" in steps
    # the job machine closed: the lifecycle's release followed
    assert steps[-1] == "  -> agent_job handles released"


def test_5_a_job_that_waits_out_its_close_bound_is_reported() -> None:
    broken = set_cell(JOB, "closing", "close_done", kind="ignore")
    detail, steps = _only(_run(1, specs={"job": broken}, config=PLAIN, stop_at=5), 5)
    assert detail == "the close work is done but the job is still closing"
    assert steps[-1] == "  -> job handles close_done"


def test_5_a_close_left_to_a_hung_callback_is_reported() -> None:
    broken = set_cell(JOB, "closing", "close_timeout", kind="ignore")
    detail, steps = _only(_run(1, specs={"job": broken}, config=PLAIN, stop_at=5), 5)
    assert detail == "after every bound the job is still closing"
    assert "run_close: a shutdown callback hangs" in steps


def test_6_a_timer_left_armed_is_reported() -> None:
    detail, steps = _only(
        _run(3, glue=Glue(cancel_timers_on_exit=False), config=PLAIN, stop_at=6), 6
    )
    assert detail == "session_host: the closing timer is still armed in closed"
    assert steps[-1] == "  -> session_host handles drained"


def test_6_a_stale_timeout_handled_is_reported() -> None:
    # only when inputs can land between a timer firing and its event being handled
    report = _run(3, glue=Glue(drop_stale_timeouts=False), mailboxes="turns", stop_at=6)
    detail, steps = _only(report, 6)
    assert detail.endswith("after the state that armed it was left")
    assert any(s.startswith("time passes:") for s in steps)


def test_7_shutdown_that_skips_the_hold_is_reported() -> None:
    broken = set_dest(JOB, "serving", "shutdown", "closing", guards=["hold_needed"])
    detail, steps = _only(_run(1, specs={"job": broken}, stop_at=7), 7)
    assert detail == "job went serving -> closing on shutdown with the hold needed"
    assert steps == ["job.shutdown", "  -> job handles shutdown"]


def test_7_a_hold_that_outlives_the_verdict_is_reported() -> None:
    broken = set_cell(JOB, "awaiting_finalize", "finalize_answered", kind="ignore")
    detail, steps = _only(_run(4, specs={"job": broken}, stop_at=7), 7)
    assert detail == "the verdict was delivered but the job still holds"
    assert steps[-1] == "  -> job handles finalize_answered"


def test_7_a_verdict_the_job_is_never_told_of_is_reported() -> None:
    # the link from the finalize's report to the job left out
    links = without(LINKS, "finalize", "report_answered", "job")
    detail, steps = _only(_run(4, links=links, stop_at=7), 7)
    assert detail == "the verdict was delivered but the job still holds"
    assert steps[-1] == "  -> finalize handles delivered"


def test_7_a_hold_that_outlives_the_simulator_is_reported() -> None:
    broken = set_cell(JOB, "awaiting_finalize", "simulator_left", kind="ignore")
    detail, steps = _only(_run(3, specs={"job": broken}, stop_at=7), 7)
    assert detail == "the simulator is gone but the job still holds"
    assert steps[-2:] == [
        "simulator leaves (CLIENT_INITIATED)",
        "  -> job handles simulator_left(reason=CLIENT_INITIATED, who=simulator)",
    ]


def test_8_a_grace_that_never_ends_is_reported() -> None:
    broken = set_cell(PART, "grace", "grace_timeout", kind="ignore")
    detail, steps = _only(_run(3, specs={"participant": broken}, config=PLAIN, stop_at=8), 8)
    assert detail == "user left but the session is still running"
    assert steps == [
        "user joins",
        "  -> participant handles participant_connected(who=user)",
        "user leaves (SIGNAL_CLOSE)",
        "  -> participant handles participant_disconnected(reason=SIGNAL_CLOSE, who=user)",
        "time passes: grace_timeout",
        "  -> participant handles grace_timeout",
    ]


def test_0_time_alone_going_round_in_a_loop_is_reported() -> None:
    # restored never comes: the avatar goes back to routing and times out again, forever
    broken = set_dest(AVATAR, "failed", "route_restored", "routing")
    detail, steps = _only(_run(2, specs={"avatar": broken}, inputs="avatar", stop_at=0), 0)
    assert detail == "time passing alone comes back to an earlier world"
    assert steps.count("time passes: join_timeout") >= 1


def test_the_model_links_whom_the_example_would_link() -> None:
    """The example configures no identity and livekit's default kinds include SIP: the
    participant there first is linked, as the shared ``eligible`` guard decides, and the
    avatar (an agent publishing on the agent's behalf) never is."""
    for present, linked in ((("sip", "simulator"), "sip"), (("simulator",), "simulator")):
        model = Model(Config(present=present))
        assert model.view(model.initial()).linked == linked
    identity = Model(Config(participant_identity="user", present=("sip", "simulator")))
    world = identity.initial()
    assert identity.view(world).linked is None
    joined = {mv.label: mv.world for mv in identity.successors(world)}["user joins"]
    assert identity.view(joined).linked == "user"
    avatar = Model(Config(simulation=False, present=()), inputs="avatar")
    w = avatar.initial()
    for label in ("avatar.start", "avatar plugin puts its route in", "avatar joins"):
        w = {mv.label: mv.world for mv in avatar.successors(w)}[label]
    assert avatar.view(w).linked is None and avatar.view(w).avatar_present


def test_sequences_are_counted_as_enumerating_them_would() -> None:
    model = Model(PLAIN, inputs="avatar")

    def paths(world: object, depth: int) -> int:
        # every path from here: internal moves are free, inputs and timeouts cost one
        n = 1
        for mv in model.successors(world):  # type: ignore[arg-type]
            if mv.kind == "internal":
                n += paths(mv.world, depth)
            elif depth > 0:
                n += paths(mv.world, depth - 1)
        return n

    for depth in (0, 1, 2, 3):
        report = explore(depth, configs=[PLAIN], inputs=["avatar"])
        assert report.sequences == paths(model.initial(), depth), depth


def _finer(
    inputs: Inputs,
    mailboxes: Mailboxes,
    depth: int,
    configs: tuple[int, ...],
    *,
    deep: bool = False,
) -> list[Any]:
    marks = [pytest.mark.exhaustive] if deep else []
    return [
        pytest.param(
            inputs, mailboxes, depth, i, marks=marks, id=f"{inputs}-{mailboxes}-{depth}-c{i}"
        )
        for i in configs
    ]


# one test per config (each its own exploration, so the workers share them out). The four
# largest (8 to 19 s of CPU each at load 6) are in the exhaustive tier; the default tier
# keeps a smaller instance of each: the same config one input shallower, or with the
# avatar's inputs alone
FINER = [
    *_finer("all", "settle", 3, (0, 1, 2, 3)),
    *_finer("job", "turns", 2, (2, 3)),
    *_finer("job", "turns", 1, (0, 1)),
    *_finer("job", "turns", 2, (0, 1), deep=True),
    *_finer("all", "any", 1, (2, 3)),
    *_finer("avatar", "any", 1, (0, 1)),
    *_finer("all", "any", 1, (0, 1), deep=True),
]


@pytest.mark.parametrize(("inputs", "mailboxes", "depth", "config"), FINER)
def test_finer_interleavings_hold_too(
    inputs: Inputs, mailboxes: Mailboxes, depth: int, config: int
) -> None:
    # every input together; inputs landing between two events an actor handles; any actor
    # with mail going next: each far larger, so shallower
    configs = [DEFAULT_CONFIGS[config]]
    report = explore(depth, configs=configs, inputs=[inputs], mailboxes=mailboxes, count=False)
    assert report.ok, report.summary()


def test_bad_arguments_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="depth must be a whole number >= 0 or None, not -1"):
        explore(-1)
    with pytest.raises(ValueError, match="workers must be a whole number >= 1, not 0"):
        explore(1, workers=0)
    with pytest.raises(ValueError, match="unknown machine 'robot'"):
        Model(specs={"robot": JOB})
    with pytest.raises(ValueError, match="mailboxes must be settle, turns or any, not 'all'"):
        Model(mailboxes="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inputs must be all, job or avatar, not 'room'"):
        Model(inputs="room")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="machine 'job' has no effect 'explode'"):
        Link(source="job", on="explode", target="job", event="shutdown")
    with pytest.raises(ValueError, match=r"machine 'job' has no cell \(serving, explode\)"):
        set_cell(JOB, "serving", "explode", kind="ignore")
    with pytest.raises(
        ValueError, match=r"cell \(serving, shutdown\) has no row guarded by \['x'\]"
    ):
        set_dest(JOB, "serving", "shutdown", "closed", guards=["x"])


def test_8_a_hung_session_close_nobody_acts_on_is_reported() -> None:
    """Issue 13 item 2: with the session's close hanging, the link gives up on it at its
    bound; if that does not shut the job down (its link left out), the job serves on."""
    links = without(LINKS, "participant", "report_close_timed_out", "job")
    detail, steps = _only(_run(4, links=links, config=PLAIN, stop_at=8), 8)
    assert detail == "the session's close hangs, the link is closed and the job is serving"
    assert steps[:4] == [
        "user joins",
        "  -> participant handles participant_connected(who=user)",
        "user leaves (CLIENT_INITIATED)",
        "  -> participant handles participant_disconnected(reason=CLIENT_INITIATED, who=user)",
    ]
    assert "session A's close hangs" in steps
    assert "time passes: session_close_timeout" in steps


@pytest.mark.parametrize(
    ("number", "depth", "fault"),
    [
        (4, 2, {"glue": Glue(unsubscribe_on_replace=False)}),  # found as a world is reached
        (
            5,
            2,
            {"specs": {"job": set_cell(JOB, "awaiting_finalize", "hold_timeout", kind="ignore")}},
        ),
        (6, 3, {"glue": Glue(cancel_timers_on_exit=False), "config": PLAIN}),
    ],
)
def test_stopping_at_the_first_counterexample_reports_what_a_whole_run_does(
    number: int, depth: int, fault: dict[str, Any]
) -> None:
    whole = _run(depth, **fault)
    first = _run(depth, stop_at=number, **fault)
    assert _only(first, number) == _only(whole, number)
    # ... having looked at fewer worlds (those reached, and those passed letting time pass)
    seen = [sum(r.states + r.eventual_states for r in x.results) for x in (first, whole)]
    assert seen[0] < seen[1], seen
