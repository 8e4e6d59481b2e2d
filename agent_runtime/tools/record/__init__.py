"""A scenario file from a trace: an incident becomes a scenario, then a test.

A production trace (``AgentJob(trace_path=...)``) holds what each machine handled — its
events with their data (identities, kinds, reasons), guard values, transitions, effect
outcomes — not the room's raw inputs. The scenario is rebuilt from those events:

- room facts, found through the declared routing table (``statemachines.routing``): an
  event some route delivers, carrying that fact's data, is the fact; one fact seen by
  several machines is one step. Participants the agent found in the room when its session
  started (the link's first look) are put in the room at t=0. The avatar participant's
  removal the avatar asked for (a retry's release, its close) follows by itself.
- the session starting (the host's first ``attach``) or another one attached, the session
  closing for a reason of its own (``user_initiated``, ``error``, ``task_completed``; a
  close caused by a departure or the job's shutdown follows by itself), the job asked to
  shut down, the avatar started (or its plugin failing to start) and closed before the
  session ended (held, each plugin start ended where the trace shows, when one of them,
  the first or a retry's, was still starting at the avatar's close or the trace's end),
  interruptions (with the outcome of the ``lk.clear_buffer`` that followed),
  the avatar's ``lk.playback_finished`` RPCs, session requests with their sender (a
  finalize the host took as the simulator's needs its sender to carry ``lk.simulator``: one
  no machine saw join is put in the room at t=0 with it, one seen without it gains it
  right after the step that last set its attributes; a departure the job took as the last
  simulator's gets the same treatment).
- the speech the playout machine followed: the agent's (``agent.say``, as many seconds as
  were handed to the avatar; a re-prompt's is the watchdog's own), the user's
  (``user.speech``, ending between the playout machine's reads of it), and the playout
  options its reads and timers show; an interruption the session's close made, and the
  playout bound's own finish of the avatar's segment (a declared link), follow by
  themselves.
- time passing: state timeouts fire by themselves; their settings are read from the
  ``after`` each timeout event carries (or from how long a state was held without one).
- the config the events reveal: the avatar's identity, a simulation (a hold was needed, or
  the finalize machine took a request as a simulation's), the agent's verdict, a room that
  connected late, a zero grace period, ``close_on_disconnect`` off, a configured
  participant identity, ``retry_avatar`` (its rejoin, and the restarts and backoff waits
  seen), ``delete_room_on_close`` (the room deletion asked
  for by the job's close work, or as the attached session's close was reported).

The ``expect`` block holds the final state of every machine seen in the trace and the
facts the trace shows (when the job closed, when the session closed, when the room was
deleted, whether the verdict was delivered and what it was).

What the trace does not hold cannot be rebuilt; each such thing found in the trace is
written in the file as a comment (and returned in ``notes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_runtime.observe.jobs import first_next_job
from agent_runtime.observe.trace import DECISIONS, TraceRecord
from agent_runtime.tools.record._compare import compare, timing
from agent_runtime.tools.record._config import _ConfigPass
from agent_runtime.tools.record._file import ALWAYS, _FilePass, render
from agent_runtime.tools.record._room import FACT_KEYS, _RoomPass
from agent_runtime.tools.record._session import _SessionPass
from agent_runtime.tools.record._speech import _SpeechPass
from agent_runtime.tools.record._state import Recorded, RecordError
from statemachines.session_host import REQUESTS

__all__ = [
    "ALWAYS",
    "FACT_KEYS",
    "USES",
    "RecordError",
    "Recorded",
    "compare",
    "record",
    "render",
    "timing",
]

# the events and guards of the specs the recorder reads by name (a test pins each one to
# its spec); what an event means is read from the rows' effects where a row says it
USES: dict[str, dict[str, tuple[str, ...]]] = {
    "job": {"events": ("shutdown", "session_closed"), "guards": ("hold_needed",)},
    "session_host": {
        "events": ("attach", "session_closed", *REQUESTS),
        "guards": ("from_simulator",),
    },
    "participant": {
        "events": (
            "participant_connected",
            "participant_disconnected",
            "session_closed",
            "session_close_timeout",
            "close_failed",
        ),
        "guards": ("eligible", "is_linked", "closing_reason", "grace_enabled"),
    },
    "avatar": {
        "events": (
            "start",
            "start_error",
            "close",
            "interrupt",
            "clear_buffer_done",
            "playback_finished",
            "avatar_connected",
            "video_published",
            "avatar_left",
        ),
        "guards": ("has_video", "rejoin"),
    },
    "finalize": {"events": ("verdict_ready",), "guards": ("simulation",)},
    "room_deletion": {"events": ("request", "allow"), "guards": ()},
    "playout": {
        "events": ("speech_created", "handed_off", "speech_done", "user_speaking", "interrupted"),
        "guards": ("watchdog_on", "user_listening", "reprompts_left"),
        "effects": ("reprompt", "reset_reprompts", "hand_over"),
    },
}


class _Builder(_RoomPass, _SpeechPass, _SessionPass, _ConfigPass, _FilePass):
    """The passes joined: one per channel of the trace, then the config and the file."""

    def build(self, name: str) -> Recorded:
        if not any(r.kind in DECISIONS for r in self.records):
            raise RecordError("the trace holds no machine event to rebuild a scenario from")
        second = first_next_job(self.records)
        if second is not None:  # a scenario is one job
            raise RecordError(second.describe())
        replay = self._initial_look()
        facts = self._facts(replay)
        avatar_identity = self._avatar_identity()
        primary = self._primary_label()
        ending = self._ending_index(primary)
        closed = self._primary_close(primary)
        self.primary_closed_at = closed.t if closed is not None else None
        self.linked = self._linked()
        self._room(facts, replay, avatar_identity)
        self._speech(primary)
        self._inputs(primary, ending)
        self._settings()
        self._playout_config()
        self._retry()
        self._deletion()
        self._stand_ins()
        return Recorded(self._scenario(name, primary), self.notes)


def record(records: Sequence[TraceRecord], *, name: str) -> Recorded:
    """The scenario that reproduces ``records`` (a trace), and what it cannot reproduce."""
    recorded = _Builder(records).build(name)
    recorded.notes = [*ALWAYS, *recorded.notes]
    return recorded
