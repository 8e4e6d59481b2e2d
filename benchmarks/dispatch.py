"""Event dispatch: one machine, one event sequence, through each way of running it.

Every contender gets the same spec rows, the same constant guard values and the same no-op
effect handlers, and must end in the same state. Setup (building the machine or actor,
resolving triggers, building event objects) is outside the timed region; the actor is timed
the way it is used: ``post`` all N events on a running loop, then ``await join()``.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transitions import Machine
from transitions.extensions.asyncio import AsyncMachine

from agent_runtime import Actor, AsyncioClock, Event, JsonlSink, MemorySink, Tracer
from statemachines import MachineSpec, step
from statemachines.machines import MACHINES

from .config import Config
from .table import Row, Target
from .timing import Lap, Stopwatch

SECTION = "dispatch"


@dataclass(frozen=True, slots=True)
class Workload:
    """A machine and an event sequence that transitions on every event.

    ``prefix`` leads from the initial state into ``cycle``, which returns to where it
    started, so the sequence can be any length.
    """

    spec: MachineSpec
    prefix: tuple[str, ...]
    cycle: tuple[str, ...]
    guards: Mapping[str, bool]
    settings: Mapping[str, float]

    def events(self, n: int) -> list[str]:
        out = list(self.prefix[:n])
        while len(out) < n:
            out.extend(self.cycle[: n - len(out)])
        return out

    def check(self, n: int) -> str:
        """Walk the sequence with the pure step; every event must be a transition.

        Returns the state the sequence ends in (every contender must agree with it).
        """
        state = self.spec.initial
        for name in self.events(n):
            st = step(self.spec, state, name, self.guards)
            if st.outcome != "transition":
                raise ValueError(
                    f"workload {self.spec.name!r}: {name!r} in {state!r} is {st.outcome}, "
                    "not a transition"
                )
            state = st.dest
        return state


WORKLOADS: dict[str, Workload] = {
    # linked <-> grace: a guard fall-through (closing_reason is false), a state timeout
    # armed on every entry to grace and cancelled on leaving it, an effect on every relink
    "participant": Workload(
        spec=MACHINES["participant"],
        prefix=("participant_connected",),
        cycle=("participant_disconnected", "participant_connected"),
        guards={
            "eligible": True,
            "is_linked": True,
            "closing_reason": False,
            "grace_enabled": True,
            "same_identity": True,
        },
        settings={"grace_period": 3600.0},
    ),
    # routing -> joined -> (internal interrupt) -> failed -> restored -> routing
    "avatar": Workload(
        spec=MACHINES["avatar"],
        prefix=("start", "plugin_started"),
        cycle=("video_published", "interrupt", "avatar_left", "route_restored", "avatar_connected"),
        guards={
            "has_video": False,
            "avatar_present": True,
            "clear_pending": False,
            "delivered": False,
            "retry_left": False,
            "speaking_in_room": False,
            "rejoin": True,
        },
        settings={"join_timeout": 3600.0},
    ),
}


def _noop(*_: object) -> None:
    return None


def _const(value: bool) -> Callable[..., bool]:
    def guard(*_: object) -> bool:
        return value

    return guard


# -- contenders: each returns (the cost of the timed region, final state) ----------------

Contender = Callable[[Workload, list[str]], Awaitable[tuple[Lap, str]]]


async def run_dict(w: Workload, names: list[str]) -> tuple[Lap, str]:
    """A hand-written table lookup: the floor any table-driven dispatch can reach."""
    Entry = tuple[tuple[Callable[..., bool], ...], str | None, tuple[Callable[..., None], ...]]
    table: dict[tuple[str, str], list[Entry]] = {}
    for r in w.spec.rows:
        guards = tuple(_const(w.guards[g]) for g in r.guards)
        table.setdefault((r.source, r.event), []).append(
            (guards, r.dest, tuple(_noop for _ in r.effects))
        )
    for c in (*w.spec.ignore, *w.spec.reject):
        table[(c.state, c.event)] = []
    state = w.spec.initial
    gc.collect()
    sw = Stopwatch()
    for ev in names:
        for guards, dest, effects in table[(state, ev)]:
            for g in guards:
                if not g(ev):
                    break
            else:
                if dest is not None:
                    state = dest
                for eff in effects:
                    eff(ev)
                break
    return sw.lap(), state


async def run_step(w: Workload, names: list[str]) -> tuple[Lap, str]:
    """The runtime's pure decision alone (no mailbox, no effects, no timers)."""
    spec, values = w.spec, dict(w.guards)
    state = spec.initial
    gc.collect()
    sw = Stopwatch()
    for ev in names:
        state = step(spec, state, ev, values).dest
    return sw.lap(), state


