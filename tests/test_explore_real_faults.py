"""Each invariant can fail: a fault planted in one machine's table (one cell changed, as a
user's own change could) is swapped into the real job, and the explorer of the real job
finds it, naming the invariant the fault breaks, in the config and with the path a user
would replay. Runs on virtual time; the slow ones are in the exhaustive tier."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from statemachines import MachineSpec, Row
from statemachines.machines import MACHINES
from verification.explore.config import CONFIGS
from verification.explore.real import Policy, Violation, run
from verification.mutation.cells import set_cell, set_dest
from verification.mutation.explored import confirmed, first_violation
from verification.mutation.swap import swapped

A, H, F = MACHINES["avatar"], MACHINES["session_host"], MACHINES["finalize"]
J, D, P = MACHINES["job"], MACHINES["room_deletion"], MACHINES["participant"]
L = MACHINES["agent_job"]

# the avatar joined and given the agent's reply, then cut: its plugin clears
CLEARING = (
    "avatar_start",
    "plugin_routed",
    "plugin_returns",
    "avatar_joins",
    "avatar_video",
    "agent_says",
    "interrupt",
)


def _row(state: str, event: str, dest: str | None, *effects: str) -> list[Row]:
    return [Row(source=state, event=event, dest=dest, effects=effects)]


Fault = Callable[[], MachineSpec]
# (what is broken, the table changed, the change, the config, the invariant, its detail)
CASES: list[tuple[str, MachineSpec, Fault, str, int, str]] = [
    (
        "an avatar that never joins keeps the audio",
        A,
        lambda: set_cell(A, "routing", "join_timeout", kind="ignore"),
        "example",
        1,
        "after every bound the audio still goes to an avatar in routing",
    ),
    (
        "a plugin start that never returns keeps the audio",
        A,
        lambda: set_cell(A, "starting", "start_timeout", kind="ignore"),
        "example",
        1,
        "after every bound the audio still goes to an avatar in starting",
    ),
    (
        "a restored route that is never restored loops on time alone",
        A,
        lambda: set_dest(A, "failed", "route_restored", "routing"),
        "example",
        0,
        "still running after 200 outcomes and deadlines alone",
    ),
    (
        "a finalize request nobody answers",
        H,
        lambda: set_cell(H, "attached", "finalize", kind="ignore"),
        "example",
        2,
        "finalize request #1 was never answered",
    ),
    (
        "a verdict given to someone not the simulator",
        H,
        lambda: set_cell(
            H, "attached", "finalize", rows=_row("attached", "finalize", None, "forward_finalize")
        ),
        "example",
        2,
        "finalize request #1, not from the simulator, got the verdict",
    ),
    (
        "a cut answer left without its error reply",
        F,
        lambda: set_cell(F, "answering", "close", rows=_row("answering", "close", "closed")),
        "example",
        2,
        "finalize request #1 was never answered",
    ),
    (
        "a host that waits for ever for a hung verdict",
        H,
        lambda: set_cell(H, "closing", "drain_timeout", kind="ignore"),
        "example",
        2,
        "finalize request #1 was never answered",
    ),
    (
        "a room deletion that does not wait for the job",
        D,
        lambda: set_dest(D, "kept", "request", "deleting"),
        "example",
        3,
        "the room deletion began while the job was serving",
    ),
    (
        "a closed session the host stays attached to",
        H,
        lambda: set_dest(H, "attached", "session_closed", "attached", guards=["is_current"]),
        "example",
        4,
        "session_host is attached with no session forwarded",
    ),
    (
        "a hold that never ends",
        J,
        lambda: set_cell(J, "awaiting_finalize", "hold_timeout", kind="ignore"),
        "example",
        5,
        "after every bound the job is still awaiting_finalize",
    ),
    (
        "a job that skips its close work",
        J,
        lambda: set_dest(J, "awaiting_finalize", "hold_timeout", "closed"),
        "example",
        5,
        "the job closed without its close work (session_host closed, room connected)",
    ),
    (
        "a close left to a hung shutdown callback",
        J,
        lambda: set_cell(J, "closing", "close_timeout", kind="ignore"),
        "example",
        5,
        "after every bound the job is still closing",
    ),
    (
        "a close whose work is done but that waits out its bound",
        J,
        lambda: set_cell(J, "closing", "close_done", kind="ignore"),
        "example",
        5,
        "the close work is done but the job is still closing",
    ),
    (
        "a room deletion the job never allows",
        D,
        lambda: set_cell(D, "requested", "allow", kind="ignore"),
        "example",
        5,
        "the job closed without its close work (session_host closed, room disconnected)",
    ),
    (
        "a shutdown that skips the hold",
        J,
        lambda: set_dest(J, "serving", "shutdown", "closing", guards=["hold_needed"]),
        "example",
        7,
        "job went serving -> closing on shutdown with the hold needed",
    ),
    (
        "a hold that outlives the simulator",
        J,
        lambda: set_cell(J, "awaiting_finalize", "simulator_left", kind="ignore"),
        "example",
        7,
        "the simulator is gone but the job still holds",
    ),
    (
        "an abort while a graceful close holds, ignored",
        L,
        lambda: set_cell(L, "closing", "abort", kind="ignore"),
        "aclose",
        10,
        "aclose(graceful=False) was called but the job is awaiting_finalize",
    ),
    (
        "AgentJob's lifecycle closed before the job machine",
        L,
        lambda: set_dest(L, "running", "close", "closed"),
        "aclose",
        10,
        "AgentJob's lifecycle is closed while the job machine is awaiting_finalize",
    ),
]
SLOW: list[tuple[str, MachineSpec, Fault, str, int, str]] = [
    (
        "a close while starting that misses the plugin's route",
        A,
        lambda: set_cell(
            A, "starting", "close", rows=_row("starting", "close", "closed", "put_route_back")
        ),
        "example",
        1,
        "after every bound the audio still goes to an avatar in closed",
    ),
    (
        "a verdict delivered twice",
        F,
        lambda: set_cell(
            F, "answered", "request", rows=_row("answered", "request", "answering", "take_request")
        ),
        "example",
        2,
        "the verdict was delivered 2 times",
    ),
    (
        "a hold that outlives the verdict",
        J,
        lambda: set_cell(J, "awaiting_finalize", "finalize_answered", kind="ignore"),
        "example",
        7,
        "the verdict was delivered but the job still holds",
    ),
    (
        "a room deletion that runs twice",
        D,
        lambda: set_cell(D, "deleting", "close", rows=_row("deleting", "close", "deleting")),
        "aclose",
        3,
        "the room deletion ran 2 times",
    ),
    (
        "a grace period that never ends",
        P,
        lambda: set_cell(P, "grace", "grace_timeout", kind="ignore"),
        "plain",
        8,
        "user left but the session is still running",
    ),
]


# the cases the walks after a one-input search find (a two-input search finds them too,
# several times later)
WALKED = {"a hold that outlives the simulator", "an abort while a graceful close holds, ignored"}


def _found(original: MachineSpec, fault: Fault, config: str, depth: int) -> Violation:
    with swapped(original, fault()):
        v = first_violation(depth, configs=[config])
    assert v is not None, "the explorer found nothing"
    return v


def _check(case: tuple[str, MachineSpec, Fault, str, int, str], depth: int = 2) -> None:
    _, original, fault, config, number, detail = case
    v = _found(original, fault, config, depth)
    assert (v.config, v.invariant, v.detail) == (config, number, detail), str(v)
    # the path it prints replays to the same failure with the fault; without it, the path
    # breaks nothing (or cannot happen: the fault made it possible)
    policy: Policy = "hang" if v.policy == "hang" else "return"
    with swapped(original, fault()):
        again = run(CONFIGS[config], v.path, policy=policy)
    assert again.violation is not None and again.violation.invariant == number
    assert confirmed(v)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_planted_fault_is_found_on_the_real_job(
    case: tuple[str, MachineSpec, Fault, str, int, str],
) -> None:
    _check(case, 1 if case[0] in WALKED else 2)


@pytest.mark.exhaustive
@pytest.mark.parametrize("case", SLOW, ids=[c[0] for c in SLOW])
def test_a_planted_fault_deeper_in_is_found_on_the_real_job(
    case: tuple[str, MachineSpec, Fault, str, int, str],
) -> None:
    _check(case)


def test_an_avatar_leaving_during_its_clear_unnoticed_is_found_from_the_clear() -> None:
    """Eight inputs deep: the walks do not get there, a search from the clear does."""
    from verification.explore.realsearch import bfs

    with swapped(A, set_cell(A, "clearing", "avatar_left", kind="ignore")):
        report = bfs(CONFIGS["example"], "example", depth=1, prefix=CLEARING, stop_at_first=True)
    (v,) = report.violations
    assert (v.invariant, v.detail) == (
        1,
        "after every bound the audio still goes to an avatar that left",
    )
    assert v.path == (*CLEARING, "avatar_leaves")


@pytest.mark.exhaustive
def test_the_tables_as_written_break_nothing_in_the_same_searches() -> None:
    """The faults above are what the searches find: the machines as written pass them
    (the default tier replays each fault's path without it instead)."""
    assert first_violation(2, configs=["example", "aclose", "plain"]) is None
