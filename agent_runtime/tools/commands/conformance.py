"""``agent-runtime conformance [--depth N] [--counterexample-depth N] [--json]``: replay the
model's covering paths and the explorer's counterexamples through a real ``AgentJob`` and
compare after every step (see ``agent_runtime.tools.conformance``). Exit 0 when the runtime
follows the model on every path, 1 with the first differing step of each path that does not."""

from __future__ import annotations

import argparse
import json
import sys

from agent_runtime.tools.conformance.suite import COUNTEREXAMPLE_DEPTH, COVER_DEPTH, conformance


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--depth", args.depth), ("--counterexample-depth", args.cex_depth)):
        if value is not None and value < 0:
            print(f"agent-runtime conformance: {flag} must be >= 0", file=sys.stderr)
            return 2
    report = conformance(
        cover_depth=COVER_DEPTH if args.depth is None else args.depth,
        counterexample_depth=COUNTEREXAMPLE_DEPTH if args.cex_depth is None else args.cex_depth,
    )
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1
