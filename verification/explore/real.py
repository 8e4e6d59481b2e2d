"""The real system, driven one input at a time: what the explorer of the real job
(``verification.explore.realsearch``) chooses from, and what it dedups on.

A run is a fresh ``Harness`` (a real ``AgentJob``: its ``JobSystem`` with its
actors, scheduler, links, watches and teardown; only the SDK's outside stood in, on a
``VirtualClock`` whose advance moves the ``VirtualTimeLoop`` it runs on, so the SDK's own
timers are virtual too) driven through a path of inputs. After every input:

* the inputs enabled next are read from the real system and its stand-ins
  (``real_inputs.enabled``): who is in the room, which requests may still be sent, the
  user's calls that would still do something, the outcomes of each stand-in that waits for
  the world's word now, and the clock's next deadline ("time passes" to it: one input,
  whatever timer it is);
* the state is the system's snapshot (``snapshot``): every actor's state, timer (its
  deadline relative to now) and live tasks, every timer on the clock, the stand-ins' waits,
  the room's membership, and the ``JobView`` the invariants read;
* every invariant that applies mid-run (``checks.safety``, ``checks.settled``) is checked.

At the end of a run, time may be let pass alone until no timer is left, and
``checks.eventual`` checked there. The tool itself posts nothing, times nothing and orders
nothing: every consequence of an input is the runtime's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualTimeLoop
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.invariants.checks import Finding, eventual, safety, settled
from agent_runtime.testing.invariants.playout import PlayoutJudge
from agent_runtime.testing.invariants.view import JobView
from agent_runtime.testing.sdk_logs import quiet_sdk_logs, sdk_task_failures_at_debug
from verification.explore.config import Config
from verification.explore.harness import Harness
from verification.explore.real_inputs import (
    TIME,
    Inputs,
    enabled,
    has_video,
    outcomes,
    running_aside,
)

_EVENTUAL_LIMIT = 200  # deadlines let pass at a run's end before giving up (a timer loop)

Snapshot = tuple[Any, ...]
Setup = Callable[[Harness], Any]


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, frozenset | set):
        return tuple(sorted(value))
    if isinstance(value, tuple | list):
        return tuple(_hashable(v) for v in value)
    return value


def _rel(t: float, now: float) -> float:
    return round(t - now, 6)


def snapshot(h: Harness, view: JobView) -> Snapshot:
    """The real system's state, as far as a run can see it: equal snapshots are one state
    of the search. Absolute time is left out (deadlines are relative to now)."""
    now = h.clock.now()
    actors = tuple(
        (
            a.spec.name,
            a.instance,
            a.state,
            a.closed,
            a.live_tasks,
            None if a.timer_deadline is None else _rel(a.timer_deadline, now),
        )
        for a in h.job.actors
    )
    # every timer on the clock: the actors' and the ones of the work they own (bounds)
    timers = tuple(sorted(_rel(w, now) for w, _, t in h.clock._timers if not t.cancelled))
    stand_ins = (
        h.plugin.waits,
        h.plugin.start_calls,
        tuple(g.waiting for g in h.verdicts),
        tuple(g.waiting for g in h.deletion_gates),
        (h.callback.waiting, h.callback.said),
        tuple(sorted((n, g.waiting, g.said) for n, g in h.closes.items())),
        tuple(sorted((n, h.session_state(n)) for n in h.sessions)),
        running_aside(h),
    )
    session = h.sessions["A"]
    sink = h.job.avatar.installed_sink if h.job.avatar is not None else None
    speech = (
        session.agent_state,
        session.user_state,
        session.current_speech is not None,
        lk.pending_playbacks(sink) if sink is not None else 0,
        h.reprompts,
    )
    room = (
        h.room.isconnected(),
        tuple(sorted((i, has_video(h, i)) for i in h.room.remote_participants)),
    )
    jv = tuple(_hashable(getattr(view, f.name)) for f in fields(JobView))
    return (actors, timers, stand_ins, speech, room, jv)


async def apply(h: Harness, token: str) -> None:
    """Do one input to the real job, then let what it causes settle."""
    if token == TIME:
        deadline = h.clock.next_deadline()
        if deadline is None:
            raise ValueError("time passes, but no timer is armed")
        await h.clock.run_until(deadline)
        await h.quiesce()
        return
    await h.do(token)


@dataclass
class Violation:
    """An invariant the real job broke: after which input of which path."""

    invariant: int
    detail: str
    path: tuple[str, ...]
    step: int  # the input after which it was seen (0: the start; len(path)+1: eventual)
    seed: int | None = None
    policy: str = ""  # how the stand-ins ended, for a violation once time passed alone
    config: str = ""  # the config's name (``CONFIGS``)
    inputs: str = ""  # the inputs the search drew from (``--inputs``), when not all
    fault: str = ""  # the planted fault it ran with (``--drop-link``), if any

    def __str__(self) -> str:
        where = "at the start" if self.step == 0 else f"after input {self.step}"
        # the replay command runs the path as it was found: its config, inputs and fault
        again = f" --config {self.config}" if self.config else ""
        if self.inputs and self.inputs != "all":
            again += f" --inputs {self.inputs}"
        if self.fault:
            again += f" --drop-link {self.fault}"
        if self.step > len(self.path):
            where = "once time passed every bound after the last input"
            again += f" --policy {self.policy}"
        seed = f" (walk seed {self.seed})" if self.seed is not None else ""
        return (
            f"invariant {self.invariant} violated {where}{seed}: {self.detail}\n"
            f"  path: {','.join(self.path) or '(none)'}\n"
            f"  replay: python3 dev.py explore --replay {','.join(self.path) or '-'}"
            f"{again}"
        )


@dataclass
class Run:
    """What one run saw: the snapshot after the start and after each input, the inputs
    enabled at its end, and the first violation, if any."""

    path: list[str] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    entered: frozenset[tuple[str, str]] = frozenset()  # (machine, state) the run went through
    # (machine, state, event) -> how many inputs of the path had been driven when an actor
    # first decided that cell (len(path) + 1: once time passed alone at the end)
    decided: dict[tuple[str, str, str], int] = field(default_factory=dict)
    read: int = field(default=0, repr=False)  # the trace records already read for it
    enabled: tuple[str, ...] = ()
    violation: Violation | None = None
    # virtual seconds the loop passed with nothing able to run (the SDK's own bounds that
    # a close the harness waited for ran to)
    idle_seconds: float = 0.0
    seconds: float = 0.0
    log: list[Applied] = field(default_factory=list)  # every input, as toscenario needs it


@dataclass(frozen=True)
class Applied:
    """One input as driven: when, and which stand-ins waited for the world's word then."""

    token: str
    at: float
    waiting: tuple[str, ...]


