"""Offline replay of a JSONL trace through the ``transitions`` machines compiled from the specs.

Every decision record (``transition``, ``ignore``, ``reject``) carries the guard values the
actor consulted. Replay starts each (machine, instance) in its spec's initial state, feeds
the recorded events through the compiled machine (``statemachines.compiled.reference_step``)
with those guard values, and stops at the first record where the recording and the spec
disagree: a different source state, outcome, destination or effects, or a guard the spec
needs that the recording never consulted. A trace of jobs one after the other (on one
clock: ``agent_runtime.observe.jobs``) is replayed job by job, each from the initial
states; jobs at once in one trace cannot be told apart, and are refused. The actor
decides with ``statemachines.step``; replay re-decides with a second implementation, so a
fault in either shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# the trace is read (and its lines checked) by the one reader; replay re-decides
from agent_runtime.observe.jobs import JobBounds, another_actor
from agent_runtime.observe.reading import AnotherJob, TraceError, load_trace, unknown_machine
from agent_runtime.observe.trace import DECISIONS, TraceRecord
from statemachines import MachineSpec
from statemachines.compiled import reference_step
from statemachines.machines import MACHINES

__all__ = [
    "Decision",
    "Divergence",
    "ReplayReport",
    "TraceError",
    "another_actor",
    "format_report",
    "load_trace",
    "replay_file",
    "replay_records",
]

logger = logging.getLogger("agent_runtime.tools.replay")


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
    jobs: int = 1  # jobs one after the other in the trace, each replayed by itself
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def replay_records(
    records: Iterable[tuple[int, TraceRecord]],
    *,
    path: str = "<trace>",
    machines: Mapping[str, MachineSpec] = MACHINES,
) -> ReplayReport:
    """Replay decision records; the report holds the first divergence, if any."""
    report = ReplayReport(path=path)
    states: dict[tuple[str, str], str] = {}
    jobs = JobBounds()
    for n, rec in records:
        report.records += 1
        job = jobs.next_job(rec)
        if job is not None:
            if not job.after_end:
                raise AnotherJob(f"{path}:{n}: {job.describe()}", after_end=False)
            report.jobs += 1
            states = {}  # the next job's machines start from their initial states
        if rec.kind not in DECISIONS:
            continue  # effect outcomes, stale timers and inputs are context, not decisions
        if not rec.event:  # the reader needs none; replay re-decides the event
            raise TraceError(f"{path}:{n}: a {rec.kind} record needs a non-empty 'event'")
        spec = machines.get(rec.machine)
        if spec is None:
            raise unknown_machine(f"{path}:{n}", rec.machine, machines)
        unknown = [g for g in rec.guards if g not in spec.guards]
        if unknown:
            raise TraceError(f"{path}:{n}: machine {rec.machine!r} has no guard {unknown[0]!r}")
        key = (rec.machine, rec.instance)
        current = states.get(key)
        if current is None or another_actor(spec, current, rec):
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
    if report.decisions == 0:
        # nothing was compared: that is no evidence that the machines agree
        if report.records == 0:
            raise TraceError(f"{path}: nothing to replay: the trace is empty")
        raise TraceError(
            f"{path}: nothing to replay: {report.records} record"
            f"{'' if report.records == 1 else 's'}, none of them a decision "
            f"({', '.join(DECISIONS)})"
        )
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

    st = reference_step(spec, current, rec.event, check)
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
    path: str | Path,
    *,
    machines: Mapping[str, MachineSpec] = MACHINES,
    warn: Callable[[str], None] | None = None,
) -> ReplayReport:
    """Load and replay a JSONL trace; raises ``TraceError`` for a file that cannot be replayed.
    ``warn`` is told of a last line cut while it was written (``load_trace``)."""
    return replay_records(
        # an event the spec does not declare is a divergence, judged below
        load_trace(path, warn=warn, machines=machines, several_jobs=True, any_event=True),
        path=str(path),
        machines=machines,
    )


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
        jobs = f" in {report.jobs} jobs, each from the initial states" if report.jobs > 1 else ""
        return (
            f"{report.path}: {report.decisions} decisions replayed ({counts}) "
            f"from {report.records} records{jobs}; instances: {machines}.\n"
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
