"""Exhaustive exploration of the composed job: every event sequence up to a depth.

Breadth first, one layer per input or timeout (internal steps, which the runtime runs on
its own, cost nothing and interleave in every order), every distinct world explored once.
Every reached world is checked (``checks.safety``; ``checks.settled`` where nothing is left
to run), and from every one of them time is let pass alone, in every order, until nothing
is left to run (``checks.eventual``). A finding reports the shortest event sequence to it.

The number of sequences is counted, not enumerated: paths from the start with at most
``depth`` inputs and timeouts, counted per layer over the explored graph.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from agent_runtime.testing.invariants.checks import BY_NUMBER, Finding, eventual, safety, settled
from statemachines import MachineSpec
from statemachines.glue import LINKS, Link
from statemachines.system import WATCHES, Watch
from verification.explore.model import (
    DEFAULT_GLUE,
    Config,
    Glue,
    Inputs,
    Kind,
    Mailboxes,
    Model,
    Move,
    World,
    mail_label,
)

_INTERNAL: frozenset[Kind] = frozenset({"internal"})
_TIME: frozenset[Kind] = frozenset({"time"})
_INPUT: frozenset[Kind] = frozenset({"input"})
_TIME_ONLY: frozenset[Kind] = frozenset({"internal", "time"})

# None: layer after layer until one brings no new world, i.e. all the model can reach
DEFAULT_DEPTH: int | None = None
# --deep adds: every input together, inputs landing between two events an actor handles,
# any actor with mail going next; each far larger than the last, so shallower
DEEP_ALL_DEPTH = 7
DEEP_TURNS_DEPTH = 4
DEEP_ANY_DEPTH = 2

# the configs a default run explores: the example agent's own, and each setting that
# changes a decision both ways
DEFAULT_CONFIGS: tuple[Config, ...] = (
    # examples/agent.py in a simulation: the simulator is who it links (no identity is
    # configured, and livekit's default kinds include SIP)
    Config.example(),
    # a SIP leg there first is linked; the room deleted at the end
    Config(present=("sip", "simulator"), grace=False, delete_room_on_close=True),
    # a configured identity; an avatar that may come back
    Config(
        participant_identity="user",
        present=("sip", "simulator"),
        close_on_disconnect=False,
        rejoin=True,
        retry_attempts=1,
    ),
    # not a simulation: nobody there at the start
    Config(simulation=False, present=(), delete_room_on_close=True, retry_attempts=1),
)
# the same job with the playout machine composed (AgentJob runs it whenever an avatar is
# configured): its default options in the example's simulation; the watchdog on, handing
# over by closing the session, with an avatar that may come back; the watchdog waiting for
# a SIP caller. Apart from DEFAULT_CONFIGS: the conformance replay runs those on a real job
# without playout
PLAYOUT_CONFIGS: tuple[Config, ...] = (
    Config(playout=True),
    Config(
        simulation=False,
        present=(),
        retry_attempts=1,
        rejoin=True,
        playout=True,
        watchdog="close",
    ),
    Config(
        present=("sip", "simulator"),
        grace=False,
        delete_room_on_close=True,
        playout=True,
        watchdog="wait",
    ),
)

# the same job with the user's own AgentJob.aclose() and aclose(graceful=False) among the
# job's inputs (the lifecycle is composed in every config; its closes double the job's
# explorations, so apart): the example's simulation (a close that holds for the simulator,
# an abort that ends the hold), and a job with nobody there that deletes its room
LIFECYCLE_CONFIGS: tuple[Config, ...] = (
    Config(aclose=True),
    Config(simulation=False, present=(), delete_room_on_close=True, retry_attempts=1, aclose=True),
)

# the configs by name (``dev.py explore --real --config NAME``): the default ones and the
# lifecycle ones (the playout ones need a job with playout, which the real explorer's
# harness runs without)
NAMED_CONFIGS: dict[str, Config] = {
    "example": DEFAULT_CONFIGS[0],
    "sip": DEFAULT_CONFIGS[1],
    "identity": DEFAULT_CONFIGS[2],
    "plain": DEFAULT_CONFIGS[3],
    "aclose": LIFECYCLE_CONFIGS[0],
    "aclose-plain": LIFECYCLE_CONFIGS[1],
}


@dataclass(frozen=True)
class Violation:
    invariant: int
    name: str
    detail: str
    config: str
    steps: tuple[str, ...]  # the event sequence, from the start, that leads to it

    def __str__(self) -> str:
        lines = [
            f"invariant {self.invariant} ({self.name}) violated under [{self.config}]: "
            f"{self.detail}"
        ]
        n = 0
        for step in self.steps:
            if step.startswith(" "):
                lines.append(f"       {step}")
            else:
                n += 1
                lines.append(f"  {n:3d}. {step}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Plan:
    """One exploration: a config, the inputs that arrive, how deep, how mail is handled."""

    config: Config
    inputs: Inputs = "job"
    depth: int | None = DEFAULT_DEPTH  # None: until no new world appears
    mailboxes: Mailboxes = "settle"

    def label(self) -> str:
        mail = "" if self.mailboxes == "settle" else f", mailboxes {self.mailboxes}"
        depth = "every depth" if self.depth is None else f"depth {self.depth}"
        return f"[{self.config.label()}] {self.inputs} inputs, {depth}{mail}"


@dataclass
class Result:
    plan: Plan
    depth: int = 0  # the deepest layer explored
    closed: bool = False  # a layer brought nothing new: the whole reachable space is in
    states: int = 0  # distinct worlds reached within the depth
    sequences: int = 0  # event sequences within the depth (counted, not enumerated)
    settled_states: int = 0  # of those, worlds with nothing left to run but inputs
    eventual_states: int = 0  # more worlds visited while letting time pass alone
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)

    def line(self) -> str:
        bad = f", {len(self.violations)} violation(s)" if self.violations else ""
        whole = f" (all of them: nothing new after depth {self.depth})" if self.closed else ""
        return (
            f"{self.plan.label()}: {self.states:,} states{whole}, {self.sequences:,} "
            f"sequences up to depth {self.depth}, "
            f"{self.eventual_states:,} more states while letting time pass, "
            f"{self.cpu_seconds:.1f} s CPU{bad}"
        )


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0  # wall clock, all workers together
    workers: int = 1

    @property
    def states(self) -> int:
        return sum(r.states for r in self.results)

    @property
    def sequences(self) -> int:
        return sum(r.sequences for r in self.results)

    @property
    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds for r in self.results)

    @property
    def depth(self) -> int:
        return min((r.depth for r in self.results), default=0)

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.results for v in r.violations]

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        depths = sorted({r.depth for r in self.results})
        lines = [
            f"explored {self.states:,} distinct states and {self.sequences:,} event sequences "
            f"(up to depth {'/'.join(map(str, depths))}: inputs and timeouts, each followed "
            f"by what it causes; work running aside ends in every order) in "
            f"{len(self.results)} explorations, {self.seconds:.1f} s on {self.workers} "
            f"worker(s) ({self.cpu_seconds:.1f} s CPU)"
        ]
        lines += [f"  {r.line()}" for r in self.results]
        lines.append("every invariant holds" if self.ok else "VIOLATIONS:")
        lines += [str(v) for v in self.violations]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "states": self.states,
            "sequences": self.sequences,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "workers": self.workers,
            "ok": self.ok,
            "explorations": [
                {
                    "config": r.plan.config.label(),
                    "inputs": r.plan.inputs,
                    "depth": r.depth,
                    "whole_space": r.closed,
                    "mailboxes": r.plan.mailboxes,
                    "states": r.states,
                    "sequences": r.sequences,
                    "settled_states": r.settled_states,
                    "eventual_states": r.eventual_states,
                    "seconds": round(r.seconds, 2),
                    "cpu_seconds": round(r.cpu_seconds, 2),
                }
                for r in self.results
            ],
            "violations": [
                {
                    "invariant": v.invariant,
                    "name": v.name,
                    "detail": v.detail,
                    "config": v.config,
                    "steps": list(v.steps),
                }
                for v in self.violations
            ],
        }


def _lines(model: Model, mv: Move, upto: int | None = None) -> list[str]:
    """A move as counterexample lines: the move, then each event it caused, indented."""
    handled = mv.handled if upto is None else mv.handled[:upto]
    return [mv.label, *(f"  -> {mail_label(e)}" for e in handled)]


class _Graph:
    """The worlds reached, how each was first reached, and their successors (by id)."""

    def __init__(self) -> None:
        self.index: dict[World, int] = {}
        self.worlds: list[World] = []
        self.parent: list[tuple[int, Move | None]] = []
        self.internal: list[list[int] | None] = []  # None: not expanded yet
        self.timed: list[list[int] | None] = []
        self.external: list[list[int]] = []  # inputs and timeouts, for counting

    def add(self, w: World, parent: int, mv: Move | None) -> tuple[int, bool]:
        # one lookup, so one hash of the world (a long tuple, hashed anew each time)
        i = len(self.worlds)
        j = self.index.setdefault(w, i)
        if j != i:
            return j, False
        self.worlds.append(w)
        self.parent.append((parent, mv))
        self.internal.append(None)
        self.timed.append(None)
        self.external.append([])
        return i, True


class _Found(Exception):
    """The invariant asked for (``stop_at``) was violated: nothing more to look for."""


class _Explorer:
    def __init__(self, model: Model, stop_at: int | None = None) -> None:
        self.model = model
        self.stop_at = stop_at
        self.label = model.config.label()
        if model.inputs != "all":
            self.label += f", {model.inputs} inputs"
        self.g = _Graph()
        self.found: dict[int, Violation] = {}
        self.settled = 0
        self.closed = False
        self.layers: list[list[int]] = []  # the worlds of each layer, as far as it went
        self.depth = 0  # the layer reached
        model.watch = lambda s: bool(safety(model.view(s)))

    def path(self, i: int) -> list[str]:
        parts: list[list[str]] = []
        while i > 0:
            i, mv = self.g.parent[i]
            assert mv is not None
            parts.append(_lines(self.model, mv))
        return [line for lines in reversed(parts) for line in lines]

    def report(self, findings: Iterable[Finding], steps: Callable[[], list[str]]) -> None:
        for number, detail in findings:
            if number not in self.found:
                self.found[number] = Violation(
                    number, BY_NUMBER[number].name, detail, self.label, tuple(steps())
                )
                if number == self.stop_at:
                    # the search order is the one a whole run takes, so this is the same
                    # (shortest) counterexample a whole run reports first
                    raise _Found

    def take(self, i: int, mv: Move) -> tuple[int, bool]:
        """Record move ``mv`` from world ``i``; check what it passed and where it ends."""
        g, model = self.g, self.model
        if mv.flagged >= 0:
            k = mv.flagged
            passed = model.passed(mv)
            self.report(
                safety(model.view(passed[k][1])), lambda: [*self.path(i), *_lines(model, mv, k)]
            )
        j, new = g.add(mv.world, i, mv)
        if new:
            self.report(safety(model.view(mv.world)), lambda: self.path(j))
        return j, new

    def expand(self, i: int, kinds: frozenset[Kind]) -> list[tuple[int, bool]]:
        return [self.take(i, mv) for mv in self.model.successors(self.g.worlds[i], kinds=kinds)]

    def internal(self, i: int) -> list[int]:
        got = self.g.internal[i]
        if got is None:
            moved = self.expand(i, _INTERNAL)
            got = self.g.internal[i] = [j for j, _ in moved]
            if not got:
                self.settled += 1
                self.report(settled(self.model.view(self.g.worlds[i])), lambda: self.path(i))
        return got

    def timed(self, i: int) -> list[int]:
        got = self.g.timed[i]
        if got is None:
            got = self.g.timed[i] = [j for j, _ in self.expand(i, _TIME)]
        return got

    def run(self, depth: int | None, stop_at_first: bool) -> list[list[int]]:
        """Layer by layer to ``depth`` inputs/timeouts, or (``None``) until a layer brings
        no new world: then every world the model can reach has been explored."""
        g = self.g
        start, _ = g.add(self.model.initial(), -1, None)
        self.report(safety(self.model.view(g.worlds[start])), lambda: [])
        placed: set[int] = {start}  # worlds given a layer (the fewest inputs reaching them)
        layer = [start]
        layers = self.layers
        d = -1
        while True:
            d += 1
            self.depth = d
            # every world reachable from this layer by internal steps alone, breadth first
            order: list[int] = []
            queue = deque(layer)
            while queue:
                i = queue.popleft()
                order.append(i)
                for j in self.internal(i):
                    if j not in placed:
                        placed.add(j)
                        queue.append(j)
            layers.append(order)
            if (stop_at_first and self.found) or d == depth:
                break
            nxt: list[int] = []
            for i in order:
                ext = [*self.timed(i), *(j for j, _ in self.expand(i, _INPUT))]
                g.external[i] = ext
                for j in ext:
                    if j not in placed:
                        placed.add(j)
                        nxt.append(j)
            if not nxt:
                self.closed = True  # nothing new: the whole reachable space is explored
                break
            layer = nxt
        return layers

    def check_eventual(self, roots: int) -> None:
        """From every explored world, let time pass alone in every order (depth first, each
        world once): check ``eventual`` where nothing is left, and that time alone never
        loops."""
        g, model = self.g, self.model
        done: set[int] = set()
        for root in range(roots):
            if root in done:
                continue
            # frames: (world id, its successors, how many of them were taken); the last one
            # taken leads to the frame above, or to the world being looked at
            stack: list[tuple[int, list[int], int]] = []
            on_stack: set[int] = set()
            todo = [root]
            while todo or stack:
                if todo:
                    i = todo.pop()
                    succ = [*self.internal(i), *self.timed(i)]
                    if not succ:
                        done.add(i)
                        findings = eventual(model.view(g.worlds[i]))
                        if findings:
                            self.report(findings, partial(self._lines_to, root, stack))
                        continue
                    on_stack.add(i)
                    stack.append((i, succ, 0))
                    continue
                i, succ, k = stack[-1]
                if k == len(succ):
                    stack.pop()
                    on_stack.discard(i)
                    done.add(i)
                    continue
                stack[-1] = (i, succ, k + 1)
                j = succ[k]
                if j in done:
                    continue
                if j in on_stack:
                    self.report(
                        [(0, "time passing alone comes back to an earlier world")],
                        partial(self._lines_to, root, stack),
                    )
                    continue
                todo.append(j)

    def _lines_to(self, root: int, stack: list[tuple[int, list[int], int]]) -> list[str]:
        out = self.path(root)
        for i, succ, k in stack:
            target = self.g.worlds[succ[k - 1]]
            for mv in self.model.successors(self.g.worlds[i], kinds=_TIME_ONLY):
                if mv.world == target:
                    out.extend(_lines(self.model, mv))
                    break
        return out


def explore_plan(
    plan: Plan,
    *,
    specs: Mapping[str, MachineSpec] | None = None,
    links: tuple[Link, ...] = LINKS,
    watches: tuple[Watch, ...] = WATCHES,
    glue: Glue = DEFAULT_GLUE,
    stop_at_first: bool = False,
    stop_at: int | None = None,
    count: bool = True,
) -> Result:
    """Run one exploration; one violation (the shortest found) per invariant.
    ``stop_at_first`` stops after the layer where anything was found; ``stop_at`` stops as
    soon as invariant ``stop_at`` is violated (a check that a fault is reported needs one
    witness, not the whole space)."""
    t0, c0 = time.perf_counter(), time.process_time()
    model = Model(
        plan.config,
        specs=specs,
        links=links,
        watches=watches,
        glue=glue,
        mailboxes=plan.mailboxes,
        inputs=plan.inputs,
    )
    ex = _Explorer(model, stop_at)
    try:
        ex.run(plan.depth, stop_at_first)
    except _Found:
        stopped = True
    else:
        stopped = False
    layers = ex.layers
    explored = len(ex.g.worlds)
    res = Result(
        plan=plan,
        depth=ex.depth,
        closed=ex.closed,
        states=explored,
        settled_states=ex.settled,
    )
    if not (stopped or (stop_at_first and ex.found)):
        with contextlib.suppress(_Found):
            ex.check_eventual(explored)
        res.eventual_states = len(ex.g.worlds) - explored
    if count and not stopped:
        res.sequences = _count_sequences(ex.g, layers, res.depth)
    res.violations = [ex.found[k] for k in sorted(ex.found)]
    res.seconds = time.perf_counter() - t0
    res.cpu_seconds = time.process_time() - c0
    return res


def _count_sequences(g: _Graph, layers: list[list[int]], depth: int) -> int:
    """Paths from the start with at most ``depth`` inputs/timeouts, any internal steps."""
    total = 0
    cur: dict[int, int] = {0: 1}
    for d in range(depth + 1):
        # spread along internal edges; they form a DAG (a cycle is reported as invariant 0),
        # so a topological order over the worlds holding paths settles every count once
        counts = _spread_internal(g, cur)
        total += sum(counts.values())
        if d == depth:
            break
        nxt: dict[int, int] = {}
        for i, c in counts.items():
            for j in g.external[i]:
                nxt[j] = nxt.get(j, 0) + c
        cur = nxt
    return total


def _spread_internal(g: _Graph, seeds: dict[int, int]) -> dict[int, int]:
    # the sub-graph of internal edges reachable from the seeds, in topological order
    indeg: dict[int, int] = {}
    seen: set[int] = set(seeds)
    stack = list(seeds)
    while stack:
        i = stack.pop()
        for j in g.internal[i] or ():
            indeg[j] = indeg.get(j, 0) + 1
            if j not in seen:
                seen.add(j)
                stack.append(j)
    counts = dict.fromkeys(seen, 0)
    for i, c in seeds.items():
        counts[i] += c
    ready = [i for i in seen if indeg.get(i, 0) == 0]
    while ready:
        i = ready.pop()
        c = counts[i]
        for j in g.internal[i] or ():
            counts[j] += c
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return counts


def explore(
    depth: int | None = DEFAULT_DEPTH,
    *,
    configs: Iterable[Config] = DEFAULT_CONFIGS,
    inputs: Iterable[Inputs] = ("job", "avatar"),
    mailboxes: Mailboxes = "settle",
    specs: Mapping[str, MachineSpec] | None = None,
    links: tuple[Link, ...] = LINKS,
    watches: tuple[Watch, ...] = WATCHES,
    glue: Glue = DEFAULT_GLUE,
    workers: int = 1,
    stop_at_first: bool = False,
    stop_at: int | None = None,
    count: bool = True,
) -> Report:
    """Explore every config with each group of inputs to ``depth`` inputs and timeouts
    (each followed by what it causes), or with ``None`` until nothing new is reachable.
    ``workers`` > 1 runs the explorations in processes."""
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise ValueError(f"depth must be a whole number >= 0 or None, not {depth!r}")
    groups: list[Inputs] = [inputs] if isinstance(inputs, str) else list(inputs)  # type: ignore[list-item]
    plans = [Plan(c, g, depth, mailboxes) for g in groups for c in configs]
    return explore_plans(
        plans,
        specs=specs,
        links=links,
        watches=watches,
        glue=glue,
        workers=workers,
        stop_at_first=stop_at_first,
        stop_at=stop_at,
        count=count,
    )


def deep_plans(configs: Iterable[Config] = DEFAULT_CONFIGS) -> list[Plan]:
    """What ``--deep`` (or AGENT_RUNTIME_DEEP=1) explores: the default plans, then every
    input together, inputs arriving between any two events an actor handles, and any
    actor with mail going next (``deep_plans(PLAYOUT_CONFIGS)``: the same with playout)."""
    cs = list(configs)
    return [
        *(Plan(c, g, DEFAULT_DEPTH) for g in ("job", "avatar") for c in cs),
        *(Plan(c, "all", DEEP_ALL_DEPTH) for c in cs),
        *(Plan(c, "job", DEEP_TURNS_DEPTH, "turns") for c in cs),
        *(Plan(c, "all", DEEP_ANY_DEPTH, "any") for c in cs),
    ]


def explore_plans(
    plans: Iterable[Plan],
    *,
    specs: Mapping[str, MachineSpec] | None = None,
    links: tuple[Link, ...] = LINKS,
    watches: tuple[Watch, ...] = WATCHES,
    glue: Glue = DEFAULT_GLUE,
    workers: int = 1,
    stop_at_first: bool = False,
    stop_at: int | None = None,
    count: bool = True,
) -> Report:
    """Run each plan, in ``workers`` processes when more than one."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a whole number >= 1, not {workers!r}")
    todo = list(plans)
    t0 = time.perf_counter()
    opts: dict[str, Any] = {
        "specs": specs,
        "links": links,
        "watches": watches,
        "glue": glue,
        "stop_at_first": stop_at_first,
        "stop_at": stop_at,
        "count": count,
    }
    workers = min(workers, len(todo)) or 1
    if workers == 1:
        results = [explore_plan(p, **opts) for p in todo]
    else:
        # spawn, not fork: the caller may hold threads or an event loop
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(partial(_run_plan, opts), todo))
    return Report(results=results, seconds=time.perf_counter() - t0, workers=workers)


def _run_plan(opts: dict[str, Any], plan: Plan) -> Result:
    return explore_plan(plan, **opts)
