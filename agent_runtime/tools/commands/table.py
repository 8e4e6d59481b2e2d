"""``agent-runtime table MACHINE``: one machine's whole state x event table, for a terminal."""

from __future__ import annotations

import argparse
import sys

from agent_runtime.tools.render import terminal_table
from statemachines.machines import MACHINES


def run(args: argparse.Namespace) -> int:
    spec = MACHINES.get(args.machine)
    if spec is None:
        print(
            f"agent-runtime table: unknown machine {args.machine!r}; "
            f"machines: {', '.join(MACHINES)}",
            file=sys.stderr,
        )
        return 2
    sys.stdout.write(terminal_table(spec))
    return 0
