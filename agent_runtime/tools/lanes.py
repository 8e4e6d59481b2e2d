"""A trace read as lanes: one per machine instance, the states it was in (from when, until
when, entered by which event), and the marks on it (effects, rejects). What ``watch`` and
``timeline`` show; built one record at a time, so a trace that grows is followed as it grows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from statemachines import MachineSpec
from statemachines.machines import MACHINES


@dataclass(slots=True)
class Segment:
    state: str
    start: float
    end: float | None = None  # None: the lane is still in it
    entered_by: str = ""  # the event of the transition into it ("" for the first)


@dataclass(slots=True)
class Mark:
    t: float
    kind: str  # effect | reject | ignore
    name: str  # the effect, or the event rejected/ignored
    outcome: str = ""  # effect: ok | error | timeout | cancelled
    detail: str = ""


@dataclass(slots=True)
class Lane:
    machine: str
    instance: str
    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    transitions: int = 0

    @property
    def state(self) -> str:
        return self.segments[-1].state if self.segments else ""

    @property
    def since(self) -> float | None:
        return self.segments[-1].start if self.segments else None


@dataclass(slots=True)
class Entry:
    """A line of the recent-history list: a transition, a reject, a failed effect, an input."""

    t: float
    machine: str
    instance: str
    text: str
    level: str = "info"  # info | warn


class Lanes:
    """Lanes built from records as they come."""

    def __init__(self, machines: Mapping[str, MachineSpec] = MACHINES) -> None:
        self.machines = machines
        self._lanes: dict[tuple[str, str], Lane] = {}
        self.inputs: list[TraceRecord] = []
        self.history: list[Entry] = []
        self.records = 0
        self.t0: float | None = None
        self.t1: float | None = None

    def add(self, rec: TraceRecord) -> None:
        self.records += 1
        self.t0 = rec.t if self.t0 is None else min(self.t0, rec.t)
        self.t1 = rec.t if self.t1 is None else max(self.t1, rec.t)
        if rec.kind == "input":
            self.inputs.append(rec)
            self.history.append(Entry(rec.t, rec.machine, rec.instance, f"input {rec.event}"))
            return
        if not rec.machine:
            return
        lane = self._lane(rec)
        if rec.kind == "transition":
            lane.transitions += 1
            if rec.dest != rec.source:
                lane.segments[-1].end = rec.t
                lane.segments.append(Segment(rec.dest, rec.t, None, rec.event))
            # one back into its own state too (a session attached in place of another):
            # a decision with its effects, only no new segment
            self.history.append(
                Entry(
                    rec.t, rec.machine, rec.instance, f"{rec.source} -> {rec.dest}  on {rec.event}"
                )
            )
        elif rec.kind in ("reject", "ignore"):
            lane.marks.append(Mark(rec.t, rec.kind, rec.event))
            if rec.kind == "reject":
                self.history.append(
                    Entry(
                        rec.t,
                        rec.machine,
                        rec.instance,
                        f"rejected {rec.event} in {rec.source}",
                        "warn",
                    )
                )
        elif rec.kind == "effect":
            lane.marks.append(Mark(rec.t, "effect", rec.effect, rec.outcome, rec.detail))
            if rec.outcome not in ("ok", "cancelled", ""):
                text = f"effect {rec.effect} {rec.outcome}"
                if rec.detail:
                    text += f": {rec.detail}"
                self.history.append(Entry(rec.t, rec.machine, rec.instance, text, "warn"))

    def extend(self, records: Iterable[TraceRecord]) -> Lanes:
        for rec in records:
            self.add(rec)
        return self

    def _lane(self, rec: TraceRecord) -> Lane:
        key = (rec.machine, rec.instance)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(rec.machine, rec.instance)
            # the state before the first record: what a decision says it left, else the
            # spec's initial state (a trace of another build may name a machine we lack)
            spec = self.machines.get(rec.machine)
            first = rec.source or (spec.initial if spec is not None else "?")
            lane.segments.append(Segment(first, rec.t if self.t0 is None else self.t0))
        return lane

    def lanes(self) -> list[Lane]:
        """In ``MACHINES`` order, then in order of first appearance."""
        order = {name: i for i, name in enumerate(self.machines)}
        first = {key: i for i, key in enumerate(self._lanes)}
        return sorted(
            self._lanes.values(),
            key=lambda ln: (order.get(ln.machine, len(order)), first[(ln.machine, ln.instance)]),
        )

    def find(self, machine: str, instance: str) -> Lane | None:
        return self._lanes.get((machine, instance))

    def label(self, lane: Lane) -> str:
        """The machine's name, with the instance when the trace has several of that machine."""
        same = sum(1 for ln in self._lanes.values() if ln.machine == lane.machine)
        return f"{lane.machine}[{lane.instance}]" if same > 1 else lane.machine

    def timeout_of(self, lane: Lane) -> str:
        """The timeout armed in the lane's state, by name, when the spec declares one."""
        spec = self.machines.get(lane.machine)
        if spec is None or lane.state not in spec.state_names:
            return ""
        st = spec.state(lane.state)
        return st.timeout.event if st.timeout is not None else ""


def summarise(value: Any, limit: int = 80) -> str:
    """A short one-line text of an input's data, for a tooltip or a terminal line."""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."
