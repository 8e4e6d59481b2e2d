"""Run the benchmarks, print one Markdown table, write it as JSON.

    python -m benchmarks                      # everything, the published sizes
    python -m benchmarks --only dispatch      # one section (comma-separated for several)
    python -m benchmarks --quick --no-write   # smaller sizes, nothing written

Each section is a function ``(Config) -> list[Row]`` in ``SECTIONS``; a new section is one
module and one entry there (``reactions`` is the hook for reaction times on scenarios).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import dispatch, footprint, imports, jobs, reactions
from .config import Config
from .table import Row, missed, render_markdown

Section = Callable[[Config], list[Row]]

SECTIONS: dict[str, Section] = {
    "dispatch": dispatch.run,
    "footprint": footprint.run,
    "jobs": jobs.run,  # the real composed job (AgentJob) beside the bare livekit-agents job
    "imports": imports.run,
    "reactions": reactions.run,
}

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "latest.json"
QUICK = Config(events=5_000, repeats=3, jobs=(300, 3_000), import_runs=3, job_repeats=1)


def collect(cfg: Config, sections: Sequence[str], *, progress: bool = False) -> list[Row]:
    """Run the named sections in order; their rows, in order."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    rows: list[Row] = []
    for name in sections:
        if progress:
            print(f"running {name} ...", file=sys.stderr, flush=True)
        got = SECTIONS[name](cfg)
        if progress and not got:
            print(f"  {name}: no rows (not measured yet)", file=sys.stderr)
        rows.extend(got)
    return rows


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def environment() -> dict[str, Any]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_1m_at_start": round(load[0], 2) if load else None,
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "statemachines", "agent_runtime")),
        "versions": {
            d: version(d) for d in ("transitions", "pydantic", "livekit-agents", "livekit")
        },
    }


def document(
    rows: Sequence[Row],
    cfg: Config,
    sections: Sequence[str],
    command: str,
    env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "command": command,
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": env if env is not None else environment(),
        "config": asdict(cfg),
        "sections": list(sections),
        "rows": [r.to_dict() for r in rows],
        "missed": [r.case for r in missed(rows)],
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Written whole or not at all: a temporary file renamed over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="The runtime's cost beside the alternatives, measured in one run on this "
        "machine: prints one table, writes it as JSON.",
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        metavar="SECTIONS",
        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})",
    )
    p.add_argument("--quick", action="store_true", help="smaller sizes: a rough table, fast")
    p.add_argument("--events", type=int, help="events per dispatch run")
    p.add_argument("--repeats", type=int, help="runs per figure (median reported)")
    p.add_argument("--jobs", help="comma-separated job counts (footprint and composed jobs)")
    p.add_argument("--import-runs", type=int, help="fresh interpreters per import figure")
    p.add_argument("--job-repeats", type=int, help="fresh processes per composed-job CPU figure")
    p.add_argument(
        "--machine",
        choices=sorted(dispatch.WORKLOADS),
        help="the machine the dispatch benchmark drives (default: participant)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the JSON goes")
    out.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p


def config_from(args: argparse.Namespace) -> Config:
    base = QUICK if args.quick else Config()
    changes: dict[str, Any] = {}
    if args.events is not None:
        changes["events"] = args.events
    if args.repeats is not None:
        changes["repeats"] = args.repeats
    if args.jobs is not None:
        changes["jobs"] = tuple(int(n) for n in args.jobs.split(","))
    if args.import_runs is not None:
        changes["import_runs"] = args.import_runs
    if args.job_repeats is not None:
        changes["job_repeats"] = args.job_repeats
    if args.machine is not None:
        changes["machine"] = args.machine
    fields = {**asdict(base), **changes}
    fields["jobs"] = tuple(fields["jobs"])
    return Config(**fields)


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    try:
        cfg = config_from(args)
        bad = [s for s in sections if s not in SECTIONS]
        if bad or not sections:
            raise ValueError(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    except ValueError as e:
        p.error(str(e))
    given = list(argv) if argv is not None else sys.argv[1:]
    command = " ".join(["python -m benchmarks", *given])
    # read before the run: its load average is the machine's, not the benchmarks' own
    env_at_start = environment()
    rows = collect(cfg, sections, progress=True)
    doc = document(rows, cfg, sections, command, env_at_start)
    env = doc["environment"]
    print(
        f"{command}\n{env['cpu']} x{env['cpus']}, Python {env['python']}, "
        f"commit {env['commit'] or '?'}{' (dirty)' if env['dirty'] else ''}, "
        f"load {env['load_average_1m_at_start']}\n"
    )
    print(render_markdown(rows))
    misses = missed(rows)
    if misses:
        print(
            "\nmissed: " + "; ".join(f"{r.case} = {r.figure} (target {r.target})" for r in misses)
        )
    if not args.no_write:
        write_json(doc, args.out)
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 1 if args.strict and misses else 0
