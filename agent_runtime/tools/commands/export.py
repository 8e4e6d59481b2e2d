"""``agent-runtime export xstate [MACHINE] [--out DIR]``: the machines as XState v5 modules.

With ``--out`` every machine (or the one named) is written to ``DIR/NAME.js``; without it
the named machine's module goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent_runtime.tools.xstate import module
from statemachines.machines import MACHINES


def run(args: argparse.Namespace) -> int:
    if args.machine is not None and args.machine not in MACHINES:
        print(
            f"agent-runtime export: unknown machine {args.machine!r}; "
            f"machines: {', '.join(MACHINES)}",
            file=sys.stderr,
        )
        return 2
    names = [args.machine] if args.machine is not None else list(MACHINES)
    if args.out is None:
        if args.machine is None:
            print(
                "agent-runtime export: name a MACHINE to print its module, or give --out DIR "
                "to write them all",
                file=sys.stderr,
            )
            return 2
        sys.stdout.write(module(MACHINES[args.machine]))
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"agent-runtime export: --out {out} is not a directory", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.js"
        path.write_text(module(MACHINES[name]), encoding="utf-8")
        print(f"wrote {path}")
    return 0
