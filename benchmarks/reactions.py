"""Reaction times on the bundled scenarios, beside what livekit-agents 1.8.9 does.

This runtime: each scenario file of ``examples/scenarios`` runs through
``agent_runtime.testing.runner.run_scenario`` (all four machines, real ``AgentSession``s, the
in-memory room, virtual time) and must meet its own ``expect`` block. A reaction is the
virtual time from the cause (a scenario step, or a deadline the file configures: the avatar's
``join_timeout`` after ``avatar.start``) to the outcome read from the result (the avatar
machine entering ``restored`` with the audio on the room; ``job_closed_at``;
``session_closed_at``; the avatar's ``clear_local_buffer`` releasing playout). Virtual times
are deterministic; the wall-clock processing beside them is real milliseconds per scenario
step (the whole run, a real ``AgentSession`` start and close included), median of the rounds.

livekit-agents 1.8.9: reproduced here where it runs without a server, with the SDK's own
classes and no runtime (a plugin-style avatar, a session with RoomIO's defaults, an
interruption while speaking to an avatar that left); read from the installed source
otherwise. Each row's note says which, naming the file and constant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config
from .table import Row
from .timing import Stopwatch

if TYPE_CHECKING:
    from agent_runtime.testing.scenario import Scenario

SECTION = "reactions"
ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = ROOT / "examples" / "scenarios"
UPSTREAM = "livekit-agents 1.8.9"
RUNTIME = "this runtime"
AVATAR = "avatar-1"


# -- this runtime: reactions read from scenario results ---------------------------------------


def step_at(sc: Scenario, event: str, **fields: Any) -> float:
    """The time of the first step of ``event`` whose fields match."""
    for s in sc.steps:
        if s.event == event and all(getattr(s, k, None) == v for k, v in fields.items()):
            return float(s.at)
    raise ValueError(f"scenario {sc.name!r} has no {event} step with {fields}")


def join_deadline(sc: Scenario) -> float:
    return step_at(sc, "avatar.start") + float(sc.config.join_timeout)


def avatar_restored(result: dict[str, Any]) -> float | None:
    for t in result["transitions"]:
        if t["machine"] == "avatar" and t["dest"] == "restored" and t["source"] != "restored":
            return float(t["t"])
    return None


def playout_released(result: dict[str, Any]) -> float | None:
    for e in result["effects"]:
        if (
            e["machine"] == "avatar"
            and e["effect"] == "clear_local_buffer"
            and e["outcome"] == "ok"
        ):
            return float(e["t"])
    return None


def playout_done(result: dict[str, Any]) -> float | None:
    done = result["facts"]["playout_done"]
    return float(done[0]["t"]) if done else None


def first_reprompt(result: dict[str, Any]) -> float | None:
    times = result["facts"]["reprompts"]
    return float(times[0]) if times else None


def fact(name: str) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        value = result["facts"][name]
        return None if value is None else float(value)

    return read


def facts_are(**want: Any) -> Callable[[dict[str, Any]], str | None]:
    def check(result: dict[str, Any]) -> str | None:
        bad = {k: result["facts"][k] for k, v in want.items() if result["facts"][k] != v}
        return f"facts {bad} (wanted {want})" if bad else None

    return check


@dataclass(frozen=True, slots=True)
class Reaction:
    case: str
    scenario: str  # file stem in examples/scenarios
    cause: Callable[[Scenario], float]
    cause_text: str
    outcome: Callable[[dict[str, Any]], float | None]
    outcome_text: str
    check: Callable[[dict[str, Any]], str | None]


@dataclass(frozen=True, slots=True)
class Upstream:
    case: str
    text: str
    how: str
    value: float | None = None
    unit: str = ""


ROOM_AUDIO = "avatar machine enters `restored` (facts.audio_output = room)"
REACTIONS: tuple[tuple[tuple[Reaction, ...], str], ...] = (
    (
        (
            Reaction(
                "avatar never joins (started before the session) -> room audio",
                "avatar_never_joins_avatar_first",
                join_deadline,
                "avatar.start + join_timeout",
                avatar_restored,
                ROOM_AUDIO,
                facts_are(audio_output="room"),
            ),
            Reaction(
                "avatar never joins (started after the session) -> room audio",
                "avatar_never_joins_session_first",
                join_deadline,
                "avatar.start + join_timeout",
                avatar_restored,
                ROOM_AUDIO,
                facts_are(audio_output="room"),
            ),
            Reaction(
                "avatar leaves mid-session -> room audio",
                "avatar_joins_then_drops",
                lambda sc: step_at(sc, "participant_disconnected", identity=AVATAR),
                "the avatar's participant_disconnected",
                avatar_restored,
                ROOM_AUDIO,
                facts_are(audio_output="room"),
            ),
            Reaction(
                "avatar plugin start() raises -> room audio",
                "avatar_start_error",
                lambda sc: step_at(sc, "avatar.start_error"),
                "avatar.start_error",
                avatar_restored,
                ROOM_AUDIO,
                facts_are(audio_output="room"),
            ),
        ),
        "avatar",
    ),
    (
        (
            Reaction(
                "simulator leaves, SIP leg stays -> job closed",
                "sim_simulator_leaves_sip_stays",
                lambda sc: step_at(sc, "participant_disconnected", identity="simulator"),
                "the simulator's participant_disconnected (during the hold)",
                fact("job_closed_at"),
                "facts.job_closed_at",
                facts_are(finalize_answered=False),
            ),
        ),
        "simulator",
    ),
    (
        (
            Reaction(
                "user leaves (CLIENT_INITIATED) -> session closed",
                "user_leaves",
                lambda sc: step_at(sc, "participant_disconnected", identity="user"),
                "the user's participant_disconnected",
                fact("session_closed_at"),
                "facts.session_closed_at (the job closes at the same instant)",
                lambda r: (
                    None
                    if r["facts"]["job_closed_at"] == r["facts"]["session_closed_at"]
                    else "the job did not close with the session"
                ),
            ),
        ),
        "user_leaves",
    ),
    (
        (
            Reaction(
                "user drops (CONNECTION_TIMEOUT), no rejoin -> session closed",
                "user_drops_no_rejoin",
                lambda sc: step_at(sc, "participant_disconnected", identity="user"),
                "the user's participant_disconnected",
                fact("session_closed_at"),
                "facts.session_closed_at (the file's grace_period is 15 s)",
                lambda r: None,
            ),
        ),
        "user_drops",
    ),
    (
        (
            Reaction(
                "avatar never reports its playback -> playout done",
                "playout_avatar_never_reports",
                lambda sc: step_at(sc, "agent.say"),
                "agent.say (3 s of audio, handed off at once)",
                playout_done,
                "the first facts.playout_done (the bound: audio + margin 2 s)",
                facts_are(agent_state="listening", rpcs_sent=[]),
            ),
        ),
        "playout_silent",
    ),
    (
        (
            Reaction(
                "avatar leaves mid-utterance -> playout done",
                "playout_avatar_leaves_mid_utterance",
                lambda sc: step_at(sc, "participant_disconnected", identity=AVATAR),
                "the avatar's participant_disconnected, 2 s into 5 s of audio",
                playout_done,
                "the first facts.playout_done (cause avatar_left)",
                facts_are(agent_state="listening", rpcs_sent=[]),
            ),
        ),
        "playout_left",
    ),
    (
        (
            Reaction(
                "interruption, the avatar confirms the cut -> playout done",
                "playout_interrupted",
                lambda sc: step_at(sc, "session.interrupt"),
                "session.interrupt (the avatar confirms the cut 0.3 s later)",
                playout_done,
                "the first facts.playout_done (bounded by margin 2 s from the cut)",
                facts_are(agent_state="listening", reprompts=[]),
            ),
        ),
        "playout_interrupt",
    ),
    (
        (
            Reaction(
                "user silent after the agent spoke -> re-prompt, from the remote playout",
                "playout_user_silent_reprompt",
                lambda sc: step_at(sc, "rpc", method="lk.playback_finished"),
                "the avatar's lk.playback_finished (3.2 s after the hand-off)",
                first_reprompt,
                "the first facts.reprompts (safety_window 1 s + reprompt_after 5 s)",
                facts_are(session_close_reason="user_initiated"),
            ),
        ),
        "playout_reprompt",
    ),
    (
        (
            Reaction(
                "interrupt after the avatar left -> playout released",
                "avatar_interrupt_after_left",
                lambda sc: step_at(sc, "session.interrupt"),
                "session.interrupt",
                playout_released,
                "the avatar's clear_local_buffer effect (no RPC: facts.rpcs_sent = [])",
                facts_are(rpcs_sent=[]),
            ),
        ),
        "interrupt",
    ),
)


@dataclass(slots=True)
class Measured:
    reaction: float  # virtual seconds
    wall_ms_per_step: list[float]
    cpu_ms_per_step: list[float]
    steps: int


async def run_scenarios(repeats: int) -> tuple[dict[str, Measured], list[float], int, Split]:
    """Every bundled scenario ``repeats`` times (after one discarded warm-up run).

    Returns the measured reactions, the wall ms per step of each round over all scenarios,
    the number of scenarios, and where one more round's time goes (per machine, timed; by
    part, profiled)."""
    from agent_runtime.testing.expect import check_expect
    from agent_runtime.testing.runner import run_scenario
    from agent_runtime.testing.scenario import load_scenario

    files = sorted(SCENARIO_DIR.glob("*.yaml"))
    if not files:
        raise RuntimeError(f"no scenario files in {SCENARIO_DIR}")
    scenarios = {p.stem: load_scenario(p) for p in files}
    wanted = {r.scenario: r for group, _ in REACTIONS for r in group}
    missing = sorted(set(wanted) - set(scenarios))
    if missing:
        raise RuntimeError(f"scenario files missing for the reactions: {missing}")
    await run_scenario(next(iter(scenarios.values())))  # the SDK's first-use costs: discarded
    measured: dict[str, Measured] = {}
    rounds: list[float] = []
    for _ in range(repeats):
        round_wall, round_steps = 0.0, 0
        for name, sc in scenarios.items():
            sw = Stopwatch()
            result = await run_scenario(sc)
            lap = sw.lap()
            failures = check_expect(sc.expect, result)
            if failures:
                raise RuntimeError(f"scenario {name}: expectations failed: {failures}")
            steps = len(sc.steps)
            round_wall += lap.wall
            round_steps += steps
            r = wanted.get(name)
            if r is None:
                continue
            problem = r.check(result)
            at = r.outcome(result)
            if problem is not None or at is None:
                raise RuntimeError(f"scenario {name}: no reaction ({problem or r.outcome_text})")
            reaction = at - r.cause(sc)
            m = measured.setdefault(name, Measured(reaction, [], [], steps))
            if abs(m.reaction - reaction) > 1e-9:
                raise RuntimeError(f"scenario {name}: virtual times differ between rounds")
            m.wall_ms_per_step.append(lap.wall * 1e3 / steps)
            m.cpu_ms_per_step.append(lap.cpu * 1e3 / steps)
        rounds.append(round_wall * 1e3 / round_steps)
    with timed_machines() as machines:
        for sc in scenarios.values():
            await run_scenario(sc)
    parts = await profiled_round(scenarios)
    steps = sum(len(sc.steps) for sc in scenarios.values())
    return measured, rounds, len(scenarios), Split(machines, parts, steps)


# -- where a step's time goes: the runtime's own part, per machine ------------------------------


@dataclass(slots=True)
class Split:
    machines: dict[str, MachineCost]  # one round, timed per machine
    parts: dict[str, float]  # one round under cProfile: CPU seconds by part
    steps: int  # scenario steps in a round


@dataclass(slots=True)
class MachineCost:
    """One machine's events over the timed rounds of every bundled scenario."""

    events: int = 0
    step_s: float = 0.0  # the whole step before the effects
    trace_s: float = 0.0  # of which: trace records written (the runner's sinks)
    listeners_s: float = 0.0  # of which: state_changed listeners (the runtime's and the runner's)
    effects_s: float = 0.0  # effect handlers until they return (their awaited part excluded)

    @property
    def core_s(self) -> float:
        """Deciding and changing state: the table, guards, timers and tasks, the mailbox."""
        return self.step_s - self.trace_s - self.listeners_s

    latency_s: list[float] = field(default_factory=list)  # queued -> its step done, wall


