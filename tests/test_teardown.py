"""The one runner of a declared teardown (``agent_runtime.runtimes.teardown``), on a virtual clock:
the order the data gives, independent steps at once, a cut or failed step never skipping
the ones after it, and no step whose work fires a link by hand."""

from __future__ import annotations

import ast
import asyncio
import logging
from pathlib import Path

import pytest

from agent_runtime.runtimes.teardown import Teardown
from agent_runtime.testing.clock import VirtualClock, settle
from statemachines.system import RELEASE, TEARDOWN, TeardownStep

log = logging.getLogger("test.teardown")

STEPS = (
    TeardownStep(name="a", bound=0.2, what="first"),
    TeardownStep(name="b", after=("a",), bound=0.2, what="one of two at once"),
    TeardownStep(name="c", after=("a",), bound=0.2, what="the other"),
    TeardownStep(name="d", after=("b", "c"), bound=0.2, what="after both"),
)


async def test_steps_run_in_the_declared_order_and_independent_ones_at_once() -> None:
    clock = VirtualClock()
    seen: list[str] = []
    gate = asyncio.Event()

    def work(name: str, wait: bool = False):  # type: ignore[no-untyped-def]
        async def run() -> None:
            seen.append(f"{name} begins")
            if wait:
                await gate.wait()
            seen.append(f"{name} ends")

        return run

    began: list[str] = []
    td = Teardown(STEPS, close_timeout=10, clock=clock, log=log, who="t", begin=began.append)
    running = asyncio.ensure_future(
        td.run({"a": work("a"), "b": work("b", wait=True), "c": work("c"), "d": work("d")}, None)
    )
    await settle()
    # b waits; c, independent of it, ran anyway; d waits for both
    assert seen == ["a begins", "a ends", "b begins", "c begins", "c ends"]
    assert td.running == ["b"]
    gate.set()
    await running
    assert seen[5:] == ["b ends", "d begins", "d ends"]
    assert began == ["a", "b", "c", "d"] and td.running == []


async def test_a_step_cut_at_its_share_or_failing_never_skips_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = VirtualClock()
    ran: list[tuple[str, float]] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def last() -> None:
        ran.append(("d", clock.now()))

    td = Teardown(
        STEPS, close_timeout=10, clock=clock, log=log, who="t", waiting_for=lambda s: f"{s} hung"
    )
    with caplog.at_level(logging.WARNING, logger="test.teardown"):
        running = td.run({"a": hangs, "b": fails, "d": last}, None)
        await clock.advance(5)
        await running
    assert ran == [("d", 2.0)]  # a cut at its share (0.2 of 10 s), b failed, c had no work
    messages = [r.getMessage() for r in caplog.records]
    assert "t: closing a took longer than 2s; cut off, the close goes on (a hung)" in messages
    assert "t: closing b failed" in messages


async def test_a_work_for_no_declared_step_is_a_clear_error() -> None:
    td = Teardown(STEPS, close_timeout=10, clock=VirtualClock(), log=log, who="t")

    async def nothing() -> None:
        return None

    with pytest.raises(KeyError, match="no teardown step"):
        td.run({"z": nothing}, None)


def test_the_declared_teardowns_leave_the_callbacks_their_share() -> None:
    # even when every step before them hangs to its share, the shutdown callbacks get time
    # before the job's own close_timeout
    before = sum(s.bound for s in TEARDOWN if s.name != "callbacks")
    assert before < 1.0
    followers = [s.name for s in RELEASE if s.after == ("job",)]
    assert len(followers) > 1  # released at once


RUNTIME = Path(__file__).resolve().parent.parent / "agent_runtime"


def test_links_are_fired_only_by_the_declared_channels() -> None:
    """Links fire from an effect's declared outcome (its ``Output``, by the actor; a
    session's close too, through the session machine) or as a declared teardown step
    begins: no other code of the runtime fires one."""
    firing: set[tuple[str, str]] = set()

    class Uses(ast.NodeVisitor):
        def __init__(self, where: str) -> None:
            self.where, self.stack = where, ["<module>"]

        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Attribute(self, node: ast.Attribute) -> None:
            if node.attr == "fire":  # a call, or the method handed on (functools.partial)
                firing.add((self.where, self.stack[-1]))
            self.generic_visit(node)

    for path in RUNTIME.rglob("*.py"):
        if "tools" in path.parts or "testing" in path.parts:
            continue
        Uses(path.relative_to(RUNTIME).as_posix()).visit(ast.parse(path.read_text()))
    assert firing == {
        # an effect's success: the actor passes its Output to the wiring it was bound to
        ("_perform.py", "_effect_done"),
        ("_perform.py", "_task_succeeded"),  # the same, for a state's task
        ("runtimes/job_close.py", "_begin_step"),  # run_close's steps (TEARDOWN)
        ("system/job_system.py", "_begin_release"),  # run_teardown's steps (RELEASE)
    }


