"""``agent-runtime explore [--configs SET] [--depth N] [--deep] [--workers N] [--json]``:
exhaustive exploration of the composed job (see ``agent_runtime.tools.explore``). Exit 0
when every invariant holds, 1 with the shortest event sequence to each one that does not.

``--configs`` picks the configurations: ``default`` (the job as the example composes it,
and each setting that changes a decision both ways), ``playout`` (the same job with the
playout machine, as ``AgentJob`` runs it with an avatar), ``lifecycle`` (with the user's
``aclose()`` and ``aclose(graceful=False)`` among the inputs), or ``all`` of them."""

from __future__ import annotations

import argparse
import json
import os
import sys

from agent_runtime.tools.explore import Config, Plan, deep_plans, explore_plans
from agent_runtime.tools.explore.search import (
    DEFAULT_CONFIGS,
    LIFECYCLE_CONFIGS,
    PLAYOUT_CONFIGS,
)

CONFIG_SETS: dict[str, tuple[Config, ...]] = {
    "default": DEFAULT_CONFIGS,
    "playout": PLAYOUT_CONFIGS,
    "lifecycle": LIFECYCLE_CONFIGS,
    "all": DEFAULT_CONFIGS + PLAYOUT_CONFIGS + LIFECYCLE_CONFIGS,
}


def run(args: argparse.Namespace) -> int:
    if args.depth is not None and args.depth < 0:
        print("agent-runtime explore: --depth must be >= 0", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print("agent-runtime explore: --workers must be >= 1", file=sys.stderr)
        return 2
    configs = CONFIG_SETS[args.configs]
    deep = args.deep or bool(os.environ.get("AGENT_RUNTIME_DEEP"))
    if deep:
        plans = deep_plans(configs)
    else:
        plans = [Plan(c, g, args.depth) for g in ("job", "avatar") for c in configs]
    workers = args.workers or os.cpu_count() or 1
    report = explore_plans(plans, workers=workers)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
    return 0 if report.ok else 1
