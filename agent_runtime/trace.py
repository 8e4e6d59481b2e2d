"""The trace: every event an actor handles (with the guard values it consulted, so the
decision can be replayed offline), every transition and every effect outcome."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

logger = logging.getLogger("agent_runtime.trace")

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


class TraceSink(Protocol):
    def write(self, record: TraceRecord) -> None: ...


class MemorySink:
    def __init__(self) -> None:
        self.records: list[TraceRecord] = []

    def write(self, record: TraceRecord) -> None:
        self.records.append(record)


class JsonlSink:
    """One JSON object a line; flushed per record so a crash keeps what led to it."""

    def __init__(self, path: str | Path) -> None:
        self._fh: IO[str] | None = Path(path).open("w", encoding="utf-8")  # noqa: SIM115

    def write(self, record: TraceRecord) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record.to_dict(), default=repr, sort_keys=True) + "\n")
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


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
    """Fans records out to sinks. An actor without a tracer records nothing."""

    def __init__(self, *sinks: TraceSink) -> None:
        self.sinks: list[TraceSink] = list(sinks)

    def write(self, record: TraceRecord) -> None:
        for s in self.sinks:
            s.write(record)


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Read a JSONL trace; a line that is not a record raises ``ValueError`` naming the line."""
    out: list[TraceRecord] = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(TraceRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a trace record ({e})") from None
    return out
