"""``agent-runtime timeline TRACE.jsonl -o PAGE.html [--title T]``: draw a trace as one
self-contained HTML page (``agent_runtime.tools.timeline``; ``-o -``: on stdout). Exit 0
with the page written, 2 when the trace cannot be read or is empty, or the page cannot be
written (one line on stderr)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from agent_runtime.observe.reading import TraceError, load_trace
from agent_runtime.tools.output import same_file, unwritable
from agent_runtime.tools.timeline import timeline_html, write_timeline


def draw(
    trace: str, out: str, *, title: str | None = None, source: str | None = None, prog: str
) -> int:
    why = draw_page(
        trace,
        out,
        title=title,
        source=source,
        warn=lambda m: print(f"{prog}: {m}", file=sys.stderr),
    )
    if why is not None:
        print(f"{prog}: {why}", file=sys.stderr)
        return 2
    if out != "-":
        print(f"wrote {out}", file=sys.stderr)
    return 0


def draw_page(
    trace: str,
    out: str,
    *,
    title: str | None = None,
    source: str | None = None,
    warn: Callable[[str], None],
) -> str | None:
    """The page of ``trace`` written to ``out``: None, or why not (one line naming the
    file)."""
    try:
        records = [rec for _, rec in load_trace(trace, warn=warn)]
    except TraceError as e:
        return str(e)
    if not records:  # refused as replay and record refuse it: a page of nothing says nothing
        return f"{trace}: nothing to draw: the trace is empty"
    try:
        if out == "-":
            html = timeline_html(records, title=title or Path(trace).name, source=source or trace)
            sys.stdout.write(html)
        else:
            write_timeline(records, out, title=title or Path(trace).name, source=source or trace)
    except OSError as e:
        return f"{out}: cannot write the page ({e.strerror or e})"
    return None


def run(args: argparse.Namespace) -> int:
    prog = "agent-runtime timeline"
    if args.out != "-" and same_file(args.out, args.trace):
        print(f"{prog}: -o {args.out} is the trace; it would be overwritten", file=sys.stderr)
        return 2
    if args.out != "-" and (why := unwritable(args.out)) is not None:
        print(f"{prog}: {args.out}: cannot write the page ({why})", file=sys.stderr)
        return 2
    return draw(args.trace, args.out, title=args.title, prog=prog)


def simulate_then_draw(
    args: argparse.Namespace, simulate: Callable[[argparse.Namespace], int]
) -> int:
    """``simulate FILE --html PAGE``: the run with a trace (a temporary one unless
    ``--trace`` names it), which ``simulate`` draws before it reports the run, so a page
    that cannot be written is in its report (``simulate`` checked there is one FILE and the
    page can be written)."""
    with tempfile.TemporaryDirectory(prefix="agent-runtime-") as tmp:
        if not args.trace:
            args.trace = str(Path(tmp) / "trace.jsonl")
        return simulate(args)


def simulated_page(args: argparse.Namespace, scenario: str) -> str | None:
    """``simulate --html``'s page, drawn from the run's trace: None, or why it could not
    be (one line)."""
    return draw_page(
        args.trace,
        args.html,
        title=f"{Path(scenario).name}: timeline",
        source=scenario,
        warn=lambda m: print(f"agent-runtime simulate: {m}", file=sys.stderr),
    )
