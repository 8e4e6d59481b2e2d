"""Conformance of the real runtime to the explorer's model, as xstate-graph's
``TestModel.testPath`` does: paths generated from the model (the covering paths, that take
every transition row the model reaches, and the shortest counterexample of every fault the
explorer knows) are driven through a real ``AgentJob`` (an ``InMemoryRoom``: a real
unconnected ``rtc.Room`` with stand-in signalling, real ``AgentSession``s, the session host
on a paired in-memory transport, virtual time), and after every step the model's view of the
job and the runtime's must agree. Stood in, because they are a server's or the outside
world's: the avatar provider, ``on_simulation_end``, the room deletion, a shutdown callback
and the end of a session's close (each does what the path says: return, fail or hang).

A runtime with one of its links not posted, or a cell of AgentJob's own lifecycle changed,
fails the replay at the first step that differs.
"""

from __future__ import annotations

import json

import pytest
from verification.conformance.command import main
from verification.conformance.harness import Harness
from verification.conformance.paths import Path, from_steps
from verification.conformance.replay import Mismatch, run
from verification.conformance.suite import conformance
from verification.explore.model import Inputs
from verification.explore.search import DEFAULT_CONFIGS

from agent_runtime.runtimes.routing import Wiring
from statemachines.glue import LINKS, without
from statemachines.machines import MACHINES
from statemachines.step import table_of
from statemachines.system import bound_of
from verification.explore import LIFECYCLE_CONFIGS, Config
from verification.mutation.cells import set_cell

# the rows no path takes, each for a reason: an input the model does not produce (the
# avatar's own lk.playback_finished outside a clear; a detach; the same session attached
# again; a finalize in a job that is not a simulation; a room reconnecting while routing;
# video from someone else while routing; an interrupt that reached no sink; a reinstall of
# the avatar's route that fails), or a state the
# eager model leaves at once (failed, replying), or a deletion closed before the job's close
NOT_TAKEN = {
    ("avatar", "routing", "room_connected"),
    ("avatar", "routing", "video_published"),
    ("avatar", "routing", "start_error"),
    ("avatar", "joined", "start_error"),
    ("avatar", "clearing", "start_error"),
    ("avatar", "joined", "interrupt"),
    ("avatar", "failed", "interrupt"),
    ("avatar", "starting", "playback_finished"),
    ("avatar", "routing", "playback_finished"),
    ("avatar", "joined", "playback_finished"),
    ("avatar", "clearing", "playback_finished"),
    ("avatar", "failed", "close"),
    ("finalize", "idle", "request"),
    ("finalize", "replying", "request"),
    ("room_deletion", "kept", "close"),
    ("room_deletion", "requested", "close"),
    ("session_host", "attached", "attach"),
    ("session_host", "attached", "detach"),
    # the host's start and its faults: the model's job starts its host before any session
    # attaches and never closes it unstarted, and no subscribe or transport fails in it
    # (these cells: tests/test_session_host.py)
    ("session_host", "new", "attach"),
    ("session_host", "new", "close"),
    ("session_host", "attached", "subscribe_failed"),
    ("session_host", "detached", "transport_failed"),
    ("session_host", "attached", "transport_failed"),
    # the job's own lifecycle before its session runs: the replay's job starts as the
    # model's does, with start_runtime() and start_session() (the start's other cells:
    # tests/test_job_lifecycle.py)
    ("agent_job", "new", "start"),
    ("agent_job", "new", "close"),
    ("agent_job", "new", "abort"),
    ("agent_job", "new", "job_closed"),
    ("agent_job", "starting", "start_part"),
    ("agent_job", "starting", "start_failed"),
    ("agent_job", "starting", "close"),
    ("agent_job", "starting", "abort"),
    ("agent_job", "starting", "job_closed"),
}


def _path(config: Config, inputs: Inputs, labels: list[str]) -> Path:
    path, skipped = from_steps(config, inputs, labels, "test")
    assert not skipped, skipped
    return path


def test_the_runtime_follows_the_model_on_the_example_agents_paths() -> None:
    # the default tier's share: the example agent's own config, its covering paths found
    # within a smaller budget, no counterexamples (the exhaustive tier replays every path)
    report = conformance(configs=DEFAULT_CONFIGS[:1], cover_budget=3_000, counterexample_depth=None)
    assert report.ok, report.summary()
    assert report.covering > 10 and report.steps > 50


@pytest.mark.exhaustive
def test_the_runtime_follows_the_model_on_every_path() -> None:
    # the user's own closes too (LIFECYCLE_CONFIGS: aclose() and aclose(graceful=False));
    # every config's counterexamples (a simulation's found a finalize left without its reply)
    report = conformance(
        configs=(*DEFAULT_CONFIGS, *LIFECYCLE_CONFIGS), counterexample_configs=DEFAULT_CONFIGS
    )
    print("\n" + report.summary())
    assert report.ok, report.summary()
    assert report.covering > 20 and report.counterexamples > 5
    # every row of every machine the model composes, the job's own lifecycle among them
    # (playout is explored composed, but the replay's job runs without it)
    composed = [s for name, s in MACHINES.items() if name != "playout"]
    assert len(report.total) == sum(len(s.rows) for s in composed)
    missed = {
        (m, MACHINES[m].rows[i].source, MACHINES[m].rows[i].event) for m, i in report.missed()
    }
    assert missed == NOT_TAKEN, report.summary()


