"""``agent-runtime watch TRACE.jsonl [--once] [--interval S] [--last N]``: follow a trace as
it grows and show each machine's current state and the last transitions.

On a terminal the view is redrawn in place; otherwise each transition (and each reject,
failed effect, scenario input) is one appended line. A line that is not a trace record, or
a record of a machine this build does not have, is named in one line and skipped. A record
whose time goes back or that starts another job (``TraceOrder``: another job's records
appended) is named and starts the view over from it, as a file that is truncated (a new
job writing the same path) starts it over from its start. Ctrl-C stops it. ``--once``
prints the current view and exits (2 when a line was named); its lines are cut to the
width only on a terminal, and a last line the job is still writing is left out, saying so.

Started before the job, it waits for the trace to be written (and for the directories on
its way, which the runtime makes), saying so once on stderr; ``--once`` does not wait. A
path that can never be a trace (a directory, one under a file, not a regular file) is
refused at once, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import select
import shutil
import stat
import sys
import textwrap
import time
from pathlib import Path
from typing import TextIO

from agent_runtime.observe.reading import (
    AnotherJob,
    TimeGoesBack,
    TraceError,
    TraceOrder,
    parse_record,
)
from agent_runtime.observe.trace import TraceRecord
from agent_runtime.tools.lanes import Entry, Lanes
from agent_runtime.tools.output import OutputGone, discard

PROG = "agent-runtime watch"
# past an hour between reads the trace is no longer followed (and time.sleep overflows
# long before a float runs out)
MAX_INTERVAL = 3600.0
pause = time.sleep  # between two reads (the tests step through it)


_HEAD = 4096  # how much of a file's start tells one trace from the next on its path


class Follower:
    """Reads the complete lines a file gains, from where it stopped; a partly written last
    line waits for its end. Starts over when the file is replaced or truncated."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pos = 0
        self._line = 0
        self._rest = b""
        self._ident: tuple[int, int] | None = None
        self._head = b""  # the file's first bytes as read (up to _HEAD)
        self.unterminated: int | None = None  # the last line read with no newline (final)

    def poll(self, *, final: bool = False) -> tuple[list[tuple[int, bytes]], bool]:
        """(line number, bytes) of each new complete line, and whether the file restarted;
        ``final``: a last line with no newline counts too (the caller reads it once, and
        drops it if it is not a whole record yet). Raises ``OSError`` when the file cannot
        be read."""
        restarted = False
        with open(self.path, "rb") as fh:
            st = os.fstat(fh.fileno())
            ident = (st.st_dev, st.st_ino)
            # truncated and written past the old end between two polls (the next job's
            # trace on the same path) is seen by its start, which is not what was read
            head = fh.read(len(self._head))
            if self._ident is not None and (
                ident != self._ident or st.st_size < self._pos or head != self._head
            ):
                self._pos, self._line, self._rest, self._head = 0, 0, b"", b""
                restarted = True
            self._ident = ident
            fh.seek(self._pos)
            data = fh.read()
        if len(self._head) < _HEAD:
            self._head += data[: _HEAD - len(self._head)]
        self._pos += len(data)
        *complete, self._rest = (self._rest + data).split(b"\n")
        self.unterminated = None
        if final and self._rest.strip():
            complete.append(self._rest)
            self._rest = b""
            self.unterminated = self._line + len(complete)
        out: list[tuple[int, bytes]] = []
        for raw in complete:
            self._line += 1
            if raw.strip():
                out.append((self._line, raw))
        return out, restarted


