"""Reading a trace back: one reader (``load_trace``) that every tool and ``read_trace``
use, each record checked alone (``parse_record``) and beside those before it
(``TraceOrder``: time never goes back, one job's machines, a second job found)."""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from agent_runtime.observe import files
from agent_runtime.observe.jobs import JobBounds
from agent_runtime.observe.trace import DECISIONS, RecordKind, TraceRecord

if TYPE_CHECKING:
    from statemachines import MachineSpec

logger = logging.getLogger("agent_runtime.trace")  # the trace's, as its writers'

_FIELDS = tuple(f.name for f in fields(TraceRecord))

_REQUIRED = ("t", "kind", "machine", "instance")
_TEXT_FIELDS = ("machine", "instance", "event", "source", "dest", "effect", "outcome", "detail")
_LONG_INT = "a number of more than 4300 digits"  # json's only other ValueError

# How a bad line is said. One reader, one check; the words differ by who reads them:
#   "fields"  (replay, record, timeline): the field and pydantic's reason, for a file checked
#   "terse"   (watch): one short line per skipped line of a trace being followed
#   "record"  (read_trace, the library's API): "not a trace record (why)"
Wording = Literal["fields", "terse", "record"]


class TraceError(ValueError):
    """A trace, or a line of it, that cannot be read; the message names the file (and line)."""


def parse_record(line: str, where: str, *, wording: Wording = "fields") -> TraceRecord:
    """One JSONL line as a record; ``TraceError`` naming ``where`` when it is not one.

    Strict: every field of its type, ``t`` finite seconds, no unknown field, and a decision
    (transition, ignore, reject) names its machine and the states it left and entered.
    """
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as e:
        # where in the line: the line itself is named by ``where``
        # (json's "Unterminated string starting at" ends with its own "at")
        why = f"{e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.colno}"
        raise _fault(where, wording, f"not JSON ({why})", inner=why) from None
    except ValueError:  # past Python's int-to-string limit
        raise _fault(where, wording, f"not JSON ({_LONG_INT})", inner=_LONG_INT) from None
    except RecursionError:
        raise _fault(
            where, wording, "not JSON (nested too deep)", inner="nested too deep"
        ) from None
    if not isinstance(raw, dict):
        raise _fault(where, wording, f"a record is a JSON object, not {type(raw).__name__}")
    from pydantic import ValidationError  # only reading a trace needs pydantic

    from agent_runtime.observe._trace_model import RecordModel

    try:
        model = RecordModel.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":  # most likely a trace of another version
            msg = "not a field of this version's records (a trace of another version?)"
        raise _fault(where, wording, f"field {loc!r}: {msg}", terse=_terse(raw)) from None
    rec = TraceRecord(**model.model_dump())
    empty = [f"{n!r}" for n in ("machine", "source", "dest") if not getattr(rec, n)]
    if rec.kind in DECISIONS and empty:
        raise _fault(
            where,
            wording,
            f"a {rec.kind} record needs a non-empty {empty[0]}",
            terse=f"a {rec.kind} record needs {' and '.join(empty)}",
        )
    return rec


def _fault(
    where: str, wording: Wording, text: str, *, terse: str | None = None, inner: str | None = None
) -> TraceError:
    """The error for a bad line in ``wording``'s words: ``terse`` is watch's phrase where it
    has one, ``inner`` the bare reason ``record`` puts in parentheses."""
    if wording == "terse" and terse is not None:
        text = terse
    elif wording == "record":
        text = f"not a trace record ({inner or text})"
    return TraceError(f"{where}: {text}")


def _terse(raw: dict[str, Any]) -> str | None:
    """Watch's words for a record pydantic refused, when it has them (else the field's)."""
    missing = [f"{k!r}" for k in _REQUIRED if k not in raw]
    if missing:
        return f"not a trace record: no {', '.join(missing)}"
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        return f"not a trace record: unknown field {unknown[0]!r}"
    if raw["kind"] not in get_args(RecordKind):
        return f"unknown record kind {raw['kind']!r}"
    t = raw["t"]
    if not _seconds(t):
        digits = len(str(abs(t))) if type(t) is int else 0
        # one too long to print is told by its size (and sign), any other as it is written
        shown = (
            f"{'a negative' if t < 0 else 'an'} integer of {digits} digits"
            if digits > 20
            else repr(t)
        )
        return f"field 't' must be a number of seconds, 0 or more, not {shown}"
    bad = [n for n in _TEXT_FIELDS if n in raw and not isinstance(raw[n], str)]
    return f"field {bad[0]!r} must be a string" if bad else None