def _transitions_rows(w: Workload) -> list[dict[str, Any]]:
    # callables rather than names: the fastest way to drive transitions (no getattr)
    return [
        {
            "trigger": r.event,
            "source": r.source,
            "dest": r.dest,
            "conditions": [_const(w.guards[g]) for g in r.guards],
            "after": [_noop for _ in r.effects],
        }
        for r in w.spec.rows
    ]


class _Model:
    state: str


async def run_machine(w: Workload, names: list[str]) -> tuple[Lap, str]:
    model = _Model()
    Machine(
        model=model,
        states=[s.name for s in w.spec.states],
        transitions=_transitions_rows(w),
        initial=w.spec.initial,
        auto_transitions=False,
    )
    triggers = [getattr(model, n) for n in names]
    gc.collect()
    sw = Stopwatch()
    for trigger in triggers:
        trigger()
    return sw.lap(), model.state


async def run_async_machine(w: Workload, names: list[str]) -> tuple[Lap, str]:
    model = _Model()
    AsyncMachine(
        model=model,
        states=[s.name for s in w.spec.states],
        transitions=_transitions_rows(w),
        initial=w.spec.initial,
        auto_transitions=False,
    )
    triggers = [getattr(model, n) for n in names]
    gc.collect()
    sw = Stopwatch()
    for trigger in triggers:
        await trigger()
    return sw.lap(), model.state


def _actor(w: Workload, tracer: Tracer | None) -> Actor:
    return Actor(
        w.spec,
        instance="bench",
        effects={e.name: _noop for e in w.spec.effects},
        guards={g: _const(v) for g, v in w.guards.items()},
        settings=w.settings,
        clock=AsyncioClock(),
        tracer=tracer,
    )


async def _drive_actor(w: Workload, names: list[str], tracer: Tracer | None) -> tuple[Lap, str]:
    actor = _actor(w, tracer)
    actor.start()
    interned = {n: Event(n) for n in set(names)}
    events = [interned[n] for n in names]
    gc.collect()
    sw = Stopwatch()
    for ev in events:
        actor.post(ev)
    await actor.join()
    lap = sw.lap()
    await actor.aclose()
    return lap, actor.state


async def run_actor(w: Workload, names: list[str]) -> tuple[Lap, str]:
    return await _drive_actor(w, names, None)


async def run_actor_memory(w: Workload, names: list[str]) -> tuple[Lap, str]:
    return await _drive_actor(w, names, Tracer(MemorySink()))


async def run_actor_otel(w: Workload, names: list[str]) -> tuple[Lap, str]:
    """What AgentJob installs by default, in a process with no OTel SDK configured."""
    from opentelemetry import trace

    from agent_runtime.observe.otel import OtelSink

    return await _drive_actor(w, names, Tracer(OtelSink(tracer=trace.get_tracer("bench"))))


async def run_actor_jsonl(w: Workload, names: list[str]) -> tuple[Lap, str]:
    with tempfile.TemporaryDirectory() as d:
        sink = JsonlSink(Path(d) / "trace.jsonl")
        try:
            return await _drive_actor(w, names, Tracer(sink))
        finally:
            sink.close()


async def run_actor_send(w: Workload, names: list[str]) -> tuple[Lap, str]:
    """``await send()`` per event: a caller that waits for every step before the next."""
    actor = _actor(w, None)
    actor.start()
    events = [Event(n) for n in names]
    gc.collect()
    sw = Stopwatch()
    for ev in events:
        await actor.send(ev)
    lap = sw.lap()
    await actor.aclose()
    return lap, actor.state


# issue 16: the actor costs at most a raw Machine trigger per event, and is at least this many
# times AsyncMachine's throughput
MACHINE_COST = 1.0
ASYNC_MACHINE_SPEEDUP = 5.0

CONTENDERS: dict[str, tuple[str, Contender]] = {
    "dict": ("hand-written dict dispatch", run_dict),
    "step": ("statemachines.step alone", run_step),
    "machine": ("transitions Machine trigger", run_machine),
    "async_machine": ("transitions AsyncMachine trigger", run_async_machine),
    "actor": ("Actor, trace off", run_actor),
    "actor_memory": ("Actor, trace on (MemorySink)", run_actor_memory),
    "actor_otel": ("Actor, trace on (OtelSink, no OTel SDK)", run_actor_otel),
    "actor_jsonl": ("Actor, trace on (JsonlSink, temp file)", run_actor_jsonl),
    "actor_send": ("Actor, await send() per event", run_actor_send),
}


