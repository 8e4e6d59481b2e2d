"""``agent-runtime replay TRACE.jsonl [--json]``: exit 0 when the machines agree with every
recorded decision, 1 at the first divergence, 2 when the trace cannot be replayed."""

from __future__ import annotations

import argparse
import json
import sys

from ..replay import TraceError, format_report, replay_file


def run(args: argparse.Namespace) -> int:
    try:
        report = replay_file(args.trace)
    except TraceError as e:
        if args.json:
            print(json.dumps({"ok": False, "error": str(e)}))
        print(f"agent-runtime replay: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        sys.stdout.write(format_report(report))
    return 0 if report.ok else 1
