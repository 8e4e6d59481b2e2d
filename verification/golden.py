"""``python3 dev.py golden [--out DIR]``: rewrite the golden transition tables
(``tests/tables/NAME.json``) the table tests compare the specs with, after an intended
change to a machine (review their diff with the spec's). The project's own check, so it
lives here, outside the wheel."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent_runtime.tools.drawing import cell_table, dump_cell_table
from statemachines import MachineSpec

TABLES = Path(__file__).resolve().parent.parent / "tests" / "tables"


def write_golden(machines: Mapping[str, MachineSpec], out: Path) -> list[Path]:
    """Write ``out/NAME.json`` for every machine; remove tables of machines that are gone."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, spec in sorted(machines.items()):
        path = out / f"{name}.json"
        path.write_text(dump_cell_table(cell_table(spec)), encoding="utf-8")
        written.append(path)
    for stray in sorted(out.glob("*.json")):
        if stray.stem not in machines:
            stray.unlink()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 dev.py golden",
        description="Rewrite the golden transition tables the table tests compare the specs "
        "with. Run it only after an intended change to a machine, and review the diff.",
    )
    p.add_argument("--out", default=str(TABLES), metavar="DIR", help="default: tests/tables")
    args = p.parse_args(argv)
    from statemachines.machines import MACHINES

    for path in write_golden(MACHINES, Path(args.out)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
