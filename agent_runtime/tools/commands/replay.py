"""``agent-runtime replay TRACE.jsonl [--json]``: exit 0 when the machines agree with every
recorded decision, 1 at the first divergence, 2 when the trace cannot be replayed (one line
on stderr naming the file; with ``--json`` also ``{"ok": false, "file": ..., "error": ...}``
on stdout; the report's object has ``warnings``, what was said on stderr of a trace read
all the same). Jobs one after the other in the trace are replayed each by itself; jobs at
once are exit 2 (``agent_runtime.observe.jobs``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from agent_runtime.tools.replay import TraceError, format_report, replay_file

logger = logging.getLogger("agent_runtime.tools.replay")


def run(args: argparse.Namespace) -> int:
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        print(f"agent-runtime replay: {message}", file=sys.stderr)

    try:
        report = replay_file(args.trace, warn=warn)
    except TraceError as e:
        return _fail(args, str(e))
    except Exception as e:  # a bug, but still one line and exit 2, never a traceback
        logger.debug("replaying %s failed", args.trace, exc_info=True)
        return _fail(
            args, f"{args.trace}: replay failed: {' '.join(f'{type(e).__name__}: {e}'.split())}"
        )
    if args.json:
        # what was said on stderr (a last line cut while the job wrote it, left out), for
        # a reader of the object alone
        print(json.dumps({**report.to_dict(), "warnings": warnings}, indent=2))
    else:
        sys.stdout.write(format_report(report))
    return 0 if report.ok else 1


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"agent-runtime replay: {message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": False, "file": args.trace, "error": message}))
    return 2