async def _apply_logged(h: Harness, token: str, log: list[Applied], drive: bool = True) -> None:
    log.append(Applied(token, h.clock.now(), tuple(outcomes(h, h.view().states))))
    if drive:
        await apply(h, token)


Chooser = Callable[[tuple[str, ...]], str | None]


async def execute(
    config: Config,
    path: Sequence[str],
    *,
    inputs: Inputs = "all",
    setup: Setup | None = None,
    choose: Chooser | None = None,
    steps: int = 0,
    check_eventual: bool | Callable[[Snapshot], bool] = True,
    policy: Policy = "return",
    seed: int | None = None,
) -> Run:
    """Drive ``path`` through a fresh harness, then up to ``steps`` more inputs picked by
    ``choose`` among the enabled ones; then, if ``check_eventual`` says so (of the last
    snapshot), let time pass alone, the stand-ins ending as ``policy`` says. Stops at the
    first violation; a path input that is not enabled raises ``ValueError`` (a replay that
    diverged: the run is not deterministic, or the path is not one of this config's)."""
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(sdk_task_failures_at_debug)
    h = Harness(config)
    judge = PlayoutJudge(h.job)  # playout's decisions, judged as they are made
    h.tracer.sinks.append(judge)
    if setup is not None:
        setup(h)
    idle_from = loop.jumped if isinstance(loop, VirtualTimeLoop) else 0.0
    run = Run()
    try:
        await h.start()

        def look() -> bool:
            _decided(h, run, len(run.path))
            view = h.view()
            run.snapshots.append(snapshot(h, view))
            run.enabled = enabled(h, view, inputs)
            found = [*safety(view), *settled(view), *judge.findings]
            if found:
                run.violation = _violation(found, run.path, len(run.path), seed)
            return not found

        ok = look()
        todo = list(path)
        while ok:
            if todo:
                token = todo.pop(0)
                if token not in run.enabled:
                    raise ValueError(
                        f"input {len(run.path) + 1} ({token}) is not enabled there; "
                        f"enabled: {', '.join(run.enabled)}"
                    )
            elif choose is not None and steps > 0:
                steps -= 1
                picked = choose(run.enabled)
                if picked is None:
                    break
                token = picked
            else:
                break
            run.path.append(token)
            try:
                await _apply_logged(h, token, run.log)
            except Exception as e:  # the job refused an input it showed as possible
                found = [(-1, f"{token} raised {type(e).__name__}: {e}")]
                run.violation = _violation(found, run.path, len(run.path), seed)
                ok = False
                break
            ok = look()
        last = run.snapshots[-1]
        if ok and (check_eventual(last) if callable(check_eventual) else check_eventual):
            mark = judge.mark()
            found = await _eventual(h, policy, run.log)
            _decided(h, run, len(run.path) + 1)
            found = found or [*judge.findings, *judge.silent_since(mark)]
            if found:
                run.violation = _violation(found, run.path, len(run.path) + 1, seed)
                run.violation.policy = policy
        if not run.log or run.log[-1].token != "end":
            await _apply_logged(h, "end", run.log, drive=False)
        # what the run went through, passing states included (before the harness's own
        # cleanup closes everything)
        run.entered = frozenset(
            {(a.spec.name, a.spec.initial) for a in h.job.actors}
            | {(r.machine, r.dest) for r in h.trace.records if r.kind == "transition"}
        )
    finally:
        await h.aclose()
        if isinstance(loop, VirtualTimeLoop):
            run.idle_seconds = loop.jumped - idle_from
        run.seconds = time.perf_counter() - started
    return run


