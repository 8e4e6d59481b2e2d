"""The mutation run's exploration stage: the real job explored with the mutant in force.

A cell mutant changes what one cell decides, so only a run that decides that cell can
tell it from the machine as written (runs are deterministic: a fresh job on virtual
time, inputs drawn from a path or a seed). The coverage run explores the machines as
written (``reach``: every config breadth first to ``depth`` inputs, then ``WALKS`` seeded
walks of ``STEPS``) and keeps, for each cell decided, the ``PATHS`` shortest runs that
decided it. A mutant of that cell is then explored from each of them (``explore_cell``):
the run itself again (the world answering, then hanging what may hang), breadth first
``depth`` more inputs from where it leads, and a few walks from there. A system mutant
changes no one cell: ``first_violation`` explores every config as the coverage run does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from verification.explore.config import CONFIGS
from verification.explore.real import Policy, Run, Violation, run
from verification.explore.realsearch import bfs, walk, walks

DEPTH = 1  # --explore-depth's default
WALKS = 300  # the coverage run's walks in each config
STEPS = 25
PATHS = 3  # the runs kept for each cell: the shortest ones
FROM_PATH_WALKS = 10  # walks from where each kept run leads, and their length
FROM_PATH_STEPS = 10

Cell = tuple[str, str, str]  # (machine, state, event)
Found = tuple[str, tuple[str, ...]]  # (config, input path)


def key(cell: Cell) -> str:
    return "|".join(cell)


def reach(
    depth: int = DEPTH, *, walks_: int = WALKS, steps: int = STEPS
) -> tuple[dict[str, list[Found]], list[Violation]]:
    """For every cell the exploration of the machines as written decides, the shortest
    runs that decided it (``key(cell)`` -> up to ``PATHS`` (config, path), each path cut
    after the input that decided the cell); and what broke on the way (nothing should:
    a violation there would make every mutant of its cells look killed)."""
    found: dict[str, list[Found]] = {}
    broke: list[Violation] = []

    def note(config: str, r: Run) -> None:
        if r.violation is not None:
            broke.append(r.violation)
        for cell, at in r.decided.items():
            kept = found.setdefault(key(cell), [])
            item = (config, tuple(r.path[:at]))
            if item not in kept:
                kept.append(item)
                kept.sort(key=lambda f: (len(f[1]), f))
                del kept[PATHS:]

    for name, config in CONFIGS.items():
        noted = functools.partial(note, name)
        bfs(config, name, depth=depth, on_run=noted)
        walks(config, name, seed=0, count=walks_, steps=steps, on_run=noted)
    return found, broke


def explore_cell(paths: Iterable[Sequence[str]], depth: int = DEPTH) -> Violation | None:
    """The first violation found from the runs that decided the cell (each a
    ``(config, *inputs)`` sequence, as ``reach`` keeps them): breadth first from where the
    run leads (its own end included, the world answering, then hanging what may hang),
    then walks from there. A run the mutant does not let happen (an input of it no longer
    enabled) is passed over."""
    for config_name, *path in paths:
        config, prefix = CONFIGS[config_name], tuple(path)
        try:
            report = bfs(config, config_name, depth=depth, prefix=prefix, stop_at_first=True)
            if report.violations:
                return report.violations[0]
            for seed in range(FROM_PATH_WALKS):
                w = walk(config, seed, FROM_PATH_STEPS, prefix=prefix)
                if w.violation is not None:
                    w.violation.config = config_name
                    return w.violation
        except ValueError:  # the mutant changed what the run could do before its end
            continue
    return None


def confirmed(v: Violation) -> bool:
    """Whether the violation is the mutant's: its run, on the machines as written (call it
    outside the swap), breaks nothing, or cannot happen (the mutant made it)."""
    policy: Policy = "hang" if v.policy == "hang" else "return"
    try:
        again = run(CONFIGS[v.config], v.path, policy=policy)
    except ValueError:
        return True
    return again.violation is None


def first_violation(
    depth: int = DEPTH,
    *,
    configs: Iterable[str] = CONFIGS,
    walks: int = 40,
    steps: int = 20,
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


def verdict(v: Violation | None) -> str:
    """The stage's verdict on a mutant: the violation and how to replay it, or ""."""
    if v is None:
        return ""
    how = f"walk seed {v.seed}" if v.seed is not None else "breadth first"
    replay = str(v).rsplit("replay: ", 1)[-1]
    return f"exploration: {v.config}, {how}: invariant {v.invariant} ({v.detail}); replay: {replay}"
