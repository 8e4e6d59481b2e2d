"""``agent-runtime timeline TRACE.jsonl -o PAGE.html [--title T]``: draw a trace as one
self-contained HTML page (``agent_runtime.tools.timeline``). Exit 0 with the page written,
2 when the trace cannot be read or is empty, or the page cannot be written (one line on
stderr)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent_runtime.observe.reading import TraceError, load_trace
from agent_runtime.tools.output import same_file
from agent_runtime.tools.timeline import write_timeline


def draw(
    trace: str, out: str, *, title: str | None = None, source: str | None = None, prog: str
) -> int:
    try:
        records = [
            rec
            for _, rec in load_trace(trace, warn=lambda m: print(f"{prog}: {m}", file=sys.stderr))
        ]
    except TraceError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if not records:  # refused as replay and record refuse it: a page of nothing says nothing
        print(f"{prog}: {trace}: nothing to draw: the trace is empty", file=sys.stderr)
        return 2
    try:
        write_timeline(records, out, title=title or Path(trace).name, source=source or trace)
    except OSError as e:
        print(f"{prog}: {out}: cannot write the page ({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"wrote {out}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    prog = "agent-runtime timeline"
    if same_file(args.out, args.trace):
        print(f"{prog}: -o {args.out} is the trace; it would be overwritten", file=sys.stderr)
        return 2
    return draw(args.trace, args.out, title=args.title, prog=prog)


def simulate_then_draw(
    args: argparse.Namespace, simulate: Callable[[argparse.Namespace], int]
) -> int:
    """``simulate FILE --html PAGE``: the run as usual, then its trace drawn (``simulate``
    checked there is one FILE and the page can be written)."""
    with tempfile.TemporaryDirectory(prefix="agent-runtime-") as tmp:
        if not args.trace:
            args.trace = str(Path(tmp) / "trace.jsonl")
        code = simulate(args)
        if code == 2 or not Path(args.trace).is_file():
            return code
        scenario = str(args.files[0])
        title = f"{Path(scenario).name}: timeline"
        drawn = draw(
            args.trace, args.html, title=title, source=scenario, prog="agent-runtime simulate"
        )
    return code if drawn == 0 else drawn
