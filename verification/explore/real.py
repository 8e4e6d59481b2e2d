"""The real system, driven one input at a time: what the explorer of the real job
(``verification.explore.realsearch``) chooses from, and what it dedups on.

A run is a fresh conformance ``Harness`` (a real ``AgentJob``: its ``JobSystem`` with its
actors, scheduler, links, watches and teardown; only the SDK's outside stood in, on a
``VirtualClock`` whose advance moves the ``VirtualTimeLoop`` it runs on, so the SDK's own
timers are virtual too) driven through a path of inputs. After every input:

* the inputs enabled next are read from the real system and its stand-ins (``enabled``):
  who is in the room, which requests may still be sent, the user's calls that would still
  do something, the outcomes of each stand-in that waits for the world's word now, and the
  clock's next deadline ("time passes" to it: one input, whatever timer it is);
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

from livekit import rtc

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.clock import VirtualTimeLoop
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.inmemory import quiet_sdk_logs, sdk_task_failures_at_debug
from agent_runtime.testing.invariants.checks import LIVE_JOB, Finding, eventual, safety, settled
from agent_runtime.testing.invariants.playout import PlayoutJudge
from agent_runtime.testing.invariants.view import JobView
from verification.conformance.harness import Harness
from verification.conformance.paths import Step
from verification.explore.abstract import PEOPLE, Config
from verification.explore.search import NAMED_CONFIGS, PLAYOUT_CONFIGS

Inputs = Literal["all", "job", "avatar", "playout"]
TIME = "time"  # the input "time passes to the clock's next deadline"
_LIFE_UP = ("new", "starting", "running")
_REASONS = ("CLIENT_INITIATED", "SIGNAL_CLOSE")
_EVENTUAL_LIMIT = 200  # deadlines let pass at a run's end before giving up (a timer loop)

# the configs by name, and the watchdog's; the real job runs playout in every one
CONFIGS = {**NAMED_CONFIGS, "watchdog": PLAYOUT_CONFIGS[1]}

Snapshot = tuple[Any, ...]
Setup = Callable[[Harness], Any]


def _traced(h: Harness, machine: str, event: str) -> bool:
    return any(r.machine == machine and r.event == event for r in h.trace.records)


def _video(h: Harness, identity: str) -> bool:
    p = h.room.remote_participants.get(identity)
    if p is None:
        return False
    return any(t.kind == rtc.TrackKind.KIND_VIDEO for t in p.track_publications.values())


def _bg(h: Harness) -> tuple[str, ...]:
    return tuple(sorted(t.get_name() for t in h._bg if not t.done()))


def enabled(h: Harness, view: JobView, inputs: Inputs = "all") -> tuple[str, ...]:
    """The inputs that may come next, as the real system and its stand-ins show them."""
    out: list[str] = []
    states = view.states
    life = states.get("agent_job", "")
    up = h.room.isconnected()
    # once AgentJob's lifecycle closed (aclose() returned, the process may exit) nothing
    # from outside reaches the job; the stand-ins' work and the clock still run
    if life != "closed":
        if up:
            out.append("room_disconnects")
        if inputs != "avatar":
            out += _job_inputs(h, view, up)
        else:
            out += _people(h, "user", up)  # the avatar's comings and goings reach a link
        if inputs != "job":
            out += _avatar_inputs(h, view, up)
    out += _outcomes(h, states)
    if h.clock.next_deadline() is not None:
        out.append(TIME)
    if inputs == "playout":
        return tuple(t for t in out if t in PLAYOUT_INPUTS)
    return tuple(out)


# what the playout machine hears of, and what gets it there: the avatar's start and its
# comings and goings, the user's, the agent's speech and the avatar's report of it, time.
# (Only the outcomes that let an avatar join: a failed one is the avatar's inputs' business.)
PLAYOUT_INPUTS = frozenset(
    {
        "user_joins",
        "user_leaves:CLIENT_INITIATED",
        "avatar_start",
        "plugin_routed",
        "plugin_returns",
        "avatar_joins",
        "avatar_video",
        "avatar_leaves",
        "interrupt",
        "agent_says",
        "user_interrupts",
        "avatar_reports",
        "user_speaks",
        "user_listens",
        "clear_settles",
        "close_a",
        "a_closed",
        TIME,
    }
)


def _people(h: Harness, who: str, up: bool) -> list[str]:
    if not up or (who == "simulator" and not h.config.simulation):
        return []
    if PEOPLE[who].identity not in h.room.remote_participants:
        return [f"{who}_joins"]
    return [f"{who}_leaves:{r}" for r in _REASONS]


def _job_inputs(h: Harness, view: JobView, up: bool) -> list[str]:
    cfg, states = h.config, view.states
    out = [i for who in ("user", "sip", "simulator") for i in _people(h, who, up)]
    present = h.room.remote_participants
    sent = h.observed.sent
    asked = sum(s.simulator for s in sent)
    if up and PEOPLE["simulator"].identity in present and asked < cfg.max_finalize_requests:
        out.append("finalize")
    if up and not any(not s.simulator for s in sent):
        out.append("stranger_finalize")
    if up:
        # the host's other doors: a state they change nothing of dedups them away
        out += ["ping", "malformed"]
    host = states.get("session_host")
    if (
        "B" not in h.sessions
        and host not in ("closing", "closed")
        and "session_host" not in view.closed
    ):
        # (attach() refuses, raising, once the host closes: a call no user makes twice)
        out.append("attach_b")
    for name in ("A", "B"):
        if name in h.sessions and h.session_state(name) == "running":
            out.append(f"close_{name.lower()}")
    if states.get("job") in LIVE_JOB and not _traced(h, "job", "shutdown"):
        out.append("shutdown")
    if not cfg.delete_room_on_close and not view.deletion_asked:
        out.append("request_deletion")
    if cfg.aclose:
        life = states.get("agent_job", "")
        if life in _LIFE_UP:
            out.append("aclose")
        if not view.aborted and (life in _LIFE_UP or states.get("job") in LIVE_JOB):
            out.append("abort")
    return out


def _avatar_inputs(h: Harness, view: JobView, up: bool) -> list[str]:
    avatar = h.job.avatar
    state = view.states.get("avatar", "closed")
    if avatar is None or state == "closed":
        return []
    out: list[str] = []
    identity = PEOPLE["avatar"].identity
    present = identity in h.room.remote_participants
    if state == "idle":
        if view.states.get("agent_job") in _LIFE_UP:
            out.append("avatar_start")
    elif up and not present:
        out.append("avatar_joins")
    if up and present and not _video(h, identity):
        out.append("avatar_video")
    if up and present:
        out.append("avatar_leaves")
    out.append("interrupt")
    if state == "joined":
        out.append("interrupt_idle")
    if "conformance:avatar.aclose" not in _bg(h):
        out.append("avatar_close")
    return out + _playout_inputs(h, view)


def _playout_inputs(h: Harness, view: JobView) -> list[str]:
    """The agent's speech and the user's, and the avatar's report of what it played: what
    the playout machine follows, as the session and the avatar show them."""
    session, out = h.sessions["A"], []
    live = lk.session_live(session)
    # the agent replies while its audio goes to the avatar (the stand-in room has no
    # server to play the room's own track, whose end the SDK would report)
    if live and session.current_speech is None and h.job.audio_route() == "avatar":
        out.append("agent_says")
    if live and session.current_speech is not None:
        out.append("user_interrupts")
    sink = h.job.avatar.installed_sink if h.job.avatar is not None else None
    if view.avatar_present and sink is not None and lk.pending_playbacks(sink):
        out.append("avatar_reports")
    playout = h.job.playout
    if live and playout is not None and playout.options.reprompt:
        out.append("user_listens" if session.user_state == "speaking" else "user_speaks")
    return out


# the stand-ins' outcomes (``_outcomes``): work running aside ending, the world's word
OUTCOMES = frozenset(
    {
        "verdict_ready",
        "plugin_routed",
        "plugin_fails",
        "plugin_no_route",
        "plugin_returns",
        "plugin_fails_late",
        "clear_settles",
        "a_closed",
        "a_hangs",
        "b_closed",
        "deletion_returns",
        "deletion_fails",
        "callbacks_return",
    }
)


def _outcomes(h: Harness, states: Mapping[str, str]) -> list[str]:
    """The world's word to each stand-in that waits for it now. A hang is no input (the
    stand-in goes on waiting), except a session's close, which the job's view tells apart."""
    out: list[str] = []
    if h.verdicts and h.verdicts[-1].waiting:
        out.append("verdict_ready")
    if h.plugin.waits == "start":
        out += ["plugin_routed", "plugin_fails", "plugin_no_route"]
    elif h.plugin.waits == "routed":
        out += ["plugin_returns", "plugin_fails_late"]
    if states.get("avatar") == "clearing":
        out.append("clear_settles")
    if h.closes["A"].waiting:
        out += ["a_closed", "a_hangs"]
    if "B" in h.closes and h.closes["B"].waiting:
        out.append("b_closed")
    if h.deletion_gates and h.deletion_gates[-1].waiting:
        out += ["deletion_returns", "deletion_fails"]
    if h.callback.waiting:
        out.append("callbacks_return")
    return out


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
        _bg(h),
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
        tuple(sorted((i, _video(h, i)) for i in h.room.remote_participants)),
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
    # the harness's own actions, as the conformance replay drives them
    await h.do(Step(action=token, label=token, at=h.clock.now()))


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

    def __str__(self) -> str:
        where = "at the start" if self.step == 0 else f"after input {self.step}"
        policy = f" --config {self.config}" if self.config else ""
        if self.step > len(self.path):
            where = "once time passed every bound after the last input"
            policy += f" --policy {self.policy}"
        seed = f" (walk seed {self.seed})" if self.seed is not None else ""
        return (
            f"invariant {self.invariant} violated {where}{seed}: {self.detail}\n"
            f"  path: {','.join(self.path) or '(none)'}\n"
            f"  replay: python3 dev.py explore --real --replay {','.join(self.path) or '-'}"
            f"{policy}"
        )


@dataclass
class Run:
    """What one run saw: the snapshot after the start and after each input, the inputs
    enabled at its end, and the first violation, if any."""

    path: list[str] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    entered: frozenset[tuple[str, str]] = frozenset()  # (machine, state) the run went through
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
    log.append(Applied(token, h.clock.now(), tuple(_outcomes(h, h.view().states))))
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
    h = Harness(config, playout=True)  # the job as users get it: playout with its avatar
    judge = PlayoutJudge(h.job)  # playout's decisions, judged as they are made
    h.tracer.sinks.append(judge)
    if setup is not None:
        setup(h)
    idle_from = loop.jumped if isinstance(loop, VirtualTimeLoop) else 0.0
    run = Run()
    try:
        await h.start()

        def look() -> bool:
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
        waiting = set(_outcomes(h, h.view().states))
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
