"""``python3 dev.py conformance [--depth N] [--counterexample-depth N] [--json]``
(``python -m verification.conformance`` in the venv): replay the model's covering paths
and the explorer's counterexamples through a real ``AgentJob`` and compare after every
step (see ``verification.conformance``). Exit 0 when the runtime follows the model on
every path, 1 with the first differing step of each path that does not, 2 on a usage
error."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from verification.conformance.suite import COUNTEREXAMPLE_DEPTH, COVER_DEPTH, conformance

PROG = "dev.py conformance"


def parser() -> argparse.ArgumentParser:
    con = argparse.ArgumentParser(
        prog=PROG,
        description="Paths that take every transition row the model reaches, and the "
        "shortest counterexample of every fault the explorer knows, replayed through a real "
        "AgentJob (in-memory room, virtual clock); after every step the model's view of the "
        "job and the runtime's must agree. Exit 1 with the first differing step of a path.",
    )
    con.add_argument("--depth", type=int, metavar="N", help="moves the covering search goes")
    con.add_argument(
        "--counterexample-depth",
        dest="cex_depth",
        type=int,
        metavar="N",
        help="how deep each fault is explored for its counterexample",
    )
    con.add_argument("--json", action="store_true", help="print the report as JSON")
    return con


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--depth", args.depth), ("--counterexample-depth", args.cex_depth)):
        if value is not None and value < 0:
            print(f"{PROG}: {flag} must be >= 0", file=sys.stderr)
            return 2
    report = conformance(
        cover_depth=COVER_DEPTH if args.depth is None else args.depth,
        counterexample_depth=COUNTEREXAMPLE_DEPTH if args.cex_depth is None else args.cex_depth,
    )
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.summary())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))
