"""Search the real job (``verification.explore.real``) by re-execution.

Two modes, both on fresh harnesses, every run deterministic (one scheduler per job, a
``VirtualClock``, inputs in a declared order):

* ``bfs``: breadth first to a depth bound (and a budget of states). A layer is one input
  from outside or one deadline, the stand-ins' outcomes taken within it. Each state is
  reached by replaying its input path from the start; one run per edge, which also reads
  the child's snapshot and enabled inputs (no fork: the SDK's FFI client runs threads). A
  state is new when its snapshot is; only new ones are expanded, and from each time is
  let pass alone twice, the world hanging what may hang, then answering everything
  (``checks.eventual``).
* ``walks``: seeded random walks (FoundationDB's simulation, TigerBeetle's VOPR): walk
  ``k`` draws its inputs with ``random.Random(seed + k)``; a violation prints that seed.

Either way a violation carries its input path, which ``replay`` runs again to the same
failure.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_runtime.actor import Event
from agent_runtime.runtimes.routing import Wiring
from statemachines.links import LINKS, without
from statemachines.machines import MACHINES
from statemachines.system import REPORTS, WATCHES
from verification.explore.config import CONFIGS, Config
from verification.explore.harness import Harness
from verification.explore.real import (
    Policy,
    Run,
    Setup,
    Snapshot,
    Violation,
    run,
)
from verification.explore.real_inputs import OUTCOMES, Inputs
from verification.explore.toscenario import NotReproducible, write_scenario


@dataclass
class RealReport:
    """What a search of the real job found."""

    config: str
    inputs: Inputs
    mode: str  # "bfs depth N" | "walks"
    states: int = 0  # distinct snapshots reached
    runs: int = 0  # fresh harnesses driven (edges tried, walks walked)
    inputs_done: int = 0  # inputs driven over every run (replays included)
    depth: int = 0  # the deepest layer explored (bfs)
    closed: bool = False  # a layer brought nothing new (bfs): every reachable state is in
    budget_hit: bool = False
    stopped: bool = False  # the search stopped early: its budget, or its first violation
    seconds: float = 0.0
    idle_seconds: float = 0.0  # virtual seconds the loop jumped with nothing to run
    layers: list[int] = field(default_factory=list)  # new states per layer (bfs)
    # each machine's states no run went through (passing ones count), by machine
    unreached: dict[str, list[str]] = field(default_factory=dict)
    entered: set[tuple[str, str]] = field(default_factory=set, repr=False)
    violations: list[Violation] = field(default_factory=list)
    # --drop-link SPEC: the fault planted in every run (its violations' replay names it)
    fault: str = ""
    # --write-scenario DIR: each violation's scenario file, or why it could not be written
    scenario_dir: str | None = None
    scenarios: list[str] = field(default_factory=list)
    # told of every run (the mutation tool records which cells each one decided)
    on_run: Callable[[Run], None] | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        out = asdict(dataclasses.replace(self, on_run=None))
        del out["entered"], out["on_run"]  # (unreached says the first for JSON)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        per = self.seconds / self.states if self.states else 0.0
        whole = " (all of them: nothing new after that depth)" if self.closed else ""
        budget = " (budget reached)" if self.budget_hit else ""
        if self.stopped and not self.budget_hit:
            budget = " (stopped at the first violation)"
        lines = [
            f"real job [{self.config}], {self.inputs} inputs, {self.mode}: "
            f"{self.states:,} states{whole}{budget} to depth {self.depth}, "
            f"{self.runs:,} runs, {self.inputs_done:,} inputs driven, "
            f"{self.seconds:.1f} s ({per * 1000:.1f} ms a state), "
            f"{self.idle_seconds:g} s of the SDK's own time waited for"
        ]
        if self.layers:
            lines.append(f"  new states by depth (outcomes within the layer): {self.layers}")
        if self.unreached:
            never = "; ".join(f"{m}: {', '.join(s)}" for m, s in self.unreached.items())
            lines.append(f"  states no run went through: {never}")
        lines += [str(v) for v in self.violations]
        lines += [f"  {s}" for s in self.scenarios]
        lines.append("every invariant holds" if self.ok else f"{len(self.violations)} violation(s)")
        return "\n".join(lines)


def drop_link(spec: str) -> Setup:
    """A fault for the harness: the runtime does not deliver the link ``SOURCE:ON:TARGET``
    (``statemachines.links.without``), as ``tests/test_explore_real_drops.py`` plants it."""
    source, on, target = spec.split(":")
    if without(LINKS, source, on, target) == LINKS:
        raise ValueError(f"no link {spec} in statemachines.links.LINKS")

    def setup(h: Harness) -> None:
        h.job.system.wiring._links = Wiring(links=without(LINKS, source, on, target))._links

    return setup


def drop_watch(spec: str) -> Setup:
    """A fault for the harness: the job system does not deliver the watch
    ``SOURCE:EVENT:TARGET`` (``statemachines.system.WATCHES``): ``TARGET`` never gets
    ``EVENT`` for ``SOURCE``'s state changes."""
    source, event, target = spec.split(":")
    if not any((w.source, w.event, w.target) == (source, event, target) for w in WATCHES):
        raise ValueError(f"no watch {spec} in statemachines.system.WATCHES")

    def setup(h: Harness) -> None:
        watchers = h.job.system._watchers
        post = watchers.get(target)
        if post is None:
            return  # the job has no such machine: nothing to drop

        def filtered(ev: Event) -> None:
            if not (ev.name == event and source in ev.data):
                post(ev)

        watchers[target] = filtered

    return setup


