"""Per-job cost of the real composed job (``AgentJob``) beside the same job without the runtime.

Both jobs are the same work on one in-memory room each (``InMemoryRoom``: a real, unconnected
``rtc.Room`` with the SFU stood in for), with a real ``AgentSession`` (RoomIO included) and the
same avatar plugin (``ScriptedAvatar``: the base ``AvatarSession.start()`` then a
``DataStreamAudioOutput`` as the published plugins install):

- **bare** (livekit-agents 1.8.9 alone, wired the upstream way):
  ``await avatar.start(session, room)``; ``await session.start(agent, room=room)``; the avatar
  joins and publishes its video; closed as a livekit job closes: ``session.aclose()``, the room
  disconnected, then the avatar's ``aclose()`` (its shutdown callback).
- **runtime**: ``AgentJob(room=..., session=..., avatar=...)``, everything else its defaults, as
  a user gets it: the playout machine composed (on by default with an avatar), the real clock,
  the OpenTelemetry sink with no SDK configured, the room's session transport;
  ``await job.start(agent)``; the same join; closed with ``await job.aclose()``.

A job is *live* once the avatar's join has been seen (runtime: every machine in the state the
reference scenario reaches). Every run checks each job: live, the audio on the avatar; closed,
every machine where the reference scenario ends (``examples/scenarios/
job_with_avatar_start_to_close.yaml``, run through the scenario runner first): a benchmark never
times a broken job.

Every measurement is a fresh interpreter (``python -m benchmarks.jobs VARIANT N MODE``), so each
starts from the same heap. ``time`` runs start N jobs one after the other and keep them live,
then close them all: CPU time of the process's one thread for each phase, and RSS growth with N
live jobs. ``memory`` runs do the same under tracemalloc: bytes held with N live jobs after a
full collection. ``tasks`` runs take N jobs one after the other, each from its start to its
close before the next, with a task factory on the loop counting every asyncio task made in each
phase of its life: start (until the job is live), live (the loop left to settle) and close.
``python -m benchmarks.jobs profile VARIANT N PHASE`` prints where the time (cProfile), the
memory (tracemalloc, by line) or the tasks (by coroutine) go.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config
from .table import Row, Target
from .timing import GcTimer, Stopwatch

SECTION = "jobs"
ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "examples" / "scenarios" / "job_with_avatar_start_to_close.yaml"
VARIANTS = ("bare", "runtime")
AVATAR = "avatar-1"
USER = "user"
# the runtime may add this much to the bare job (issue 24: start and memory 10%, the close,
# seven machines taken to their last state, 20%); N x the jobs may cost this much x
SHARE_LIMIT = 1.10
LIMITS = {"start": SHARE_LIMIT, "close": 1.20}
GROWTH_SLACK = 1.05
# issue 38: over its whole life, the runtime's job may make at most this many more asyncio tasks
# than the bare job; counted over this many jobs (a count barely varies from job to job)
TASK_SLACK = 4
TASK_JOBS = 20
PHASES = ("start", "live", "close")
MODES = ("time", "memory", "tasks")


# -- the two jobs ----------------------------------------------------------------------------


def _room(i: int) -> Any:
    from agent_runtime.testing.inmemory import InMemoryRoom

    room = InMemoryRoom(name=f"job-{i}")
    room.connect_locally()
    room.add_participant(USER)  # the job is dispatched for a user already in the room
    return room


def _avatar_joins(room: Any) -> None:
    room.add_participant(AVATAR, kind="agent")
    room.publish_track(AVATAR, "video")


def _agent() -> Any:
    from livekit.agents import Agent

    return Agent(instructions="A benchmark agent.")


@dataclass(slots=True)
class BareJob:
    """livekit-agents alone: the room, the session with RoomIO, the avatar plugin."""

    room: Any
    session: Any
    avatar: Any

    @classmethod
    async def start(cls, i: int) -> BareJob:
        from livekit.agents import AgentSession

        from agent_runtime.testing.scripted_avatar import ScriptedAvatar

        room = _room(i)
        session: Any = AgentSession()
        avatar = ScriptedAvatar(avatar_identity=AVATAR)
        await avatar.start(session, room)
        await session.start(_agent(), room=room)
        _avatar_joins(room)
        await avatar.wait_for_join(timeout=None)
        return cls(room, session, avatar)

    async def close(self) -> None:
        # a livekit job's shutdown: the session, the room, then the shutdown callbacks (the
        # avatar registered its aclose() there)
        await self.session.aclose()
        await self.room.disconnect()
        await self.avatar.aclose()

    def live_problem(self) -> str | None:
        from agent_runtime.runtimes.avatar import route_of

        route = route_of(self.session, self.avatar.installed)
        return None if route == "avatar" else f"audio goes to {route}, not the avatar"

    def closed_problem(self) -> str | None:
        from agent_runtime.sdk import livekit_compat as lk

        return None if not lk.session_started(self.session) else "the session is still running"

    def machines(self) -> dict[str, str]:
        return {}  # livekit alone: no machines


@dataclass(slots=True)
class RuntimeJob:
    """The same job composed by ``AgentJob`` (its production defaults)."""

    job: Any
    closed_states: dict[str, str] | None = None

    @classmethod
    async def start(cls, i: int) -> RuntimeJob:
        from livekit.agents import AgentSession

        from agent_runtime.system.agent_job import AgentJob
        from agent_runtime.testing.scripted_avatar import ScriptedAvatar

        room = _room(i)
        # no options: the job users get (with an avatar, that includes the playout machine)
        job = AgentJob(
            room=room, session=AgentSession(), avatar=ScriptedAvatar(avatar_identity=AVATAR)
        )
        await job.start(_agent())
        _avatar_joins(room)
        assert job.avatar is not None
        await job.avatar.wait_for("joined")
        return cls(job)

    async def close(self) -> None:
        # as the reference scenario's job.shutdown step, then everything released
        self.job.shutdown("done")
        await self.job.wait_closed()
        self.closed_states = self.job.states
        await self.job.aclose()

    def live_problem(self) -> str | None:
        if self.job.audio_route() != "avatar":
            return f"audio goes to {self.job.audio_route()}, not the avatar"
        return _differs(self.job.states, REFERENCE_STATES["live"])

    def closed_problem(self) -> str | None:
        if self.closed_states is None:
            return "never closed"
        return _differs(self.closed_states, REFERENCE_STATES["closed"])

    def machines(self) -> dict[str, str]:
        # every machine's state now: once aclose() has run, room deletion has gone on from the
        # reference scenario's last state (allowed) to closed
        return dict(self.job.states)


JOBS: dict[str, Callable[[int], Awaitable[Any]]] = {
    "bare": BareJob.start,
    "runtime": RuntimeJob.start,
}
# the states of the reference scenario's job: live (before the shutdown step) and at its end
REFERENCE_STATES: dict[str, dict[str, str]] = {}


def _differs(got: dict[str, str], want: dict[str, str]) -> str | None:
    # both ways: a machine the job lacks (playout left out, say) is a different job too
    bad = {m: got.get(m) for m in got.keys() | want.keys() if got.get(m) != want.get(m)}
    return f"states {bad}, the reference scenario has {want}" if bad else None


async def reference_states() -> dict[str, dict[str, str]]:
    """Every machine's state in the reference scenario: live (just before its shutdown step)
    and at its end, from the scenario runner; its ``expect`` block must hold."""
    from agent_runtime.testing.expect import check_expect
    from agent_runtime.testing.runner import run_scenario
    from agent_runtime.testing.scenario import load_scenario

    sc = load_scenario(REFERENCE)
    result = await run_scenario(sc)
    failures = check_expect(sc.expect, result)
    if failures:
        raise RuntimeError(f"{REFERENCE.name}: the reference scenario fails: {failures}")
    shutdown = next(s.at for s in sc.steps if s.event == "job.shutdown")
    from statemachines.machines import MACHINES

    live = {name: spec.initial for name, spec in MACHINES.items()}
    for t in result["transitions"]:
        if t["t"] < shutdown:
            live[t["machine"]] = t["dest"]
    return {"live": live, "closed": dict(result["final_states"])}


def _check(jobs: list[Any], which: str) -> None:
    for i, j in enumerate(jobs):
        problem = j.live_problem() if which == "live" else j.closed_problem()
        if problem is not None:
            raise RuntimeError(f"{type(j).__name__} {i} is not {which}: {problem}")


# -- one measurement, in this process ---------------------------------------------------------


def _rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _quiet_loop() -> None:
    # the SDK's own background tasks may end with an error once their room is gone; a
    # benchmark prints its table, not their tracebacks (the checks above catch a broken job)
    asyncio.get_running_loop().set_exception_handler(lambda _loop, _ctx: None)


async def _warm_up(variant: str) -> None:
    """One job started and closed: first-use costs (imports, schema builds, caches) are paid
    once per process, not per job."""
    job = await JOBS[variant](-1)
    await job.close()
    from agent_runtime.testing.clock import settle

    await settle()


class TaskCounter:
    """A loop task factory (``loop.set_task_factory``) that counts the tasks made through it,
    by phase and by coroutine: ``loop.create_task``, ``asyncio.create_task`` and
    ``ensure_future``/``gather``/``wait_for`` given a coroutine all come here."""

    def __init__(self) -> None:
        self.phase = ""
        self.made = 0
        self.by_coroutine: Counter[tuple[str, str]] = Counter()

    def __call__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        self.made += 1
        self.by_coroutine[self.phase, getattr(coro, "__qualname__", type(coro).__name__)] += 1
        # kwargs: the context create_task passes on when it is given one
        return asyncio.Task(coro, loop=loop, **kwargs)

    def take(self) -> int:
        """Tasks made since the last take."""
        made, self.made = self.made, 0
        return made


async def count_tasks(start: Callable[[int], Awaitable[Any]], n: int) -> dict[str, Any]:
    """``n`` jobs one after the other, each from its start to its close (the loop settled
    after each phase), with every asyncio task made counted: per job and phase, and by
    coroutine over all of them."""
    from agent_runtime.testing.clock import settle

    loop = asyncio.get_running_loop()
    counter = TaskCounter()
    per_phase: dict[str, list[int]] = {p: [] for p in PHASES}
    machines: dict[str, dict[str, str]] = {}
    previous = loop.get_task_factory()
    loop.set_task_factory(counter)  # type: ignore[arg-type]
    try:
        await settle()
        counter.take()  # nothing from before the first job
        counter.by_coroutine.clear()
        for i in range(n):
            counter.phase = "start"
            job = await start(i)
            per_phase["start"].append(counter.take())
            counter.phase = "live"
            await settle()
            per_phase["live"].append(counter.take())
            _check([job], "live")
            machines["live"] = job.machines()
            counter.phase = "close"
            await job.close()
            await settle()
            per_phase["close"].append(counter.take())
            _check([job], "closed")
            machines["closed"] = job.machines()
    finally:
        loop.set_task_factory(previous)
    by_coroutine: dict[str, dict[str, float]] = {p: {} for p in PHASES}
    for (phase, name), made in counter.by_coroutine.most_common():
        by_coroutine[phase][name] = made / n
    return {"tasks": per_phase, "by_coroutine": by_coroutine, "machines": machines}


async def _run(variant: str, n: int, mode: str) -> dict[str, Any]:
    from agent_runtime.testing.clock import settle
    from agent_runtime.testing.inmemory import quiet_sdk_logs

    _quiet_loop()
    with quiet_sdk_logs(logging.CRITICAL):
        REFERENCE_STATES.update(await reference_states())
        await _warm_up(variant)
        start = JOBS[variant]
        gc.collect()
        out: dict[str, Any] = {"variant": variant, "jobs": n, "mode": mode}
        if mode == "tasks":
            out.update(await count_tasks(start, n))
            return out
        if mode == "memory":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            jobs = [await start(i) for i in range(n)]
            await settle()
            gc.collect()
            out["bytes"] = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            _check(jobs, "live")
            out["machines"] = {"live": jobs[-1].machines()}
            for j in jobs:
                await j.close()
            await settle()
            _check(jobs, "closed")
            out["machines"]["closed"] = jobs[-1].machines()
            return out
        timer = GcTimer()
        rss0 = _rss()
        gc.callbacks.append(timer)
        sw = Stopwatch()
        jobs = [await start(i) for i in range(n)]
        await settle()
        lap = sw.lap()
        gc.callbacks.remove(timer)
        out["start"] = {"seconds": lap.cpu, "wall_seconds": lap.wall, **timer.take()}
        _check(jobs, "live")
        out["machines"] = {"live": jobs[-1].machines()}
        gc.collect()
        out["rss_bytes"] = _rss() - rss0
        gc.callbacks.append(timer)
        sw = Stopwatch()
        for j in jobs:
            await j.close()
        await settle()
        lap = sw.lap()
        gc.callbacks.remove(timer)
        out["close"] = {"seconds": lap.cpu, "wall_seconds": lap.wall, **timer.take()}
        _check(jobs, "closed")
        out["machines"]["closed"] = jobs[-1].machines()
        return out


def child(variant: str, n: int, mode: str) -> dict[str, Any]:
    return asyncio.run(_run(variant, n, mode))


async def _profile(variant: str, n: int, phase: str, top: int) -> None:
    """Where ``phase`` (start, close: cProfile; memory: tracemalloc by line; tasks: by
    coroutine) goes."""
    import cProfile
    import pstats

    from agent_runtime.testing.clock import settle
    from agent_runtime.testing.inmemory import quiet_sdk_logs

    _quiet_loop()
    with quiet_sdk_logs(logging.CRITICAL):
        REFERENCE_STATES.update(await reference_states())
        await _warm_up(variant)
        if phase == "tasks":
            counted = await count_tasks(JOBS[variant], n)
            print(f"{variant}: asyncio tasks made per job, by phase and coroutine (top {top})")
            for p in PHASES:
                made = counted["tasks"][p]
                print(f"{p}: {sum(made) / n:g} per job (median {statistics.median(made):g})")
                for name, per_job in list(counted["by_coroutine"][p].items())[:top]:
                    print(f"{per_job:8.2f}  {name}")
            return
        gc.collect()
        prof = cProfile.Profile()
        if phase == "memory":
            tracemalloc.start(1)
            snap0 = tracemalloc.take_snapshot()
        elif phase == "start":
            prof.enable()
        jobs = [await JOBS[variant](i) for i in range(n)]
        await settle()
        if phase == "start":
            prof.disable()
        _check(jobs, "live")
        if phase == "memory":
            gc.collect()
            stats = tracemalloc.take_snapshot().compare_to(snap0, "lineno")
            tracemalloc.stop()
            print(f"{variant}: bytes held per live job, by line (top {top})")
            for s in stats[:top]:
                frame = s.traceback[0]
                print(
                    f"{s.size_diff / n:10.0f} B {s.count_diff / n:7.1f} blocks  "
                    f"{_short(frame.filename)}:{frame.lineno}"
                )
            total = sum(s.size_diff for s in stats)
            print(f"{total / n / 1024:10.1f} KiB per job in all")
            by_part: dict[str, int] = {}
            for s in stats:
                part = _part(s.traceback[0].filename)
                by_part[part] = by_part.get(part, 0) + s.size_diff
            for part, size in sorted(by_part.items(), key=lambda kv: -kv[1]):
                print(f"{size / n / 1024:10.1f} KiB per job allocated in {part}")
        if phase == "close":
            prof.enable()
        for j in jobs:
            await j.close()
        await settle()
        if phase == "close":
            prof.disable()
        _check(jobs, "closed")
        if phase != "memory":
            stats_p = pstats.Stats(prof)
            stats_p.sort_stats("tottime").print_stats(top)
            stats_p.sort_stats("cumulative").print_stats(int(os.environ.get("BENCH_TOP", top)))
            if os.environ.get("BENCH_CALLERS"):
                stats_p.print_callers(os.environ["BENCH_CALLERS"])


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/wt-bench/", "/lib/python3.11/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def _part(filename: str) -> str:
    f = filename.replace("\\", "/")
    if "/agent_runtime/testing/" in f:
        return "the in-memory room and scripted plugin (both jobs)"
    if "/agent_runtime/" in f or "/statemachines/" in f:
        return "the runtime (agent_runtime, statemachines)"
    if "/livekit/" in f:
        return "livekit (rtc, agents)"
    if "/opentelemetry/" in f:
        return "opentelemetry"
    return "python and other libraries"


# -- the section: fresh processes, interleaved ---------------------------------------------------


def _spawn(variant: str, n: int, mode: str) -> dict[str, Any]:
    """One child process's figures. A child killed by a signal (livekit's native library
    aborting in one of its own threads, seen once in hundreds of runs) is run once more,
    and said on stderr; a child that fails any other way, or twice, is an error."""
    for attempt in (1, 2):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.jobs", variant, str(n), mode],
            cwd=ROOT,
            check=False,
            capture_output=True,
            text=True,
        )
        if out.returncode >= 0 or attempt == 2:
            break
        print(
            f"jobs benchmark child ({variant}, {n}, {mode}) killed by signal "
            f"{-out.returncode}; running it once more. Its last words:\n{out.stderr[-800:]}",
            file=sys.stderr,
        )
    if out.returncode != 0:
        raise RuntimeError(
            f"jobs benchmark child ({variant}, {n}, {mode}) failed:\n{out.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(sizes: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Per size and variant: ``repeats`` timed runs (rounds interleave sizes and variants, so
    drift in the machine's speed spreads over all of them) and one memory run."""
    time_runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(repeats):
        for n in sizes:
            for v in VARIANTS:
                time_runs.setdefault((v, n), []).append(_spawn(v, n, "time"))
    memory = {(v, n): _spawn(v, n, "memory")["bytes"] for n in sizes for v in VARIANTS}
    # counted in processes of their own: the counting factory would weigh on the CPU figures
    tasks = {v: _spawn(v, TASK_JOBS, "tasks") for v in VARIANTS}
    return {"sizes": sizes, "time": time_runs, "memory": memory, "tasks": tasks}