async def measure(w: Workload, n: int, repeats: int) -> dict[str, list[Lap]]:
    """The cost of each run of each contender; rounds interleave the contenders so drift
    in the machine's speed spreads over all of them. One short warm-up round is discarded."""
    names = w.events(n)
    want = w.check(n)
    warm = w.events(min(n, 500))
    for _, fn in CONTENDERS.values():
        await fn(w, warm)
    laps: dict[str, list[Lap]] = {k: [] for k in CONTENDERS}
    for _ in range(repeats):
        for key, (label, fn) in CONTENDERS.items():
            lap, final = await fn(w, names)
            if final != want:
                raise RuntimeError(f"{label} ended in {final!r}, the table says {want!r}")
            laps[key].append(lap)
    return laps


def rows_from(laps: Mapping[str, list[Lap]], w: Workload, n: int) -> list[Row]:
    seconds = {k: [lap.cpu for lap in v] for k, v in laps.items()}
    median = {k: statistics.median(v) for k, v in seconds.items()}
    runs = len(seconds["actor"])
    how = (
        f"{w.spec.name} machine, {n:,} events that all transition (cycle "
        f"{' -> '.join(w.cycle)}), no-op effects, constant guards; CPU time, median of "
        f"{runs} interleaved runs in one process after a warm-up; setup untimed; the actor "
        "posts every event on a running loop, then awaits join(), and it also arms and "
        "cancels the state timeouts the spec declares (transitions and dict have no timers)"
    )
    rows: list[Row] = []
    for key, (label, _) in CONTENDERS.items():
        med = median[key]
        rows.append(
            Row(
                SECTION,
                label,
                n / med,
                "events/s",
                text=f"{n / med:,.0f} events/s ({med / n * 1e6:.2f} us/event)",
                how=how,
                samples=tuple(n / s for s in seconds[key]),
                extra={
                    "us_per_event": med / n * 1e6,
                    "wall_us_per_event": statistics.median(lap.wall for lap in laps[key]) / n * 1e6,
                },
            )
        )

    def paired(num: str, den: str) -> tuple[float, tuple[float, ...]]:
        # the ratio within each round (both ran back to back), then the median of those:
        # load from elsewhere on the machine moves both sides of a pair together
        per_round = tuple(a / b for a, b in zip(seconds[num], seconds[den], strict=True))
        return statistics.median(per_round), per_round

    how_tp = (
        "events/s of the first over events/s of the second: median over the rounds of the "
        "ratio within each round"
    )
    how_cost = (
        "us/event of the first over us/event of the second: median over the rounds of the "
        "ratio within each round"
    )
    for case, num, den, target, how_r in (
        (
            "Actor (trace off) throughput / AsyncMachine",
            "async_machine",
            "actor",
            Target(">=", ASYNC_MACHINE_SPEEDUP),
            how_tp,
        ),
        (
            "Actor (trace off) per-event cost / Machine",
            "actor",
            "machine",
            Target("<=", MACHINE_COST),
            how_cost,
        ),
        (
            # what a job runs by default: AgentJob's OpenTelemetry sink, no SDK configured
            "Actor (trace on, OtelSink without an SDK) per-event cost / Machine",
            "actor_otel",
            "machine",
            Target("<=", MACHINE_COST),
            how_cost,
        ),
        (
            "Actor (trace on, MemorySink) per-event cost / Machine",
            "actor_memory",
            "machine",
            None,
            how_cost,
        ),
        ("Actor (trace off) per-event cost / dict dispatch", "actor", "dict", None, how_cost),
    ):
        value, per_round = paired(num, den)
        rows.append(Row(SECTION, case, value, "x", target=target, how=how_r, samples=per_round))
    return rows


def run(cfg: Config) -> list[Row]:
    try:
        w = WORKLOADS[cfg.machine]
    except KeyError:
        raise ValueError(
            f"no dispatch workload for machine {cfg.machine!r}; choose from {sorted(WORKLOADS)}"
        ) from None
    laps = asyncio.run(measure(w, cfg.events, cfg.repeats))
    return rows_from(laps, w, cfg.events)