def drop_report(spec: str) -> Setup:
    """A fault for the harness: the job system does not deliver the report
    ``SOURCE:REPORT:TARGET`` (``statemachines.system.REPORTS``, named by what the source's
    runtime emits, as a link by its effect): ``TARGET`` never hears it."""
    key = tuple(spec.split(":"))
    if not any((r.source, r.report, r.target) == key for r in REPORTS):
        raise ValueError(f"no report {spec} in statemachines.system.REPORTS")
    kept = tuple(r for r in REPORTS if (r.source, r.report, r.target) != key)

    def setup(h: Harness) -> None:
        system = h.job.system
        system._unhear()
        system._unhear = system._hear_reports(reports=kept)

    return setup


def drop(spec: str) -> Setup:
    """``drop_link``, ``drop_watch`` or ``drop_report``, whichever table names ``spec``."""
    for plant in (drop_link, drop_watch):
        try:
            return plant(spec)
        except ValueError:
            pass
    try:
        return drop_report(spec)
    except ValueError:
        raise ValueError(
            f"no link, watch or report {spec} (statemachines.links.LINKS, "
            "statemachines.system.WATCHES, REPORTS)"
        ) from None


# every link (statemachines.links.LINKS, by source, effect and target), watch
# (statemachines.system.WATCHES, by source, event and target) and report (REPORTS, by
# source, report and target) a fault may drop
LINK_SPECS: tuple[str, ...] = tuple(dict.fromkeys(f"{k.source}:{k.on}:{k.target}" for k in LINKS))
WATCH_SPECS: tuple[str, ...] = tuple(f"{w.source}:{w.event}:{w.target}" for w in WATCHES)
REPORT_SPECS: tuple[str, ...] = tuple(f"{r.source}:{r.report}:{r.target}" for r in REPORTS)


def _note(report: RealReport, r: Run, seen: set[Snapshot]) -> bool:
    """Count a run; keep its violation when it is the first of its invariant (the shortest,
    breadth first). Whether the run's last state is new."""
    report.runs += 1
    report.entered |= r.entered
    if report.on_run is not None:
        report.on_run(r)
    report.inputs_done += len(r.path)
    report.idle_seconds += r.idle_seconds
    v = r.violation
    if v is not None and all(w.invariant != v.invariant for w in report.violations):
        v.config, v.inputs, v.fault = report.config, report.inputs, report.fault
        report.violations.append(v)
        if report.scenario_dir is not None:
            report.scenarios.append(_write(report, v, r))
    last = r.snapshots[-1]
    if last in seen:
        return False
    seen.add(last)
    return True


def _write(report: RealReport, v: Violation, r: Run) -> str:
    """Write the violation's run as a scenario file: what to print about it."""
    name = f"invariant-{v.invariant}-{report.config}"
    name += f"-seed-{v.seed}" if v.seed is not None else f"-{len(v.path)}-inputs"
    try:
        path = write_scenario(
            report.scenario_dir or ".", name, report.config, CONFIGS[report.config], r.log
        )
    except NotReproducible as e:
        return f"invariant {v.invariant}: no scenario written: {e}"
    return f"invariant {v.invariant}: scenario written; replay: agent-runtime simulate {path}"


