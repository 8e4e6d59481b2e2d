"""The playout machine explored exhaustively against an abstract world.

The world is what the machine cannot see directly: whether the avatar is joined, whether
the user is listening, speaking or gone, whether agent audio handed to the avatar is still
unplayed (``pending``), and the re-prompts used. Every input the session, the avatar and
the user can produce is tried in every world reached, in any order, with the state's own
timeout whenever one is armed; the machine decides with the same pure
``statemachines.step`` the runtime runs and the runtime's own guards
(``statemachines.glue``) reading the world, its effects applied to it. Checked in every
world and on every step:

- ``avatar_gone``: never waiting in ``remote_playout`` for an avatar that is not joined;
- ``reprompt_over_audio``: a re-prompt never runs while agent audio is pending or the user
  is not there and silent;
- ``reprompt_count``: never more than ``max_reprompts`` re-prompts since the user last
  spoke or left;
- ``armed_over_audio``: the watchdog is never armed (``settling``/``watching``) while agent
  audio is pending;
- ``unbounded_wait``: with nothing happening but the machine's own timers, it comes to rest
  (a state without a timer, never ``remote_playout``) within ``2 * max_reprompts + 3``
  timeouts;
- ``rejected``: no input is ever refused (the session's events are facts, not requests);
- ``unwatched_audio``: agent audio handed to a joined avatar is always waited for
  (``remote_playout``), so its end is reported or bounded;
- ``turn_not_followed``: once the agent starts a turn (a speech queued, thinking, speaking)
  the machine follows it (``agent_turn`` or ``remote_playout``): the watchdog is disarmed;
- ``turn_not_ended``: the SDK's own playout report (``agent_listening``) ends the turn, and
  the avatar's ``lk.playback_finished`` ends the wait for it, unless another segment it
  was given is still unreported (one report ends one segment);
- ``watchdog_misarmed``: when a turn ends, the watchdog arms (``settling``) exactly when it
  is on and the user is there and silent, and is off (``idle``) otherwise; it is never
  armed while it is off, and the user speaking or leaving disarms it;
- ``watchdog_silent``: once armed, the machine's own timers alone lead to a re-prompt,
  or to the hand-over once ``max_reprompts`` went unanswered since the user last spoke or
  left (wherever that was: over the agent too); a silent user is never left in silence;
- ``not_closed``: the session's close ends the machine (``closed``) from every state, and
  nothing else does;
- ``moved_by_noise``: the machine moves only on what concerns it: at rest, the user (who
  disarms it), a new turn, audio at a joined avatar or its own timers; in a turn, the
  turn's end, audio or a cut at a joined avatar; waiting for the avatar, the end of that
  wait; and a state's timer is not restarted by an event that does not set it again.

Pure: no runtime, no clock. ``explore_playout`` returns what it found, with the shortest
input sequence reaching each problem.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from agent_runtime.testing.invariants.playout import Facts, decision
from statemachines import MachineSpec, step
from statemachines.glue import EMPTY, GUARDS, Guard
from statemachines.playout import PLAYOUT, QUIET
from statemachines.playout import TURN as _TURN

User = Literal["listening", "speaking", "gone"]
AT_REST = frozenset({"idle", "agent_turn", "exhausted", "closed"})
TURN = frozenset(_TURN)  # the agent's audio is not done
ARMED = frozenset(QUIET)  # the watchdog is armed or arming
STARTS_A_TURN = frozenset({"speech_created", "agent_thinking", "agent_speaking"})


@dataclass(frozen=True, slots=True)
class World:
    state: str
    joined: bool = True  # the avatar is joined
    user: User = "listening"
    # ended segments of agent audio at the joined avatar, not yet reported (the sink counts
    # them; two stand for "more than one")
    pending: int = 0
    reprompts: int = 0  # the machine's count (its effects keep it)
    unanswered: int = 0  # re-prompts since the user last spoke or left (the world's count)


@dataclass(frozen=True, slots=True)
class Problem:
    check: str
    detail: str
    path: tuple[str, ...]  # the inputs from the initial world

    def __str__(self) -> str:
        return f"{self.check}: {self.detail} (after {' -> '.join(self.path) or 'nothing'})"


@dataclass
class Report:
    worlds: int = 0
    steps: int = 0
    problems: list[Problem] = field(default_factory=list)
    rows_taken: set[int] = field(default_factory=set)  # indexes into spec.rows

    @property
    def ok(self) -> bool:
        return not self.problems


# an input: its name, whether the world allows it, the world after it, the machine's event
Input = tuple[str, Callable[[World], bool], Callable[[World], World], str | None]


def _always(w: World) -> bool:
    return True


def _same(w: World) -> World:
    return w


INPUTS: tuple[Input, ...] = (
    ("speech_created", _always, _same, "speech_created"),
    ("agent_thinking", _always, _same, "agent_thinking"),
    ("agent_speaking", _always, _same, "agent_speaking"),
    # the SDK's wait ends only once its segment was reported or finished locally
    ("agent_listening", _always, lambda w: replace(w, pending=0), "agent_listening"),
    # a speech handle's end says nothing about the avatar (the SDK's fallbacks end it too)
    ("speech_done", _always, _same, "speech_done"),
    # pushed to a joined avatar it waits there; to the room it is the SDK's own
    (
        "handed_off",
        _always,
        lambda w: replace(w, pending=min(w.pending + 1, 2) if w.joined else w.pending),
        "handed_off",
    ),
    (
        "playback_finished",
        lambda w: w.joined,
        # one report, one segment
        lambda w: replace(w, pending=max(w.pending - 1, 0)),
        "playback_finished",
    ),
    # a cut while a joined avatar has (or is about to have) the agent's audio: its sink
    # asks the avatar to clear, and the avatar's word on the cut is what ends the turn
    (
        "interrupted",
        _always,
        lambda w: replace(w, pending=max(w.pending, int(w.joined and w.state in TURN))),
        "interrupted",
    ),
    # audio is handed off here only to a joined avatar: none waits for its join
    (
        "avatar_joins",
        lambda w: not w.joined,
        lambda w: replace(w, joined=True),
        "avatar_joined",
    ),
    (
        "avatar_leaves",
        lambda w: w.joined,
        lambda w: replace(w, joined=False, pending=0),  # nobody plays it any more
        "avatar_left",
    ),
    (
        "user_speaks",
        lambda w: w.user == "listening",
        lambda w: replace(w, user="speaking", unanswered=0),
        "user_speaking",
    ),
    ("user_stops", lambda w: w.user == "speaking", lambda w: replace(w, user="listening"), None),
    (
        "user_leaves",
        lambda w: w.user != "gone",
        lambda w: replace(w, user="gone", unanswered=0),
        "user_left",
    ),
    ("user_rejoins", lambda w: w.user == "gone", lambda w: replace(w, user="listening"), None),
    ("close", _always, _same, "close"),
)


@dataclass(frozen=True, slots=True)
class _Facts:
    """A world as the runtime's guards read it (``statemachines.glue.PlayoutFacts``)."""

    world: World
    watchdog_on: bool
    max_reprompts: int

    @property
    def avatar_state(self) -> str:
        return "joined" if self.world.joined else "routing"

    @property
    def audio_at_avatar(self) -> bool:
        return self.world.pending > 0

    @property
    def user_linked(self) -> bool:
        return self.world.user != "gone"

    @property
    def user_speaking(self) -> bool:
        return self.world.user == "speaking"

    @property
    def reprompts(self) -> int:
        return self.world.reprompts