class _TimedEffects(Mapping[str, Any]):
    """An actor's effect handlers, each call timed (what it runs before it returns)."""

    __slots__ = ("_cost", "_inner")

    def __init__(self, inner: Mapping[str, Any], cost: MachineCost) -> None:
        self._inner, self._cost = inner, cost

    def __getitem__(self, name: str) -> Any:
        fn, cost = self._inner[name], self._cost

        def timed(event: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(event)
            finally:
                cost.effects_s += time.thread_time() - t0

        return timed

    def __contains__(self, name: object) -> bool:
        return name in self._inner

    def __iter__(self) -> Iterator[str]:
        return iter(self._inner)

    def __len__(self) -> int:
        return len(self._inner)


@contextlib.contextmanager
def timed_machines() -> Iterator[dict[str, MachineCost]]:
    """Every ``Actor`` built inside, timed per machine (CPU time of the thread): its steps
    (the runtime's own work on each event), its effects until they return (the runtime's
    glue and the SDK calls it makes); and the wall time from an event queued (a room fact,
    an RPC outcome, a timer, a posted input) to its step done, awaited effects included.
    The timing wraps the actor's own methods; it adds a few microseconds per event."""
    from agent_runtime.actor import Actor

    costs: dict[str, MachineCost] = {}
    queued: dict[int, tuple[Any, float]] = {}
    clock = time.perf_counter  # reactions: wall time
    cpu = time.thread_time  # the work itself: CPU time (a busy machine does not inflate it)
    orig_init, orig_enqueue = Actor.__init__, Actor._enqueue
    orig_step, orig_done = Actor._step, Actor._done
    orig_record, orig_tell = Actor._record, Actor._emit_state
    stepping: list[MachineCost] = []  # the step being timed (steps never nest)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        cost = costs.setdefault(self.spec.name, MachineCost())
        self._effects = _TimedEffects(self._effects, cost)

    def enqueue(self: Any, entry: Any) -> None:
        queued[id(entry[0])] = (entry[0], clock())
        orig_enqueue(self, entry)

    def step(self: Any, event: Any) -> Any:
        cost = costs[self.spec.name]
        stepping.append(cost)
        t0 = cpu()
        try:
            return orig_step(self, event)
        finally:
            cost.step_s += cpu() - t0
            cost.events += 1
            stepping.pop()

    def record(self: Any, rec: Any) -> None:
        t0 = cpu()
        try:
            orig_record(self, rec)
        finally:
            if stepping:
                stepping[-1].trace_s += cpu() - t0

    def tell(self: Any, change: Any) -> None:
        t0 = cpu()
        try:
            orig_tell(self, change)
        finally:
            if stepping:
                stepping[-1].listeners_s += cpu() - t0

    def done(self: Any, event: Any, fut: Any, result: Any) -> None:
        orig_done(self, event, fut, result)
        got = queued.pop(id(event), None)
        if got is not None and got[0] is event:
            costs[self.spec.name].latency_s.append(clock() - got[1])

    patched = {
        "__init__": init,
        "_enqueue": enqueue,
        "_step": step,
        "_done": done,
        "_record": record,
        "_emit_state": tell,
    }
    for name, fn in patched.items():
        setattr(Actor, name, fn)
    try:
        yield costs
    finally:
        for name, fn in (
            ("__init__", orig_init),
            ("_enqueue", orig_enqueue),
            ("_step", orig_step),
            ("_done", orig_done),
            ("_record", orig_record),
            ("_emit_state", orig_tell),
        ):
            setattr(Actor, name, fn)


def _part(filename: str) -> str:
    f = filename.replace("\\", "/")
    if "/agent_runtime/testing/" in f or "/benchmarks/" in f:
        return "the scenario runner and its stand-ins"
    if "/agent_runtime/" in f or "/statemachines/" in f:
        return "the runtime"
    if "/livekit/" in f:
        return "livekit-agents and rtc"
    if "asyncio" in f or "selectors" in f:
        return "the asyncio loop"
    return "other libraries (pydantic, OTel, stdlib)"


async def profiled_round(scenarios: dict[str, Scenario]) -> dict[str, float]:
    """One round of every scenario under cProfile: CPU seconds by where the code lives (each
    function's own time; the profiler slows small Python functions more, so these are
    shares, not speeds)."""
    import cProfile
    import pstats

    from agent_runtime.testing.runner import run_scenario

    prof = cProfile.Profile()
    prof.enable()
    for sc in scenarios.values():
        await run_scenario(sc)
    prof.disable()
    parts: dict[str, float] = {}
    raw: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, tottime, _, _) in raw.items():
        part = _part(filename if filename != "~" else name)
        parts[part] = parts.get(part, 0.0) + tottime
    return parts


