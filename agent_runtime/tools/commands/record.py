"""``agent-runtime record TRACE.jsonl [-o OUT.yaml] [--name NAME] [--check]``: write the
scenario that reproduces a trace (``agent_runtime.tools.record``), so an incident becomes a
scenario file and then a test.

Exit 0 with the scenario written (to stdout without ``-o``); with ``--check`` the scenario is
also run and compared with the trace: exit 1 naming each machine whose final state or
transitions differ. Exit 2 when the trace cannot be read, holds nothing to rebuild from or
more than one job, or the file cannot be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from agent_runtime.observe.reading import TraceError, load_trace
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.testing.scenario import ScenarioError, name_problem, parse_scenario
from agent_runtime.tools.output import same_file, unwritable, write_file
from agent_runtime.tools.record import RecordError, compare, record, render, timing

PROG = "agent-runtime record"
logger = logging.getLogger("agent_runtime.tools.record")


def run(args: argparse.Namespace) -> int:
    if args.name is not None and (problem := name_problem(args.name)) is not None:
        return _fail(f"--name: {problem}")
    if args.out == "-":  # standard output, as without -o
        args.out = None
    if args.out and same_file(args.out, args.trace):
        return _fail(f"-o {args.out} is the trace; it would be overwritten")
    if args.out and (why := unwritable(args.out)) is not None:
        return _fail(f"{args.out}: cannot write the scenario ({why})")
    try:
        records = [rec for _, rec in load_trace(args.trace, warn=_warn)]
        recorded = record(records, name=args.name or f"recorded from {Path(args.trace).name}")
    except (TraceError, RecordError) as e:
        return _fail(f"{args.trace}: {e}" if isinstance(e, RecordError) else str(e))
    text = render(recorded, source=args.trace)
    try:
        # named by the trace it comes from: the -o file is not written yet
        scenario = parse_scenario(yaml.safe_load(text), source=args.trace)
    except ScenarioError as e:  # a bug: the reader refuses a trace whose times go back
        return _fail(f"the scenario rebuilt from the trace is invalid: {e}")
    if args.out:
        try:
            write_file(args.out, text)
        except OSError as e:
            return _fail(f"{args.out}: cannot write the scenario ({e.strerror or e})")
        steps = len(scenario.steps)
        print(
            f"wrote {args.out} ({steps} steps, t = {secs(scenario.steps[0].at)} .. "
            f"{secs(scenario.steps[-1].at)})",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    if not args.check:
        return 0
    from agent_runtime.testing.clock import run as on_virtual_time
    from agent_runtime.testing.runner import (
        run_scenario,  # imports livekit.agents: only when running
    )

    try:
        result = on_virtual_time(run_scenario(scenario))
    except Exception as e:  # a bug, but still one line and exit 2, never a traceback
        logger.debug("running the recorded scenario failed", exc_info=True)
        return _fail(f"running the rebuilt scenario failed: {' '.join(str(e).split())}")
    differences = compare(records, result)
    if differences:
        print("the rebuilt scenario does not reproduce the trace:", file=sys.stderr)
        for d in differences:
            print(f"  {d}", file=sys.stderr)
        return 1
    print(
        "the rebuilt scenario reproduces the trace: every machine ends in the same state "
        "after the same transitions",
        file=sys.stderr,
    )
    late = timing(records, result)
    if late:
        print("but not every one at the trace's time:", file=sys.stderr)
        for d in late:
            print(f"  {d}", file=sys.stderr)
    return 0


def _warn(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2