def _seconds(t: Any) -> bool:
    """Whether ``t`` is a time a trace can hold: a finite number, 0 or more, that is a float
    (an integer of 400 digits is not: it overflowed the readers that took it)."""
    if not isinstance(t, int | float) or isinstance(t, bool):
        return False
    try:
        return math.isfinite(float(t)) and t >= 0
    except OverflowError:
        return False


def unknown_machine(where: str, machine: str, machines: Collection[str]) -> TraceError:
    """The one error for a record of a machine not in ``machines`` (the reader's, replay's)."""
    return TraceError(f"{where}: unknown machine {machine!r}; machines: {', '.join(machines)}")


class TimeGoesBack(TraceError):
    """A record whose time is before that of the record before it."""


class AnotherJob(TraceError):
    """The first record of a second job in the trace (``agent_runtime.observe.jobs``)."""

    def __init__(self, message: str, *, after_end: bool) -> None:
        super().__init__(message)
        self.after_end = after_end  # the job before it had ended: the jobs can be split


class TraceOrder:
    """The rules a record meets beside those before it, in the file's order (``load_trace``;
    ``watch`` as a trace grows). A trace is one job's records, written in time order from
    its one clock: a time that goes back is two traces joined, or an edited one, and a
    second job's records (``AnotherJob``) are another trace's too; ``several_jobs``: jobs
    one after the other are taken (replay reads each by itself), jobs at once never. A
    record (but a scenario's ``input``) is of one of ``machines``, by default the runtime's,
    and names an event, states and effects its machine declares: of another machine, or
    naming another, it is nothing this build can rebuild or draw (a typo, an edit, another
    version). ``any_event``: a decision's event, states and effects the machine does not
    declare are taken (replay judges them itself, as a divergence)."""

    def __init__(
        self,
        machines: Mapping[str, MachineSpec] | None = None,
        *,
        several_jobs: bool = False,
        any_event: bool = False,
    ) -> None:
        if machines is None:
            from statemachines.machines import MACHINES  # only reading a trace needs them

            machines = MACHINES
        self.machines = machines
        self.several_jobs = several_jobs
        self.any_event = any_event
        self._jobs = JobBounds()
        self._last: tuple[float, int] | None = None  # the last time taken, and its line
        # each machine's declared events, states and effects, as first needed
        self._declared: dict[str, tuple[frozenset[str], ...]] = {}

    def check(self, rec: TraceRecord, path: str, line: int, *, terse: bool = False) -> None:
        """``TraceError`` naming ``path:line`` when ``rec`` breaks a rule; else its time is
        the one the next record must not go back from. ``terse``: no list of machines."""
        where = f"{path}:{line}"
        if rec.kind != "input" and rec.machine not in self.machines:
            if terse:
                raise TraceError(f"{where}: unknown machine {rec.machine!r}")
            raise unknown_machine(where, rec.machine, self.machines)
        why = self._undeclared(rec) if rec.kind != "input" else None
        if why is not None:
            raise TraceError(
                f"{where}: machine {rec.machine!r} {why}"
                + ("" if terse else " (an edited trace, or another version's?)")
            )
        if self._last is not None and rec.t < self._last[0]:
            t, n = self._last
            raise TimeGoesBack(
                f"{where}: time goes backwards ({rec.t!r} after {t!r} on line {n}): not one "
                "clock's trace (two joined, an edited one, or runtimes with clocks of their "
                "own writing to one tracer?)"
            )
        job = self._jobs.next_job(rec)
        if job is not None and not (self.several_jobs and job.after_end):
            raise AnotherJob(f"{where}: {job.describe()}", after_end=job.after_end)
        self._last = (rec.t, line)

    def _undeclared(self, rec: TraceRecord) -> str | None:
        """What ``rec`` names that its machine does not declare (an event, a state, an
        effect), in words; None when it names none. ``any_event``: only an effect record's
        effect is checked (replay judges a decision's event, states and effects itself)."""
        declared = self._declared.get(rec.machine)
        if declared is None:
            spec = self.machines[rec.machine]
            declared = self._declared[rec.machine] = (
                frozenset(spec.events),
                frozenset(spec.state_names),
                frozenset(e.name for e in spec.effects),
            )
        events, states, effects = declared
        if self.any_event:
            named = [rec.effect] if rec.kind == "effect" and rec.effect else []
            return next((f"declares no effect {e!r}" for e in named if e not in effects), None)
        if rec.event and rec.event not in events:
            return f"declares no event {rec.event!r}"
        state = next((s for s in (rec.source, rec.dest) if s and s not in states), None)
        if state is not None:
            return f"has no state {state!r}"
        named = [*rec.effects, rec.effect] if rec.effect else rec.effects
        return next((f"declares no effect {e!r}" for e in named if e not in effects), None)