def _per_job(runs: list[dict[str, Any]], phase: str, n: int) -> list[float]:
    return [r[phase]["seconds"] / n * 1e6 for r in runs]


def rows_from(results: dict[str, Any]) -> list[Row]:
    sizes: tuple[int, ...] = tuple(results["sizes"])
    runs: dict[tuple[str, int], list[dict[str, Any]]] = results["time"]
    memory: dict[tuple[str, int], int] = results["memory"]
    rounds = len(runs[(VARIANTS[0], sizes[0])])
    how_cpu = (
        "CPU time of the process's thread (the event loop and everything it runs, native "
        "SDK calls included) to start N jobs one after the other until each is live, or to "
        f"close them all; over N; median of {rounds} fresh processes per figure, the variants "
        "and sizes interleaved; gc = the part spent in the cyclic garbage collector"
    )
    how_mem = (
        "tracemalloc: bytes still allocated with N live jobs after gc.collect(), over N (its "
        "own fresh process); RSS: growth of the resident set with N live jobs, over N (median "
        "of the timed runs)"
    )
    how_ratio = (
        "the runtime's job over the bare job; CPU: median over the rounds of the ratio within "
        "each round (the two ran back to back)"
    )
    how_growth = "the total for the larger N over the total for the smaller N"
    rows: list[Row] = []
    for n in sizes:
        for v in VARIANTS:
            label = "runtime (AgentJob)" if v == "runtime" else "bare livekit-agents"
            r = runs[(v, n)]
            for phase in ("start", "close"):
                us = statistics.median(_per_job(r, phase, n))
                gc_us = statistics.median(x[phase]["gc_seconds"] / n * 1e6 for x in r)
                rows.append(
                    Row(
                        SECTION,
                        f"{n:,} jobs, {label}: CPU to {phase}",
                        us,
                        "us/job",
                        text=f"{us:,.0f} us/job (gc {gc_us:,.0f})",
                        how=how_cpu,
                        samples=tuple(_per_job(r, phase, n)),
                        extra={
                            "gc_us_per_job": gc_us,
                            "wall_us_per_job": statistics.median(
                                x[phase]["wall_seconds"] / n * 1e6 for x in r
                            ),
                            "gc_collections": [x[phase]["gc_collections"] for x in r],
                        },
                    )
                )
            kib = memory[(v, n)] / n / 1024
            rss = statistics.median(x["rss_bytes"] for x in r) / n / 1024
            rows.append(
                Row(
                    SECTION,
                    f"{n:,} jobs, {label}: memory per live job",
                    kib,
                    "KiB/job",
                    text=f"{kib:,.1f} KiB/job (RSS {rss:,.0f})",
                    how=how_mem,
                    extra={"tracemalloc_bytes": memory[(v, n)], "rss_kib_per_job": rss},
                )
            )
        for phase in ("start", "close"):
            per_round = tuple(
                a / b
                for a, b in zip(
                    _per_job(runs[("runtime", n)], phase, n),
                    _per_job(runs[("bare", n)], phase, n),
                    strict=True,
                )
            )
            rows.append(
                Row(
                    SECTION,
                    f"{n:,} jobs: runtime / bare, CPU to {phase}",
                    statistics.median(per_round),
                    "x",
                    target=Target("<=", LIMITS[phase]),
                    how=how_ratio,
                    samples=per_round,
                )
            )
        rows.append(
            Row(
                SECTION,
                f"{n:,} jobs: runtime / bare, memory per live job",
                memory[("runtime", n)] / memory[("bare", n)],
                "x",
                target=Target("<=", SHARE_LIMIT),
                how=how_ratio,
            )
        )
    if len(sizes) >= 2:
        small, big = sizes[0], sizes[-1]
        limit = big / small * GROWTH_SLACK
        for v in VARIANTS:
            label = "runtime" if v == "runtime" else "bare"
            for phase in ("start", "close"):
                ratio = statistics.median(
                    b[phase]["seconds"] / s[phase]["seconds"]
                    for b, s in zip(runs[(v, big)], runs[(v, small)], strict=True)
                )
                rows.append(
                    Row(
                        SECTION,
                        f"{big:,} / {small:,} jobs, {label}: CPU to {phase}",
                        ratio,
                        "x",
                        target=Target("<=", limit) if v == "runtime" else None,
                        how=how_growth,
                    )
                )
            rows.append(
                Row(
                    SECTION,
                    f"{big:,} / {small:,} jobs, {label}: memory",
                    memory[(v, big)] / memory[(v, small)],
                    "x",
                    target=Target("<=", limit) if v == "runtime" else None,
                    how=how_growth,
                )
            )
    rows.extend(task_rows(results["tasks"]))
    return rows


