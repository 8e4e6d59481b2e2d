"""Import cost, each figure from fresh interpreters.

Every run is a new ``python -c`` that times one import with ``perf_counter`` (interpreter
start-up is not counted; CPU time is kept beside it in the JSON). Bytecode caches may be
written and one discarded run comes first, so the figures are for an installed project,
not for compiling its sources.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .table import Row, Target

SECTION = "imports"
ROOT = Path(__file__).resolve().parent.parent

# each probe prints the wall and CPU seconds of the import being measured, which runs
# after ``before`` (``pass`` when nothing comes first)
_PROBE = """
import json, time
{before}
c0 = time.process_time()
t0 = time.perf_counter()
{target}
t1 = time.perf_counter()
c1 = time.process_time()
print(json.dumps({{"wall": t1 - t0, "cpu": c1 - c0}}))
"""


@dataclass(frozen=True, slots=True)
class Probe:
    case: str
    target: str
    before: str = "pass"
    limit_ms: float | None = None


# what statemachines.spec takes from pydantic: importing them loads pydantic's models
PYDANTIC_NAMES = "from pydantic import BaseModel, ConfigDict, Field, model_validator"

PROBES = (
    Probe("import statemachines", "import statemachines", limit_ms=100.0),
    Probe("import statemachines beyond pydantic", "import statemachines", before=PYDANTIC_NAMES),
    Probe(
        "import statemachines.machines (the specs built and validated)",
        "import statemachines.machines",
    ),
    Probe("import livekit.agents (for reference)", "import livekit.agents"),
    Probe("import agent_runtime, alone", "import agent_runtime"),
    Probe(
        "import agent_runtime beyond livekit.agents",
        "import agent_runtime",
        before="import livekit.agents",
    ),
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # measure with bytecode caches, as installed
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def probe_once(p: Probe) -> tuple[float, float]:
    """Wall and CPU seconds the probe's import took in one fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(before=p.before, target=p.target)],
        cwd=ROOT,
        env=_env(),
        check=True,
        capture_output=True,
        text=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["wall"]), float(got["cpu"])


def measure(
    runs: int, probes: Sequence[Probe] = PROBES, *, warm_up: bool = True
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds per run for each probe; rounds interleave the probes."""
    if not probes:
        raise ValueError("no import probes to run")
    if warm_up:
        for p in probes:
            probe_once(p)  # writes bytecode caches; discarded
    out: dict[str, list[tuple[float, float]]] = {p.case: [] for p in probes}
    for i in range(runs):
        # each round starts one probe later, so none always runs right after the heaviest
        for p in (*probes[i % len(probes) :], *probes[: i % len(probes)]):
            out[p.case].append(probe_once(p))
    return out


def rows_from(
    seconds: dict[str, list[tuple[float, float]]], probes: Sequence[Probe] = PROBES
) -> list[Row]:
    rows: list[Row] = []
    for p in probes:
        runs = [wall for wall, _ in seconds[p.case]]
        ms = statistics.median(runs) * 1e3
        how = (
            f"perf_counter (wall time) around the import in a fresh interpreter, median of "
            f"{len(runs)} runs (bytecode cached; start-up not counted)"
        )
        if p.before != "pass":
            how += f"; timed after `{p.before}` already ran in the same interpreter"
        rows.append(
            Row(
                SECTION,
                p.case,
                ms,
                "ms",
                target=Target("<", p.limit_ms) if p.limit_ms is not None else None,
                how=how,
                samples=tuple(s * 1e3 for s in runs),
                extra={
                    "cpu_ms": statistics.median(c for _, c in seconds[p.case]) * 1e3,
                    "min_ms": min(runs) * 1e3,
                },
            )
        )
    return rows


def run(cfg: Config) -> list[Row]:
    return rows_from(measure(cfg.import_runs))