class Watch:
    """The state of the view: lanes from the records read so far, and the problems seen."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.follower = Follower(path)
        self.lanes = Lanes()
        self.order = TraceOrder(self.lanes.machines)  # the rules between records, as read
        self.problems: list[str] = []
        self.cut: int | None = None  # a last line not whole yet, left out (final only)

    def poll(self, *, final: bool = False) -> tuple[list[Entry], list[str], bool]:
        """New history entries, new problems, and whether the trace restarted (``final``:
        the last line even without its newline, when it is a whole record)."""
        problems: list[str] = []
        try:
            lines, restarted = self.follower.poll(final=final)
        except OSError as e:
            problem = f"{self.path}: cannot read the trace ({e.strerror or e})"
            if not self.problems or self.problems[-1] != problem:
                self.problems.append(problem)
                return [], [problem], False
            return [], [], False
        if restarted:
            self.lanes = Lanes()
            self.order = TraceOrder(self.lanes.machines)
            self.problems = []
        entries: list[Entry] = []
        before = len(self.lanes.history)
        for n, raw in lines:
            where = f"{self.path}:{n}"
            try:
                rec: TraceRecord = parse_record(raw.decode("utf-8"), where, wording="terse")
            except UnicodeDecodeError:
                problems.append(f"{where}: not UTF-8 text; line skipped")
                continue
            except TraceError as e:
                if n == self.follower.unterminated:
                    self.cut = n  # a last line still being written, as following would wait
                    continue
                problems.append(f"{e}; line skipped")
                continue
            try:
                self.order.check(rec, self.path, n, terse=True)
            except (TimeGoesBack, AnotherJob) as e:
                # another job's records from here on (one appended to the file, on its own
                # clock or on the same one): followed from here, as a file a new job
                # rewrote is (skipping them would stop the follower on the old job for good)
                problems.append(f"{e}; the view starts over from this line")
                entries += self.lanes.history[before:]
                self.lanes, before = Lanes(), 0
                self.order = TraceOrder(self.lanes.machines)
                self.order.check(rec, self.path, n)
            except TraceError as e:  # a machine this build does not have
                problems.append(f"{e}; line skipped")
                continue
            self.lanes.add(rec)
        self.problems += problems
        return entries + self.lanes.history[before:], problems, restarted

    # -- the view ------------------------------------------------------------------------------
    def view(self, *, last: int, width: int | None) -> list[str]:
        """The view's lines, each cut at ``width`` (None: whole, for a file or a pipe)."""
        lanes = self.lanes
        t = f"t = {lanes.t1:.3f}" if lanes.t1 is not None else "no records yet"
        out = [f"{PROG} {self.path}: {lanes.records} records, {t}", ""]
        rows = [("machine", "state", "since", "timeout armed")]
        for lane in lanes.lanes():
            since = f"{lane.since:.3f}" if lane.since is not None else ""
            rows.append((lanes.label(lane), lane.state, since, lanes.timeout_of(lane)))
        if len(rows) == 1:
            out.append("(no machine has written a record yet)")
        else:
            widths = [max(len(r[i]) for r in rows) for i in range(4)]
            out += [
                "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
            ]
        out += ["", "last transitions"]
        recent = lanes.history[-last:] if last > 0 else []
        out += [_entry_line(e, lanes) for e in recent] or ["  (none yet)"]
        if width is not None:
            out = [line[:width] for line in out]
        if self.problems:
            # wrapped, not cut: a problem is read whole
            out += ["", "problems"]
            for p in self.problems[-3:]:
                if width is None:
                    out.append(f"  {p}")
                    continue
                out += textwrap.wrap(p, width, initial_indent="  ", subsequent_indent="    ") or [
                    "  "
                ]
        return out


def _entry_line(e: Entry, lanes: Lanes) -> str:
    lane = lanes.find(e.machine, e.instance)
    who = lanes.label(lane) if lane is not None else e.machine
    mark = "!" if e.level == "warn" else " "
    return f"{mark} {e.t:10.3f}  {who:<14} {e.text}"