def test_a_link_the_runtime_does_not_post_is_caught() -> None:
    # the job is never told the verdict went out: the model closes, the runtime holds on
    path = _path(
        Config.example(),
        "job",
        [
            "session A closes",
            "session A finishes closing",
            "finalize_simulation request",
            "on_simulation_end returns for request #1",
        ],
    )
    assert run(path).steps == 4  # the runtime as it is follows the model

    def unlinked(h: Harness) -> None:
        broken = Wiring(links=without(LINKS, "finalize", "report_answered", "job"))
        h.job.system.wiring._links = broken._links

    with pytest.raises(Mismatch) as caught:
        run(path, setup=unlinked)
    msg = str(caught.value)
    assert "after step 4 (on_simulation_end returns for request #1)" in msg
    assert "4. t=0 on_simulation_end returns for request #1" in msg  # the path is shown
    assert "states: model {" in msg and "'job': 'closing'" in msg
    assert "'job': 'awaiting_finalize'" in msg.split("runtime", 2)[2]


def test_a_retry_keeps_the_new_attempts_route() -> None:
    # found by the conformance: the release of a failed attempt ran after the next attempt's
    # start had begun, forgot its route and left the audio on a failed avatar
    rejoin = next(c for c in DEFAULT_CONFIGS if c.rejoin)
    path = _path(
        rejoin,
        "avatar",
        [
            "avatar.start",
            "avatar plugin start() fails early",
            "time passes: backoff_elapsed",
            "avatar plugin puts its route in",
            "avatar plugin start() fails late",
        ],
    )
    done = run(path)
    assert done.views[-1][1].audio_route == "room"
    assert done.views[-1][1].states["avatar"] == "restored"


def test_the_cli_reports_coverage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--depth", "2", "--counterexample-depth", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["paths"] == data["covering"] + data["counterexamples"]
    assert 0 < data["rows_taken"] < data["rows_total"]
    assert main(["--depth", "-1"]) == 2


def test_the_avatar_leaves_after_the_session_or_its_share_of_the_bound() -> None:
    # run_close in livekit's order: the session's close first (its speech ends on the route
    # it has), the avatar's step once it closed or after half of the step's bound
    plain = next(c for c in DEFAULT_CONFIGS if not c.simulation)
    path = _path(
        plain,
        "all",
        [
            "avatar.start",
            "avatar plugin puts its route in",
            "avatar plugin start() returns",
            "avatar joins",
            "avatar publishes video",
            "job.shutdown",
            "time passes: run_close's wait for the session's close",
        ],
    )
    views = [runtime for _, runtime in run(path).views]
    assert (views[6].states["avatar"], views[6].session) == ("joined", "closing")
    assert views[6].audio_route == "avatar"
    assert path.steps[-1].at == pytest.approx(bound_of("session", 10.0))  # its share
    assert (views[7].states["avatar"], views[7].audio_route) == ("closed", "room")


# the example agent in a simulation, with the user's own closes among the job's inputs
ACLOSE = LIFECYCLE_CONFIGS[0]
CLOSES = [
    "AgentJob.aclose()",
    "AgentJob.aclose(graceful=False)",
    "session A finishes closing",
    "run_close: shutdown callbacks return",
]


def test_the_users_closes_follow_the_model() -> None:
    # aclose() holds for the simulator; aclose(graceful=False) ends the hold; the lifecycle
    # closes once the job machine did and its release ended (both calls then return)
    path = _path(ACLOSE, "job", CLOSES)
    views = [runtime for _, runtime in run(path).views]
    assert [v.states["agent_job"] for v in views] == [
        "running",
        "closing",
        "closing",
        "closing",
        "closed",
    ]
    assert [v.states["job"] for v in views[:3]] == ["serving", "awaiting_finalize", "closing"]
    assert views[1].tasks["agent_job"] == ("closing",)  # run_teardown waits for the job
    assert views[4].states["room_deletion"] == "closed"  # aclose() released it on return


def test_a_lifecycle_cell_the_runtime_gets_wrong_is_caught() -> None:
    # a runtime whose lifecycle ignores an abort while closing: the hold goes on
    path = _path(ACLOSE, "job", CLOSES)
    wrong = set_cell(MACHINES["agent_job"], "closing", "abort", kind="ignore")

    def ignores_abort(h: Harness) -> None:
        lifecycle = h.job.system.lifecycle
        lifecycle.spec, lifecycle._table = wrong, table_of(wrong)

    with pytest.raises(Mismatch) as caught:
        run(path, setup=ignores_abort)
    msg = str(caught.value)
    assert "after step 2 (AgentJob.aclose(graceful=False))" in msg
    model, runtime = msg.split("first differences:")[1].split(", runtime ", 1)
    assert "'job': 'closing'" in model
    assert "'job': 'awaiting_finalize'" in runtime
