"""The trace: every event an actor handles (with the guard values it consulted, so the
decision can be replayed offline), every transition and every effect outcome."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Literal, Protocol, get_args

from agent_runtime.observe import files

logger = logging.getLogger("agent_runtime.trace")


def describe(error: BaseException) -> str:
    """How an error reads in the trace and the logs: ``Type: message``, or the type alone
    when the message is empty (a bare ``CancelledError()``)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


RecordKind = Literal["transition", "ignore", "reject", "effect", "stale", "input"]


@dataclass(slots=True)
class TraceRecord:
    t: float
    kind: RecordKind
    machine: str
    instance: str
    event: str = ""
    source: str = ""
    dest: str = ""
    effects: list[str] = field(default_factory=list)
    guards: dict[str, bool] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    effect: str = ""
    outcome: str = ""  # effect: ok | error | timeout | cancelled
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", [], {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TraceRecord:
        return cls(**d)


_FIELDS = tuple(f.name for f in fields(TraceRecord))


class TraceSink(Protocol):
    def write(self, record: TraceRecord) -> None: ...


# what one record keeps of a payload (its ``data`` and ``detail``): a trace is for reading
# what happened, and a peer's 50 MB reason or a deeply nested payload must not become a
# 50 MB line, a recursion in the encoder or a held copy
MAX_TEXT = 1000  # characters kept of one string (or bytes of one bytes value)
MAX_ITEMS = 100  # entries kept of one list or mapping
MAX_DEPTH = 6  # levels of nesting kept
MAX_PAYLOAD = 4000  # characters kept in all of one record's payload, roughly its JSON size


def bound_record(record: TraceRecord) -> TraceRecord:
    """Cut ``record``'s payload to the bounds above, in place; small payloads are untouched."""
    budget = [MAX_PAYLOAD]
    if record.detail:  # first: it is the error of an effect, the part most worth keeping
        record.detail = _bound(record.detail, budget, 0)
    if record.data:
        record.data = _bound(record.data, budget, 0)
    return record


def _cut(text: str, keep: int) -> str:
    return f"{text[:keep]}...[{len(text) - keep:,} more characters]"


def _bound(value: Any, budget: list[int], depth: int) -> Any:
    # exact types first: this runs on every record, and most payloads are a few short strings
    t = type(value)
    if t is str:
        keep = max(0, min(MAX_TEXT, budget[0]))
        budget[0] -= len(value) + 2 if len(value) <= keep else keep + 2
        return value if len(value) <= keep else _cut(value, keep)
    if t is bool or t is float or value is None:
        budget[0] -= 5
        return value
    if t is int:
        budget[0] -= 5
        # json cannot even write an int past 4,300 digits; keep its size, not its digits
        return value if value.bit_length() <= 64 else f"<an integer of {value.bit_length()} bits>"
    if t is dict or t is list or t is tuple or isinstance(value, Mapping | list | tuple):
        if not value:
            return value
        if depth >= MAX_DEPTH or budget[0] <= 0:
            budget[0] -= 5
            return f"<{t.__name__} of {len(value)} items, not kept>"
        if t is dict or isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for n, (k, v) in enumerate(value.items()):
                if n >= MAX_ITEMS or budget[0] <= 0:
                    out["..."] = f"[{len(value) - n:,} more items]"
                    break
                if type(k) is not str:
                    k = k if isinstance(k, int | float | bool) else repr(k)
                if type(k) is str and len(k) < 64:  # inline: the common case, kept whole
                    budget[0] -= len(k) + 2
                else:
                    k = _bound(k, budget, depth)
                if type(v) is str and len(v) < 64:
                    budget[0] -= len(v) + 2
                    out[k] = v
                else:
                    out[k] = _bound(v, budget, depth + 1)
            return out
        items: list[Any] = []
        for n, v in enumerate(value):
            if n >= MAX_ITEMS or budget[0] <= 0:
                items.append(f"...[{len(value) - n:,} more items]")
                break
            items.append(_bound(v, budget, depth + 1))
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, str):  # a str subclass (a str enum): kept as it is while short
        if len(value) <= min(MAX_TEXT, budget[0]):
            budget[0] -= len(value) + 2
            return value
        return _bound(str.__str__(value), budget, depth)
    if isinstance(value, bytes | bytearray):
        text = _bound(bytes(value[:MAX_TEXT]).decode("utf-8", "replace"), budget, depth)
        return text + (
            f"...[{len(value) - MAX_TEXT:,} more bytes]" if len(value) > MAX_TEXT else ""
        )
    if isinstance(value, int | float):  # an int or float subclass (an IntEnum, ...)
        if isinstance(value, float) or value.bit_length() <= 64:
            budget[0] -= 5
            return value
        return _bound(int(value), budget, depth)
    # any other object: kept by reference (no copy); JsonlSink writes a bounded repr of it
    budget[0] -= 20
    return value


