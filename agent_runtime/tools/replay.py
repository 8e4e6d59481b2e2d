"""Offline replay of a JSONL trace through the pure step function.

Every decision record (``transition``, ``ignore``, ``reject``) carries the guard values the
actor consulted. Replay starts each (machine, instance) in its spec's initial state, feeds
the recorded events through ``statemachines.step`` with those guard values, and stops at the
first record where the recording and the spec disagree: a different source state, outcome,
destination or effects, or a guard the spec needs that the recording never consulted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from statemachines import MachineSpec, step
from statemachines.machines import MACHINES

from ..trace import TraceRecord

logger = logging.getLogger("agent_runtime.tools.replay")

DECISIONS = ("transition", "ignore", "reject")
_KINDS = (*DECISIONS, "effect", "stale", "input")


class TraceError(ValueError):
    """The trace cannot be replayed: a malformed line or a machine this build does not know."""


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: str
    source: str
    dest: str
    effects: list[str]


@dataclass(frozen=True, slots=True)
class Divergence:
    line: int
    machine: str
    instance: str
    event: str
    reason: str
    expected: Decision  # what the spec decides from the replayed state
    recorded: Decision  # what the trace says happened


@dataclass(slots=True)
class ReplayReport:
    path: str
    records: int = 0  # every record read
    decisions: int = 0  # decision records replayed (up to and including a divergence)
    outcomes: dict[str, int] = field(default_factory=dict)
    instances: dict[str, int] = field(default_factory=dict)  # machine -> instances seen
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _check_record(path: str, n: int, rec: TraceRecord) -> None:
    def bad(msg: str) -> TraceError:
        return TraceError(f"{path}:{n}: {msg}")

    if rec.kind not in _KINDS:
        raise bad(f"unknown record kind {rec.kind!r} (expected one of {', '.join(_KINDS)})")
    for name in ("machine", "instance", "event", "source", "dest"):
        if not isinstance(getattr(rec, name), str):
            raise bad(f"field {name!r} must be a string, not {getattr(rec, name)!r}")
    if rec.kind not in DECISIONS:
        return
    for name in ("machine", "event", "source", "dest"):
        if not getattr(rec, name):
            raise bad(f"a {rec.kind} record needs a non-empty {name!r}")
    if not isinstance(rec.effects, list) or not all(isinstance(e, str) for e in rec.effects):
        raise bad(f"'effects' must be a list of effect names, not {rec.effects!r}")
    if not isinstance(rec.guards, dict) or not all(
        isinstance(k, str) and isinstance(v, bool) for k, v in rec.guards.items()
    ):
        raise bad(f"'guards' must map guard names to true/false, not {rec.guards!r}")


def load_trace(path: str | Path) -> list[tuple[int, TraceRecord]]:
    """(line number, record) for every non-blank line; ``TraceError`` names a bad line."""
    p = str(path)
    out: list[tuple[int, TraceRecord]] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{p}: cannot read the trace ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{p}: not a UTF-8 text file ({e.reason})") from None
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{p}:{n}: not JSON ({e.msg})") from None
        if not isinstance(raw, dict):
            raise TraceError(f"{p}:{n}: a record is a JSON object, not {type(raw).__name__}")
        try:
            rec = TraceRecord.from_dict(raw)
        except TypeError as e:
            raise TraceError(f"{p}:{n}: not a trace record ({e})") from None
        _check_record(p, n, rec)
        out.append((n, rec))
    return out


def replay_records(
    records: Iterable[tuple[int, TraceRecord]],
    *,
    path: str = "<trace>",
    machines: Mapping[str, MachineSpec] = MACHINES,
) -> ReplayReport:
    """Replay decision records; the report holds the first divergence, if any."""
    report = ReplayReport(path=path)
    states: dict[tuple[str, str], str] = {}
    for n, rec in records:
        report.records += 1
        if rec.kind not in DECISIONS:
            continue  # effect outcomes, stale timers and inputs are context, not decisions
        spec = machines.get(rec.machine)
        if spec is None:
            raise TraceError(
                f"{path}:{n}: unknown machine {rec.machine!r}; machines: {', '.join(machines)}"
            )
        key = (rec.machine, rec.instance)
        current = states.get(key)
        if current is None:
            report.instances[rec.machine] = report.instances.get(rec.machine, 0) + 1
            current = spec.initial
        elif spec.state(current).final and rec.source == spec.initial and current != rec.source:
            # a final state is never left: a record from the initial state is a new actor
            # that reuses the instance name (e.g. a second session in the same job)
            report.instances[rec.machine] = report.instances.get(rec.machine, 0) + 1
            current = spec.initial
        report.decisions += 1
        recorded = Decision(rec.kind, rec.source, rec.dest, list(rec.effects))
        divergence = _compare(spec, current, rec, recorded)
        if divergence is not None:
            reason, expected = divergence
            report.divergence = Divergence(
                n, rec.machine, rec.instance, rec.event, reason, expected, recorded
            )
            return report
        report.outcomes[rec.kind] = report.outcomes.get(rec.kind, 0) + 1
        states[key] = rec.dest
    return report


def _compare(
    spec: MachineSpec, current: str, rec: TraceRecord, recorded: Decision
) -> tuple[str, Decision] | None:
    """(reason, what the spec decides) when the record disagrees with the spec, else None."""
    if rec.event not in spec.events:
        return (
            f"the machine declares no event {rec.event!r}",
            Decision("unknown event", current, current, []),
        )
    missing: list[str] = []

    def check(name: str) -> bool:
        if name not in rec.guards:
            missing.append(name)
            return False
        return rec.guards[name]

    st = step(spec, current, rec.event, check)
    expected = Decision(st.outcome, st.source, st.dest, list(st.effects))
    if rec.source != current:
        return f"recorded source {rec.source!r}, replay is in {current!r}", expected
    if missing:
        return (
            f"the spec consults guard {missing[0]!r}, which the recording did not",
            expected,
        )
    if st.outcome != rec.kind:
        return f"outcome differs: {st.outcome} replayed, {rec.kind} recorded", expected
    if st.dest != rec.dest:
        return f"destination differs: {st.dest!r} replayed, {rec.dest!r} recorded", expected
    if list(st.effects) != list(rec.effects):
        return "effects differ", expected
    return None


def replay_file(
    path: str | Path, *, machines: Mapping[str, MachineSpec] = MACHINES
) -> ReplayReport:
    """Load and replay a JSONL trace; raises ``TraceError`` for a file that cannot be replayed."""
    return replay_records(load_trace(path), path=str(path), machines=machines)


def _decision(d: Decision) -> str:
    if d.outcome == "transition":
        move = f"{d.source} -> {d.dest}" if d.dest != d.source else f"{d.source} (stays)"
        effects = f" / {', '.join(d.effects)}" if d.effects else ""
        return f"transition {move}{effects}"
    return f"{d.outcome} in {d.source}"


def format_report(report: ReplayReport) -> str:
    """The report for people."""
    if report.divergence is None:
        labels = {"transition": "transitions", "ignore": "ignored", "reject": "rejected"}
        counts = ", ".join(f"{report.outcomes.get(k, 0)} {v}" for k, v in labels.items())
        machines = ", ".join(f"{m} x{n}" for m, n in report.instances.items()) or "none"
        return (
            f"{report.path}: {report.decisions} decisions replayed ({counts}) "
            f"from {report.records} records; instances: {machines}.\n"
            "Every decision agrees with the machines.\n"
        )
    d = report.divergence
    who = f"{d.machine}[{d.instance}]" if d.instance else d.machine
    return (
        f"{report.path}:{d.line}: {who} on event {d.event!r}: {d.reason}\n"
        f"  expected (spec): {_decision(d.expected)}\n"
        f"  recorded:        {_decision(d.recorded)}\n"
        f"{report.decisions - 1} decisions agreed before this one.\n"
    )
