"""Every link, watch and report the real job's system delivers, dropped one at a time: the explorer
of the real job (``verification.explore.realsearch``) reports each drop as an invariant
broken, within a small search, or the drop is argued here to change nothing a user relies
on (another path backs it up), or it is reached only by a directed path (deeper than the
search's budget), replayed here to the invariant it breaks.

In the exhaustive tier: the searches take about 3 minutes on a shared 2-core machine."""

from __future__ import annotations

from typing import Literal

import pytest

from verification.explore.command import main
from verification.explore.config import CONFIGS
from verification.explore.real import run
from verification.explore.realsearch import (
    LINK_SPECS,
    REPORT_SPECS,
    WATCH_SPECS,
    bfs,
    drop,
    walks,
)

Search = tuple[Literal["bfs", "walks"], str, Literal["all", "job", "avatar", "playout"], int]

# each drop the explorer catches: how (breadth first to a depth, or seeded walks from seed
# 0), in which config, over which inputs, and the invariant it reports
CAUGHT: dict[str, tuple[Search, int]] = {
    "session:report_closed:session_host": (("bfs", "example", "job", 1), 11),
    "session:report_own_closed:participant": (("bfs", "example", "job", 1), 11),
    "session:report_own_closed:avatar": (("walks", "example", "all", 100), 11),
    "session:report_own_closed:playout": (("bfs", "example", "job", 1), 9),
    "session_host:report_session_closed:job": (("bfs", "example", "job", 1), 11),
    "session_host:forward_finalize:finalize": (("walks", "example", "all", 100), 2),
    "session_host:close_finalize:finalize": (("walks", "example", "all", 100), 2),
    "finalize:report_answered:job": (("bfs", "example", "job", 2), 7),
    "participant:report_close_timed_out:job": (("bfs", "sip", "job", 2), 8),
    "job:run_close:session_host": (("walks", "example", "all", 100), 10),
    "job:run_close:room_deletion": (("walks", "example", "all", 100), 5),
    "agent_job:ask_shutdown:job": (("bfs", "aclose", "job", 1), 10),
    "agent_job:ask_abort:job": (("bfs", "aclose", "job", 1), 10),
    "job:job_closed:agent_job": (("bfs", "example", "job", 1), 10),
    # the agent's own job.shutdown(): the job holds with the agent still on the call
    "job:job_holding:agent_job": (("bfs", "example", "job", 1), 13),
    "participant:user_left:playout": (("walks", "watchdog", "avatar", 300), 9),
    # a report (statemachines.system.REPORTS), named by what the avatar's runtime emits:
    # the reply's end at the joined avatar's sink is never heard, nobody awaits its audio
    "avatar:segment_flushed:playout": (("bfs", "example", "playout", 4), 12),
}

# drops that change no promise: why
ARGUED: dict[str, str] = {
    "session_host:report_session_closed:room_deletion": (
        "the same request (delete_room_on_close) goes to room_deletion at the job's close "
        "(run_close, room step) that this report starts; the deletion is deferred until "
        "allowed at that step either way"
    ),
    "job:run_close:avatar": (
        "the teardown's session step closes the primary session, whose close link closes the "
        "avatar; when that close hangs, the release closes it once the job machine closed. "
        "Only the order changes (the avatar closed after the disconnect), which no "
        "invariant states"
    ),
    "avatar:playback_finished:playout": (
        "livekit's own sink hears the same lk.playback_finished (the runtime's handler hands "
        "it on): the speech's playout ends and the agent state turns listening in the same "
        "step, and agent_listening ends playout's wait (TURN) at the same time. Only the event "
        "that ends the wait changes, which no invariant states (invariant 12 judges each "
        "decision made, and every one made is right; one that saw the drop would compare the "
        "avatar's accepted reports with playout's decisions). Bfs to depth 4 from the joined "
        "avatar over the playout inputs (example, watchdog) and 150 walks of 25 (example, "
        "watchdog, identity) found nothing; tests/test_playout.py, run with it dropped, fails "
        "only where it asserts which event ended the wait"
    ),
    "job:run_close:participant": (
        "as the avatar: the session's close link, else the release, closes the link; it "
        "follows nobody once the session is gone (invariant 11)"
    ),
    "avatar:avatar_left:playout": (
        "every way out of joined or clearing puts the route back (or closes the plugin), "
        "which finishes the sink's pending segments: the SDK's own playout report "
        "(agent_listening) ends the wait in the same step (a joined avatar leaving mid-reply "
        "was run with the watch dropped: playout went remote_playout -> idle on it)"
    ),
}

