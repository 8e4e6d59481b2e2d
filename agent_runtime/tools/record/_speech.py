"""The speech channel: what the ``playout`` machine followed of the session.

- the agent's speech: each speech the session created, but a re-prompt's (created by the
  machine's own ``reprompt`` effect), is an ``agent.say`` of the seconds of audio handed to
  the avatar (``handed_off``'s ``pushed``); on the room's audio output, of the seconds it
  played (from its creation, or from the avatar's route put back when it waited at the
  avatar's sink, to its end), and an interruption there a ``session.interrupt``;
- the user's voice: a ``user.speech`` from each ``user_speaking``; the trace shows when it
  began and what the machine's ``user_listening`` guard read later, not when it ended;
- the playout options the machine's reads and timers show: the watchdog on, how many
  re-prompts it allowed, the hand-over that closed the session (and its reason), the margin
  of a bound that fired, how long the re-prompt spoke;
- what a machine's effect posted to another through a declared link
  (``statemachines.links.LINKS``: the bound finishing the avatar's segment) is no step.
"""

from __future__ import annotations

from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.settings import PlayoutOptions
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.tools.record._state import _State
from statemachines.avatar import ROUTED
from statemachines.glue import avatar_change_event
from statemachines.links import links_from
from statemachines.machines import MACHINES

_PLAYOUT = MACHINES["playout"]
# the state whose bound the runtime computes from the audio pushed, and its timeout event
_BOUNDED = next(s for s in _PLAYOUT.states if s.timeout and s.timeout.setting == "playout_bound")
_BOUND_FIRED = _BOUNDED.timeout.event if _BOUNDED.timeout else ""
# re-entered rows (not internal ones): each computes the bound again
_REENTERS = frozenset((r.source, r.event) for r in _PLAYOUT.rows if r.dest == _BOUNDED.name)
# the avatar's state whose entry the bound counts audio its sink took before from, and the
# rows that enter it again (a transition from it to it that is not internal)
_JOINED = "joined"
_REJOINS = frozenset(
    (r.source, r.event) for r in MACHINES["avatar"].rows if r.source == r.dest == _JOINED
)
_MAX_SAY = 10.0  # the longest agent.say a scenario takes
# a speech on the room's audio output that ended as it began: the shortest a step says
_UNTIMED_SAY = 0.1


def _pushed_by_speech(recs: list[tuple[int, TraceRecord]]) -> dict[int, float]:
    """The audio handed to the avatar (``handed_off``'s ``pushed``), by the speech it was
    (the index in ``recs`` of its ``speech_created``). Speeches play one after another and
    the SDK creates a queued one before the first plays, so a hand-off is the oldest
    speech still open (created, not done) that has none yet."""
    open_: list[tuple[int, Any]] = []
    out: dict[int, float] = {}
    for n, (_, r) in enumerate(recs):
        if r.kind == "effect":
            continue
        if r.event == "speech_created":
            open_.append((n, r.data.get("speech_id")))
        elif r.event == "handed_off" and isinstance(r.data.get("pushed"), int | float):
            first = next((m for m, _ in open_ if m not in out), None)
            if first is not None:
                out[first] = float(r.data["pushed"])
        elif r.event == "speech_done":
            open_ = [(m, sid) for m, sid in open_ if sid != r.data.get("speech_id")]
    return out


