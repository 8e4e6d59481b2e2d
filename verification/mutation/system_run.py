"""``python3 dev.py mutation --system``: the mutants of the system between the machines
(``system``), each judged by the behaviour tests that reach what it changes, then, if it
survives them, by the exploration of the real job with it in force.

The tests are the cell mutants' (the suite without ``snapshot`` and the explorer's command
and mutation tests); a coverage run on the unchanged system records which
parts of the system each one reaches, and a mutant runs only the tests that reached its
part, fastest first, until one fails under it and passes without it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verification.mutation.system import SystemMutant

# the tests that state the system's declarations as written (the posts, routes, orders and
# shares they expect are spelled out): they catch any change of the tables by construction,
# as the golden tables catch any cell change, so they judge no system mutant
DECLARATION_TESTS = (
    "tests/test_glue.py::test_the_wiring_posts_exactly_the_declared_links_whose_flags_hold",
    "tests/test_routing.py::test_a_machine_follows_exactly_its_routes_with_the_shared_conditions",
    "tests/test_routing.py::test_machines_hear_a_fact_in_the_declared_order_whatever_order_",
    "tests/test_routing.py::test_a_link_with_a_flag_fires_only_when_the_job_sets_it",
    "tests/test_teardown.py::test_the_declared_teardowns_leave_the_callbacks_their_share",
)


@dataclass
class SystemVerdict:
    mutant: SystemMutant
    status: str = "survived"  # killed | survived
    by: str = ""
    reached: int = 0  # behaviour tests that reach what it changes (unchanged system)
    tests_run: int = 0
    explored: bool = False  # the exploration judged it too
    seconds: float = 0.0
    flaky: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.mutant.name,
            "what": self.mutant.what,
            "status": self.status,
            "by": self.by,
            "reached": self.reached,
            "tests_run": self.tests_run,
            "explored": self.explored,
            "seconds": round(self.seconds, 3),
            "flaky": self.flaky,
        }


def selected_tests(m: SystemMutant, coverage: dict[str, Any]) -> list[tuple[str, float]]:
    """The passing behaviour tests that reached what ``m`` changes, fastest first."""
    out = []
    for nodeid, t in coverage["tests"].items():
        if nodeid.startswith(DECLARATION_TESTS):
            continue
        if t["outcome"] == "passed" and m.selects(frozenset(t.get("system", ()))):
            out.append((nodeid, t["seconds"]))
    return sorted(out, key=lambda t: (t[1], t[0]))


def judge_system(
    mutants: Sequence[SystemMutant],
    coverage: dict[str, Any],
    *,
    workers: int,
    workdir: Path,
    explore_depth: int,
) -> list[SystemVerdict]:
    from verification.mutation.run import _wait, _worker, shares_of

    if any("system" not in t for t in coverage["tests"].values()):
        raise ValueError("this coverage file has no system touches: record it again")
    verdicts = {m.name: SystemVerdict(m) for m in mutants}
    explore = explore_depth >= 0
    todo: list[tuple[float, dict[str, Any]]] = []
    for m in mutants:
        tests = selected_tests(m, coverage)
        v = verdicts[m.name]
        v.reached, v.explored = len(tests), explore
        if not tests and not v.explored:
            continue
        cost = sum(s for _, s in tests) + (30.0 if v.explored else 0.0)
        todo.append((cost, {"key": m.name, "tests": tests, "explore": v.explored}))
    procs = []
    for i, share in enumerate(shares_of(todo, workers)):
        if share:
            job = {"mode": "mutants", "system": True, "mutants": share}
            job["explore_depth"] = explore_depth
            procs.append((f"system-{i}", _worker(job, workdir, f"system-{i}")))
    _wait(procs, workdir)
    for name, _ in procs:
        for r in json.loads((workdir / f"{name}.out.json").read_text()):
            v = verdicts[r["key"]]
            v.status, v.by, v.tests_run = r["status"], r["by"], r["tests_run"]
            v.seconds, v.flaky = r["seconds"], r["flaky"]
    return list(verdicts.values())


def format_system_report(verdicts: Sequence[SystemVerdict], seconds: dict[str, float]) -> str:
    killed = sum(v.status == "killed" for v in verdicts)
    lines = [
        "mutants of the system: links, watches, reports, routes, the follow order and the "
        "teardowns changed, judged by the behaviour tests that reach them and the exploration",
        "",
    ]
    for v in verdicts:
        where = f"{v.reached} test(s) reach it, {v.tests_run} run" + (
            "; explored" if v.explored else ""
        )
        verdict = f"killed by {v.by}" if v.status == "killed" else "SURVIVED"
        lines += [f"{v.mutant.name}: {verdict}", f"    {v.mutant.what}  [{where}]"]
        if v.flaky:
            lines.append(f"    failing without the mutant too: {', '.join(v.flaky[:3])}")
    lines += [
        "",
        f"killed {killed}/{len(verdicts)}",
        f"time: coverage {seconds['coverage']:.0f}s, mutants {seconds['mutants']:.0f}s, "
        f"total {seconds['total']:.0f}s",
    ]
    return "\n".join(lines) + "\n"


def system_main(
    names: list[str] | None,
    *,
    tests: Sequence[str],
    coverage_file: str | None,
    workers: int,
    explore_depth: int,
    json_out: str | None,
    workdir: Path,
) -> int:
    from verification.mutation.run import record_coverage
    from verification.mutation.system import by_name

    t0 = time.perf_counter()
    mutants = by_name(names)
    if coverage_file and Path(coverage_file).is_file():
        coverage = json.loads(Path(coverage_file).read_text())
    else:
        coverage = record_coverage(tests, -1, workdir)  # no exploration cells needed here
        if coverage_file:
            Path(coverage_file).write_text(json.dumps(coverage))
    t1 = time.perf_counter()
    verdicts = judge_system(
        mutants, coverage, workers=workers, workdir=workdir, explore_depth=explore_depth
    )
    t2 = time.perf_counter()
    seconds = {"coverage": t1 - t0, "mutants": t2 - t1, "total": t2 - t0}
    print(format_system_report(verdicts, seconds), end="")
    if json_out:
        Path(json_out).write_text(
            json.dumps({"seconds": seconds, "mutants": [v.as_dict() for v in verdicts]}, indent=1)
        )
    return 1 if any(v.status == "survived" for v in verdicts) else 0