class _Explorer:
    def __init__(
        self,
        spec: MachineSpec,
        guards: Mapping[str, Guard],
        *,
        watchdog: bool,
        max_reprompts: int,
    ) -> None:
        self.spec = spec
        self._guards = guards
        self.watchdog = watchdog
        self.max_reprompts = max_reprompts
        self.report = Report()
        self.effects: tuple[str, ...] = ()  # of the last decision
        self._row_index = {id(r): k for k, r in enumerate(spec.rows)}

    def guards(self, w: World) -> dict[str, bool]:
        """The runtime's own guards (``statemachines.glue``), on the world's facts."""
        facts = _Facts(w, self.watchdog, self.max_reprompts)
        return {name: guard(facts, EMPTY) for name, guard in self._guards.items()}

    def inputs(self, w: World) -> Iterator[tuple[str, World, str | None]]:
        for name, allowed, change, event in INPUTS:
            if allowed(w):
                yield name, change(w), event
        timeout = self.spec.state(w.state).timeout
        if timeout is not None:
            yield timeout.event, w, timeout.event

    def handle(self, w: World, event: str, path: tuple[str, ...]) -> World:
        """The machine's step on ``event`` in world ``w`` (already changed by the input)."""
        st = step(self.spec, w.state, event, self.guards(w))
        self.report.steps += 1
        self.effects = st.effects if st.outcome == "transition" else ()
        if st.outcome == "reject":
            self.flag("rejected", f"{event} refused in {w.state}", path)
            return w
        self.check_step(w, event, st.dest, st.changed, path)
        if st.outcome != "transition":
            return w
        for r in self.spec.rows:
            if (r.source, r.event, r.guards) == (w.state, event, st.guards):
                self.report.rows_taken.add(self._row_index[id(r)])
                break
        out = replace(w, state=st.dest)
        for effect in st.effects:
            if effect == "reprompt":
                if out.pending or out.user != "listening":
                    self.flag(
                        "reprompt_over_audio",
                        f"re-prompt with pending={out.pending}, user {out.user}",
                        path,
                    )
                if out.unanswered >= self.max_reprompts:
                    self.flag("reprompt_count", f"{out.unanswered + 1} re-prompts in a row", path)
                # counted up to one past the limit: the worlds stay finite for a bad spec
                top = self.max_reprompts + 1
                out = replace(
                    out,
                    reprompts=min(out.reprompts + 1, top),
                    unanswered=min(out.unanswered + 1, top),
                )
            elif effect == "reset_reprompts":
                out = replace(out, reprompts=0)
            elif effect == "finish_playout":
                out = replace(out, pending=0)
        return out

    def check_step(
        self, w: World, event: str, after: str, left: bool, path: tuple[str, ...]
    ) -> None:
        """What the documented behaviour asks of one decision (``w`` is the world the
        input made, ``after`` the machine's state once it decided, ``left`` whether it
        left its state to get there): the real job's own checks
        (``agent_runtime.testing.invariants.playout.decision``), on the world's facts."""
        facts = Facts(
            watchdog=self.watchdog,
            listening=w.user == "listening",
            joined=w.joined,
            left=left,
            audio=w.pending > 0,
        )
        for problem in decision(w.state, event, after, facts):
            check, _, detail = problem.partition(": ")
            self.flag(check, detail, path)

    def flag(self, check: str, detail: str, path: tuple[str, ...]) -> None:
        if not any(p.check == check for p in self.report.problems):
            self.report.problems.append(Problem(check, detail, path))

    def check_world(self, w: World, path: tuple[str, ...]) -> None:
        if w.state == "remote_playout" and not w.joined:
            self.flag("avatar_gone", "waiting in remote_playout, the avatar not joined", path)
        if w.pending and w.state not in ("remote_playout", "closed"):
            self.flag("unwatched_audio", f"{w.state} with audio at the avatar", path)
        if w.state in ARMED and w.pending:
            self.flag("armed_over_audio", f"{w.state} with agent audio pending", path)
        self.check_timers(w, path)

    def check_timers(self, w: World, path: tuple[str, ...]) -> None:
        limit = 2 * self.max_reprompts + 3
        cur = w
        said: tuple[str, ...] = ()  # the first re-prompt or hand-over on the way
        for _ in range(limit + 1):
            if cur.state in AT_REST:
                break
            timeout = self.spec.state(cur.state).timeout
            if timeout is None:
                self.flag("unbounded_wait", f"{cur.state} waits with no timeout", path)
                return
            cur = self.handle(cur, timeout.event, path)
            said = said or tuple(e for e in self.effects if e in ("reprompt", "hand_over"))
        else:
            self.flag("unbounded_wait", f"still in {cur.state} after {limit} timeouts", path)
            return
        if w.state in ARMED and self.watchdog:
            # a re-prompt while fewer than max_reprompts went unanswered, else the hand-over
            want = "reprompt" if w.unanswered < self.max_reprompts else "hand_over"
            if said[:1] != (want,):
                self.flag(
                    "watchdog_silent",
                    f"armed in {w.state} with {w.unanswered} re-prompt(s) unanswered, its "
                    f"timers end in {cur.state} with {said[:1] or 'nothing said'}, not {want}",
                    path,
                )

    def run(self) -> Report:
        start = World(self.spec.initial)
        seen: dict[World, tuple[str, ...]] = {start: ()}
        queue = deque([start])
        self.check_world(start, ())
        while queue:
            w = queue.popleft()
            if w.state == "closed":
                continue
            for name, changed, event in self.inputs(w):
                path = (*seen[w], name)
                nxt = changed if event is None else self.handle(changed, event, path)
                if nxt not in seen:
                    seen[nxt] = path
                    self.check_world(nxt, path)
                    queue.append(nxt)
        self.report.worlds = len(seen)
        return self.report


def explore_playout(
    spec: MachineSpec = PLAYOUT,
    *,
    watchdog: bool = True,
    max_reprompts: int = 2,
    guards: Mapping[str, Guard] = GUARDS["playout"],
) -> Report:
    """Every world the machine and its inputs can reach, each checked; see the module.
    ``guards`` are the runtime's own unless a test breaks one."""
    if max_reprompts < 0:
        raise ValueError("max_reprompts must be >= 0")
    return _Explorer(spec, guards, watchdog=watchdog, max_reprompts=max_reprompts).run()
