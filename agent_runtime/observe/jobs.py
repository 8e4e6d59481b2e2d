"""Where one job's records end and another job's begin, in a trace read in order.

A job has one ``agent_job`` machine and one ``job`` machine. A decision of either by
another actor than the one its job had (another instance, or one started again from its
initial state after its final one) is the first record of another job. When the job
before it had ended (each of those machines in a final state), the trace is jobs one after
the other: each can be read by itself. Else two jobs ran at once into one tracer, and no
reader can tell whose record is whose (instance names such as an avatar's identity are
the same in every job).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runtime.observe.trace import DECISIONS, TraceRecord

if TYPE_CHECKING:
    from statemachines import MachineSpec

JOB_MACHINES = ("agent_job", "job")  # the machines a job has exactly one of
ADVICE = 'write each job to its own file (trace_path="traces/{job_id}.jsonl")'


def another_actor(spec: MachineSpec, current: str | None, rec: TraceRecord) -> bool:
    """Whether the decision ``rec`` is the first of another actor of ``spec`` than the one
    last seen under its instance name (in state ``current``; None: none was): a final
    state is never left, so a record from the initial state after one is a new actor that
    reuses the name (a second session in the same job)."""
    if current is None:
        return True
    final = current in spec.state_names and spec.state(current).final
    return final and rec.source == spec.initial and current != rec.source


@dataclass(frozen=True, slots=True)
class NextJob:
    """The first record of another job, and whether the job before it had ended."""

    record: TraceRecord
    after_end: bool

    def describe(self) -> str:
        r = self.record
        where = f"(t = {r.t!r}, in {r.instance!r})"
        if self.after_end:
            what = (
                f"the {r.machine} machine starts again here {where} after the job before it ended"
            )
        else:
            what = (
                f"another {r.machine} machine starts here {where} while the job before it is "
                "still running, and the records of jobs at once cannot be told apart"
            )
        return f"the trace holds more than one job: {what}; {ADVICE}"


class JobBounds:
    """Fed a trace's records in order, says which one starts another job (``next_job``)."""

    def __init__(self) -> None:
        from statemachines.machines import MACHINES  # only reading a trace needs them

        self._specs = {m: MACHINES[m] for m in JOB_MACHINES}
        self._actors: dict[str, tuple[str, str]] = {}  # machine -> (instance, state), this job

    def next_job(self, rec: TraceRecord) -> NextJob | None:
        """The ``NextJob`` ``rec`` starts, if it starts one (from it on, the records are that
        job's); else None, and ``rec`` is the current job's."""
        spec = self._specs.get(rec.machine)
        if spec is None or rec.kind not in DECISIONS:
            return None
        seen = self._actors.get(rec.machine)
        new = seen is None or seen[0] != rec.instance or another_actor(spec, seen[1], rec)
        if seen is None or not new:
            self._actors[rec.machine] = (rec.instance, rec.dest)
            return None
        ended = all(
            s in self._specs[m].state_names and self._specs[m].state(s).final
            for m, (_, s) in self._actors.items()
        )
        self._actors = {rec.machine: (rec.instance, rec.dest)}
        return NextJob(rec, after_end=ended)


def first_next_job(records: Iterable[TraceRecord]) -> NextJob | None:
    """The first record of a second job in ``records``, if any."""
    bounds = JobBounds()
    for rec in records:
        found = bounds.next_job(rec)
        if found is not None:
            return found
    return None