def load_trace(
    path: str | Path,
    *,
    wording: Wording = "fields",
    warn: Callable[[str], None] | None = None,
    machines: Mapping[str, MachineSpec] | None = None,
    several_jobs: bool = False,
    any_event: bool = False,
) -> list[tuple[int, TraceRecord]]:
    """(line number, record) for every non-blank line of a JSONL trace; ``TraceError`` when
    the file is none (not a regular file, too large, not UTF-8) or names the bad line, or
    the first record that breaks ``TraceOrder``'s rules (``machines``: those it knows, and
    their events and states unless ``any_event``; a second job is one, unless
    ``several_jobs`` and the first had ended before it).

    A last line with no newline at its end that is not a record (not UTF-8, not JSON) is the
    line a job was writing when the file was read or cut (a crash, a full disk, a copy of a
    running job's trace): it is left out, and ``warn`` (by default a warning logged on
    ``agent_runtime.trace``) is told in one line; with no record before it, it is the
    error. A bad line anywhere else is an error.
    """
    p = str(path)
    try:
        data = files.read_input(path, limit=files.MAX_TRACE_BYTES, what="a trace file")
    except files.InputFileError as e:
        raise TraceError(f"{p}: cannot read the trace: {e}") from None
    out: list[tuple[int, TraceRecord]] = []
    order = TraceOrder(machines, several_jobs=several_jobs, any_event=any_event)
    # line by line from the bytes: no second copy of the whole file as text
    for n, raw in enumerate(io.BytesIO(data), 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            rec = parse_record(line, f"{p}:{n}", wording=wording)
        except (UnicodeDecodeError, TraceError) as e:
            if not raw.endswith(b"\n") and _unfinished(raw):
                cut = f"{p}:{n}: the last line is incomplete (a trace still being written, or cut)"
                if not out:  # no record to go on with: one error, not a warning then "empty"
                    raise TraceError(f"{cut}; no whole record before it") from None
                (warn or logger.warning)(f"{cut}; read up to line {out[-1][0]}")
                break
            if isinstance(e, UnicodeDecodeError):
                raise TraceError(f"{p}:{n}: not a UTF-8 text file ({e.reason})") from None
            raise
        order.check(rec, p, n)
        out.append((n, rec))
    return out


def _unfinished(raw: bytes) -> bool:
    """Whether a line is not a whole JSON value: cut while it was written."""
    try:
        json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:  # a character cut short, or bytes that are no text
        return e.reason == "unexpected end of data"
    except json.JSONDecodeError:  # a value cut short
        return True
    except (ValueError, RecursionError):  # a whole value, too long or too deep: a bad line
        return False
    return False


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Read a JSONL trace; a file that is none (not a regular file, too large), a line that
    is not a record, or one whose time goes back, whose machine is not the runtime's (or
    event or state not its machine's) or that starts a second job (``TraceOrder``) raises
    ``ValueError`` (a ``TraceError``) naming the file and line. A last line cut while it
    was written is left out with a warning logged (with no whole record before it, it is the
    error)."""
    return [rec for _, rec in load_trace(path, wording="record")]
