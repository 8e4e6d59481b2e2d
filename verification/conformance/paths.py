"""The event paths the conformance replay drives through the real runtime.

A path is a sequence of the model's moves (inputs, outcomes of work running aside, and
timeouts) from the start of a job, each one something a test can do to a real ``AgentJob``.
Paths are walked in the explorer's model with ``eager`` work (what the runtime finishes by
itself is done at once, as on an event loop with nothing else ready) and beside virtual
time (``Walker``): a timeout may fire only when it is the next one due, as on the
runtime's clock, so every path here is one the runtime can take.

Two sources: paths that together take every transition row the composed job can take
(``covering_paths``), and the shortest counterexamples of the explorer, read back from their
printed steps (``from_steps``).

Pure: no asyncio, no livekit.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from statemachines.glue import LINKS, without
from statemachines.system import bound_of, host_drain
from verification.explore.abstract import AUTO_WORK, GRACE_PERIOD, Config, Glue, Inputs
from verification.explore.model import MACHINE_NAMES, Kind, Model, Move, World
from verification.explore.search import Plan, explore_plan

# the runtime settings the replay runs with (seconds); a timeout's duration in the walker
# comes from the same numbers, so a path's timeouts fire in the runtime's order
SETTINGS: dict[str, float] = {
    "join_timeout": 30.0,
    "session_end_timeout": 300.0,
    "close_timeout": 10.0,
    "session_close_timeout": 60.0,
    "backoff_initial": 1.0,
    "backoff_multiplier": 2.0,
}
# the job gives the host's drain its part of the host step's share (host_drain); run_close's
# session and avatar steps their shares of close_timeout (statemachines.system.TEARDOWN)
DRAIN_TIMEOUT = host_drain(SETTINGS["close_timeout"])
SESSION_WAIT = bound_of("session", SETTINGS["close_timeout"])  # before the avatar's step
SESSION_STEP_BOUND = bound_of("avatar", SETTINGS["close_timeout"])  # the avatar's step
BOUND = "close_session_bound"  # the action of the avatar step's bound (run_close)
WAIT = "close_session_wait"  # the action of the wait for the session before the avatar
_TIME: frozenset[Kind] = frozenset({"time"})


def timer_seconds(config: Config, key: str, armed_in: str, world: World) -> float:
    """How long the timer ``key`` (a machine, or run_close's bound) runs from when it is
    armed in state ``armed_in``."""
    if key == BOUND:
        return SESSION_STEP_BOUND
    if key == WAIT:
        return SESSION_WAIT
    setting = {
        "avatar": {"starting": "join_timeout", "routing": "join_timeout", "backoff": "backoff"},
        "job": {"awaiting_finalize": "session_end_timeout", "closing": "close_timeout"},
        "participant": {"grace": "grace_period", "closing": "session_close_timeout"},
        "room_deletion": {"deleting": "close_timeout"},
        "session_host": {"closing": "drain_timeout"},
    }[key][armed_in]
    if setting == "grace_period":
        return GRACE_PERIOD if config.grace else 0.0
    if setting == "drain_timeout":
        return DRAIN_TIMEOUT
    if setting == "backoff":  # AvatarRetry's Backoff before restart n
        n = world.av_attempts
        return SETTINGS["backoff_initial"] * SETTINGS["backoff_multiplier"] ** n
    return SETTINGS[setting]


_TIMERS = {
    "avatar": "t_avatar",
    "job": "t_job",
    "participant": "t_part",
    "room_deletion": "t_dele",
    "session_host": "t_host",
}


_KEYS = (*_TIMERS, BOUND, WAIT)


def _armed(world: World) -> tuple[str, ...]:
    """Where each timer of ``_KEYS`` was armed ("" for none), in that order. Spelled out:
    it runs twice for every move the walk takes."""
    step = world.job_task.partition(":")[2]
    return (
        world.t_avatar,
        world.t_job,
        world.t_part,
        world.t_dele,
        world.t_host,
        # run_close's bounds: the avatar step's own, and the session step's
        "avatar" if step == "avatar" else "",
        "session" if step == "session" else "",
    )


@dataclass(frozen=True)
class Node:
    """A world of the model, at a virtual time, with the timers armed: (key, deadline,
    arming order), the next one due first."""

    world: World
    now: float = 0.0
    armed: tuple[tuple[str, float, int], ...] = ()
    seq: int = 0

    def key(self) -> tuple[World, tuple[str, ...]]:
        return self.world, tuple(k for k, _, _ in self.armed)


@dataclass(frozen=True)
class Step:
    """One move of a path: what a test does (``action``), as the model labels it, and the
    virtual time it happens at (a timeout: its deadline)."""

    action: str
    label: str
    at: float


class Walker:
    """The eager model walked beside virtual time."""

    def __init__(self, config: Config, inputs: Inputs = "all") -> None:
        self.config = config
        self.model = Model(config, eager=True, inputs=inputs)
        self.model.taken = []
        first = self.model._start()
        # the job starting: its start-up mail handled
        self._started = self.model._move("internal", "", "the job starts", first, _nothing)
        self.initial_rows = frozenset(
            (m, i) for m, i, _ in (*self.model.start_rows, *self._started.rows)
        )
        self._first = first
        # a world's moves, once: the walk reaches a world again with other timers armed
        self._succ: dict[World, list[Move]] = {}

    def start(self) -> Node:
        return self._arm(Node(self._first), self._started)

    def moves(self, node: Node) -> list[tuple[Move, Node]]:
        """Every move from ``node`` the runtime can take: any input or outcome, and the
        timeout that is due next (with every other one due at the same time: the clock
        fires them together)."""
        out = []
        due = node.armed[0][0] if node.armed else None
        succ = self._succ.get(node.world)
        if succ is None:
            self.model.taken = []  # each move keeps its own rows
            succ = self._succ[node.world] = self.model.successors(node.world)
        for mv in succ:
            if mv.kind != "time":
                out.append((mv, self._arm(node, mv)))
            elif mv.action.removeprefix("timeout:") == due:
                out.append(self._fire_due(node, mv))
        return out

    def _fire_due(self, node: Node, mv: Move) -> tuple[Move, Node]:
        """``mv`` fires the timer due first; then every other one due at that time."""
        _, deadline, _ = node.armed[0]
        after = self._arm(Node(node.world, deadline, node.armed[1:], node.seq), mv)
        rows = list(mv.rows)
        while after.armed and after.armed[0][1] <= deadline:
            key = after.armed[0][0]
            self.model.taken = []
            nxt = [
                m
                for m in self.model.successors(after.world, kinds=_TIME)
                if m.action.removeprefix("timeout:") == key
            ]
            if not nxt:
                break
            rows += nxt[0].rows
            after = self._arm(Node(after.world, deadline, after.armed[1:], after.seq), nxt[0])
        return mv._replace(world=after.world, rows=tuple(rows)), after

    def _arm(self, node: Node, mv: Move) -> Node:
        """The timers once ``mv`` happened: a state left cancels its machine's timer, a
        state entered arms its own (as the actor does), run_close's bound runs while its
        session step waits."""
        armed = {k: (d, n) for k, d, n in node.armed}
        seq = node.seq
        end = mv.world
        entered = {m for m, _, changed in mv.rows if changed}
        for key, before, after in zip(_KEYS, _armed(node.world), _armed(end), strict=True):
            if key in entered or before != after:
                armed.pop(key, None)
                if after:
                    seconds = timer_seconds(self.config, key, after, end)
                    armed[key] = (node.now + seconds, seq)
                    seq += 1
        ordered = tuple(sorted(((k, d, n) for k, (d, n) in armed.items()), key=lambda x: x[1:]))
        return Node(end, node.now, ordered, seq)

    def step_of(self, mv: Move, after: Node) -> Step:
        return Step(mv.action, mv.label, after.now)


@dataclass(frozen=True)
class Path:
    """A path to replay: the config and inputs it runs under, its steps, and why it is
    there (the rows it covers, or the counterexample it comes from)."""

    config: Config
    inputs: Inputs
    steps: tuple[Step, ...]
    why: str = ""
    covers: frozenset[tuple[str, int]] = field(default_factory=frozenset)

    def __str__(self) -> str:
        lines = [f"[{self.config.label()}] {self.inputs} inputs: {self.why}"]
        lines += [f"  {i + 1:3d}. t={s.at:g} {s.label}" for i, s in enumerate(self.steps)]
        return "\n".join(lines)


# -- paths that take every row ---------------------------------------------------------------


def rows_of_every_machine(model: Model) -> set[tuple[str, int]]:
    """Every transition row of every machine the model composes (``MACHINE_NAMES``)."""
    return {(m, i) for m in MACHINE_NAMES for i in range(len(model.specs[m].rows))}


def covering_paths(
    configs: Iterable[Config],
    *,
    groups: Iterable[Inputs] = ("job", "avatar", "all"),
    depth: int = 9,
    budget: int = 20_000,
) -> tuple[list[Path], set[tuple[str, int]]]:
    """Paths that together take every row the walk reaches (breadth first, each node once,
    to ``depth`` moves or ``budget`` nodes per config and group), few of them: the shortest
    path to each row, extended by greedy choice. Returns them and the rows no path takes."""
    candidates: list[Path] = []
    every: set[tuple[str, int]] = set()
    for config in configs:
        for group in groups:
            walker = Walker(config, group)
            every |= rows_of_every_machine(walker.model)
            candidates += _shortest_to_each_row(walker, depth, budget)
    chosen = _greedy(candidates)
    covered = set().union(*(p.covers for p in chosen)) if chosen else set()
    return chosen, every - covered


def _shortest_to_each_row(walker: Walker, depth: int, budget: int) -> list[Path]:
    start = walker.start()
    seen = {start.key()}
    # node, the steps to it, the rows taken on the way
    queue: deque[tuple[Node, tuple[Step, ...], frozenset[tuple[str, int]]]] = deque(
        [(start, (), walker.initial_rows)]
    )
    first: dict[tuple[str, int], Path] = {}
    while queue and len(seen) < budget:
        node, steps, rows = queue.popleft()
        if len(steps) >= depth:
            continue
        for mv, after in walker.moves(node):
            taken = rows | frozenset((m, i) for m, i, _ in mv.rows)
            path_steps = (*steps, walker.step_of(mv, after))
            for row in sorted(taken - rows):
                if row not in first:
                    first[row] = Path(
                        walker.config, walker.model.inputs, path_steps, "covering", taken
                    )
            k = after.key()
            if k not in seen:
                seen.add(k)
                queue.append((after, path_steps, taken))
    return list(first.values())


def _greedy(candidates: list[Path]) -> list[Path]:
    left = set().union(*(p.covers for p in candidates)) if candidates else set()
    chosen: list[Path] = []
    pool = sorted(candidates, key=lambda p: (-len(p.covers), len(p.steps)))
    while left:
        best = max(pool, key=lambda p: (len(p.covers & left), -len(p.steps)))
        gain = best.covers & left
        if not gain:
            break
        chosen.append(best)
        left -= gain
    return chosen


# -- counterexamples, read back --------------------------------------------------------------

_MAIL = re.compile(r"^\S+ handles \S+")


def from_steps(
    config: Config, inputs: Inputs, labels: Iterable[str], why: str
) -> tuple[Path, list[str]]:
    """The path a counterexample's printed steps take, walked in the model as the runtime
    runs it: mail and the work the runtime does by itself come on their own, a timeout
    waits for the ones due before it. Where a step cannot be taken (the counterexample came
    from a changed spec or link, and the real ones go elsewhere) the path stops; the
    second value says what was left out."""
    walker = Walker(config, inputs)
    node = walker.start()
    steps: list[Step] = []
    skipped: list[str] = []
    auto = set(AUTO_WORK.values())
    todo = [s for s in labels if not s.startswith(" ")]
    for i, label in enumerate(todo):
        if label in auto or _MAIL.match(label):
            continue
        for _ in range(len(node.armed) + 1):
            moves = walker.moves(node)
            match = [(mv, after) for mv, after in moves if mv.label == label]
            if match:
                mv, node = match[0]
                steps.append(walker.step_of(mv, node))
                break
            due = [(mv, after) for mv, after in moves if mv.kind == "time"]
            if not label.startswith("time passes") or not due:
                skipped = todo[i:]
                break
            mv, node = due[0]  # a timeout due before the one the step waits for
            steps.append(walker.step_of(mv, node))
        else:
            skipped = todo[i:]
        if skipped:
            break
    return Path(config, inputs, tuple(steps), why), skipped


def _nothing(s: object) -> None:
    return None


def faults() -> list[tuple[str, dict[str, Any]]]:
    """Every fault the explorer knows how to inject, as ``explore_plan`` keywords: each of
    the model's abstractions broken (``Glue``), each link between the machines left out."""
    out: list[tuple[str, dict[str, Any]]] = [
        (f"model fault: {f.name} off", {"glue": Glue(**{f.name: False})}) for f in fields(Glue)
    ]
    for link in LINKS:
        where = f"{link.source}.{link.on}{':' + link.step if link.step else ''}"
        links = without(LINKS, link.source, link.on, link.target)
        out.append((f"link left out: {where} -> {link.target}.{link.event}", {"links": links}))
    return out


def counterexample_paths(
    configs: Iterable[Config], *, groups: Iterable[Inputs] = ("job", "avatar"), depth: int = 3
) -> tuple[list[Path], list[str]]:
    """The shortest counterexample the explorer finds for each fault (``faults``) under
    each config and group of inputs, as paths of the real model (duplicates once). Returns
    them and what could not be followed (a fault's path the real glue does not take)."""
    paths: dict[tuple[Config, str, tuple[Step, ...]], Path] = {}
    left: list[str] = []
    for config in configs:
        for group in groups:
            for why, fault in faults():
                res = explore_plan(
                    Plan(config, group, depth), stop_at_first=True, count=False, **fault
                )
                for v in res.violations:
                    label = f"{why}: invariant {v.invariant} ({v.name})"
                    path, skipped = from_steps(config, group, v.steps, label)
                    if skipped:
                        left.append(f"{label} [{config.label()}]: stops before {skipped[0]!r}")
                    paths.setdefault((config, group, path.steps), path)
    return list(paths.values()), left