# deeper than the search's budget (an avatar joined, a reply handed to it: five inputs and
# more): the directed path a user's job takes, and the invariant it breaks (here as soon as
# the bound finished the playout without telling the avatar: its audio waits there unawaited)
JOINED = "avatar_start,plugin_routed,plugin_returns,avatar_joins,avatar_video,agent_says"
DIRECTED: dict[str, tuple[str, int]] = {
    "playout:finish_playout:avatar": (f"{JOINED},time", 12),
    # the reply handed to the avatar's sink before the plugin's start() returned: without
    # the watch, nothing awaits it once the avatar joins
    "avatar:avatar_joined:playout": (
        "avatar_start,avatar_joins,plugin_routed,agent_says,avatar_video,plugin_returns",
        12,
    ),
}


def test_every_link_watch_and_report_is_listed_once() -> None:
    listed = [*CAUGHT, *ARGUED, *DIRECTED]
    assert sorted(listed) == sorted({*LINK_SPECS, *WATCH_SPECS, *REPORT_SPECS})
    assert len(listed) == len(set(listed))
    # one spec names one channel: --drop-link SPEC drops what its table declares
    assert not {*LINK_SPECS} & {*WATCH_SPECS} and not {*LINK_SPECS, *WATCH_SPECS} & {*REPORT_SPECS}


def test_a_dropped_report_is_named_as_the_fault_of_the_violation_it_causes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--drop-link SOURCE:REPORT:TARGET`` drops a declared report (it dropped links and
    watches only: "no watch ... in statemachines.system.WATCHES", exit 2). The joined
    avatar's sink ends the reply's segment, playout never hears it: invariant 12, and the
    replay printed names the fault; without it the same path holds."""
    spec = "avatar:segment_flushed:playout"
    path = JOINED
    assert main(["--inputs", "playout", "--replay", path, "--drop-link", spec]) == 1
    out = capsys.readouterr().out
    assert "invariant 12 violated after input 6: agent audio waits at the joined avatar" in out
    assert f"--drop-link {spec}" in out
    assert main(["--inputs", "playout", "--replay", path]) == 0
    assert "every invariant holds" in capsys.readouterr().out
    assert main(["--drop-link", "avatar:segment_flushed:job"]) == 2
    err = capsys.readouterr().err
    assert "no link, watch or report avatar:segment_flushed:job" in err


@pytest.mark.exhaustive
@pytest.mark.parametrize("spec", sorted(CAUGHT))
def test_a_dropped_link_watch_or_report_is_caught_by_the_explorer(spec: str) -> None:
    (mode, name, inputs, size), invariant = CAUGHT[spec]
    config = CONFIGS[name]
    if mode == "bfs":
        report = bfs(config, name, inputs=inputs, depth=size, setup=drop(spec), stop_at_first=True)
    else:
        report = walks(config, name, seed=0, count=size, steps=25, inputs=inputs, setup=drop(spec))
    assert not report.ok, f"{spec}: {report.summary()}"
    assert report.violations[0].invariant == invariant, report.summary()


@pytest.mark.parametrize("spec", sorted(DIRECTED))
def test_a_drop_deeper_than_the_search_breaks_its_invariant_on_its_path(spec: str) -> None:
    path, invariant = DIRECTED[spec]
    broken = run(CONFIGS["example"], path.split(","), setup=drop(spec))
    assert broken.violation is not None and broken.violation.invariant == invariant
    # the same path holds every invariant on the job as it ships
    assert run(CONFIGS["example"], path.split(",")).violation is None
