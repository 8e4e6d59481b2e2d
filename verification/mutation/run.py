"""The driver: build the mutants, record what the tests visit, share the mutants among
worker processes, and report killed / equivalent / survived per machine."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verification.mutation.equivalent import argument
from verification.mutation.explored import DEPTH as DEFAULT_DEPTH
from verification.mutation.mutants import Mutant, all_mutants

# what the behaviour tests are: the suite and the bundled scenarios, without the tests of
# the explorer's command and of its planted faults (the exploration is a stage of its own;
# a planted fault swaps a spec, which a mutant of the same machine has replaced already)
# and of this tool (its arguments' premises read the specs as written)
DEFAULT_PATHS = ("tests", "examples/scenarios")
IGNORED = (
    "tests/test_explore_cli.py",
    "tests/test_explore_real_faults.py",
    "tests/test_mutation.py",
)
PROPS_EXAMPLES = "AGENT_RUNTIME_PROPS_EXAMPLES"


@dataclass
class Verdict:
    mutant: Mutant
    status: str  # refused | killed | equivalent | survived
    by: str = ""  # the test or invariant that killed it, or the argument, or the refusal
    reached: int = 0  # behaviour tests in which an actor decides the cell (unchanged specs)
    exercised: int = 0  # ... and decided it under the mutant
    explored: bool = False  # the exploration steps the cell
    seconds: float = 0.0
    flaky: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        m = self.mutant
        return {
            "key": m.key,
            "machine": m.machine,
            "label": m.label,
            "status": self.status,
            "by": self.by,
            "reached": self.reached,
            "exercised": self.exercised,
            "explored": self.explored,
            "seconds": round(self.seconds, 3),
            "flaky": self.flaky,
        }


def shares_of(
    todo: Sequence[tuple[float, dict[str, Any]]], workers: int
) -> list[list[dict[str, Any]]]:
    """The jobs split among ``workers``: the longest first onto the least loaded one."""
    shares: list[tuple[float, list[dict[str, Any]]]] = [(0.0, []) for _ in range(workers)]
    for cost, want in sorted(todo, key=lambda t: -t[0]):
        load, share = min(shares, key=lambda s: s[0])
        shares.remove((load, share))
        shares.append((load + cost, [*share, want]))
    return [share for _, share in shares]


def _worker(job: dict[str, Any], workdir: Path, name: str) -> subprocess.Popen[bytes]:
    path = workdir / f"{name}.json"
    job["out"] = str(workdir / f"{name}.out.json")
    path.write_text(json.dumps(job))
    log = (workdir / f"{name}.stdout").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "verification.mutation.worker", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _wait(procs: Sequence[tuple[str, subprocess.Popen[bytes]]], workdir: Path) -> None:
    for name, p in procs:
        if p.wait() != 0:
            tail = (workdir / f"{name}.stdout").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"worker {name} failed (exit {p.returncode}):\n{tail}")


def record_coverage(paths: Sequence[str], depth: int, workdir: Path) -> dict[str, Any]:
    """Run the behaviour tests once on the unchanged specs: per test its outcome, time and
    decided cells; and the cells the exploration steps."""
    job: dict[str, Any] = {
        "mode": "coverage",
        "paths": list(paths),
        "ignore": [f"--ignore={p}" for p in IGNORED],
        "explore_depth": depth,
    }
    p = _worker(job, workdir, "coverage")
    _wait([("coverage", p)], workdir)
    data: dict[str, Any] = json.loads(Path(job["out"]).read_text())
    return data


LOG_LINE = re.compile(r"^(\S+#\d+) (killed|survived) after \d+ tests, ([\d.]+)s: .*?(?:  (.*))?$")


def read_logs(paths: Iterable[Path]) -> dict[str, tuple[str, str, float]]:
    """The verdicts a cut-short run's workers logged (``mutants-N.out.json.log``): key ->
    (status, by, seconds)."""
    done: dict[str, tuple[str, str, float]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            m = LOG_LINE.match(line)
            if m is not None:
                done[m.group(1)] = (m.group(2), m.group(4) or "", float(m.group(3)))
    return done


def judge(
    mutants: Iterable[Mutant],
    coverage: dict[str, Any],
    *,
    workers: int,
    workdir: Path,
    check_arguments: bool = False,
    done: dict[str, tuple[str, str, float]] | None = None,
) -> list[Verdict]:
    tests = coverage["tests"]
    explore = coverage.get("explore")
    explored_cells = {tuple(c) for c in explore["cells"]} if explore else set()
    # the real job's runs that decided each cell (a mutant is explored from them)
    paths: dict[str, list[list[str]]] = explore["paths"] if explore else {}
    if explore and not explore["ok"]:
        print(
            "the exploration broke on the machines as written; its kills may be wrong:\n  "
            + "\n  ".join(explore.get("broke", [])),
            file=sys.stderr,
        )
    by_cell: dict[tuple[str, str, str], list[tuple[str, float]]] = {}
    for nodeid, t in tests.items():
        if t["outcome"] != "passed":
            continue  # a test that fails on the unchanged specs tells nothing
        for c in t["cells"]:
            by_cell.setdefault(tuple(c), []).append((nodeid, t["seconds"]))
    verdicts: dict[str, Verdict] = {}
    todo: list[tuple[float, dict[str, Any]]] = []
    for m in mutants:
        if m.spec is None:
            verdicts[m.key] = Verdict(m, "refused", m.refused)
            continue
        cell = (m.machine, m.state, m.event)
        selected = sorted(by_cell.get(cell, []), key=lambda t: (t[1], t[0]))
        v = verdicts[m.key] = Verdict(
            m, "survived", reached=len(selected), explored=cell in explored_cells
        )
        why = argument(m)
        if why is not None:
            v.status, v.by = "equivalent", why
            if not check_arguments:
                continue
        if not selected and not v.explored:
            continue  # nothing that judges behaviour ever decides this cell
        if done and done.get(m.key, ("",))[0] == "killed":  # killed in the run resumed
            v.status, v.by, v.seconds = done[m.key]
            continue  # a survivor is judged again: the tests may have changed since
        cost = sum(s for _, s in selected) + (30.0 if v.explored else 0.0)
        todo.append(
            (
                cost,
                {
                    "key": m.key,
                    "machine": m.machine,
                    "index": m.index,
                    "tests": selected,
                    "explore": v.explored,
                    "paths": paths.get("|".join(cell), []),
                },
            )
        )
    procs = []
    for i, share in enumerate(shares_of(todo, workers)):
        if share:
            job = {
                "mode": "mutants",
                "mutants": share,
                "explore_depth": explore["depth"] if explore else -1,
            }
            procs.append((f"mutants-{i}", _worker(job, workdir, f"mutants-{i}")))
    _wait(procs, workdir)
    for name, _ in procs:
        for r in json.loads((workdir / f"{name}.out.json").read_text()):
            v = verdicts[r["key"]]
            v.exercised, v.seconds, v.flaky = r["exercised"], r["seconds"], r["flaky"]
            if r["status"] == "killed":
                v.status, v.by = r["status"], r["by"]
    return list(verdicts.values())


def wrongly_argued(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """Killed mutants that an equivalence argument covers: the argument is wrong."""
    return [v for v in verdicts if v.status == "killed" and argument(v.mutant) is not None]


def summary(verdicts: Sequence[Verdict]) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for v in verdicts:
        for name in (v.mutant.machine, "all"):
            r = rows.setdefault(
                name,
                {"mutants": 0, "refused": 0, "killed": 0, "equivalent": 0, "survived": 0},
            )
            r["mutants"] += 1
            r[v.status] += 1
    if "all" in rows:  # last
        rows["all"] = rows.pop("all")
    return rows


def format_report(
    verdicts: Sequence[Verdict],
    seconds: dict[str, float],
    workers: int,
    *,
    examples: int | None = None,
) -> str:
    lines = [
        "behaviour-only mutation score: single-cell mutants of every machine, judged by the "
        "behaviour tests and the exploration (golden and per-cell tables left out)",
        *([f"property tests at {examples} examples each"] if examples else []),
        "",
        f"{'machine':<14}{'mutants':>8}{'refused':>8}{'valid':>7}{'killed':>8}"
        f"{'equiv.':>8}{'survived':>9}   score",
    ]
    for name, r in summary(verdicts).items():
        valid = r["mutants"] - r["refused"]
        judged = valid - r["equivalent"]
        score = f"{r['killed']}/{judged} = {100 * r['killed'] / judged:.1f}%" if judged else "-"
        lines.append(
            f"{name:<14}{r['mutants']:>8}{r['refused']:>8}{valid:>7}{r['killed']:>8}"
            f"{r['equivalent']:>8}{r['survived']:>9}   {score}"
        )
    by_test = sum(1 for v in verdicts if v.status == "killed" and "exploration" not in v.by)
    by_explore = sum(1 for v in verdicts if v.status == "killed" and "exploration" in v.by)
    lines += [
        "",
        f"killed by a behaviour test: {by_test}; by the exploration only: {by_explore}",
        "score = killed / (valid - equivalent); refused = the spec model does not load it",
        f"time: coverage {seconds['coverage']:.0f}s, mutants {seconds['mutants']:.0f}s "
        f"on {workers} worker(s), total {seconds['total']:.0f}s",
    ]
    survivors = [v for v in verdicts if v.status == "survived"]
    if survivors:
        lines += ["", f"survivors ({len(survivors)}): no behaviour test notices"]
        for v in survivors:
            where = (
                f"decided by {v.reached} test(s), {v.exercised} under the mutant"
                if v.reached
                else "decided by no behaviour test"
            ) + ("; explored" if v.explored else "")
            lines.append(f"  {v.mutant.label}  [{where}]")
    wrong = wrongly_argued(verdicts)
    if wrong:
        lines += ["", "argued equivalent, yet killed (fix the argument):"]
        lines += [f"  {v.mutant.label}  [{v.by}]" for v in wrong]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="dev.py mutation",
        description="The behaviour-only mutation score of the machines. Run from the "
        "repository root. Exit 0 when every mutant is killed, refused or argued equivalent.",
    )
    ap.add_argument("--machine", action="append", help="only this machine (repeatable)")
    ap.add_argument(
        "--cell", action="append", metavar="STATE,EVENT", help="only this cell (repeatable)"
    )
    ap.add_argument(
        "--tests",
        nargs="+",
        default=list(DEFAULT_PATHS),
        metavar="PATH",
        help=f"the behaviour tests (default: {' '.join(DEFAULT_PATHS)})",
    )
    ap.add_argument(
        "--explore-depth",
        type=int,
        default=DEFAULT_DEPTH,
        help=f"the exploration stage's breadth-first depth in each config, before its walks "
        f"(default {DEFAULT_DEPTH}; -1: no exploration)",
    )
    ap.add_argument(
        "--props-examples",
        type=int,
        metavar="N",
        help="examples per property test (default: the suite's own); fewer makes a "
        "surviving mutant cheaper to judge and the judgement weaker",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--coverage", metavar="FILE", help="reuse (or, if absent, write) this")
    ap.add_argument("--json", metavar="FILE", help="write every verdict here")
    ap.add_argument(
        "--resume",
        nargs="+",
        metavar="LOG",
        help="keep the kills a cut-short run's workers logged (mutants-N.out.json.log); "
        "its survivors are judged again",
    )
    ap.add_argument(
        "--system",
        action="store_true",
        help="the mutants of the system between the machines instead (links, watches, "
        "reports, routes, the follow order, the teardowns): verification/mutation/system.py",
    )
    ap.add_argument(
        "--mutant", action="append", metavar="NAME", help="with --system: only this one"
    )
    ap.add_argument(
        "--check-arguments",
        action="store_true",
        help="run the mutants argued equivalent too (a kill means the argument is wrong)",
    )
    args = ap.parse_args(argv)
    if not Path("tests").is_dir() or not Path("pyproject.toml").is_file():
        ap.error("run it from the repository root (where tests/ and pyproject.toml are)")
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    if args.props_examples is not None:
        if args.props_examples < 1:
            ap.error("--props-examples must be at least 1")
        # read by tests/test_properties.py in every worker (they inherit the environment)
        os.environ[PROPS_EXAMPLES] = str(args.props_examples)
    if args.system:
        return _system(args, ap)
    t0 = time.perf_counter()
    try:
        mutants = all_mutants(args.machine)
    except ValueError as e:
        ap.error(str(e))
    if args.cell:
        wanted = {tuple(c.split(",", 1)) for c in args.cell}
        mutants = [m for m in mutants if (m.state, m.event) in wanted]
    depth = args.explore_depth
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        workdir = Path(tmp)
        t1 = time.perf_counter()
        if args.coverage and Path(args.coverage).is_file():
            coverage = json.loads(Path(args.coverage).read_text())
            explored = coverage.get("explore")
            if explored and "paths" not in explored:  # the model's, before the real job's
                ap.error(f"{args.coverage} has no runs of the real job: record it again")
            # a shallower exploration than the one recorded: judge at that depth
            if explored and depth < 0:
                coverage["explore"] = None
            elif explored and depth < explored["depth"]:
                explored["depth"] = depth
        else:
            coverage = record_coverage(args.tests, depth, workdir)
            if args.coverage:
                Path(args.coverage).write_text(json.dumps(coverage))
        t2 = time.perf_counter()
        verdicts = judge(
            mutants,
            coverage,
            workers=args.workers,
            workdir=workdir,
            check_arguments=args.check_arguments,
            done=read_logs(Path(p) for p in args.resume or ()),
        )
        t3 = time.perf_counter()
    seconds = {"coverage": t2 - t1, "mutants": t3 - t2, "total": t3 - t0}
    print(format_report(verdicts, seconds, args.workers, examples=args.props_examples), end="")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "summary": summary(verdicts),
                    "seconds": seconds,
                    "workers": args.workers,
                    "explore_depth": depth,
                    "props_examples": args.props_examples,
                    "mutants": [v.as_dict() for v in verdicts],
                },
                indent=1,
            )
        )
    bad = any(v.status == "survived" for v in verdicts) or wrongly_argued(verdicts)
    return 1 if bad else 0


def _system(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    from verification.mutation.system_run import system_main

    if args.machine or args.cell or args.resume or args.check_arguments:
        ap.error("--system takes none of --machine, --cell, --resume, --check-arguments")
    depth = args.explore_depth
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        try:
            return system_main(
                args.mutant,
                tests=args.tests,
                coverage_file=args.coverage,
                workers=args.workers,
                explore_depth=depth,
                json_out=args.json,
                workdir=Path(tmp),
            )
        except ValueError as e:
            ap.error(str(e))