class _SpeechPass(_State):
    def _linked(self) -> set[int]:
        """The records a declared link delivered: an effect's follow-up, not an input."""
        out: set[int] = set()
        for i, r in enumerate(self.records):
            if r.kind != "effect" or r.outcome != "ok":
                continue
            for link in links_from(r.machine, r.effect):
                j = next(
                    (
                        j
                        for j in range(i + 1, len(self.records))
                        if self.records[j].machine == link.target
                        and self.records[j].event == link.event
                        and self.records[j].kind != "effect"
                        and j not in out
                    ),
                    None,
                )
                if j is not None and self.records[j].t == r.t:
                    out.add(j)
        return out

    def _speech(self, primary: str | None) -> None:
        recs = self.of("playout")
        if not recs:
            heard = any(
                r.kind == "transition" and avatar_change_event(r.source, r.dest)
                for _, r in self.of("avatar")
            )
            if heard and any(r.event == "attach" for _, r in self.of("session_host")):
                # the avatar's changes a playout machine hears, and none there: the job
                # turned it off (a trace that shows neither leaves AgentJob's default)
                self.config["playout"] = False
            return
        self.config["playout"] = True
        reprompted_at: float | None = None
        heard = False
        pushed = _pushed_by_speech(recs)
        for n, (i, r) in enumerate(recs):
            if r.kind == "transition" and "reprompt" in r.effects:
                reprompted_at = r.t
            if r.event == "speech_created":
                seconds = self._spoken(recs, n, pushed.get(n))
                if reprompted_at == r.t:  # the re-prompt's own speech, said by the effect
                    reprompted_at = None
                    self.config.setdefault("reprompt_speech", seconds)
                else:
                    self.step(i, r.t, "agent.say", duration=seconds)
            elif r.event == "user_speaking":
                heard = True
                self.step(i, r.t, "user.speech", duration=self._heard(recs, n))
            elif r.event == "interrupted" and not self._cut_elsewhere(r):
                # on the room's audio output (the avatar's channel rebuilds its own)
                self.step(i, r.t, "session.interrupt")
        if heard:
            self.note(
                "the trace shows when the user began to speak and what the playout machine "
                "read of it later, not when the speech ended: each ends halfway between the "
                "last read that found the user speaking and the first that did not (or one "
                "second after the last read)"
            )
        self._watchdog(recs, primary)
        self._margin(recs)

    def _spoken(self, recs: list[tuple[int, TraceRecord]], n: int, pushed: float | None) -> float:
        """Seconds of audio the speech created at ``recs[n]`` handed to the avatar
        (``pushed``, when it reached the avatar's sink)."""
        said = recs[n][1]
        if pushed is not None:
            if pushed > _MAX_SAY:
                self.note(
                    f"t={secs(said.t)}: the agent handed {secs(pushed)}s of audio to the avatar; "
                    f"a scenario's agent.say says at most {secs(_MAX_SAY)}s"
                )
            return min(pushed, _MAX_SAY) if pushed > 0 else _UNTIMED_SAY
        # on the room's audio output: it plays as long as the trace shows it did
        speech = said.data.get("speech_id")
        ends = (d for _, d in recs[n + 1 :] if d.event == "speech_done")
        done = next((d for d in ends if d.data.get("speech_id") == speech), None)
        began = self._on_room_audio_from(recs[n][0], said.t)
        spoke = None if done is None else done.t - (began if began <= done.t else said.t)
        cut = done is None or bool(done.data.get("interrupted"))
        if spoke is not None and (spoke > _MAX_SAY or (cut and spoke >= _MAX_SAY)):
            self.note(
                f"t={secs(said.t)}: the agent spoke {secs(spoke)}s on the room's audio "
                f"output; a scenario's agent.say says at most {secs(_MAX_SAY)}s"
            )
        if cut or spoke is None:
            self.note(
                f"t={secs(said.t)}: how long the agent's speech on the room's audio output "
                f"would have played is not in the trace (it was cut, or had not ended): "
                f"{secs(_MAX_SAY)}s stands in"
            )
            return _MAX_SAY
        played = round(spoke, 6)
        return min(played, _MAX_SAY) if played > 0 else _UNTIMED_SAY

    def _on_room_audio_from(self, index: int, t: float) -> float:
        """When a speech created at ``t`` (record ``index``) that reached no avatar began on
        the room's audio output: at once, unless the avatar's route was in then: its first
        frame waited at the avatar's sink until that route was put back (a scenario's
        ``agent.say`` then waits there too)."""
        state: str | None = None
        for j, r in self.of("avatar"):
            if r.kind != "transition":
                continue
            if j < index:
                state = r.dest
            elif state not in ROUTED:
                return t
            elif r.event == "route_restored":
                return r.t
        return t

    def _heard(self, recs: list[tuple[int, TraceRecord]], n: int) -> float:
        """How long the user who began to speak at ``recs[n]`` spoke: past every later read
        of the machine's ``user_listening`` that found them speaking, short of the first
        that did not (or of their next speech)."""
        start = recs[n][1].t
        speaking, silent = start, None
        for _, r in recs[n + 1 :]:
            if r.event == "user_speaking":
                silent = r.t
                break
            read = r.guards.get("user_listening")
            if read is False:
                speaking = r.t
            elif read is True:
                silent = r.t
                break
        end = speaking + 1.0 if silent is None else (speaking + silent) / 2
        return round(max(end - start, 0.001), 6)

    def _cut_elsewhere(self, r: TraceRecord) -> bool:
        """The interruption is rebuilt by another channel: the avatar machine's (a
        ``session.interrupt`` step), or the session's close that caused it."""
        if r.t == self.primary_closed_at:
            return True
        return any(a.event == "interrupt" and a.t == r.t for _, a in self.of("avatar"))

    def _watchdog(self, recs: list[tuple[int, TraceRecord]], primary: str | None) -> None:
        """The watchdog's options its reads and hand-over show."""
        if any(r.guards.get("watchdog_on") for _, r in recs):
            self.playout["reprompt"] = True
        count, allowed = 0, 0
        closed = self._primary_close(primary)
        for _, r in recs:
            if r.kind != "transition":
                continue
            if "reset_reprompts" in r.effects:
                count = 0
            if r.guards.get("reprompts_left") is True:
                allowed = max(allowed, count + 1)
            elif r.guards.get("reprompts_left") is False:
                self.playout["max_reprompts"] = count
            if "reprompt" in r.effects:
                count += 1
            if "hand_over" in r.effects and closed is not None and closed.t == r.t:
                self.playout["when_exhausted"] = "close"
                if closed.data.get("reason"):
                    self.playout["close_reason"] = str(closed.data["reason"])
                self.watchdog_closed_at = r.t
        if "max_reprompts" not in self.playout and allowed > 2:  # 2: the default
            self.playout["max_reprompts"] = allowed

    def _margin(self, recs: list[tuple[int, TraceRecord]]) -> None:
        """``margin``, from a bound that fired: what it waited (``after``) less what was
        left of the audio pushed (cut at an interruption) when the wait began, as the
        replay's speech, pushed at once when it is said, leaves it. Audio pushed before
        the avatar joined plays from the join on (``PlayoutRuntime.playout_bound``). A
        speech said while another was playing waits in the session's queue: its audio is
        pushed once the one before it is done, not when it was said."""
        said: float | None = None
        pushed = 0.0
        cut: float | None = None
        began = 0.0
        joined = float("-inf")  # when the avatar entered joined, as the wait began
        playing: set[Any] = set()  # the speeches created and not done
        queued: list[tuple[Any, float]] = []  # said while another played: (id, when)
        for i, r in recs:
            if r.event == "speech_created":
                if playing:
                    queued.append((r.data.get("speech_id"), r.t))
                else:
                    said = r.t
                playing.add(r.data.get("speech_id"))
            elif r.event == "speech_done":
                playing.discard(r.data.get("speech_id"))
                queued = [(sid, t) for sid, t in queued if sid in playing]
                if queued and playing == {sid for sid, _ in queued}:
                    said = max(queued.pop(0)[1], r.t)  # the next one in the queue starts
            elif r.event == "handed_off" and isinstance(r.data.get("pushed"), int | float):
                pushed = float(r.data["pushed"])
            elif r.event == "interrupted":
                cut = r.t
            if r.kind != "transition":
                continue
            if (r.source, r.event) in _REENTERS and r.dest == _BOUNDED.name:
                began, joined = r.t, self._joined_since(i)
            after = r.data.get("after")
            if r.event == _BOUND_FIRED and isinstance(after, int | float):
                end = began if said is None else max(said, joined) + pushed
                if cut is not None and (said is None or cut >= said):
                    end = min(end, cut)
                margin = round(max(0.0, float(after) - max(0.0, end - began)), 6)
                self.playout.setdefault("margin", margin)

    def _joined_since(self, i: int) -> float:
        """When the avatar entered ``joined``, if it is there as ``self.records[i]`` is
        handled (the beginning of time when it is not, or there is no avatar)."""
        since = float("-inf")
        for n, r in self.of("avatar"):
            if n >= i:
                break
            if r.kind != "transition":
                continue
            if r.dest != _JOINED:
                since = float("-inf")
            elif r.source != _JOINED or (r.source, r.event) in _REJOINS:
                since = r.t
        return since

    def _playout_config(self) -> None:
        """The playout machine's options, once every pass has read them."""
        if self.config.get("playout") is not True:
            return
        defaults = PlayoutOptions()
        options = {k: v for k, v in self.playout.items() if getattr(defaults, k) != v}
        if options:
            self.config["playout"] = options
