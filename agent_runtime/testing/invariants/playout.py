"""What the playout machine promises on each of its decisions (invariant 12), judged on a
real job as it runs.

The view the other invariants read is taken between inputs; these need the moment of the
decision: what the machine's guards could see then (the watchdog configured, a linked user
who is silent, a joined avatar) and whether the state was left. ``PlayoutJudge`` is a trace
sink: it reads those facts from the job as each playout record is written (the record is
written once the machine decided, before its effects run) and checks the decision against
the documented behaviour, independently of the table that made it:

- ``rejected``: no input is refused (the session's events are facts, not requests);
- ``not_closed``: the session's close ends the machine from every state, nothing else does;
- ``turn_not_followed``: a new turn (a speech queued, thinking, speaking) is followed;
- ``turn_not_ended``: the SDK's playout report ends a turn, the avatar's report ends the
  wait for it (unless another ended segment still waits for its own report: the SDK
  counts them), and a speech done before any audio ends a turn that has none;
- ``waits_for_nothing``: the wait for the avatar's report begins only with audio (or a
  cut) at a joined avatar, or with audio its sink took before it joined, as it joins;
- ``watchdog_misarmed``: a turn that ends arms the watchdog exactly when it is configured
  and the user is there and silent; it is never armed otherwise, and the user speaking or
  leaving disarms it;
- ``reprompt_count``: at most ``max_reprompts`` re-prompts since the user last spoke or
  left (whether the user was silent then is judged between inputs: the user's change may
  be on its way to the machine as its timer fires);
- ``moved_by_noise``: the machine moves only on what concerns it, and an event that does
  not set a state's timer again does not restart it;
- ``watchdog_silent`` (``silent_since``, once only time passes): once armed, its own timers
  alone re-prompt the silent user until ``max_reprompts`` went unanswered, then hand over.

Two more need no moment and are in ``checks.settled``: agent audio at a joined avatar is
waited for (``remote_playout``), and the watchdog is not armed over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_runtime.observe.trace import DECISIONS, TraceRecord
from statemachines.playout import PLAYOUT, QUIET
from statemachines.playout import TURN as _TURN

if TYPE_CHECKING:
    from agent_runtime.system.agent_job import AgentJob
    from agent_runtime.testing.invariants.checks import Finding

NUMBER = 12
TURN = frozenset(_TURN)  # the agent's audio is not done
ARMED = frozenset(QUIET)  # the watchdog is armed or arming
STARTS_A_TURN = frozenset({"speech_created", "agent_thinking", "agent_speaking"})
USER = frozenset({"user_speaking", "user_left"})  # the user answered: the count starts again
_TIMER = {s.name: s.timeout.event if s.timeout else None for s in PLAYOUT.states}


@dataclass(frozen=True, slots=True)
class Facts:
    """What the machine's guards could see as it decided."""

    watchdog: bool  # re-prompts are configured
    listening: bool  # a linked user is there and not speaking
    joined: bool  # the avatar is joined (or clearing)
    left: bool  # the decision left its state (a re-entry included)
    audio: bool = False  # the avatar's sink holds ended segments it has not reported


def decision(state: str, event: str, after: str, facts: Facts) -> list[str]:
    """What is wrong with deciding ``event`` in ``state`` to land in ``after``."""
    out: list[str] = []
    if state == "closed":
        return out
    if (event == "close") != (after == "closed"):
        out.append(f"not_closed: {event} in {state} leads to {after}")
    if not _concerns(state, event, after, facts):
        out.append(f"moved_by_noise: {event} moves {state} to {after}")
    if event in STARTS_A_TURN and after not in TURN:
        out.append(f"turn_not_followed: {event} in {state} leaves it in {after}")
    if event == "agent_listening" and after in TURN:
        out.append(f"turn_not_ended: agent_listening in {state} stays in {after}")
    if event == "speech_done" and state == "agent_turn" and after in TURN:
        out.append(f"turn_not_ended: speech_done in agent_turn stays in {after}")
    if event == "playback_finished" and after == "remote_playout" and not facts.audio:
        out.append("turn_not_ended: playback_finished still waits for the avatar")
    handed = (event in ("handed_off", "interrupted") and facts.joined) or (
        event == "avatar_joined" and facts.audio
    )
    if after == "remote_playout" and state != "remote_playout" and not handed:
        out.append(f"waits_for_nothing: {event} in {state} waits for the avatar's report")
    how = f"watchdog {'on' if facts.watchdog else 'off'}, user {_user(facts)}"
    if state in TURN and after not in TURN and after != "closed":
        want = "settling" if facts.watchdog and facts.listening else "idle"
        if after != want:
            out.append(f"watchdog_misarmed: {event} ends the turn in {after}, not {want} ({how})")
    # staying armed on an event that is not the user's is judged between inputs: the
    # user's change may be on its way to the machine as it decides
    armed_by_it = state not in ARMED or event in USER
    if after in ARMED and (not facts.watchdog or (armed_by_it and not facts.listening)):
        out.append(f"watchdog_misarmed: {event} leaves it armed ({after}), {how}")
    return out