def bfs(
    config: Config,
    name: str,
    *,
    inputs: Inputs = "all",
    depth: int = 3,
    budget: int = 5_000,
    setup: Setup | None = None,
    free_outcomes: bool = True,
    stop_at_first: bool = False,
    scenario_dir: str | None = None,
    prefix: tuple[str, ...] = (),
    on_run: Callable[[Run], None] | None = None,
    fault: str = "",
) -> RealReport:
    """Breadth first over the real job's snapshots, up to ``depth`` inputs and ``budget``
    states, from the start or from where ``prefix`` (a path) leads. With ``free_outcomes``
    a layer is one input from outside or one deadline: the stand-ins' outcomes are taken
    within the layer, in every order, at no cost in depth. ``stop_at_first``: stop at the
    first violation. ``fault``: the ``--drop-link`` spec ``setup`` plants, for the replay
    command a violation prints."""
    started = time.perf_counter()
    report = RealReport(name, inputs, f"bfs depth {depth}", on_run=on_run, fault=fault)
    report.scenario_dir = scenario_dir
    seen: set[Snapshot] = set()
    Node = tuple[tuple[str, ...], tuple[str, ...]]  # (path, inputs enabled at its end)

    def is_new(snap: Snapshot) -> bool:
        return snap not in seen  # time let pass alone only from states not seen yet

    def visit(path: tuple[str, ...]) -> Node | None:
        """The run to ``path``'s state: the node when it is new and broke nothing. From a
        new one time passes alone twice: the world hanging what may hang (in this run),
        then answering everything (one more run)."""
        before = len(seen)
        r = run(config, path, inputs=inputs, setup=setup, check_eventual=is_new, policy="hang")
        new = _note(report, r, seen)
        if new and r.violation is None:
            again = run(config, path, inputs=inputs, setup=setup, policy="return")
            _note(report, again, seen)
        if len(seen) > budget and before <= budget:
            report.budget_hit = report.stopped = True
        if stop_at_first and report.violations:
            report.stopped = True
        broke = r.violation is not None and r.violation.step <= len(path)
        return (path, r.enabled) if new and not broke else None

    def free(token: str) -> bool:
        return free_outcomes and token in OUTCOMES

    counted = 0
    root = visit(prefix)
    layer = [root] if root is not None else []
    for d in range(depth + 1):
        # the layer closed under the stand-ins' outcomes, breadth first
        queue, order = deque(layer), []
        while queue and not report.stopped:
            node = queue.popleft()
            order.append(node)
            for token in node[1]:
                if free(token) and (child := visit((*node[0], token))) is not None:
                    queue.append(child)
        report.layers.append(len(seen) - counted)  # new snapshots within this layer
        counted = len(seen)
        report.depth = d
        if d == depth or report.stopped:
            break
        nxt: list[Node] = []
        for path, enabled in order:
            for token in enabled:
                if report.stopped:
                    break
                if not free(token) and (child := visit((*path, token))) is not None:
                    nxt.append(child)
        if not nxt:
            report.closed = True
            break
        layer = nxt
    if report.stopped and len(seen) > counted:
        report.layers.append(len(seen) - counted)  # the part of the next layer reached
    report.states = len(seen)
    report.unreached = unreached(report.entered)
    report.seconds = time.perf_counter() - started
    return report


def walk(
    config: Config,
    seed: int,
    steps: int,
    *,
    inputs: Inputs = "all",
    setup: Setup | None = None,
    prefix: tuple[str, ...] = (),
) -> Run:
    """One seeded random walk (from where ``prefix`` leads): ``steps`` inputs, each drawn
    with ``random.Random(seed)`` among the enabled ones, then time let pass alone (the world
    answering everything for an even seed, hanging what may hang for an odd one)."""
    rng = random.Random(seed)

    def choose(enabled: tuple[str, ...]) -> str | None:
        return rng.choice(enabled) if enabled else None

    policy: Policy = "hang" if seed % 2 else "return"
    return run(
        config,
        prefix,
        inputs=inputs,
        setup=setup,
        choose=choose,
        steps=steps,
        seed=seed,
        policy=policy,
    )


