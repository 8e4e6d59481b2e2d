"""The conformance run: generate the paths (``paths``), replay each through a real job
(``replay``), and say what they covered: the transition rows of every machine taken on the
way, of all the rows the composed job declares."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from verification.conformance.paths import (
    Path,
    Walker,
    counterexample_paths,
    covering_paths,
    rows_of_every_machine,
)
from verification.conformance.replay import Mismatch, run
from verification.explore.abstract import Config
from verification.explore.search import DEFAULT_CONFIGS

# how far the searches go by default: the covering search's moves and nodes per config and
# group of inputs, and the depth each fault is explored to for its counterexample
COVER_DEPTH = 9
COVER_BUDGET = 20_000
COUNTEREXAMPLE_DEPTH = 3


@dataclass
class Report:
    paths: int = 0  # replayed
    covering: int = 0
    counterexamples: int = 0
    steps: int = 0
    rows: set[tuple[str, int]] = field(default_factory=set)  # taken by a replayed path
    total: set[tuple[str, int]] = field(default_factory=set)  # every row of every machine
    mismatches: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # invariants the runtime broke
    cut_short: list[str] = field(default_factory=list)  # counterexamples followed in part
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.findings

    def missed(self) -> list[tuple[str, int]]:
        return sorted(self.total - self.rows)

    def summary(self) -> str:
        lines = [
            f"replayed {self.paths} paths ({self.covering} covering, {self.counterexamples} "
            f"from counterexamples; {self.steps} steps) through the real AgentJob in "
            f"{self.seconds:.0f} s",
            f"transition rows taken: {len(self.rows)} of {len(self.total)}",
        ]
        from statemachines.machines import MACHINES

        for m, i in self.missed():
            r = MACHINES[m].rows[i]
            lines.append(f"  not taken: {m} ({r.source}, {r.event}) -> {r.dest or 'internal'}")
        lines += [f"MISMATCH {m}" for m in self.mismatches]
        lines += [f"INVARIANT {f}" for f in self.findings]
        lines.append("the runtime follows the model on every path" if self.ok else "FAILED")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "paths": self.paths,
            "covering": self.covering,
            "counterexamples": self.counterexamples,
            "steps": self.steps,
            "rows_taken": len(self.rows),
            "rows_total": len(self.total),
            "not_taken": [list(r) for r in self.missed()],
            "mismatches": self.mismatches,
            "findings": self.findings,
        }


def conformance(
    *,
    configs: Iterable[Config] = DEFAULT_CONFIGS,
    cover_depth: int = COVER_DEPTH,
    cover_budget: int = COVER_BUDGET,
    counterexample_depth: int | None = COUNTEREXAMPLE_DEPTH,
    counterexample_configs: Iterable[Config] | None = None,
) -> Report:
    """Replay every covering path and every counterexample's path; a mismatch or a broken
    invariant is reported with its path (the run goes on to the next path)."""
    t0 = time.perf_counter()
    cs = list(configs)
    covering, _ = covering_paths(cs, depth=cover_depth, budget=cover_budget)
    cex: list[Path] = []
    cut: list[str] = []
    if counterexample_depth is not None:
        cex_configs = cs if counterexample_configs is None else list(counterexample_configs)
        cex, cut = counterexample_paths(cex_configs, depth=counterexample_depth)
    out = Report(
        paths=len(covering) + len(cex),
        covering=len(covering),
        counterexamples=len(cex),
        total=rows_of_every_machine(Walker(cs[0]).model),
        cut_short=cut,
    )
    for path in (*covering, *cex):
        try:
            done = run(path)
        except Mismatch as e:
            out.mismatches.append(str(e))
            continue
        out.steps += done.steps
        out.rows |= done.rows
        out.findings += [
            f"invariant {n} at step {i}: {what}\n{path}" for i, (n, what) in done.findings
        ]
    out.seconds = time.perf_counter() - t0
    return out
