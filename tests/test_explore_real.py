"""The explorer of the real job (``verification.explore.real``/``realsearch``): a real
``AgentJob`` on a virtual clock, driven by inputs read from the system itself, searched by
re-execution. Runs are deterministic, the default config holds its invariants within a
small depth, and a link the runtime no longer delivers is found, its path replayed to the
same failure."""

from __future__ import annotations

import json
import shlex

import pytest

from agent_runtime.runtimes.avatar import audio_chain
from agent_runtime.sdk import livekit_compat as lk
from verification.explore.command import main
from verification.explore.config import CONFIGS
from verification.explore.harness import Harness
from verification.explore.real import run
from verification.explore.real_inputs import OUTCOMES, PLAYOUT_INPUTS, TIME
from verification.explore.realsearch import bfs, drop_link, walk, walks

EXAMPLE = CONFIGS["example"]
# the job stops holding once its verdict went out: a link the runtime delivers
FAULT = "finalize:report_answered:job"


def test_a_replayed_path_and_a_seeded_walk_give_the_same_snapshots() -> None:
    seed = 3  # (a walk that goes its 10 inputs: some end early, in a closed job)
    first = walk(EXAMPLE, seed, 10)
    again = walk(EXAMPLE, seed, 10)
    assert first.path == again.path and len(first.path) == 10
    assert first.snapshots == again.snapshots
    # the walk's path, replayed, passes through the same states
    replayed = run(EXAMPLE, first.path, policy="hang" if seed % 2 else "return")
    assert replayed.snapshots == first.snapshots
    # a path through the avatar, time and the close, twice
    path = ["avatar_start", "plugin_routed", "avatar_joins", "ctx_shutdown", TIME, "a_closed"]
    one, two = run(EXAMPLE, path), run(EXAMPLE, path)
    assert one.violation is None and one.snapshots == two.snapshots
    assert len({s for s in one.snapshots}) == len(path) + 1  # each input changed the state


def test_the_inputs_come_from_the_real_system() -> None:
    start = run(EXAMPLE, [], check_eventual=False)
    # the simulator is in the room (it may leave, not join), nobody waits for the world yet
    assert "simulator_leaves:CLIENT_INITIATED" in start.enabled
    assert "simulator_joins" not in start.enabled and "user_joins" in start.enabled
    assert not OUTCOMES & set(start.enabled)
    assert TIME not in start.enabled  # no timer is armed in a serving job
    # the plugin's start waits for its provider: its outcomes, and the join timeout
    started = run(EXAMPLE, ["avatar_start"], check_eventual=False)
    assert {"plugin_routed", "plugin_fails", "plugin_no_route", TIME} <= set(started.enabled)
    assert "avatar_start" not in started.enabled
    with pytest.raises(ValueError, match="not enabled"):
        run(EXAMPLE, ["plugin_routed"])


def test_the_playout_inputs_start_where_a_prefix_leads_and_reach_the_watchdog() -> None:
    """``--inputs playout`` offers only what the playout machine hears of; a walk or a
    search may start where a path leads (the avatar joined, the user there)."""
    joined = ("avatar_start", "plugin_routed", "plugin_returns", "avatar_joins", "avatar_video")
    start = run(CONFIGS["watchdog"], [*joined, "user_joins"], inputs="playout")
    assert start.violation is None
    assert set(start.enabled) <= PLAYOUT_INPUTS and "agent_says" in start.enabled
    assert not {"ctx_shutdown", "job_shutdown", "attach_b", "finalize"} & set(start.enabled)
    one = walk(CONFIGS["watchdog"], 5, 6, inputs="playout", prefix=(*joined, "user_joins"))
    assert one.path[:6] == [*joined, "user_joins"] and len(one.path) == 12
    # a reply played at the avatar and reported: the watchdog settles, and one layer on
    # (time) it times the silence
    played = (*joined, "user_joins", "agent_says", "avatar_reports")
    searched = bfs(CONFIGS["watchdog"], "watchdog", inputs="playout", depth=1, prefix=played)
    assert searched.ok, searched.summary()
    assert "watching" not in searched.unreached.get("playout", [])


def test_a_reply_on_the_rooms_track_plays_on_the_clock_and_the_sdk_reports_its_end() -> None:
    """No avatar: the agent's reply goes to the room's track (the harness's speaker, on the
    job's clock), the turn waits for it, and when its second has passed the SDK's own
    playout report ends the turn; the watchdog arms, then times the silence."""
    jobs: list[Harness] = []
    played = run(
        CONFIGS["watchdog"], ["user_joins", "agent_says", "time", "time"], setup=jobs.append
    )
    assert played.violation is None, played.violation
    playout = [{m: s for m, _, s, *_ in snap[0]}["playout"] for snap in played.snapshots]
    assert playout[2:] == ["agent_turn", "settling", "watching"]
    tracker = jobs[0].job.playout
    assert tracker is not None
    assert [(pytest.approx(d.t), d.cause) for d in tracker.done] == [(1.0, "agent_listening")]


