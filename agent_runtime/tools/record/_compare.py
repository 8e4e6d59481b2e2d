"""Checking a run of the recorded scenario against its trace (``record --check``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.result import seconds_text
from statemachines.machines import MACHINES


def compare(records: Sequence[TraceRecord], result: dict[str, Any]) -> list[str]:
    """How a run of the recorded scenario differs from the trace: each machine's final state
    and its transitions (event, source, dest) in order. Empty when they agree."""
    want: dict[str, list[tuple[str, str, str]]] = {}
    finals: dict[str, str] = {}
    for r in records:
        if r.kind == "transition" and _compared(r.machine, r.event, r.source, r.dest):
            want.setdefault(r.machine, []).append((_as_step(r.machine, r.event), r.source, r.dest))
        if r.kind in ("transition", "ignore", "reject") and r.machine in MACHINES:
            finals[r.machine] = r.dest or r.source
    got: dict[str, list[tuple[str, str, str]]] = {}
    ran_finals = dict(result["final_states"])
    traced = any(r.machine == "room_deletion" and r.event == "close" for r in records)
    closed = False  # the run's lifecycle is closed: what comes after is the release's
    for t in result["transitions"]:
        closed = closed or (t["machine"] == "agent_job" and t["dest"] == "closed")
        if closed and not traced and (t["machine"], t["event"]) == ("room_deletion", "close"):
            # aclose() closes the deletion after the lifecycle, and a job's trace file is
            # closed with the lifecycle: no trace of a job holds it
            ran_finals["room_deletion"] = t["source"]
            continue
        if not _compared(t["machine"], t["event"], t["source"], t["dest"]):
            continue
        got.setdefault(t["machine"], []).append(
            (_as_step(t["machine"], t["event"]), t["source"], t["dest"])
        )
    out: list[str] = []
    for machine, state in sorted(finals.items()):
        ran = ran_finals.get(machine)
        if ran != state:
            out.append(f"final state of {machine}: the trace ends in {state!r}, the run in {ran!r}")
    for machine in sorted(set(want) | set(got)):
        w, g = want.get(machine, []), got.get(machine, [])
        if w == g:
            continue
        n = next(
            (i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b), min(len(w), len(g))
        )
        out.append(f"{machine}: transition {n + 1} differs: trace {_row(w, n)}, run {_row(g, n)}")
    return out


# how far apart a transition's time in the run and in the trace may be before it is named:
# a trace written on a deployed job's clock holds times the scenario's steps round to the
# microsecond
TIME_TOLERANCE = 1e-3


def timing(records: Sequence[TraceRecord], result: dict[str, Any]) -> list[str]:
    """Where a run whose transitions agree with the trace's (``compare`` empty) makes one at
    another time: the first such transition of each machine. A deployed job's answers take
    time a scenario's stand-ins do not (an RPC, a plugin's call), so these are named, not
    failed."""
    want: dict[str, list[tuple[float, str]]] = {}
    for r in records:
        if r.kind == "transition" and _compared(r.machine, r.event, r.source, r.dest):
            want.setdefault(r.machine, []).append((r.t, f"{r.source} -> {r.dest} on {r.event}"))
    got: dict[str, list[float]] = {}
    for t in result["transitions"]:
        if t["machine"] in want and _compared(t["machine"], t["event"], t["source"], t["dest"]):
            got.setdefault(t["machine"], []).append(float(t["t"]))
    out: list[str] = []
    for machine, rows in sorted(want.items()):
        for n, ((at, row), ran) in enumerate(zip(rows, got.get(machine, []), strict=False)):
            if abs(at - ran) > TIME_TOLERANCE:
                out.append(
                    f"{machine}: transition {n + 1} ({row}) is at t={seconds_text(at)} in the "
                    f"trace, t={seconds_text(ran)} in the run"
                )
                break
    return out


def _compared(machine: str, event: str, source: str, dest: str | None) -> bool:
    """Whether a transition is compared: the further parts of a start in parts are the
    lifecycle's internal rows, which a whole ``AgentJob.start()`` does not make."""
    return not (machine == "agent_job" and event == "start_part" and dest in (None, source))


def _as_step(machine: str, event: str) -> str:
    """A scenario starts its job in parts (``avatar.start``, ``session.start``): the whole
    ``AgentJob.start()`` a trace may hold is its first part, to the lifecycle's table."""
    return "start_part" if (machine, event) == ("agent_job", "start") else event


def _row(rows: list[tuple[str, str, str]], n: int) -> str:
    if n >= len(rows):
        return "(none)"
    event, source, dest = rows[n]
    return f"{source} -> {dest} on {event}"