def _user(f: Facts) -> str:
    return "listening" if f.listening else "not listening"


def _concerns(before: str, event: str, after: str, f: Facts) -> bool:
    """Whether ``event`` may take the machine from ``before`` to ``after``."""
    reentered = after == before and f.left
    if (after == before and not reentered) or event == "close":
        return True
    timer = _TIMER[before]
    if reentered and timer is None:
        return True  # nothing to restart
    at_avatar = event in ("handed_off", "interrupted") and f.joined
    if before == "remote_playout":
        # more audio, or a cut, sets the bound again from what was pushed
        ends = ("agent_listening", "playback_finished", "avatar_left", "playout_timeout")
        return at_avatar or event in ends
    if before == "agent_turn":
        # audio the sink took before the avatar joined is awaited from its join
        joined_with_audio = event == "avatar_joined" and f.audio
        return at_avatar or joined_with_audio or event in ("agent_listening", "speech_done")
    if event in USER:
        return after == "idle"
    own_timer = event == timer and not reentered
    return own_timer or event in STARTS_A_TURN or (event == "handed_off" and f.joined)


class PlayoutJudge:
    """A trace sink that judges each decision of ``job``'s playout machine as it is
    recorded (add it to the job's tracer); ``findings`` holds the first of each check."""

    def __init__(self, job: AgentJob) -> None:
        self._job = job
        self.findings: list[Finding] = []
        self._unanswered = 0  # re-prompts since the user last spoke or left
        self._decisions: list[tuple[str, tuple[str, ...]]] = []  # (event, effects)

    def write(self, record: TraceRecord) -> None:
        # a sink that raises is dropped by the tracer, and the check would stop unseen
        try:
            self._judge(record)
        except Exception as e:
            self._flag(f"judge_failed: {type(e).__name__}: {e}")

    def _judge(self, record: TraceRecord) -> None:
        tracker = self._job.playout
        if record.machine != "playout" or record.kind not in DECISIONS or tracker is None:
            return
        if record.kind == "reject":
            self._flag(f"rejected: {record.event} refused in {record.source}")
            return
        moved = record.kind == "transition"
        after = record.dest if moved else record.source
        # written after the state was left, before it was entered: a re-entry has no timer
        left = moved and (
            after != record.source
            or (_TIMER[after] is not None and tracker.actor.timer_deadline is None)
        )
        facts = Facts(
            watchdog=tracker.options.reprompt,
            listening=tracker.user_listening,
            joined=tracker.avatar_joined,
            left=left,
            # what the guard read: a report carries the count it leaves owed
            audio=bool(record.data.get("owed", tracker.audio_at_avatar)),
        )
        for problem in decision(record.source, record.event, after, facts):
            self._flag(problem)
        if record.event in USER:
            self._unanswered = 0
        if "reprompt" in record.effects:
            limit = tracker.options.max_reprompts
            if self._unanswered >= limit:
                self._flag(f"reprompt_count: {self._unanswered + 1} re-prompts in a row")
            self._unanswered += 1
        self._decisions.append((record.event, tuple(record.effects)))

    def mark(self) -> tuple[str, int, int]:
        """Where the machine is now: its state, the re-prompts unanswered, the decisions
        so far (what ``silent_since`` reads)."""
        tracker = self._job.playout
        state = tracker.actor.state if tracker is not None else "closed"
        return state, self._unanswered, len(self._decisions)

    def silent_since(self, mark: tuple[str, int, int]) -> list[Finding]:
        """With nothing but time passing since ``mark``: an armed watchdog's timers alone
        re-prompt the silent user until ``max_reprompts`` went unanswered, then hand over,
        unless something else (the session's close) ended it first."""
        state, unanswered, start = mark
        tracker = self._job.playout
        if state not in ARMED or tracker is None or not tracker.options.reprompt:
            return []
        limit = tracker.options.max_reprompts
        want = ["reprompt"] * max(0, limit - unanswered) + ["hand_over"]
        said: list[str] = []
        cut = False  # ended by something else than its timers
        for event, effects in self._decisions[start:]:
            said += [e for e in effects if e in ("reprompt", "hand_over")]
            if "hand_over" in effects:
                break
            if event == "close" or event in USER:
                cut = True
                break
        if said == want or (cut and said == want[: len(said)]):
            return []
        return [
            (
                NUMBER,
                f"watchdog_silent: armed in {state} with {unanswered} re-prompt(s) "
                f"unanswered, its timers alone said {', '.join(said) or 'nothing'}, "
                f"not {', '.join(want)}",
            )
        ]

    def _flag(self, problem: str) -> None:
        check = problem.split(":", 1)[0]
        if not any(d.split(":", 1)[0] == check for _, d in self.findings):
            self.findings.append((NUMBER, problem))
