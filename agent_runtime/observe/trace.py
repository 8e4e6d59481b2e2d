"""The trace: every event an actor handles (with the guard values it consulted, so the
decision can be replayed offline), every transition and every effect outcome."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from agent_runtime.observe.trace_writer import GaveUp, LineWriter

if sys.platform != "win32":  # no advisory locks there: a trace file is truncated as opened
    import fcntl

logger = logging.getLogger("agent_runtime.trace")


def describe(error: BaseException) -> str:
    """How an error reads in the trace and the logs: ``Type: message``, or the type alone
    when the message is empty (a bare ``CancelledError()``)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


RecordKind = Literal["transition", "ignore", "reject", "effect", "stale", "input"]
DECISIONS = ("transition", "ignore", "reject")  # the kinds that are a machine's decision


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


class TraceFileBusy(OSError):
    """The trace file is being written by another ``JsonlSink`` (another job's, say)."""


class TraceFileStalled(OSError):
    """The trace file takes no more records: its reader stopped reading (a FIFO), or its
    disk stalled (a network mount that does not answer)."""


# a test may lower them
MAX_QUEUED = 4 * 1024 * 1024  # bytes of records that may wait for the file: minutes of a job
CLOSE_WAIT = 1.0  # real seconds close() waits for them to be written, then gives up


class JsonlSink:
    """One JSON object a line, in order, written by a thread of the sink's own: the event
    loop only hands each record over, so a file that takes no more (a FIFO whose reader
    stopped reading, a stalled network mount) never blocks the job.

    Each record is flushed once the thread writes it (no buffer keeps it), so a crash
    keeps what led to it, but for the records handed over and not written yet: those of
    the crash's last moment, if the process ends without closing the sink (``kill -9``,
    ``os._exit``; an interpreter that exits closes it).

    A write that fails (a full disk) disables the sink: the file keeps the records before
    it, ``failed`` says why, and the error goes to the tracer, which logs it once (with
    the next record, or from ``close()`` if none came). Records the file does not take
    (``MAX_QUEUED`` bytes of them waiting) disable it the same way (``TraceFileStalled``).
    ``close()`` waits up to ``CLOSE_WAIT`` seconds for the records still waiting (none once
    the file stalled), then gives up, and says how many the file did not get.
    """

    def __init__(self, path: str | Path) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"JsonlSink takes a file path (str or Path), not {path!r}")
        self.path = str(path)
        self.failed: str | None = None
        self._reported = False  # whether ``failed`` was raised to the tracer or logged
        self._written: int | None = None  # the records in the file, once closed
        # non-blocking open: a FIFO with no reader is an error at once (ENXIO), not a
        # hang; and non-blocking it stays, so that the writer can give up on a full pipe
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o666)
        try:
            # truncated only once no other trace writes it (a job still running on one
            # trace_path): its records were lost to this one's
            if stat.S_ISREG(os.fstat(fd).st_mode):
                if sys.platform != "win32":
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        msg = f"{self.path!r} is being written by another trace"
                        raise TraceFileBusy(msg) from None
                    except OSError:
                        pass  # a filesystem with no locks (some NFS): written unguarded
                os.ftruncate(fd, 0)
            self._writer: LineWriter | None = LineWriter(fd, self.path, MAX_QUEUED)
        except BaseException:
            os.close(fd)
            raise
        # a sink never closed (a program's own): closed when collected, or at the exit
        self._finalizer = weakref.finalize(self, self._writer.close, CLOSE_WAIT)

    def __repr__(self) -> str:
        return f"JsonlSink({self.path!r})"

    @property
    def written(self) -> int:
        """The records in the file (so far, while the sink is open)."""
        if self._written is not None:
            return self._written
        return self._writer.counts()[0] if self._writer is not None else 0

    def write(self, record: TraceRecord) -> None:
        writer = self._writer
        if writer is None or self.failed is not None:
            return
        if writer.error is not None:  # the thread's last write failed
            self._fail(describe(writer.error), CLOSE_WAIT)
            raise writer.error
        try:
            line = json.dumps(record.to_dict(), default=_short_repr, sort_keys=True)
        except Exception as e:
            self._fail(describe(e), CLOSE_WAIT)
            raise
        if not writer.put(f"{line}\n".encode()):
            _, waiting = writer.counts()
            stalled = TraceFileStalled(
                f"the trace file takes no more records: its reader stopped reading, or its "
                f"disk stalled ({_records(waiting)} waiting to be written); none is written "
                "from here on"
            )
            self._fail(describe(stalled), 0.0)
            raise stalled

    def flush(self, timeout: float = CLOSE_WAIT) -> bool:
        """Wait up to ``timeout`` real seconds for the records written so far to be in
        the file (or its write to fail); whether they are: not once a write failed, nor
        after a close that lost some."""
        if self._writer is None:  # closed: by a close that wrote every one, or not
            return self.failed is None
        return self._writer.flush(timeout)

    def _fail(self, why: str, wait: float) -> None:
        self.failed, self._reported = why, True  # the tracer logs what write raises
        self._close(wait)

    def close(self) -> None:
        """Write the records still waiting (for ``CLOSE_WAIT`` seconds at most; at once
        if the file stalled) and close the file. Records it did not get are logged."""
        self._close(0.0 if self.failed is not None else CLOSE_WAIT)
        if self.failed is not None and not self._reported:
            self._reported = True
            logger.warning("trace sink %r failed at its close (%s)", self, self.failed)

    def _close(self, wait: float) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        self._finalizer.detach()
        writer.close(wait)
        self._written, lost = writer.counts()
        if self.failed is not None or not lost:
            return
        if writer.error is not None and not isinstance(writer.error, GaveUp):
            self.failed = f"{describe(writer.error)}: {_records(lost)} not written"
        else:
            self.failed = (
                f"the trace file took no more records in the {wait:g} s its close waits: its "
                f"reader stopped reading, or its disk stalled; {_records(lost)} not written"
            )


