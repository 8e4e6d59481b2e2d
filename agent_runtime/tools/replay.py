"""Offline replay of a JSONL trace through the ``transitions`` machines compiled from the specs.

Every decision record (``transition``, ``ignore``, ``reject``) carries the guard values the
actor consulted. Replay starts each (machine, instance) in its spec's initial state, feeds
the recorded events through the compiled machine (``statemachines.compiled.reference_step``)
with those guard values, and stops at the first record where the recording and the spec
disagree: a different source state, outcome, destination or effects, or a guard the spec
needs that the recording never consulted. The actor decides with ``statemachines.step``;
replay re-decides with a second implementation, so a fault in either shows.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_runtime.observe import files
from agent_runtime.observe.trace import TraceRecord
from statemachines import MachineSpec
from statemachines.compiled import reference_step
from statemachines.machines import MACHINES

logger = logging.getLogger("agent_runtime.tools.replay")

DECISIONS = ("transition", "ignore", "reject")


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


class _Record(BaseModel):
    """What a trace line must be (``TraceRecord``, as ``JsonlSink`` writes it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    t: float = Field(ge=0, allow_inf_nan=False)  # seconds since the clock's start
    kind: Literal["transition", "ignore", "reject", "effect", "stale", "input"]
    machine: str
    instance: str
    event: str = ""
    source: str = ""
    dest: str = ""
    effects: list[str] = Field(default_factory=list)
    guards: dict[str, bool] = Field(default_factory=dict)
    data: dict[str, Any] = Field(default_factory=dict)
    effect: str = ""
    outcome: str = ""
    detail: str = ""


def _record(path: str, n: int, raw: Any) -> TraceRecord:
    def bad(msg: str) -> TraceError:
        return TraceError(f"{path}:{n}: {msg}")

    if not isinstance(raw, dict):
        raise bad(f"a record is a JSON object, not {type(raw).__name__}")
    try:
        rec = _Record.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise bad(f"field {where!r}: {err['msg']}") from None
    if rec.kind in DECISIONS:
        for name in ("machine", "event", "source", "dest"):
            if not getattr(rec, name):
                raise bad(f"a {rec.kind} record needs a non-empty {name!r}")
    return TraceRecord(**rec.model_dump())


def _json_line(path: str, n: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{n}: not JSON ({e.msg})") from None
    except ValueError:  # past Python's int-to-string limit
        raise TraceError(f"{path}:{n}: not JSON (a number of more than 4300 digits)") from None
    except RecursionError:
        raise TraceError(f"{path}:{n}: not JSON (nested too deep)") from None


def load_trace(path: str | Path) -> list[tuple[int, TraceRecord]]:
    """(line number, record) for every non-blank line; ``TraceError`` names a bad line."""
    p = str(path)
    try:
        data = files.read_input(path, limit=files.MAX_TRACE_BYTES, what="a trace file")
    except files.InputFileError as e:
        raise TraceError(f"{p}: cannot read the trace: {e}") from None
    out: list[tuple[int, TraceRecord]] = []
    # line by line from the bytes: no second copy of the whole file as text
    for n, raw in enumerate(io.BytesIO(data), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{p}: not a UTF-8 text file ({e.reason})") from None
        if line.strip():
            out.append((n, _record(p, n, _json_line(p, n, line))))
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
        unknown = [g for g in rec.guards if g not in spec.guards]
        if unknown:
            raise TraceError(f"{path}:{n}: machine {rec.machine!r} has no guard {unknown[0]!r}")
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
