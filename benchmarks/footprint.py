"""Per-job footprint: the six actors of one job, for many live jobs in one process.

A job here is what the runtime builds for every job: avatar, job, session_host,
participant, room_deletion and finalize actors, each with its own handler and guard
mappings (no-op handlers), one clock and one settings mapping shared by the six, each
actor started (initial state entered), all built on a running loop. The jobs stay alive
until measured.

Every run is a fresh interpreter (``python -m benchmarks.footprint N time|memory``), so
each size starts from the same heap and garbage-collector state; time and memory are
separate runs, so tracemalloc's bookkeeping never lands in the time figure. Time is the
CPU time of the building thread (see ``timing``). The child also reports the time spent in
the cyclic garbage collector while building: CPython makes a full pass over every live
object after about 70,000 container allocations, which 1,000 jobs never reach and 10,000
jobs reach twice, so that is the part of the cost that grows faster than the jobs.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import Config
from .table import Row, Target
from .timing import GcTimer, Stopwatch

SECTION = "footprint"
JOB_MACHINES = ("avatar", "job", "session_host", "participant", "room_deletion", "finalize")
SETTINGS = {
    "join_timeout": 30.0,
    "session_end_timeout": 300.0,
    "close_timeout": 10.0,
    "grace_period": 15.0,
    "drain_timeout": 3.0,
}
ROOT = Path(__file__).resolve().parent.parent


def _noop(*_: object) -> None:
    return None


def _false(*_: object) -> bool:
    return False


def job_builder() -> Callable[[int], tuple[Any, ...]]:
    """A function that builds the started actors of job ``i``."""
    from agent_runtime import Actor, AsyncioClock
    from statemachines.machines import MACHINES

    specs = [MACHINES[m] for m in JOB_MACHINES]
    names = [([e.name for e in s.effects], list(s.guards)) for s in specs]

    def build(i: int) -> tuple[Actor, ...]:
        clock = AsyncioClock()
        settings = dict(SETTINGS)
        instance = f"job-{i}"
        actors = tuple(
            Actor(
                spec,
                instance=instance,
                effects=dict.fromkeys(effects, _noop),
                guards=dict.fromkeys(guards, _false),
                settings=settings,
                clock=clock,
            )
            for spec, (effects, guards) in zip(specs, names, strict=True)
        )
        for a in actors:
            a.start()
        return actors

    return build


def _full_collection() -> float:
    """CPU seconds one full collection takes over what the process holds now."""
    sw = Stopwatch()
    gc.collect()
    return sw.lap().cpu


def child(n: int, mode: str) -> dict[str, Any]:
    """One measurement in this process: build ``n`` jobs and keep them alive."""

    async def main() -> dict[str, Any]:
        build = job_builder()
        build(-1)  # first-use caches are paid once per process, not per job
        gc.collect()
        if mode == "memory":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            jobs = [build(i) for i in range(n)]
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            assert len(jobs) == n
            return {"jobs": n, "bytes": after - before}
        full_before = _full_collection()
        timer = GcTimer()
        gc.callbacks.append(timer)
        sw = Stopwatch()
        jobs = [build(i) for i in range(n)]
        lap = sw.lap()
        gc.callbacks.remove(timer)
        assert all(j[0].state == "idle" for j in jobs)
        return {
            "jobs": n,
            "seconds": lap.cpu,
            "wall_seconds": lap.wall,
            "gc_seconds": timer.seconds,
            "gc_collections": timer.collections,
            "full_collection_seconds_without_jobs": full_before,
            "full_collection_seconds_with_jobs": _full_collection(),
        }

    return asyncio.run(main())


def _spawn(n: int, mode: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.footprint", str(n), mode],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def measure(sizes: tuple[int, ...], repeats: int) -> dict[int, dict[str, Any]]:
    """Per size: the timed runs (``repeats`` fresh processes, interleaved across sizes so
    drift in the machine's speed spreads over all of them) and one memory run."""
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            runs[n].append(_spawn(n, "time"))
    return {n: {"runs": runs[n], "bytes": _spawn(n, "memory")["bytes"]} for n in sizes}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def rows_from(results: dict[int, dict[str, Any]]) -> list[Row]:
    how_t = (
        "CPU time of building N jobs (4 actors each, started) kept alive, in a fresh process "
        "per run; median of the runs; per job = total / N; gc = the part of it spent inside "
        "the cyclic garbage collector, full = full (generation 2) collections"
    )
    how_m = (
        "tracemalloc: bytes still allocated with the N jobs alive, after gc.collect(), "
        "over N; its own fresh process"
    )
    rows: list[Row] = []
    for n, res in results.items():
        runs = res["runs"]
        us = _median(runs, "seconds") / n * 1e6
        gc_us = _median(runs, "gc_seconds") / n * 1e6
        full = statistics.median(r["gc_collections"][2] for r in runs)
        rows.append(
            Row(
                SECTION,
                f"{n:,} jobs: build time",
                us,
                "us/job",
                target=Target("<=", 100.0),
                text=f"{us:.1f} us/job (gc {gc_us:.1f}, {full:g} full)",
                how=how_t,
                samples=tuple(r["seconds"] / n * 1e6 for r in runs),
                extra={
                    "jobs": n,
                    "gc_us_per_job": gc_us,
                    "wall_us_per_job": _median(runs, "wall_seconds") / n * 1e6,
                    "gc_collections_per_generation": [r["gc_collections"] for r in runs],
                    "full_collection_ms_without_jobs": _median(
                        runs, "full_collection_seconds_without_jobs"
                    )
                    * 1e3,
                    "full_collection_ms_with_jobs": _median(
                        runs, "full_collection_seconds_with_jobs"
                    )
                    * 1e3,
                },
            )
        )
        rows.append(
            Row(
                SECTION,
                f"{n:,} jobs: memory",
                res["bytes"] / n / 1024,
                "KiB/job",
                target=Target("<=", 32.0),
                how=how_m,
                extra={"jobs": n, "total_bytes": res["bytes"]},
            )
        )
    sizes = sorted(results)
    if len(sizes) < 2:
        return rows
    small, big = sizes[0], sizes[-1]
    limit = big / small * 1.1  # linear growth with 10% slack: 11x for 10x the jobs
    how = (
        f"total for {big:,} jobs over total for {small:,} jobs (exactly linear would be "
        f"{big / small:g}x); times: median over the rounds of the ratio within each round "
        "(the two sizes run back to back)"
    )
    pairs = list(zip(results[big]["runs"], results[small]["runs"], strict=True))
    total = tuple(b["seconds"] / s["seconds"] for b, s in pairs)
    outside = tuple(
        (b["seconds"] - b["gc_seconds"]) / (s["seconds"] - s["gc_seconds"]) for b, s in pairs
    )
    label = f"{big:,} / {small:,} jobs"
    return [
        *rows,
        Row(
            SECTION,
            f"{label}: time",
            statistics.median(total),
            "x",
            target=Target("<=", limit),
            how=how,
            samples=total,
        ),
        Row(
            SECTION,
            f"{label}: time outside the garbage collector",
            statistics.median(outside),
            "x",
            how=how,
            samples=outside,
        ),
        Row(
            SECTION,
            f"{label}: memory",
            results[big]["bytes"] / max(results[small]["bytes"], 1),
            "x",
            target=Target("<=", limit),
            how=how,
        ),
    ]


def run(cfg: Config) -> list[Row]:
    return rows_from(measure(tuple(sorted(set(cfg.jobs))), cfg.repeats))


if __name__ == "__main__":  # the child: python -m benchmarks.footprint N time|memory
    jobs, what = int(sys.argv[1]), sys.argv[2]
    if what not in ("time", "memory") or jobs < 1:
        sys.exit("usage: python -m benchmarks.footprint N time|memory")
    print(json.dumps(child(jobs, what)))
