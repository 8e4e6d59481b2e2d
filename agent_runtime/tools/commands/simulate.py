"""``agent-runtime simulate [FILE ...] [--json] [--trace OUT.jsonl] [--html PAGE.html]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from ...testing.expect import check_expect
from ...testing.scenario import Scenario, ScenarioError, load_scenario

DEFAULT_DIR = Path("examples/scenarios")


def _files(args: argparse.Namespace) -> list[Path]:
    if args.files:
        return [Path(f) for f in args.files]
    here = DEFAULT_DIR
    if not here.is_dir():  # run from elsewhere: the scenarios beside the installed project
        here = Path(__file__).resolve().parents[2] / DEFAULT_DIR
    return sorted(here.glob("*.yaml"))


def _summary(path: Path, scenario: Scenario, result: dict[str, Any], failures: list[str]) -> str:
    facts = result["facts"]
    status = "ok" if not failures else "FAILED"
    if scenario.expect is None:
        status = "ran (no expect block)"
    lines = [f"{scenario.name}  [{path.name}]  {status}"]
    lines.append(
        "  final: " + ", ".join(f"{m}={s}" for m, s in sorted(result["final_states"].items()))
    )
    keys = (
        "audio_output",
        "finalize_answered",
        "verdict",
        "session_closed_at",
        "room_deleted_at",
        "job_closed_at",
    )
    lines.append("  facts: " + ", ".join(f"{k}={json.dumps(facts.get(k))}" for k in keys))
    if facts.get("rpcs_sent"):
        rpcs = ", ".join(
            f"{r['method']}->{r['destination']}:{r['outcome']}@{r['t']:g}"
            for r in facts["rpcs_sent"]
        )
        lines.append(f"  rpcs:  {rpcs}")
    lines += [f"  expect failed: {f}" for f in failures]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "html", None):
        from .timeline import simulate_then_draw  # the page is drawn from the run's trace

        return simulate_then_draw(args, _simulate)
    return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    from ...testing.runner import run_scenario  # imports livekit.agents: only when simulating

    files = _files(args)
    if not files:
        print("no scenario files found", file=sys.stderr)
        return 2
    if args.json and len(files) != 1:
        print("--json prints the result object of exactly one FILE", file=sys.stderr)
        return 2
    if args.trace and len(files) != 1:
        print("--trace records exactly one FILE", file=sys.stderr)
        return 2
    scenarios: list[tuple[Path, Scenario]] = []
    for f in files:
        try:
            scenarios.append((f, load_scenario(f)))
        except ScenarioError as e:
            print(f"invalid scenario: {e}", file=sys.stderr)
            return 2
    worst = 0
    for path, scenario in scenarios:
        result = asyncio.run(run_scenario(scenario, trace_path=args.trace))
        failures = check_expect(scenario.expect, result)
        result["expect"] = (
            None if scenario.expect is None else {"held": not failures, "failures": failures}
        )
        if failures:
            worst = 1
        if args.json:
            print(json.dumps(result, indent=2, sort_keys=True))
        else:
            print(_summary(path, scenario, result, failures))
    if not args.json:
        held = sum(1 for _, s in scenarios if s.expect is not None)
        print(
            f"\n{len(scenarios)} scenario(s) run, {held} with expectations: "
            f"{'all held' if worst == 0 else 'some failed'}"
        )
    return worst
