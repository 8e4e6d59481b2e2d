"""``python3 dev.py explore [--configs SET] [--depth N] [--deep] [--workers N] [--json]``
(``python -m verification.explore`` in the venv): exhaustive exploration of the composed
job (see ``verification.explore``). Exit 0 when every invariant holds, 1 with the shortest
event sequence to each one that does not, 2 on a usage error.

``--real`` explores the real job instead (``verification.explore.realsearch``): breadth
first (``--depth``, ``--budget``), or seeded random walks (``--seed``, ``--walks``,
``--steps``), or one printed path again (``--replay``).

``--configs`` picks the configurations: ``default`` (the job as the example composes it,
and each setting that changes a decision both ways), ``playout`` (the same job with the
playout machine, as ``AgentJob`` runs it with an avatar), ``lifecycle`` (with the user's
``aclose()`` and ``aclose(graceful=False)`` among the inputs), or ``all`` of them."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from verification.explore import Config, Plan, deep_plans, explore_plans
from verification.explore.search import (
    DEFAULT_CONFIGS,
    LIFECYCLE_CONFIGS,
    NAMED_CONFIGS,
    PLAYOUT_CONFIGS,
)

PROG = "dev.py explore"
CONFIG_SETS: dict[str, tuple[Config, ...]] = {
    "default": DEFAULT_CONFIGS,
    "playout": PLAYOUT_CONFIGS,
    "lifecycle": LIFECYCLE_CONFIGS,
    "all": DEFAULT_CONFIGS + PLAYOUT_CONFIGS + LIFECYCLE_CONFIGS,
}


def parser() -> argparse.ArgumentParser:
    exp = argparse.ArgumentParser(
        prog=PROG,
        description="Breadth-first exploration of an abstract model of the job's machines "
        "together. By default every world the model can reach (layer after layer until "
        "nothing new appears); exit 1 with the shortest event sequence to each violation.",
    )
    exp.add_argument(
        "--configs",
        choices=tuple(CONFIG_SETS),
        default="default",
        help="which configurations: the job as the example composes it and each setting "
        "both ways (default); with the playout machine; with the user's aclose() and "
        "aclose(graceful=False) among the inputs; or all of them",
    )
    exp.add_argument("--depth", type=int, metavar="N", help="stop after N inputs/timeouts")
    exp.add_argument(
        "--deep",
        action="store_true",
        help="also every input together and finer interleavings (or AGENT_RUNTIME_DEEP=1)",
    )
    exp.add_argument("--workers", type=int, metavar="N", help="processes (default: CPUs)")
    exp.add_argument("--json", action="store_true", help="print the report as JSON")
    real = exp.add_argument_group("the real job (--real)")
    real.add_argument(
        "--real",
        action="store_true",
        help="drive the real AgentJob (its system, actors, links and teardown; the SDK's "
        "outside stood in, on a virtual clock), not the model: breadth first to --depth "
        "(3 unless given), or walks with --seed, or --replay",
    )
    real.add_argument("--config", choices=(*NAMED_CONFIGS, "watchdog"), default="example")
    real.add_argument(
        "--inputs",
        choices=("all", "job", "avatar", "playout"),
        default="all",
        help="which inputs: the job's, the avatar's, what the playout machine hears of "
        "(the avatar's start and presence, the user, the agent's speech, time), or all "
        "(default)",
    )
    real.add_argument(
        "--budget", type=int, default=5_000, metavar="STATES", help="stop at this many states"
    )
    real.add_argument("--seed", type=int, metavar="S", help="random walks from seed S")
    real.add_argument("--walks", type=int, default=20, metavar="K", help="walks (seeds S..S+K-1)")
    real.add_argument("--steps", type=int, default=12, metavar="M", help="inputs a walk")
    real.add_argument(
        "--replay", metavar="PATH", help="run a printed path again (inputs joined by commas)"
    )
    real.add_argument(
        "--prefix",
        metavar="PATH",
        help="start every walk or search where this path leads (inputs joined by commas), "
        "e.g. the avatar joined: avatar_start,plugin_routed,plugin_returns,avatar_joins,"
        "avatar_video",
    )
    real.add_argument(
        "--policy",
        choices=("return", "hang"),
        default="return",
        help="with --replay: how the stand-ins end once time passes alone",
    )
    real.add_argument(
        "--drop-link",
        metavar="SOURCE:ON:TARGET",
        help="a planted fault: the runtime does not deliver this link of statemachines.glue "
        "(or this watch of statemachines.system, as SOURCE:EVENT:TARGET)",
    )
    real.add_argument(
        "--write-scenario",
        metavar="DIR",
        help="write each violation as a scenario file in DIR (made if missing), which "
        "`agent-runtime simulate FILE` replays to the same failure (its expect block "
        "checks every invariant); a run a scenario cannot reproduce is named, with why",
    )
    return exp


def run(args: argparse.Namespace) -> int:
    if args.real:
        # imported here: the real job needs livekit, which the model's explorer (and its
        # spawned workers, which import this module) does without
        from verification.explore.realsearch import run_real

        return run_real(args)
    if args.depth is not None and args.depth < 0:
        print(f"{PROG}: --depth must be >= 0", file=sys.stderr)
        return 2
    if args.workers is not None and args.workers < 1:
        print(f"{PROG}: --workers must be >= 1", file=sys.stderr)
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


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))
