"""``agent-runtime export xstate [MACHINE] [--out DIR]``: the machines as XState v5 modules.

With ``--out`` every machine (or the one named) is written to ``DIR/NAME.js``; without it
the named machine's module goes to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent_runtime.tools.output import check_directory, write_all
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
    files = {f"{name}.js": module(MACHINES[name]) for name in names}
    # every target checked first, then all written or none: a file there is the user's
    why = check_directory(out, list(files))
    if why is not None:
        print(f"agent-runtime export: {out}: {why}", file=sys.stderr)
        return 2
    try:
        written = write_all(out, files)
    except OSError as e:  # a read-only or full disk, /proc, /sys
        failed = e.filename if e.filename is not None else out
        print(f"agent-runtime export: {failed}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0
