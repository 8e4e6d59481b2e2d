"""The pure step function (checked against ``transitions`` in ``test_compiled.py``)."""

from __future__ import annotations

import sys

import pytest

from statemachines import UnknownEvent, UnknownState, step
from statemachines.machines import MACHINES

# unit tests of step on cells of the real specs, as written
pytestmark = pytest.mark.snapshot


def test_step_transition_internal_ignore_reject() -> None:
    av = MACHINES["avatar"]
    s = step(av, "starting", "plugin_started")
    assert (s.outcome, s.dest, s.effects, s.changed) == (
        "transition",
        "routing",
        ("check_presence",),
        True,
    )
    s = step(av, "routing", "interrupt")
    assert (s.outcome, s.dest, s.internal, s.changed) == ("transition", "routing", True, False)
    assert s.effects == ("clear_local_buffer",)
    assert step(av, "joined", "video_published").outcome == "ignore"
    assert step(av, "closed", "start").outcome == "reject"


def test_guards_pick_the_first_row_that_holds() -> None:
    p = MACHINES["participant"]
    both = {"is_linked": True, "closing_reason": True, "grace_enabled": True}
    assert step(p, "linked", "participant_disconnected", both).dest == "closing"
    grace = {"is_linked": True, "closing_reason": False, "grace_enabled": True}
    assert step(p, "linked", "participant_disconnected", grace).dest == "grace"
    no_grace = {"is_linked": True, "closing_reason": False, "grace_enabled": False}
    assert step(p, "linked", "participant_disconnected", no_grace).dest == "closing"
    other = step(p, "linked", "participant_disconnected", {"is_linked": False})
    assert (other.dest, other.internal) == ("linked", True)
    # guard values may be a callable too
    assert step(p, "linked", "participant_disconnected", lambda g: True).dest == "closing"


def test_unknown_names_raise() -> None:
    with pytest.raises(UnknownEvent, match="machine 'job' has no event 'explode'"):
        step(MACHINES["job"], "serving", "explode")
    with pytest.raises(UnknownState, match="machine 'job' has no state 'limbo'"):
        step(MACHINES["job"], "limbo", "shutdown")


def test_import_statemachines_pulls_in_no_livekit() -> None:
    import subprocess

    code = (
        "import statemachines, statemachines.machines, sys;"
        "bad=[m for m in sys.modules if m.startswith('livekit')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_table_cache_lets_a_spec_go_once_it_is_unused() -> None:
    """Issue 13 item 10: every spec step had seen stayed alive in its table cache (2,000
    copied specs held 56 MB). A copy stepped once is collectable, and holding many copies
    in turn leaves the memory where it was."""
    import gc
    import tracemalloc
    import weakref

    spec = MACHINES["participant"]
    copy = spec.model_copy(deep=True)
    assert step(copy, "waiting", "close").dest == "closed"
    gone = weakref.ref(copy)
    del copy
    gc.collect()
    assert gone() is None, "the table cache keeps a spec alive"

    def use_copies(n: int) -> None:
        for _ in range(n):
            step(spec.model_copy(deep=True), "linked", "close")

    use_copies(20)  # warm up whatever is built once
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        use_copies(200)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a copy and its table are some 20 KiB: 200 kept alive would hold megabytes
    assert held < 200_000, f"{held} bytes still held after 200 copies were dropped"