def test_a_reply_still_captured_as_the_route_goes_back_is_not_ended_under_it() -> None:
    """The session's clear waits for the avatar's report, the agent's next reply is being
    captured, the room drops and the session's close hangs, then the avatar closes and the
    route goes back to the room. livekit's proxy keeps the reply's segment open across the
    swap (it goes on at the room's output); the runtime must not end it as an orphan, or
    the room output's report finds nothing to end, the wrapper above keeps it owed and the
    agent stays "speaking" for good (invariant 9; a walk of the explorer found it)."""
    jobs: list[Harness] = []
    path = [
        *("avatar_start", "plugin_routed", "plugin_returns", "avatar_joins", "avatar_video"),
        *("user_joins", "interrupt", "agent_says", "room_disconnects", "a_hangs"),
        *("avatar_close", TIME),
    ]
    closed = run(CONFIGS["watchdog"], path, policy="hang", setup=jobs.append)
    assert closed.violation is None, closed.violation
    chain = audio_chain(jobs[0].job.session)
    assert [lk.pending_playbacks(out) for out in chain] == [0] * len(chain)


def test_the_example_config_holds_its_invariants_to_a_small_depth() -> None:
    report = bfs(EXAMPLE, "example", depth=1)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.states > 20 and report.layers[0] == 1 and not report.budget_hit
    # what the search never went through is named: the avatar's join takes three inputs;
    # a state passed through within one input counts (the lifecycle's starting, in the
    # start), and the JSON report says the same
    assert "joined" in report.unreached["avatar"] and "starting" not in report.unreached["avatar"]
    assert "starting" not in report.unreached.get("agent_job", [])
    assert json.loads(json.dumps(report.as_dict()))["unreached"] == report.unreached
    assert "states no run went through: " in report.summary()
    walked = walks(EXAMPLE, "example", seed=0, count=6, steps=8)
    assert walked.ok, walked.summary()


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_config_holds_its_invariants_two_inputs_deep_and_on_300_walks(name: str) -> None:
    """The exhaustive tier's exploration: every config breadth first to two inputs (the
    stand-ins' outcomes within a layer), then 300 seeded walks of 25 inputs."""
    config = CONFIGS[name]
    report = bfs(config, name, depth=2)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.depth == 2 and report.states > 150 and not report.budget_hit
    walked = walks(config, name, seed=0, count=300, steps=25)
    print(walked.summary())
    assert walked.ok, walked.summary()
    assert walked.states > report.states


def test_a_link_the_runtime_does_not_deliver_is_found_and_replayed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the search from the simulator's request, one input and the outcomes after it (from
    # the start it takes two, several times as long; the exhaustive tier drops every link)
    prefix = ("finalize",)
    report = bfs(
        EXAMPLE,
        "example",
        inputs="job",
        depth=2 - len(prefix),
        prefix=prefix,
        setup=drop_link(FAULT),
        stop_at_first=True,
    )
    assert not report.ok and report.stopped
    (found,) = report.violations
    assert found.invariant == 7 and "the verdict was delivered" in found.detail
    assert "verdict_ready" in found.path and "finalize" in found.path
    printed = str(found)
    assert f"--replay {','.join(found.path)}" in printed
    # the printed path, replayed with the same fault, fails the same way; without it, not
    path = ",".join(found.path)
    assert main(["--inputs", "job", "--replay", path, "--drop-link", FAULT]) == 1
    out = capsys.readouterr().out
    assert f"invariant 7 violated after input {found.step}" in out
    assert found.detail in out
    assert main(["--inputs", "job", "--replay", path]) == 0
    assert "every invariant holds" in capsys.readouterr().out


def test_the_replay_command_a_planted_fault_prints_fails_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command a violation prints is the one to copy: run as printed it fails on the
    same invariant (it named the path and the config, not the inputs drawn from nor the
    fault planted, so it passed)."""
    path = "finalize,ctx_shutdown,verdict_ready"  # as the search above finds it
    argv = ["--inputs", "job", "--replay", path, "--drop-link", FAULT]
    assert main(argv) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.strip().startswith("replay: ")]
    printed = shlex.split(line.split("python3 dev.py explore ", 1)[1])
    assert printed[printed.index("--drop-link") + 1] == FAULT
    assert printed[printed.index("--inputs") + 1] == "job"
    assert main(printed) == 1
    again = capsys.readouterr().out
    assert "invariant 7 violated" in again and line in again


def test_the_cli_checks_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--depth", "-1"]) == 2
    assert main(["--drop-link", "a:b:c"]) == 2
    assert main(["--replay", "plugin_routed"]) == 1
    assert "diverged" in capsys.readouterr().err
    assert main(["--prefix", "plugin_routed", "--seed", "0", "--walks", "1"]) == 2
    assert "--prefix is not a path of this config" in capsys.readouterr().err
    assert main(["--replay", "avatar_start", "--prefix", "avatar_start"]) == 2
    assert "a --replay path is whole" in capsys.readouterr().err
    joined = "avatar_start,plugin_routed,plugin_returns,avatar_joins,avatar_video"
    argv = ["--config", "watchdog", "--inputs", "playout", "--prefix", joined]
    assert main([*argv, "--seed", "0", "--walks", "2", "--steps", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depth"] == 8  # the prefix, then 3 inputs