class MemorySink:
    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def write(self, record: TraceRecord) -> None:
        self.records.append(record)


class JsonlSink:
    """One JSON object a line; flushed per record so a crash keeps what led to it.

    A write that fails (a full disk) disables the sink: the file keeps the records before
    it, ``failed`` says why, and the error goes to the tracer, which logs it once.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.failed: str | None = None
        self.written = 0
        # non-blocking open: a FIFO with no reader is an error at once (ENXIO), not a
        # hang; then blocking writes as for any file
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NONBLOCK", 0), 0o666
        )
        try:
            os.set_blocking(fd, True)
            self._fh: IO[str] | None = open(fd, "w", encoding="utf-8")  # noqa: SIM115
        except BaseException:
            os.close(fd)
            raise

    def __repr__(self) -> str:
        return f"JsonlSink({self.path!r})"

    def write(self, record: TraceRecord) -> None:
        if self._fh is None:
            return
        try:
            line = json.dumps(record.to_dict(), default=_short_repr, sort_keys=True)
            self._fh.write(line + "\n")
            self._fh.flush()
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            self.close()
            raise
        self.written += 1

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            # what a failed write left in the buffer cannot be written either
            with contextlib.suppress(OSError):
                fh.close()


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:
        return f"<{type(value).__name__}: repr failed: {e}>"
    return text if len(text) <= MAX_TEXT else _cut(text, MAX_TEXT)


class LoggingSink:
    """Structured log records: transitions at debug, rejects at info, failed effects at warning."""

    def write(self, record: TraceRecord) -> None:
        if record.kind == "reject":
            level = logging.INFO
        elif record.kind == "effect" and record.outcome not in ("ok", "cancelled"):
            level = logging.WARNING
        else:
            level = logging.DEBUG
        if logger.isEnabledFor(level):
            logger.log(level, "%s %s", record.machine, record.kind, extra=record.to_dict())


class Tracer:
    """Fans records out to sinks, each record's payload bounded first. An actor without a
    tracer records nothing.

    Tracing is observation: a sink that raises, in ``write`` or in ``active`` and whatever
    it raises (a ``CancelledError`` too; a Ctrl-C goes up), is logged once and disabled
    (its name and error stay in ``failures``); the other sinks and the machines go on as if
    it were not there. Disabled, not retried: a trace is read in order (replay feeds its
    decisions one after the other), so a file that stops at its last good record is
    evidence, and one with holes where writes failed would not be.
    """

    def __init__(self, *sinks: TraceSink) -> None:
        self.sinks: list[TraceSink] = list(sinks)
        self.failures: list[str] = []
        # the job's log fields (job_id, room), set by whoever composes the job
        self.labels: Mapping[str, str] = {}

    @property
    def active(self) -> bool:
        """Whether a record written now would be kept by a sink. A sink may say it would
        not (``active`` false: an OpenTelemetry sink with nothing recording); actors then
        build no record at all."""
        for s in self.sinks:
            try:
                if getattr(s, "active", True):
                    return True
            except (Exception, asyncio.CancelledError) as e:
                self._disable(s, e, "active")
        return False

    def write(self, record: TraceRecord) -> None:
        bound_record(record)
        for s in self.sinks:
            try:
                s.write(record)
            except (Exception, asyncio.CancelledError) as e:
                self._disable(s, e, "write")

    def _disable(self, sink: TraceSink, error: BaseException, where: str) -> None:
        # a copy without it: a loop walking the old list goes on unchanged
        self.sinks = [s for s in self.sinks if s is not sink]
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self.failures.append(f"{sink!r}: {text}")
        # WARNING: a trace is lost from here on (the log policy)
        job, room = self.labels.get("job_id", ""), self.labels.get("room", "")
        logger.warning(
            "%strace sink %r failed in %s (%s); it is disabled, the machines go on without it",
            f"job {job} (room {room}): " if job else f"room {room}: " if room else "",
            sink,
            where,
            text,
            exc_info=error if not isinstance(error, Exception) else None,
            extra={"job_id": job, "room": room, "sink": repr(sink)},
        )


# -- reading a trace back ------------------------------------------------------------------------

DECISIONS = ("transition", "ignore", "reject")
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
        shown = f"an integer of {len(str(abs(t)))} digits" if type(t) is int else repr(t)
        return f"field 't' must be a number of seconds, not {shown}"
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
    record (but a scenario's ``input``) is of one of ``machines``, by default the runtime's:
    of another, it is no machine this build can replay or draw (a typo, another version)."""

    def __init__(
        self, machines: Collection[str] | None = None, *, several_jobs: bool = False
    ) -> None:
        if machines is None:
            from statemachines.machines import MACHINES  # only reading a trace needs them

            machines = MACHINES
        from agent_runtime.observe.jobs import JobBounds

        self.machines = machines
        self.several_jobs = several_jobs
        self._jobs = JobBounds()
        self._last: tuple[float, int] | None = None  # the last time taken, and its line

    def check(self, rec: TraceRecord, path: str, line: int, *, terse: bool = False) -> None:
        """``TraceError`` naming ``path:line`` when ``rec`` breaks a rule; else its time is
        the one the next record must not go back from. ``terse``: no list of machines."""
        where = f"{path}:{line}"
        if rec.kind != "input" and rec.machine not in self.machines:
            if terse:
                raise TraceError(f"{where}: unknown machine {rec.machine!r}")
            raise unknown_machine(where, rec.machine, self.machines)
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


