"""The mutation run's exploration stage: the real job explored with the mutant in force.

Every config of ``verification.explore.config.CONFIGS``, breadth first to ``depth``
inputs, then ``WALKS`` seeded walks of ``STEPS`` inputs each, stopping at the first
violation. Runs are deterministic (a fresh job on virtual time, inputs drawn from the
walk's seed), so the stage judges a mutant the same way every time, and the cells it
decides on the machines as written are a fixed set (the coverage run records them).
"""

from __future__ import annotations

from collections.abc import Iterable

from verification.explore.config import CONFIGS
from verification.explore.real import Violation
from verification.explore.realsearch import bfs, walk

DEPTH = 1  # --explore-depth's default
WALKS = 40
STEPS = 20


def first_violation(
    depth: int = DEPTH,
    *,
    configs: Iterable[str] = CONFIGS,
    walks: int = WALKS,
    steps: int = STEPS,
) -> Violation | None:
    """The first violation found in ``configs``, in order: each breadth first, then its
    walks (seeds 0 to ``walks - 1``)."""
    for name in configs:
        config = CONFIGS[name]
        report = bfs(config, name, depth=depth, stop_at_first=True)
        if report.violations:
            return report.violations[0]
        for seed in range(walks):
            r = walk(config, seed, steps)
            if r.violation is not None:
                r.violation.config = name
                return r.violation
    return None


def explore(depth: int) -> str:
    """The stage's verdict: the first violation (its config, path and invariant), or ""."""
    v = first_violation(depth)
    if v is None:
        return ""
    how = f"walk seed {v.seed}" if v.seed is not None else "breadth first"
    return (
        f"exploration: {v.config}, {how}: invariant {v.invariant} ({v.detail}) after "
        f"{','.join(v.path) or 'the start'}"
    )
