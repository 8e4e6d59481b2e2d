"""The log records of one fuzz run, kept for its report instead of printed as they come.

A fuzz draws a world that misbehaves on purpose (strangers asking for the verdict, a
simulator that never asks, an avatar that leaves before its video): the job and livekit
log what it does, a warning a run. A passing fuzz prints its summary, not those; a
failing one shows its failing run's records beside the shortest sequence.

Which records are the run's: those of the runtime (``agent_runtime.*`` loggers) and of
livekit (``livekit.*``, already cut to ERROR under the fuzzer: its chatter about the
in-memory room) logged while the run's own event loop runs (every run has a loop of its
own: two runs at once, on two threads, never take each other's), but not one labelled
with another job (``job_id`` and ``room``, as ``Actor.report`` sets them): a line naming
no job (``job closed (...)``) is the run's job's too. The user's own loggers are left as
they are: their logging is theirs.

A handler cannot keep a record from the user's handlers; only the filters of the logger
the record is logged on can, so this is a filter on those loggers, added as the run opens
and removed as it ends, however it ends (``Harness.open``, ``Harness.release_log``). The
run's ``UserFailures`` (a handler on the root logger) still gets each record taken: it
hears the agent's failures that livekit and the runtime only log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.result import seconds_text

_RUNTIME, _SDK = "agent_runtime", "livekit"  # the loggers the filter goes on
KEPT = logging.INFO  # what the report shows of the records taken (those logging made)
MAX_LINES = 40  # a report's log lines, at most (the rest counted)


class RunLog(logging.Filter):
    """Takes the run's records (see the module) off the loggers they are logged on, and
    keeps those at ``KEPT`` and above as lines for the report (``lines``), stamped with
    the run's virtual time."""

    def __init__(
        self,
        clock: VirtualClock,
        job_id: str,
        room: str,
        hears: Callable[[], logging.Handler | None],
    ) -> None:
        super().__init__()
        self.clock = clock
        self.labels = (job_id, room)
        self.hears = hears  # the run's UserFailures while it listens
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lines: list[str] = []
        self.more = 0  # lines past MAX_LINES
        self._on: list[logging.Logger] = []

    def install(self) -> None:
        """Add the filter (on the run's loop); ``remove`` takes it off again."""
        self.loop = asyncio.get_running_loop()
        manager = logging.Logger.manager
        names = [_RUNTIME, _SDK, *manager.loggerDict]
        self._on = [
            logging.getLogger(n)
            for n in dict.fromkeys(names)
            if n.partition(".")[0] in (_RUNTIME, _SDK)
            and not isinstance(manager.loggerDict.get(n), logging.PlaceHolder)
        ]
        for log in self._on:
            log.addFilter(self)

    def remove(self) -> None:
        for log in self._on:
            log.removeFilter(self)
        self._on = []

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._ours(record):
            return True
        failures = self.hears()
        if failures is not None and record.levelno >= failures.level:
            failures.handle(record)  # the agent's failures livekit only logs are still heard
        if record.levelno >= KEPT:
            if len(self.lines) < MAX_LINES:
                self.lines.append(self._line(record))
            else:
                self.more += 1
        return False

    def _ours(self, record: logging.LogRecord) -> bool:
        try:
            on_our_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # a thread's: not the run's
            return False
        if not on_our_loop:
            return False
        if not hasattr(record, "job_id"):
            return True  # livekit's, or a runtime line that names no job
        return (getattr(record, "job_id", None), getattr(record, "room", None)) == self.labels

    def _line(self, record: logging.LogRecord) -> str:
        try:
            text = record.getMessage()
        except Exception:  # bad arguments: the format string says enough
            text = str(record.msg)
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {error})"
        # to the millisecond, as the run's steps are: the clock's float sums (audio played
        # frame by frame) read 3.49999999999955 for 3.5
        at = seconds_text(round(self.clock.now(), 3))
        return f"t={at} {record.levelname} {record.name}: {text}"

    def report_lines(self) -> list[str]:
        return self.lines + ([f"... {self.more} more"] if self.more else [])