def _records(n: int) -> str:
    return f"{n:,} record" if n == 1 else f"{n:,} records"


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
        for s in sinks:
            if isinstance(s, type):  # its write is a function wanting self: the first fails
                raise TypeError(
                    f"Tracer takes sinks, not a sink class, {s.__name__}: pass {s.__name__}()"
                )
            if not callable(getattr(s, "write", None)):
                raise TypeError(
                    f"Tracer takes sinks (objects with a write(record) method: JsonlSink, "
                    f"MemorySink, ...), not {s!r}"
                )
        self.sinks: list[TraceSink] = list(sinks)
        self.failures: list[str] = []
        # the job's log fields (job_id, room), set by whoever composes the job (``label``)
        self.labels: Mapping[str, str] = {}
        self.shared = False  # given to more than one job: its failure is every one's

    def label(self, labels: Mapping[str, str]) -> None:
        """Name the job this tracer traces, in its warnings. A tracer given to a second job
        names none: a sink failing then is disabled for every job that shares it."""
        if self.shared or (self.labels and self.labels is not labels):
            self.shared, self.labels = True, {}
        else:
            self.labels = labels

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
        place = job_place(self.labels)
        logger.warning(
            "%strace sink %r failed in %s (%s); it is disabled%s, the machines go on without it",
            f"{place}: " if place else "",
            sink,
            where,
            text,
            " for every job sharing its tracer" if self.shared else "",
            exc_info=error if not isinstance(error, Exception) else None,
            extra={"job_id": job, "room": room, "sink": repr(sink)},
        )


def job_place(labels: Mapping[str, str]) -> str:
    """Where a log line comes from, by a job's labels: ``job J (room R)``, ``job J``,
    ``room R``, or nothing when neither is known (a job built by hand has no id)."""
    job, room = labels.get("job_id", ""), labels.get("room", "")
    if job:
        return f"job {job} (room {room})" if room else f"job {job}"
    return f"room {room}" if room else ""
