"""``python3 dev.py explore`` (``python -m verification.explore`` in the venv): the real
job explored (``verification.explore.realsearch``): breadth first (``--depth``,
``--budget``), or seeded random walks (``--seed``, ``--walks``, ``--steps``), or one
printed path again (``--replay``). Exit 0 when every invariant holds, 1 with each
violation (its path, and its seed for a walk), 2 on a usage error."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from verification.explore.config import CONFIGS

PROG = "dev.py explore"


def parser() -> argparse.ArgumentParser:
    real = argparse.ArgumentParser(
        prog=PROG,
        description="Explore the real AgentJob (its system, actors, links, watches and "
        "teardown; the SDK's outside stood in, on virtual time): breadth first to --depth "
        "(3 unless given), or seeded walks with --seed, or one path again with --replay. "
        "Exit 1 with each violation's path (and seed).",
    )
    real.add_argument("--depth", type=int, metavar="N", help="breadth first to N inputs")
    real.add_argument("--json", action="store_true", help="print the report as JSON")
    real.add_argument("--config", choices=tuple(CONFIGS), default="example")
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
        help="a planted fault: the runtime does not deliver this link of statemachines.links "
        "(or this watch of statemachines.system.WATCHES, as SOURCE:EVENT:TARGET, or this "
        "report of statemachines.system.REPORTS, as SOURCE:REPORT:TARGET)",
    )
    real.add_argument(
        "--write-scenario",
        metavar="DIR",
        help="write each violation as a scenario file in DIR (made if missing), which "
        "`agent-runtime simulate FILE` replays to the same failure (its expect block "
        "checks every invariant); a run a scenario cannot reproduce is named, with why",
    )
    return real


def run(args: argparse.Namespace) -> int:
    # imported here: parsing the options (and --help) needs no livekit
    from verification.explore.realsearch import run_real

    return run_real(args)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))