# -- livekit-agents 1.8.9 without the runtime ----------------------------------------------------


@contextlib.contextmanager
def captured_sdk_logs() -> Iterator[list[logging.LogRecord]]:
    """The SDK's log records, kept here instead of printed (the table is the output)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logging.getLogger("livekit")
    handler = Keep(logging.DEBUG)
    old = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(old[0])
        log.propagate = old[1]


async def _frames(n: int, rate: int = 24000) -> AsyncIterator[Any]:
    from livekit import rtc

    per = rate // 100
    for _ in range(n):
        yield rtc.AudioFrame(b"\0\0" * per, rate, 1, per)


def _room(*, avatar: bool = False) -> Any:
    from agent_runtime.testing.clock import VirtualClock
    from agent_runtime.testing.inmemory import InMemoryRoom

    room = InMemoryRoom(clock=VirtualClock())
    room.connect_locally()
    room.add_participant("user")
    if avatar:
        room.add_participant(AVATAR, kind="agent")
        room.publish_track(AVATAR, "video")
    return room


async def upstream_avatar_routes() -> dict[str, str]:
    """Where the agent's audio ends up after each avatar failure, with a plugin-style
    ``AvatarSession`` (``ScriptedAvatar``: the base class's ``start()``, then
    ``replace_audio_tail(DataStreamAudioOutput(...))`` as the plugins do) and no runtime."""
    from livekit import rtc
    from livekit.agents import Agent, AgentSession

    from agent_runtime.runtimes.avatar import audio_chain
    from agent_runtime.testing.clock import settle
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

    out: dict[str, str] = {}
    for case in ("never joins, avatar first", "never joins, session first", "leaves"):
        room = _room()
        session: AgentSession[Any] = AgentSession()
        plugin = ScriptedAvatar(avatar_identity=AVATAR)
        if case.endswith("avatar first"):
            await plugin.start(session, room)
            await session.start(Agent(instructions="upstream"), room=room)
        else:
            await session.start(Agent(instructions="upstream"), room=room)
            await plugin.start(session, room)
        await settle()
        if case == "leaves":
            room.add_participant(AVATAR, kind="agent")
            room.publish_track(AVATAR, "video")
            await plugin.wait_for_join(timeout=1.0)
            room.remove_participant(AVATAR, rtc.DisconnectReason.SIGNAL_CLOSE)
            await settle()
        else:
            # the app gives up on the join, as the upstream docs suggest, and closes it
            with contextlib.suppress(TimeoutError):
                await plugin.wait_for_join(timeout=0.01)
            await plugin.aclose()
            await settle()
        out[case] = " -> ".join(type(o).__name__ for o in audio_chain(session))
        await plugin.aclose()
        await session.aclose()
    return out


async def upstream_user_leaves() -> dict[str, Any]:
    """A session with RoomIO's defaults (``close_on_disconnect=True``), the user leaving
    for a closing reason and for another one."""
    from livekit import rtc
    from livekit.agents import Agent, AgentSession

    from agent_runtime.sdk import livekit_compat as lk
    from agent_runtime.testing.clock import settle

    out: dict[str, Any] = {}
    for reason in ("CLIENT_INITIATED", "CONNECTION_TIMEOUT"):
        room = _room()
        session: AgentSession[Any] = AgentSession()
        await session.start(Agent(instructions="upstream"), room=room)
        await settle()
        closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        session.once("close", lambda ev, f=closed: f.done() or f.set_result(ev))
        t0 = time.perf_counter()
        room.remove_participant("user", rtc.DisconnectReason.Value(reason))
        await settle()
        if reason == "CLIENT_INITIATED":
            ev = await asyncio.wait_for(closed, 10)
            out[reason] = {
                "closed": True,
                "ms": (time.perf_counter() - t0) * 1e3,
                "close_reason": ev.reason.value,
            }
        else:
            # nothing closed it and nothing is scheduled to: no close task, no timer
            out[reason] = {
                "closed": closed.done(),
                "close_pending": lk.session_closing_task(session) is not None,
            }
            await session.aclose()
    return out


async def upstream_interrupt_after_avatar_left(logs: list[logging.LogRecord]) -> dict[str, Any]:
    """Speaking to a joined avatar through a plugin-style ``DataStreamAudioOutput``; the
    avatar leaves; the session is interrupted. Real seconds until the speech's playout is
    released. The in-memory room's ``lk.clear_buffer`` to the departed avatar stays in flight
    (its stand-in clock is not advanced; the real SDK gives up after 7 s)."""
    from livekit.agents import Agent, AgentSession
    from livekit.agents.voice import speech_handle
    from livekit.rtc import DisconnectReason

    from agent_runtime.sdk import livekit_compat as lk
    from agent_runtime.testing.clock import settle
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

    room = _room(avatar=True)
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions="upstream"), room=room)
    plugin = ScriptedAvatar(avatar_identity=AVATAR)
    await plugin.start(session, room)
    await plugin.wait_for_join(timeout=1.0)
    sink = plugin.installed
    assert sink is not None
    handle = session.say("a long answer", audio=_frames(1_000))
    deadline = time.perf_counter() + 10
    while not lk.pending_playbacks(sink):  # the avatar is playing a segment
        if time.perf_counter() > deadline:
            raise RuntimeError("the upstream speech never reached the avatar sink")
        await asyncio.sleep(0.005)
    room.remove_participant(AVATAR, DisconnectReason.CONNECTION_TIMEOUT)
    await settle()
    seen = len(logs)
    t0 = time.perf_counter()
    session.interrupt()
    await asyncio.wait_for(handle.wait_for_playout(), 30)
    stall = time.perf_counter() - t0
    # the in-memory room records a call when it ends
    finished = [c.method for c in room.local_participant.rpc_calls]
    await plugin.aclose()
    await session.aclose()
    fallback = any(
        "speech not done in time after interruption" in r.getMessage() for r in logs[seen:]
    )
    return {
        "seconds": stall,
        "fallback_logged": fallback,
        "interruption_timeout": speech_handle.INTERRUPTION_TIMEOUT,
        "clear_buffer_in_flight": "lk.clear_buffer" not in finished,
    }


# how long (real seconds) a reproduction watches for something upstream never does, and the
# sink's clear fallback (DataStreamAudioOutput's own default); the smoke test shortens both
UPSTREAM_WATCH = 1.0
CLEAR_BUFFER_TIMEOUT = 2.0
CONFIRM_AFTER = 0.3  # when the avatar confirms a cut (playout_interrupted.yaml's 0.3 s)


async def _speaking_to_an_avatar(seconds: float) -> tuple[Any, Any, Any, Any]:
    """A started session whose audio goes to a joined avatar through a plugin-style
    ``DataStreamAudioOutput`` (no runtime), saying ``seconds`` of audio; returns once the
    audio is all pushed: (room, session, plugin, speech handle)."""
    from livekit.agents import Agent, AgentSession

    from agent_runtime.sdk import livekit_compat as lk
    from agent_runtime.testing.scripted_avatar import ScriptedAvatar

    room = _room(avatar=True)
    session: AgentSession[Any] = AgentSession()
    await session.start(Agent(instructions="upstream"), room=room)
    plugin = ScriptedAvatar(avatar_identity=AVATAR, clear_buffer_timeout=CLEAR_BUFFER_TIMEOUT)
    await plugin.start(session, room)
    await plugin.wait_for_join(timeout=1.0)
    handle = session.say("an answer", audio=_frames(round(seconds * 100)))
    deadline = time.perf_counter() + 10
    sink = plugin.installed
    assert sink is not None
    while lk.pushed_seconds(sink) < seconds - 1e-6 or session.agent_state != "speaking":
        if time.perf_counter() > deadline:
            raise RuntimeError("the upstream speech never reached the avatar sink")
        await asyncio.sleep(0.005)
    return room, session, plugin, handle


async def upstream_playout() -> dict[str, Any]:
    """What livekit-agents alone does with the agent's audio at an avatar: never reported,
    the avatar leaving mid-utterance, an interruption the avatar does not confirm, and
    when ``user_away_timeout`` starts."""
    from livekit.rtc import DisconnectReason

    from agent_runtime.sdk import livekit_compat as lk
    from agent_runtime.testing.clock import settle

    out: dict[str, Any] = {}
    for case in ("silent", "left"):
        room, session, plugin, handle = await _speaking_to_an_avatar(0.2)
        if case == "left":
            room.remove_participant(AVATAR, DisconnectReason.SIGNAL_CLOSE)
        await asyncio.sleep(UPSTREAM_WATCH)
        out[case] = {
            "state": session.agent_state,
            "done": handle.done(),
            "away_timer": lk.user_away_armed(session),
            "watched": UPSTREAM_WATCH,
        }
        await plugin.aclose()
        await session.aclose()

    out["interrupt"] = {"clear_buffer_timeout": CLEAR_BUFFER_TIMEOUT}
    for case in ("confirmed", "unconfirmed"):
        room, session, plugin, handle = await _speaking_to_an_avatar(5.0)
        t0 = time.perf_counter()
        session.interrupt()
        if case == "confirmed":  # the avatar confirms the cut, as in the scenario
            await asyncio.sleep(CONFIRM_AFTER)
            await room.invoke_rpc(
                "lk.playback_finished", AVATAR, '{"playback_position": 0.3, "interrupted": true}'
            )
        await asyncio.wait_for(handle.wait_for_playout(), 30)
        out["interrupt"][case] = time.perf_counter() - t0
        calls = [c.method for c in room.local_participant.rpc_calls]
        out["interrupt"]["clear_sent"] = "lk.clear_buffer" in calls
        await plugin.aclose()
        await session.aclose()

    # user_away_timeout: armed only once both sides listen, i.e. at the avatar's report
    room, session, plugin, handle = await _speaking_to_an_avatar(0.2)
    before = lk.user_away_armed(session)
    await room.invoke_rpc(
        "lk.playback_finished", AVATAR, '{"playback_position": 0.2, "interrupted": false}'
    )
    await asyncio.wait_for(handle.wait_for_playout(), 10)
    await settle()
    out["away"] = {
        "before_report": before,
        "after_report": lk.user_away_armed(session),
        "timeout": session.options.user_away_timeout,
    }
    await plugin.aclose()
    await session.aclose()
    return out


def upstream_rows(
    avatar: dict[str, str],
    users: dict[str, Any],
    interrupt: dict[str, Any],
    playout: dict[str, Any],
) -> dict[str, Upstream]:
    left = users["CLIENT_INITIATED"]
    dropped = users["CONNECTION_TIMEOUT"]
    fallback = interrupt["interruption_timeout"]
    silent, gone, cut, away = (playout[k] for k in ("silent", "left", "interrupt", "away"))
    return {
        "playout_silent": Upstream(
            "avatar never reports its playback -> playout done",
            f"never (still {silent['state']!r} {silent['watched']:g} s after its audio)",
            "reproduced here without the runtime: a real AgentSession speaking 0.2 s to a joined "
            "avatar through a plugin-style DataStreamAudioOutput whose lk.playback_finished "
            f"never comes; the speech is not done ({not silent['done']}) and user_away_timeout "
            f"is not armed ({not silent['away_timer']}): AgentActivity waits on "
            "audio_output.wait_for_playout() with no bound (voice/agent_activity.py), and the "
            "away timer starts only when user and agent both listen (voice/agent_session.py "
            "_update_agent_state)",
        ),
        "playout_left": Upstream(
            "avatar leaves mid-utterance -> playout done",
            f"never (still {gone['state']!r} {gone['watched']:g} s after the avatar left)",
            "reproduced here without the runtime: as above, the avatar participant leaves "
            f"while its audio is pending; the speech is not done ({not gone['done']}): nothing "
            "in DataStreamAudioOutput or AvatarSession ends a segment for a participant that "
            "left",
        ),
        "playout_interrupt": Upstream(
            "interruption, the avatar confirms the cut -> playout done",
            f"{cut['confirmed']:.2f} s (the same: at the confirmation)",
            "reproduced here without the runtime: speaking 5 s to a joined avatar, "
            f"session.interrupt() (lk.clear_buffer sent: {cut['clear_sent']}), the avatar's "
            f"lk.playback_finished {CONFIRM_AFTER:g} s later: real seconds until the speech's "
            "playout is done. Unconfirmed, the sink gives up after its clear_buffer_timeout = "
            f"{cut['clear_buffer_timeout']:g} s ({cut['unconfirmed']:.2f} s measured; "
            "voice/avatar/_datastream_io.py; a plugin that sets it to None, as lemonslice "
            "does, leaves it to INTERRUPTION_TIMEOUT), where this runtime's bound is its "
            "margin from the cut (2 s by default): no gain here but that the bound is the "
            "runtime's, whatever the plugin's setting",
            value=cut["confirmed"],
            unit="s",
        ),
        "playout_reprompt": Upstream(
            "user silent after the agent spoke -> re-prompt, from the remote playout",
            f"user_away_timeout {away['timeout']:g} s after the report marks the user 'away' "
            "(the re-prompt is the app's); never without a report",
            "reproduced here without the runtime: user_away_timeout is armed at the avatar's "
            f"lk.playback_finished (armed before it: {away['before_report']}; after it: "
            f"{away['after_report']}), so the SDK too counts from the remote playout when the "
            "avatar reports; it sets user_state 'away' and does nothing else, and with no "
            "report (the first row) it never starts",
        ),
        "avatar": Upstream(
            "avatar failure -> room audio",
            "never restored",
            "reproduced here without the runtime: a plugin-style AvatarSession (base start(), then "
            "replace_audio_tail(DataStreamAudioOutput)) on a real AgentSession; audio chain "
            + "; ".join(f"{k}: {v}" for k, v in avatar.items())
            + " (AvatarSession.aclose() in voice/avatar/_types.py has no restore; with the "
            "avatar first, session.start() turned RoomIO's audio output off, so no room "
            "output exists to go back to)",
        ),
        "simulator": Upstream(
            "simulator leaves -> job closed",
            "up to session_end_timeout (300 s)",
            "read from the installed source: job.py JobContext._on_simulator_disconnected asks "
            "for shutdown at once, but the verdict is lost then (the session's host closed "
            "with it); an app holding for the verdict can only wait in on_session_end, which "
            "ipc/job_proc_lazy_main.py _shutdown_job bounds by session_end_timeout = 300.0 "
            "(worker.py) and which nothing tells that the simulator left",
        ),
        "user_leaves": Upstream(
            "user leaves (CLIENT_INITIATED) -> session closed",
            f"at once ({left['ms']:.1f} ms real); the job is not ended by it",
            "reproduced here: a real AgentSession with RoomIO's defaults closes with "
            f"{left['close_reason']} when the user leaves (voice/room_io/room_io.py "
            "_on_participant_disconnected, DEFAULT_CLOSE_ON_DISCONNECT_REASONS); read from the "
            "source: nothing shuts the job down on that close (only delete_room_on_close "
            "deletes the room), so the job waits for the room to end server-side",
            value=left["ms"] / 1e3,
            unit="s",
        ),
        "user_drops": Upstream(
            "user drops (CONNECTION_TIMEOUT), no rejoin -> session closed",
            "not closed by the SDK: minutes (server timeouts, 5-6 min reported)",
            "reproduced here: with RoomIO's defaults, after the user left with CONNECTION_TIMEOUT "
            f"the session is still open (closed: {dropped['closed']}, close scheduled: "
            f"{dropped['close_pending']}): only CLIENT_INITIATED, ROOM_DELETED and USER_REJECTED "
            "close it (voice/room_io/types.py DEFAULT_CLOSE_ON_DISCONNECT_REASONS); the 5-6 "
            "minutes until server-side timeouts end the job are the users' report (seed 002)",
        ),
        "interrupt": Upstream(
            "interrupt after the avatar left -> playout released",
            f"{interrupt['seconds']:.2f} s (INTERRUPTION_TIMEOUT fallback)",
            "reproduced here without the runtime: speaking to a joined avatar through a "
            "plugin-style DataStreamAudioOutput, the avatar leaves, session.interrupt(); real "
            "seconds until the speech's playout is released, by the fallback "
            f"(INTERRUPTION_TIMEOUT = {fallback:g} in voice/speech_handle.py; "
            f"'speech not done in time after interruption' logged: {interrupt['fallback_logged']})"
            "; the lk.clear_buffer RPC to the departed avatar still in flight then: "
            f"{interrupt['clear_buffer_in_flight']} (the SDK ends it after max_round_trip_latency "
            "= 7 s, livekit/rtc/participant.py perform_rpc)",
            value=interrupt["seconds"],
            unit="s",
        ),
    }


async def measure_upstream() -> dict[str, Upstream]:
    with captured_sdk_logs() as logs:
        avatar = await upstream_avatar_routes()
        users = await upstream_user_leaves()
        interrupt = await upstream_interrupt_after_avatar_left(logs)
        playout = await upstream_playout()
    return upstream_rows(avatar, users, interrupt, playout)


def rows_from(
    measured: dict[str, Measured],
    rounds: list[float],
    n_scenarios: int,
    upstream: dict[str, Upstream],
    split: Split | None = None,
) -> list[Row]:
    rows: list[Row] = []
    for group, key in REACTIONS:
        for r in group:
            m = measured[r.scenario]
            wall = statistics.median(m.wall_ms_per_step)
            rows.append(
                Row(
                    SECTION,
                    f"{r.case}: {RUNTIME}",
                    m.reaction,
                    "s",
                    text=f"{_seconds(m.reaction)} ({wall:.1f} ms wall/step)",
                    how=(
                        f"examples/scenarios/{r.scenario}.yaml through run_scenario (its expect "
                        f"block held): virtual seconds from {r.cause_text} to {r.outcome_text}; "
                        f"beside it real ms per scenario step, the whole run included (median "
                        f"of {len(m.wall_ms_per_step)} rounds, {m.steps} steps)"
                    ),
                    samples=tuple(m.wall_ms_per_step),
                    extra={
                        "scenario": r.scenario,
                        "virtual_s": m.reaction,
                        "wall_ms_per_step": wall,
                        "cpu_ms_per_step": statistics.median(m.cpu_ms_per_step),
                        "steps": m.steps,
                    },
                )
            )
        u = upstream[key]
        rows.append(
            Row(
                SECTION,
                f"{u.case}: {UPSTREAM}",
                u.value,
                u.unit,
                text=u.text,
                how=u.how,
            )
        )
    rows.append(
        Row(
            SECTION,
            f"processing per scenario step, all {n_scenarios} bundled scenarios: {RUNTIME}",
            statistics.median(rounds),
            "ms/step",
            how=(
                "wall-clock ms of run_scenario per scenario step over every file in "
                "examples/scenarios (set-up, a real AgentSession start and close included), "
                f"median of {len(rounds)} rounds after one discarded warm-up run"
            ),
            samples=tuple(rounds),
        )
    )
    if split is not None:
        rows.extend(split_rows(split, statistics.median(rounds)))
    return rows


def split_rows(split: Split, ms_per_step: float) -> list[Row]:
    """The runtime's part of a scenario step: by part of the code (profiled), then each
    machine's own work per event and its reaction from cause to effect done (timed)."""
    rows: list[Row] = []
    total = sum(split.parts.values())
    if total > 0:
        share = split.parts.get("the runtime", 0.0) / total
        others = ", ".join(
            f"{part} {t / total:.0%}"
            for part, t in sorted(split.parts.items(), key=lambda kv: -kv[1])
            if part != "the runtime"
        )
        rows.append(
            Row(
                SECTION,
                f"processing per scenario step, the runtime's part: {RUNTIME}",
                share * ms_per_step,
                "ms/step",
                text=f"{share * ms_per_step:.2f} ms/step ({share:.0%}; {others})",
                how=(
                    "one more round of every bundled scenario under cProfile: each function's "
                    "own CPU time, summed by where the code lives (agent_runtime and "
                    "statemachines; livekit; the asyncio loop; the scenario runner, in-memory "
                    "room and scripted avatar; the rest); the runtime's share applied to the "
                    "unprofiled ms per step above"
                ),
                extra={"cpu_s_by_part": split.parts, "steps": split.steps},
            )
        )
    how = (
        "one more round of every bundled scenario with each Actor timed (the thread's CPU "
        "time around its own methods): per event, deciding and changing state (table, guards, "
        "timers and tasks, mailbox: the figure), then beside it the trace records written (the "
        "runner's "
        "sinks), the state changes heard (the owning runtime, the runtime's glue and the "
        "runner's recording) "
        "and the effect handlers until they return (the runtime's glue and the SDK calls it "
        "makes; an awaited effect's wait not included); reaction: wall time "
        "from the event queued (room fact, RPC outcome, timer, posted input) to its step done, "
        "awaited effects included, median and 90th percentile"
    )
    for machine, c in sorted(split.machines.items()):
        if not c.events:
            continue
        step_us = c.core_s / c.events * 1e6
        trace_us = c.trace_s / c.events * 1e6
        listen_us = c.listeners_s / c.events * 1e6
        fx_us = c.effects_s / c.events * 1e6
        lat = sorted(c.latency_s)
        med = statistics.median(lat) * 1e3 if lat else 0.0
        p90 = lat[int(0.9 * (len(lat) - 1))] * 1e3 if lat else 0.0
        rows.append(
            Row(
                SECTION,
                f"{machine}: the runtime's work per event",
                step_us,
                "us/event",
                text=(
                    f"{step_us:.1f} us/event to decide and change state; beside it trace "
                    f"{trace_us:.1f}, listeners {listen_us:.1f}, effects {fx_us:.1f} us; cause "
                    f"-> effect done {med:.2f} ms (p90 {p90:.2f}); {c.events} events"
                ),
                how=how,
                extra={
                    "events": c.events,
                    "step_us_per_event": step_us,
                    "trace_us_per_event": trace_us,
                    "listeners_us_per_event": listen_us,
                    "effects_us_per_event": fx_us,
                    "reaction_ms_median": med,
                    "reaction_ms_p90": p90,
                    "reactions_timed": len(lat),
                },
            )
        )
    return rows


def _seconds(x: float) -> str:
    return "0 s" if abs(x) < 5e-7 else f"{x:g} s"


def run(cfg: Config) -> list[Row]:
    from agent_runtime.testing import clock

    # the scenarios run as simulate runs them, on the virtual-time loop (the room's audio
    # plays on its clock there); upstream's own cases on a plain loop
    measured, rounds, n, split = clock.run(run_scenarios(cfg.repeats))
    upstream = asyncio.run(measure_upstream())
    return rows_from(measured, rounds, n, upstream, split)