def walks(
    config: Config,
    name: str,
    *,
    seed: int,
    count: int,
    steps: int,
    inputs: Inputs = "all",
    setup: Setup | None = None,
    on_walk: Callable[[int, Run], None] | None = None,
    scenario_dir: str | None = None,
    prefix: tuple[str, ...] = (),
    on_run: Callable[[Run], None] | None = None,
    fault: str = "",
) -> RealReport:
    """``count`` walks, walk ``k`` with seed ``seed + k`` (each from where ``prefix``
    leads); ``fault`` as for ``bfs``."""
    started = time.perf_counter()
    report = RealReport(
        name,
        inputs,
        f"{count} walks of {steps} inputs from seed {seed}",
        on_run=on_run,
        fault=fault,
    )
    report.scenario_dir = scenario_dir
    seen: set[Snapshot] = set()
    for k in range(count):
        r = walk(config, seed + k, steps, inputs=inputs, setup=setup, prefix=prefix)
        _note(report, r, seen)
        seen.update(r.snapshots)
        report.depth = max(report.depth, len(r.path))
        if on_walk is not None:
            on_walk(seed + k, r)
    report.states = len(seen)
    report.unreached = unreached(report.entered)
    report.seconds = time.perf_counter() - started
    return report


def unreached(entered: set[tuple[str, str]]) -> dict[str, list[str]]:
    """Each machine's states that no run went through, for the machines the runs had."""
    out = {}
    for machine in sorted({m for m, _ in entered}):
        left = [s for s in MACHINES[machine].state_names if (machine, s) not in entered]
        if left:
            out[machine] = left
    return out


def replay(
    config: Config,
    name: str,
    path: tuple[str, ...],
    *,
    inputs: Inputs = "all",
    setup: Setup | None = None,
    policy: Policy = "return",
    scenario_dir: str | None = None,
    fault: str = "",
) -> RealReport:
    """Run ``path`` again (and let time pass alone at its end, as ``policy`` says);
    ``fault`` as for ``bfs``."""
    started = time.perf_counter()
    report = RealReport(name, inputs, f"replay of {len(path)} inputs", fault=fault)
    report.scenario_dir = scenario_dir
    seen: set[Snapshot] = set()
    r = run(config, path, inputs=inputs, setup=setup, policy=policy)
    _note(report, r, seen)
    seen.update(r.snapshots)
    report.depth = len(r.path)
    report.states = len(seen)
    report.unreached = unreached(report.entered)
    report.seconds = time.perf_counter() - started
    return report


def run_real(args: Any) -> int:
    """``dev.py explore``: exit 0 when every invariant holds, 1 with each violation
    (its path, and its seed for a walk), 2 on a usage error."""
    prog = "dev.py explore"
    for name in ("depth", "budget", "walks", "steps"):
        value = getattr(args, name)
        if value is not None and value < 0:
            print(f"{prog}: --{name} must be >= 0", file=sys.stderr)
            return 2
    config = CONFIGS[args.config]
    try:
        setup = drop(args.drop_link) if args.drop_link else None
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    kw: dict[str, Any] = {
        "inputs": args.inputs,
        "setup": setup,
        "fault": args.drop_link or "",
        "scenario_dir": getattr(args, "write_scenario", None),
    }
    if args.replay is not None and getattr(args, "prefix", None):
        print(
            f"{prog}: --prefix starts walks and searches; a --replay path is whole", file=sys.stderr
        )
        return 2
    if args.replay is not None:
        path = tuple(t for t in args.replay.split(",") if t and t != "-")
        try:
            report = replay(config, args.config, path, policy=args.policy, **kw)
        except ValueError as e:  # an input not enabled: the path is not this config's
            print(f"{prog}: the replay diverged: {e}", file=sys.stderr)
            return 1
    else:
        prefix = tuple(t for t in (getattr(args, "prefix", None) or "").split(",") if t)
        try:
            if args.seed is not None:
                report = walks(
                    config,
                    args.config,
                    seed=args.seed,
                    count=args.walks,
                    steps=args.steps,
                    prefix=prefix,
                    **kw,
                )
            else:
                depth = 3 if args.depth is None else args.depth
                report = bfs(
                    config, args.config, depth=depth, budget=args.budget, prefix=prefix, **kw
                )
        except ValueError as e:  # an input of the prefix not enabled where it comes
            print(f"{prog}: --prefix is not a path of this config: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
    return 0 if report.ok else 1