def load_trace(
    path: str | Path,
    *,
    wording: Wording = "fields",
    warn: Callable[[str], None] | None = None,
    machines: Collection[str] | None = None,
    several_jobs: bool = False,
) -> list[tuple[int, TraceRecord]]:
    """(line number, record) for every non-blank line of a JSONL trace; ``TraceError`` when
    the file is none (not a regular file, too large, not UTF-8) or names the bad line, or
    the first record that breaks ``TraceOrder``'s rules (``machines``: those it knows; a
    second job is one, unless ``several_jobs`` and the first had ended before it).

    A last line with no newline at its end that is not a record (not UTF-8, not JSON) is the
    line a job was writing when the file was read or cut (a crash, a full disk, a copy of a
    running job's trace): it is left out, and ``warn`` (by default a warning logged on
    ``agent_runtime.trace``) is told in one line. A bad line anywhere else is an error.
    """
    p = str(path)
    try:
        data = files.read_input(path, limit=files.MAX_TRACE_BYTES, what="a trace file")
    except files.InputFileError as e:
        raise TraceError(f"{p}: cannot read the trace: {e}") from None
    out: list[tuple[int, TraceRecord]] = []
    order = TraceOrder(machines, several_jobs=several_jobs)
    # line by line from the bytes: no second copy of the whole file as text
    for n, raw in enumerate(io.BytesIO(data), 1):
        try:
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            rec = parse_record(line, f"{p}:{n}", wording=wording)
        except (UnicodeDecodeError, TraceError) as e:
            if not raw.endswith(b"\n") and _unfinished(raw):
                message = (
                    f"{p}:{n}: the last line is incomplete (a trace still being written, "
                    f"or cut); " + (f"read up to line {n - 1}" if n > 1 else "nothing before it")
                )
                (warn or logger.warning)(message)
                break
            if isinstance(e, UnicodeDecodeError):
                raise TraceError(f"{p}: not a UTF-8 text file ({e.reason})") from None
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
    is not a record, or one whose time goes back, whose machine is not the runtime's or
    that starts a second job (``TraceOrder``) raises ``ValueError`` (a ``TraceError``)
    naming the file and line. A
    last line cut while it was written is left out with a warning logged."""
    return [rec for _, rec in load_trace(path, wording="record")]