def _bad_option(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--interval`` or ``--last``, if anything."""
    if not (math.isfinite(args.interval) and 0 < args.interval <= MAX_INTERVAL):
        return (
            f"--interval must be above 0 and at most {MAX_INTERVAL:g} seconds, "
            f"not {args.interval:g}"
        )
    if args.last < 1:
        # 0 or less showed "(none yet)" above a trace that has transitions
        return f"--last must be 1 or more, not {args.last}"
    return None


NOT_YET = "no such file"  # what _not_a_trace says of a trace that may still be written


def _not_a_trace(path: str) -> str | None:
    """Why ``path`` is not a trace file to follow, or None: ``NOT_YET`` when it (or a
    directory on its way, which the runtime makes for its trace) does not exist yet; else
    why it never will be one (a directory, a file where a directory must be, no access)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return NOT_YET
    except NotADirectoryError:
        # a file on the way: the runtime cannot make the directory it stands for
        blocker = next(
            (p for p in reversed(Path(path).parents) if p.exists() and not p.is_dir()), None
        )
        return f"{blocker or 'a parent'} is not a directory: no trace can be written there"
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISDIR(mode):
        return "a directory, not a trace file"
    if not stat.S_ISREG(mode):  # a FIFO or a device would block or never end
        return "not a regular file"
    return None


def run(args: argparse.Namespace) -> int:
    bad = _bad_option(args)
    if bad is not None:
        print(f"{PROG}: {bad}", file=sys.stderr)
        return 2
    path: str = args.trace
    try:
        problem = _not_a_trace(path)
        if problem == NOT_YET and not args.once:  # --once shows what is there now
            # started before the job: its trace (and the directories the runtime makes for
            # it) comes when the job starts, as `tail -F` waits for a log
            print(f"{PROG}: waiting for {path} to be written", file=sys.stderr)
            while problem == NOT_YET:
                pause(args.interval)
                problem = _not_a_trace(path)
    except KeyboardInterrupt:  # how a follower is stopped, waiting too
        return 0
    if problem is not None:
        print(f"{PROG}: {path}: {problem}", file=sys.stderr)
        return 2
    watch = Watch(path)
    out: TextIO = sys.stdout
    try:
        if args.once:
            _, problems, _ = watch.poll(final=True)
            for p in problems:
                print(f"{PROG}: {p}", file=sys.stderr)
            if watch.cut is not None:  # not a problem: the job is writing it
                print(f"{PROG}: {path}:{watch.cut}: not whole yet (still being written?); "
                      "not shown", file=sys.stderr)  # fmt: skip
            # cut to the terminal only on one: a file or a pipe gets whole lines
            width = shutil.get_terminal_size((100, 24)).columns if out.isatty() else None
            out.write("\n".join(watch.view(last=args.last, width=width)) + "\n")
            return 2 if watch.problems else 0
        if out.isatty():
            return _live(watch, out, args)
        return _lines(watch, out, args)
    except KeyboardInterrupt:  # how a follower is stopped: not an interruption
        return 0
    except (BrokenPipeError, OutputGone) as e:
        # `watch trace | head`: the reader has gone, which is the other way a follower ends
        if isinstance(e, OutputGone) and not e.broken_pipe:
            raise  # a full disk: the CLI says so
        # stdout is gone; let the interpreter's flush at exit find nothing to write
        discard(sys.stdout)
        return 0


def _lines(watch: Watch, out: TextIO, args: argparse.Namespace) -> int:
    while True:
        entries, problems, restarted = watch.poll()
        if restarted:
            out.write(f"-- {watch.path} was truncated or replaced: reading it from the start\n")
        for e in entries:
            out.write(_entry_line(e, watch.lanes) + "\n")
        for p in problems:
            print(f"{PROG}: {p}", file=sys.stderr)
        out.flush()
        if _reader_gone(out):
            raise BrokenPipeError  # as a write would, had there been one
        pause(args.interval)


def _reader_gone(out: TextIO) -> bool:
    """Whether ``out`` is a pipe whose reader has gone (``watch trace | head`` once head
    has its lines): the pipe took all that was written, so with nothing new to write the
    follower would never hear of it (as ``tail -f`` asks the pipe, this asks it)."""
    try:
        fd = out.fileno()
    except (OSError, ValueError):
        return False
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # an error or a hang-up is reported whatever is asked
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _live(watch: Watch, out: TextIO, args: argparse.Namespace) -> int:
    out.write("\x1b[?25l\x1b[2J")  # hide the cursor, clear the screen
    try:
        drawn: list[str] | None = None
        while True:
            watch.poll()
            size = shutil.get_terminal_size((100, 24))
            header = 4 + len(watch.lanes.lanes()) + (5 if watch.problems else 0)
            last = max(1, min(args.last, size.lines - header - 1))
            lines = watch.view(last=last, width=size.columns)
            lines.append("(Ctrl-C to stop)")
            if lines != drawn:
                # home, each line cleared to its end, then everything below cleared
                out.write("\x1b[H" + "".join(f"{line}\x1b[K\n" for line in lines) + "\x1b[J")
                out.flush()
                drawn = lines
            pause(args.interval)
    finally:
        out.write("\x1b[?25h\n")
        out.flush()