_DECISIONS = ("transition", "ignore", "reject")


def _decided(h: Harness, run: Run, inputs: int) -> None:
    """Note the cells decided since the last look (the trace records every decision)."""
    records = h.trace.records
    for r in records[run.read :]:
        if r.kind in _DECISIONS:
            run.decided.setdefault((r.machine, r.source, r.event), inputs)
    run.read = len(records)


def _violation(found: list[Finding], path: list[str], step: int, seed: int | None) -> Violation:
    number, detail = min(found)
    return Violation(number, detail, tuple(path), step, seed)


# how the world ends what it was asked once no input comes: "return" everything returns
# or finishes; "hang" everything that may hang hangs (session B's close, the deletion and
# the plugin's clear have no hang in the harness: they finish or fail)
Policy = Literal["return", "hang"]
_ENDS: dict[Policy, tuple[str, ...]] = {
    "return": (
        "verdict_ready",
        "plugin_routed",
        "plugin_returns",
        "clear_settles",
        "a_closed",
        "b_closed",
        "deletion_returns",
        "callbacks_return",
    ),
    "hang": ("clear_settles", "a_hangs", "b_closed", "deletion_fails", "callback_hangs"),
}


async def _eventual(h: Harness, policy: Policy, log: list[Applied]) -> list[Finding]:
    """Let time pass alone: no input from outside, each stand-in that waits told how it
    ends (``policy``), time run to each next deadline until no timer is left; then what
    must hold once every bound has passed."""
    for _ in range(_EVENTUAL_LIMIT):
        waiting = set(outcomes(h, h.view().states))
        word = next((w for w in _ENDS[policy] if w in waiting), None)
        if word is not None:
            await _apply_logged(h, word, log)
            continue
        if h.clock.next_deadline() is None:
            log.append(Applied("end", h.clock.now(), ()))
            return eventual(h.view())
        await _apply_logged(h, TIME, log)
    return [(0, f"still running after {_EVENTUAL_LIMIT} outcomes and deadlines alone")]


def run(config: Config, path: Sequence[str], **kw: Any) -> Run:
    """``execute`` on an event loop of its own, on virtual time (the SDK's own timers
    included: the same path gives the same run), with the SDK's and the job's own log
    lines quiet (a search runs thousands of jobs; what it finds, it prints)."""
    was = logging.root.manager.disable
    with quiet_sdk_logs(logging.CRITICAL):
        logging.disable(logging.CRITICAL)
        try:
            return on_virtual_time(execute(config, path, **kw))
        finally:
            logging.disable(was)
