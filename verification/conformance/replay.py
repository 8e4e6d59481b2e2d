"""Replay a path through the real runtime and compare, after every step, the model's view
of the job with the runtime's (``view.COMPARED``); the shared invariants are checked on the
runtime's view as it goes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.inmemory import quiet_sdk_logs, sdk_task_failures_at_debug
from agent_runtime.testing.invariants.checks import Finding, safety, settled
from agent_runtime.testing.invariants.view import COMPARED, JobView, differences
from verification.conformance.harness import Harness
from verification.conformance.paths import Node, Path, Walker


class Mismatch(AssertionError):
    """The runtime and the model differ after a step of a path."""


@dataclass
class Replayed:
    """What a replay saw: the rows the model took, and the invariants the runtime broke
    along the way (a correct runtime breaks none)."""

    path: Path
    steps: int = 0
    rows: set[tuple[str, int]] = field(default_factory=set)
    findings: list[tuple[int, Finding]] = field(default_factory=list)  # (step, finding)
    views: list[tuple[JobView, JobView]] = field(default_factory=list)


def _describe(path: Path, i: int, label: str, diffs: list[str]) -> str:
    lines = [
        f"the runtime differs from the model after step {i} ({label}) of this path:",
        str(path),
        "first differences:",
        *(f"  {d}" for d in diffs),
    ]
    return "\n".join(lines)


async def replay(
    path: Path,
    *,
    compare: tuple[str, ...] = COMPARED,
    setup: Callable[[Harness], Any] | None = None,
) -> Replayed:
    """Drive ``path`` through a fresh harness; raise ``Mismatch`` at the first step after
    which the views differ. ``setup`` may change the harness before it starts (a fault)."""
    walker = Walker(path.config, path.inputs)
    node: Node = walker.start()
    out = Replayed(path, rows=set(walker.initial_rows))
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(sdk_task_failures_at_debug)
    h = Harness(path.config)
    if setup is not None:
        setup(h)
    try:
        await h.start()
        _check(out, 0, "the job starts", walker.model.view(node.world), h.view(), compare)
        for i, step in enumerate(path.steps, 1):
            match = [
                (mv, after)
                for mv, after in walker.moves(node)
                if mv.action == step.action and mv.label == step.label
            ]
            if not match:
                raise Mismatch(
                    f"step {i} ({step.label}) is not a move of the model any more:\n{path}"
                )
            mv, node = match[0]
            out.rows |= {(m, r) for m, r, _ in mv.rows}
            await h.do(step)
            _check(out, i, step.label, walker.model.view(node.world), h.view(), compare)
            out.steps = i
    finally:
        await h.aclose()
    return out


def _check(
    out: Replayed, i: int, label: str, model: JobView, runtime: JobView, compare: tuple[str, ...]
) -> None:
    out.views.append((model, runtime))
    diffs = differences(model, runtime, compare)
    if diffs:
        raise Mismatch(_describe(out.path, i, label, diffs))
    out.findings += [(i, f) for f in (*safety(runtime), *settled(runtime))]


def run(path: Path, **kw: Any) -> Replayed:
    """``replay`` on an event loop of its own, on virtual time (the SDK's own timers
    included), with the SDK's chatter quiet."""
    with quiet_sdk_logs(logging.CRITICAL):
        return on_virtual_time(replay(path, **kw))