def task_rows(tasks: dict[str, dict[str, Any]]) -> list[Row]:
    """Tasks over a job's life: each job's figure, and the runtime's extra against its target."""
    n = len(tasks[VARIANTS[0]]["tasks"]["start"])
    how = (
        "asyncio tasks made over a job's life, counted by a task factory on the loop "
        "(loop.set_task_factory: create_task, and ensure_future, gather and wait_for given a "
        "coroutine): start (until the job is live), live (the loop left to settle) and close "
        f"(until the loop settles); the jobs one after the other; median of {n} jobs, in one "
        "fresh process per variant, each phase's own median beside it"
    )
    rows: list[Row] = []
    median: dict[str, float] = {}
    for v in VARIANTS:
        label = "runtime (AgentJob)" if v == "runtime" else "bare livekit-agents"
        per_phase: dict[str, list[int]] = tasks[v]["tasks"]
        totals = [sum(job) for job in zip(*(per_phase[p] for p in PHASES), strict=True)]
        median[v] = statistics.median(totals)
        phases = {p: statistics.median(per_phase[p]) for p in PHASES}
        rows.append(
            Row(
                SECTION,
                f"{label}: asyncio tasks over a job's life",
                median[v],
                "tasks/job",
                text=f"{median[v]:g} tasks/job ("
                + ", ".join(f"{p} {x:g}" for p, x in phases.items())
                + ")",
                how=how,
                samples=tuple(float(t) for t in totals),
                extra={"by_phase": phases, "by_coroutine": tasks[v]["by_coroutine"]},
            )
        )
    extra = median["runtime"] - median["bare"]
    rows.append(
        Row(
            SECTION,
            "runtime - bare: asyncio tasks over a job's life",
            extra,
            "tasks/job",
            target=Target("<=", TASK_SLACK),
            text=f"{extra:+g} tasks/job ({median['runtime']:g} against {median['bare']:g})",
            how="the runtime's job's median over the bare job's (the rows above)",
        )
    )
    return rows


def run(cfg: Config) -> list[Row]:
    return rows_from(measure(tuple(sorted(set(cfg.jobs))), cfg.job_repeats))


def _main(argv: list[str]) -> int:
    usage = (
        "usage: python -m benchmarks.jobs {bare|runtime} N {time|memory|tasks}\n"
        "       python -m benchmarks.jobs profile {bare|runtime} N {start|close|memory|tasks} "
        "[TOP]"
    )
    if argv[:1] == ["profile"] and len(argv) in (4, 5):
        _, variant, n, phase, *rest = argv
        if variant in VARIANTS and phase in ("start", "close", "memory", "tasks") and int(n) > 0:
            asyncio.run(_profile(variant, int(n), phase, int(rest[0]) if rest else 40))
            return 0
    elif len(argv) == 3 and argv[0] in VARIANTS and argv[2] in MODES:
        print(json.dumps(child(argv[0], int(argv[1]), argv[2])))
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