async def test_a_step_whose_work_raises_cancelled_error_never_skips_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A work that waited on a task someone else cancelled gets CancelledError without being
    cancelled itself: a failure like any other; the teardown goes on."""
    clock = VirtualClock()
    ran: list[str] = []

    async def waits_on_a_cancelled_task() -> None:
        task = asyncio.ensure_future(asyncio.Event().wait())
        task.cancel()
        await task

    async def last() -> None:
        ran.append("d")

    td = Teardown(STEPS, close_timeout=10, clock=clock, log=log, who="t")
    with caplog.at_level(logging.ERROR, logger="test.teardown"):
        await td.run({"a": waits_on_a_cancelled_task, "d": last}, None)
    assert ran == ["d"] and td.ended == {"a", "b", "c", "d"}
    assert "t: closing a failed" in [r.getMessage() for r in caplog.records]


async def test_the_teardown_cut_from_outside_stops_where_it_is() -> None:
    clock = VirtualClock()
    ran: list[str] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def last() -> None:
        ran.append("d")

    td = Teardown(STEPS, close_timeout=1000, clock=clock, log=log, who="t")
    running = td.run({"a": hangs, "d": last}, None)
    await settle()
    (hung,) = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "hangs"]  # type: ignore[union-attr]
    running.cancel()  # the cut runs as it is asked, not a turn of the loop later
    assert hung.cancelling() == 1  # the step's own work is cut with it
    with pytest.raises(asyncio.CancelledError):
        await running
    await settle()
    # nothing begins after the cut, and the step it cut is named as cut (still running)
    assert ran == [] and td.running == ["a"] and td.ended == set()
    assert hung.cancelled()


async def test_a_teardown_cut_as_a_step_begins_runs_nothing_of_it() -> None:
    clock = VirtualClock()
    ran: list[str] = []
    running: list[asyncio.Future[None]] = []

    def begin(step: str) -> None:
        if step == "b":
            running[0].cancel()  # the whole is cut from the step's own begin (its link)

    async def work() -> None:
        ran.append("b")

    first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    td = Teardown(STEPS, close_timeout=10, clock=clock, log=log, who="t", begin=begin)
    running.append(td.run({"a": lambda: first, "b": work}, None))
    first.set_result(None)  # a ends: b begins, and its begin cuts the whole
    with pytest.raises(asyncio.CancelledError):
        await running[0]
    await settle()
    assert ran == []  # b's work never ran, and c, begun after the cut, not at all
    assert td.running == ["b"]  # what the cut says it cut
    assert clock.pending == 0  # no step's bound left armed


async def test_a_step_with_nothing_left_to_wait_for_ends_as_it_begins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a work returns None when its part is already done (a machine closed before its step),
    # or raises at once: either way the step ends where it begins and the next ones run
    clock = VirtualClock()
    seen: list[str] = []

    def done_already() -> None:
        seen.append("a asked")

    def broken() -> None:
        raise RuntimeError("cannot even begin")

    async def d() -> None:
        seen.append("d ran")

    began: list[str] = []
    td = Teardown(STEPS, close_timeout=10, clock=clock, log=log, who="t", begin=began.append)
    tasks_before = len(asyncio.all_tasks())
    with caplog.at_level(logging.ERROR, logger=log.name):
        running = td.run({"a": done_already, "b": broken, "d": d}, None)
        await settle()
        await running
    assert seen == ["a asked", "d ran"]
    assert began == ["a", "b", "c", "d"] and td.running == [] and td.ended == set("abcd")
    assert "t: closing b failed" in caplog.text and "cannot even begin" in caplog.text
    assert len(asyncio.all_tasks()) == tasks_before  # nothing left running


async def test_a_teardown_following_futures_runs_no_task_and_leaves_them_to_their_owners(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the job's teardowns follow what the machines already run (a state reached, a close
    # under way): the runner is callbacks, and a cut stops the following, not the work
    clock = VirtualClock()
    loop = asyncio.get_running_loop()
    a: asyncio.Future[None] = loop.create_future()
    b: asyncio.Future[None] = loop.create_future()
    tasks_before = asyncio.all_tasks()
    td = Teardown(STEPS, close_timeout=10, clock=clock, log=log, who="t")
    with caplog.at_level(logging.WARNING, logger=log.name):
        running = td.run({"a": lambda: a, "b": lambda: b}, "released")
        assert asyncio.all_tasks() == tasks_before
        a.set_result(None)
        await settle()
        assert td.running == ["b"]
        await clock.advance(5)  # b is cut at its share (2 s)
        assert await running == "released"
    assert "t: closing b took longer than 2s" in caplog.text
    assert not b.done()  # its owner's to end: only following it was cut
    assert asyncio.all_tasks() == tasks_before
