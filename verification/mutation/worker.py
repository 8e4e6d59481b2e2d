"""One process of a mutation run: ``python -m verification.mutation.worker JOB.json``.

``coverage``: run the behaviour tests once on the unchanged specs (pytest, in this
process) and record, for each test, its outcome, its time and the cells the actors
decided; then the cells the exploration steps, to the job's depth.

``mutants``: collect the tests the job names once, then for each mutant: swap it in, run
its tests fastest first until one fails (a test that fails is run again on the unchanged
specs and counts only if it passes there), then, if none did and the exploration reaches
its cell, explore with it. Each test runs under a time budget; one that runs past it is a
failure (the user would be waiting too).

Hypothesis draws part of its data from constants in the project's loaded modules; a worker
loads other modules than the suite does, so they are left out here: every worker, and every
run, draws the same examples.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from statemachines.machines import MACHINES
from verification.mutation.mutants import Mutant, mutants_of
from verification.mutation.swap import Visits, swapped
from verification.mutation.system import SystemMutant, Touches, applied, by_name

# the marker of tests that pin the specs as written (left out of the behaviour-only run)
SNAPSHOT = "snapshot"
# the marker of the long tier (property tests at length, the whole space explored): the
# behaviour-only run judges with the default tier's
EXHAUSTIVE = "exhaustive"


class TestTimeout(Exception):
    """The test ran past its budget under a mutant."""


@contextmanager
def _budget(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise TestTimeout(f"still running after {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    # again every second until the test gives up: code under test that swallows the first
    # (an event loop's callback, a task) would otherwise wait forever
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _same_examples_everywhere() -> None:
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - hypothesis is a dev dependency
        return
    empty = providers.Constants()  # type: ignore[attr-defined]
    providers._get_local_constants = lambda: empty


# how long the exploration stage may take for one mutant (a mutant that makes a run loop
# is cut as a test would be, and survives: nothing could be seen)
EXPLORE_BUDGET = 600.0


def _explore(swap: Any, depth: int, paths: list[list[str]] | None = None) -> str:
    """The exploration stage's verdict with the mutant in force (``swap``): from the runs
    that decided its cell (``paths``), or over every config (a system mutant: ``None``).
    A violation counts only if its run breaks nothing without the mutant."""
    from verification.mutation.explored import (
        confirmed,
        explore_cell,
        first_violation,
        verdict,
    )

    try:
        with _budget(EXPLORE_BUDGET), swap:
            v = first_violation(depth) if paths is None else explore_cell(paths, depth)
    except TestTimeout:
        return ""
    if v is not None and not confirmed(v):
        return ""  # its run breaks without the mutant too: not the mutant's doing
    return verdict(v)


# the playout machine's own table is explored against its world too, in every option world
# its tests explore (watchdog on/off, 0 to 2 re-prompts)
PLAYOUT_WORLDS = tuple((watchdog, n) for watchdog in (True, False) for n in (0, 1, 2))


def _explore_playout(spec: Any) -> str:
    """The first broken guarantee of the playout exploration with ``spec``, or ""."""
    from verification.explore.playout import explore_playout

    for watchdog, n in PLAYOUT_WORLDS:
        report = explore_playout(spec, watchdog=watchdog, max_reprompts=n)
        if report.problems:
            p = min(report.problems, key=lambda p: (p.check, len(p.path)))
            return f"exploration: playout check {p} [watchdog={watchdog}, max_reprompts={n}]"
    return ""


class _Coverage:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.visits = Visits()
        self.touches = Touches()
        self.tests: dict[str, dict[str, Any]] = {}

    def _entry(self, nodeid: str) -> dict[str, Any]:
        return self.tests.setdefault(
            nodeid, {"seconds": 0.0, "outcome": "passed", "cells": [], "system": []}
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Iterator[None]:
        self.visits.cells = set()
        self.touches.touched = set()
        with self.visits.installed(), self.touches.installed():
            yield
        entry = self._entry(item.nodeid)
        entry["cells"] = sorted(self.visits.cells)
        entry["system"] = sorted(self.touches.touched)  # what it reached of the system

    def pytest_runtest_logreport(self, report: Any) -> None:
        e = self._entry(report.nodeid)
        e["seconds"] += report.duration
        if report.failed:
            e["outcome"] = "failed"
        elif report.skipped and e["outcome"] == "passed":
            e["outcome"] = "skipped"

    def finish(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tests": self.tests, "explore": None}
        depth = self.job.get("explore_depth", -1)
        if depth >= 0:
            from verification.mutation.explored import reach

            t0 = time.perf_counter()
            paths, broke = reach(depth)  # the real job's: the runs that decided each cell
            visits = Visits()
            with visits.installed(pure=True):
                found = _explore_playout(MACHINES["playout"])
            # the cells the stage judges: the playout table's (its exploration judges them),
            # and each cell some run of the real job decided, with those runs
            real = {tuple(k.split("|")) for k in paths}
            out["explore"] = {
                "depth": depth,
                "ok": not found and not broke,
                "broke": [str(v) for v in broke[:5]],
                "seconds": time.perf_counter() - t0,
                "cells": sorted({*visits.cells, *real}),
                "paths": {k: [[c, *p] for c, p in v] for k, v in paths.items()},
            }
        return out


class _Mutants:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.results: list[dict[str, Any]] = []
        self.visits = Visits()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: Any) -> bool:
        self.judge_all({item.nodeid: item for item in session.items})
        return True

    def judge_all(self, items: dict[str, Any]) -> None:
        from _pytest.runner import runtestprotocol

        built: dict[str, list[Mutant]] = {}
        # what the imports and the collection built lives as long as this process: frozen,
        # it is left out of every collection below (each full one walked all of it, about as
        # long as a test takes); what a test leaves is still collected
        gc.collect()
        gc.freeze()

        def run(nodeid: str, budget: float) -> str:
            try:
                with _budget(budget):
                    reports = runtestprotocol(items[nodeid], nextitem=None, log=False)
            except TestTimeout:
                return "timeout"
            except SystemError as e:
                # the alarm went off inside the compiler while pytest formatted a failure
                if "recursion depth mismatch" in str(e):
                    return "timeout"
                raise
            finally:
                # what a failed test left pending (its loop is closed) is collected here,
                # not at a random point of the next run: a finalizer run by the collector
                # inside the compiler breaks it ("recursion depth mismatch"), which made a
                # clean re-run on the unchanged specs fail and the kill count as flaky
                gc.collect()
            failed = [r for r in reports if r.failed]
            if any("TestTimeout" in str(r.longrepr) for r in failed):
                return "timeout"
            return "failed" if failed else "passed"

        if self.job.get("system"):
            self.judge_system(run)
            return
        for want in self.job["mutants"]:
            machine = want["machine"]
            if machine not in built:
                built[machine] = mutants_of(MACHINES[machine])
            m = built[machine][want["index"]]
            assert m.key == want["key"] and m.spec is not None, want
            self.results.append(self.judge(m, want, run))
            with open(self.job["out"] + ".log", "a") as log:
                r = self.results[-1]
                log.write(
                    f"{m.key} {r['status']} after {r['tests_run']} tests, {r['seconds']:.1f}s: "
                    f"{m.label}  {r['by']}\n"
                )

    def judge(self, m: Mutant, want: dict[str, Any], run: Any) -> dict[str, Any]:
        assert m.spec is not None
        original = MACHINES[m.machine]
        t0 = time.perf_counter()
        result: dict[str, Any] = {
            "key": m.key,
            "status": "survived",
            "by": "",
            "tests_run": 0,
            "exercised": 0,  # tests in which an actor decided the changed cell
            "flaky": [],
        }
        self.visits.watch = (m.spec, m.state, m.event)
        for nodeid, seconds in want["tests"]:
            budget = max(5.0, 10 * seconds)
            self.visits.watched = False
            with self.visits.installed(), swapped(original, m.spec):
                outcome = run(nodeid, budget)
            result["tests_run"] += 1
            result["exercised"] += self.visits.watched
            if outcome == "passed":
                continue
            # a kill counts only if the same test passes on the unchanged specs
            if run(nodeid, budget) != "passed":
                result["flaky"].append(nodeid)
                continue
            result["status"], result["by"] = "killed", f"{nodeid} ({outcome})"
            break
        if result["status"] == "survived" and want["explore"] and m.machine == "playout":
            found = _explore_playout(m.spec)
            if found:
                result["status"], result["by"] = "killed", found
        elif result["status"] == "survived" and want["explore"]:
            swap = swapped(original, m.spec)
            found = _explore(swap, self.job["explore_depth"], want["paths"])
            if found:
                result["status"], result["by"] = "killed", found
        result["seconds"] = time.perf_counter() - t0
        return result

    def judge_system(self, run: Any) -> None:
        """The system mutants the job names: each one's tests, fastest first, until one
        fails under it and passes without it; then, if none did, the exploration with it
        in force."""
        mutants = {m.name: m for m in by_name([w["key"] for w in self.job["mutants"]])}
        for want in self.job["mutants"]:
            m: SystemMutant = mutants[want["key"]]
            t0 = time.perf_counter()
            result: dict[str, Any] = {
                "key": m.name,
                "status": "survived",
                "by": "",
                "tests_run": 0,
                "exercised": 0,
                "flaky": [],
            }
            for nodeid, seconds in want["tests"]:
                budget = max(5.0, 10 * seconds)
                with applied(m):
                    outcome = run(nodeid, budget)
                result["tests_run"] += 1
                if outcome == "passed":
                    continue
                if run(nodeid, budget) != "passed":  # it fails without the mutant too
                    result["flaky"].append(nodeid)
                    continue
                result["status"], result["by"] = "killed", f"{nodeid} ({outcome})"
                break
            if result["status"] == "survived" and want["explore"]:
                found = _explore(applied(m), self.job["explore_depth"])
                if found:
                    result["status"], result["by"] = "killed", found
            result["seconds"] = time.perf_counter() - t0
            self.results.append(result)
            with open(self.job["out"] + ".log", "a") as log:
                log.write(
                    f"{m.name} {result['status']} after {result['tests_run']} tests, "
                    f"{result['seconds']:.1f}s: {m.what}  {result['by']}\n"
                )


def main(argv: list[str]) -> int:
    (job_path,) = argv
    job = json.loads(Path(job_path).read_text())
    os.environ.setdefault("PROPS_DEV", "1")  # property tests: report the first failure as found
    _same_examples_everywhere()
    args = ["-p", "no:cacheprovider", "-q", "--no-header", "-W", "ignore"]
    if job["mode"] == "coverage":
        cov = _Coverage(job)
        code = pytest.main(
            # this -m replaces the default one, which leaves out the exhaustive tier too
            [*args, "-m", f"not {SNAPSHOT} and not {EXHAUSTIVE}", *job["ignore"], *job["paths"]],
            plugins=[cov],
        )
        if code not in (0, 1):  # 1: some tests failed (they are left out of the selection)
            print(f"coverage run failed: pytest exit {code}", file=sys.stderr)
            return 2
        Path(job["out"]).write_text(json.dumps(cov.finish()))
        return 0
    muts = _Mutants(job)
    nodeids = sorted({nodeid for m in job["mutants"] for nodeid, _ in m["tests"]})
    if nodeids:
        code = pytest.main([*args, *nodeids], plugins=[muts])
        if code not in (0, 1):
            print(f"mutant run failed: pytest exit {code}", file=sys.stderr)
            return 2
    else:  # the exploration alone judges these
        muts.judge_all({})
    Path(job["out"]).write_text(json.dumps(muts.results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
