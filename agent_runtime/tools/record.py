"""A scenario file from a trace: an incident becomes a scenario, then a test.

A production trace (``AgentJob(trace_path=...)``) holds what each machine handled — its
events with their data (identities, kinds, reasons), guard values, transitions, effect
outcomes — not the room's raw inputs. The scenario is rebuilt from those events:

- room facts, found through the declared routing table (``statemachines.routing``): an
  event some route delivers, carrying that fact's data, is the fact; one fact seen by
  several machines is one step. Participants the agent found in the room when its session
  started (the link's first look) are put in the room at t=0.
- the session starting (the host's first ``attach``) or another one attached, the session
  closing for a reason of its own (``user_initiated``, ``error``, ``task_completed``; a
  close caused by a departure or the job's shutdown follows by itself), the job asked to
  shut down, the avatar started (or its plugin failing to start) and closed before the
  session ended, interruptions (with the outcome of the ``lk.clear_buffer`` that followed),
  the avatar's ``lk.playback_finished`` RPCs, session requests with their sender (a
  finalize the host took as the simulator's needs its sender to carry ``lk.simulator``: one
  no machine saw join is put in the room at t=0 with it, one seen without it gains it
  right after the step that last set its attributes; a departure the job took as the last
  simulator's gets the same treatment).
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

import functools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.settings import ALL_CAUSES, DEFAULT_CLOSING_REASONS, DEFAULT_PARTICIPANT_KINDS
from agent_runtime.system.job_system import LIFECYCLE_SHUTDOWN
from agent_runtime.testing.scenario import CLOSE_REASONS, Config
from statemachines.machines import MACHINES
from statemachines.routing import ROUTES
from statemachines.session_host import REQUESTS

# the data each room fact carries to every machine it is routed to (agent_runtime.runtimes.routing's
# fact_data; a test pins the two together)
FACT_KEYS: dict[str, frozenset[str]] = {
    "participant_joined": frozenset({"identity", "kind", "attributes"}),
    "participant_left": frozenset({"identity", "kind", "reason"}),
    "track_published": frozenset({"identity", "kind"}),
    "track_muted": frozenset({"identity", "kind", "muted"}),
    "attributes_changed": frozenset({"identity", "changed"}),
    "room_connected": frozenset(),
    "room_disconnected": frozenset({"reason"}),
    "reconnecting": frozenset(),
    "reconnected": frozenset(),
}
# a session closing for one of these follows from something else in the trace
_CONSEQUENT_CLOSES = frozenset({"participant_disconnected", "job_shutdown"})
_SIMULATOR_ATTRIBUTE = "lk.simulator"
_PUBLISH_ON_BEHALF = "lk.publish_on_behalf"
_RPC_TIMEOUT_CODES = frozenset({1501, 1502})  # CONNECTION_TIMEOUT, RESPONSE_TIMEOUT
_RPC_GONE = {1503: "disconnected", 1401: "not_found"}  # RECIPIENT_DISCONNECTED / _NOT_FOUND
# who sent a request, when the trace does not say (a transport that cannot tell)
_UNNAMED_CALLER = "unnamed-caller"

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
}


def _events_with_effect(machine: str, effect: str) -> frozenset[str]:
    """The events of ``machine`` whose rows run ``effect`` (read from its spec)."""
    return frozenset(r.event for r in MACHINES[machine].rows if effect in r.effects)


# the host forwarding a finalize to the finalize machine (or refusing a stranger's)
_FINALIZE_REQUESTS = _events_with_effect("session_host", "forward_finalize")
# the host telling the job its attached session closed (delete_room_on_close asks then)
_SESSION_CLOSE_REPORTS = _events_with_effect("session_host", "report_session_closed")
# the verdict delivered, the job told
_ANSWERED = _events_with_effect("finalize", "report_answered")
# the server deleted the room
_DELETED = _events_with_effect("room_deletion", "record_deleted")
# the work the scenario runner stands in for: the event that ends it well, and what it does
_STAND_INS: dict[str, tuple[frozenset[str], str]] = {
    "room_deletion": (_DELETED, "the room deletion succeeds at once"),
    "finalize": (
        frozenset({"verdict_ready"}),
        "on_simulation_end returns at once and its reply goes out",
    ),
}

ALWAYS = (
    "participants the agent found in the room when its session started are in the room at "
    "t=0: the trace does not say when they joined",
    "settings the trace does not show stay at their defaults (a timeout that never fired; "
    "delete_room_on_close when the room deletion was never asked for: a job that did not "
    "close, nor report its session's close, shows nothing of it)",
    "what the session said or heard, payloads of session requests other than "
    "finalize_simulation, and room events no machine handled are not in the trace",
)


class RecordError(ValueError):
    """The trace holds nothing a scenario could be rebuilt from."""


@dataclass
class Recorded:
    """The rebuilt scenario (a mapping ``parse_scenario`` accepts) and what could not be."""

    scenario: dict[str, Any]
    notes: list[str] = field(default_factory=list)


@dataclass
class _Fact:
    index: int  # of its first record
    name: str
    t: float
    data: dict[str, Any]
    records: list[TraceRecord]


def _routes() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for r in ROUTES:
        out.setdefault((r.machine, r.event), []).append(r.fact)
    return out


def _timeouts() -> dict[tuple[str, str], tuple[str, str, float]]:
    """(machine, timeout event) -> (state, setting, default), from the specs."""
    out: dict[tuple[str, str], tuple[str, str, float]] = {}
    for m in MACHINES.values():
        for s in m.states:
            if s.timeout is not None:
                out[(m.name, s.timeout.event)] = (s.name, s.timeout.setting, s.timeout.default)
    return out


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@functools.cache
def _known_requests() -> frozenset[str]:
    """The session request kinds of the protocol this build speaks."""
    from livekit.protocol.agent_pb import agent_session as agent_pb

    oneof = agent_pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"]
    return frozenset(f.name for f in oneof.fields)


class _Builder:
    def __init__(self, records: Sequence[TraceRecord]) -> None:
        self.records = [r for r in records if r.kind != "input"]
        self.had_inputs = len(self.records) != len(records)
        self.steps: list[tuple[int, dict[str, Any]]] = []  # (record index, step)
        self.participants: dict[str, dict[str, Any]] = {}
        self.present: set[str] = set()
        # each participant's attributes from a record index on (None: gone), as the steps
        # and the participants at t=0 (index -1) put it in the room
        self.history: dict[str, list[tuple[int, dict[str, str] | None]]] = {}
        self.config: dict[str, Any] = {}
        self.notes: list[str] = []
        self.session_closed_at: float | None = None  # the primary session's, once seen
        self.routes = _routes()
        self.timeouts = _timeouts()

    # -- helpers -------------------------------------------------------------------------
    def of(self, machine: str) -> list[tuple[int, TraceRecord]]:
        """The events ``machine`` handled (not its effects' outcomes), with their index."""
        return [
            (i, r)
            for i, r in enumerate(self.records)
            if r.machine == machine and r.kind in ("transition", "ignore", "reject")
        ]

    def step(self, index: int, t: float, event: str, **fields: Any) -> None:
        self.steps.append((index, {"at": t, "event": event, **fields}))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # -- the passes --------------------------------------------------------------------
    def build(self, name: str) -> Recorded:
        if not any(r.kind in ("transition", "ignore", "reject") for r in self.records):
            raise RecordError("the trace holds no machine event to rebuild a scenario from")
        replay = self._initial_look()
        facts = self._facts(replay)
        avatar_identity = self._avatar_identity()
        primary = self._primary_label()
        ending = self._ending_index(primary)
        self._room(facts, replay, avatar_identity)
        self._inputs(primary, ending)
        self._settings()
        self._retry()
        self._deletion()
        self._stand_ins()
        return Recorded(self._scenario(name, primary), self.notes)

    def _initial_look(self) -> set[int]:
        """The link's first look at the room (participants already there when the session
        started): its first records, all participant_connected at the same time."""
        out: set[int] = set()
        recs = self.of("participant")
        if not recs:
            return out
        t0 = recs[0][1].t
        for i, r in recs:
            if r.event != "participant_connected" or r.t != t0:
                break
            out.add(i)
        return out

    def _facts(self, skip: set[int]) -> list[_Fact]:
        """Room facts in order; one fact delivered to several machines is one fact."""
        facts: list[_Fact] = []
        open_: dict[tuple[float, str, str], list[_Fact]] = {}
        seen: dict[tuple[tuple[float, str, str], str], int] = {}
        for i, r in enumerate(self.records):
            if i in skip or r.kind not in ("transition", "ignore", "reject"):
                continue
            for fact in self.routes.get((r.machine, r.event), ()):
                if set(r.data) != FACT_KEYS[fact]:
                    continue  # the same event posted by the runtime itself, not a fact
                key = (r.t, fact, _key(r.data))
                n = seen.get((key, r.machine), 0)
                seen[(key, r.machine)] = n + 1
                known = open_.setdefault(key, [])
                if n < len(known):  # the n-th delivery of a fact this machine saw n times
                    known[n].records.append(r)
                else:
                    f = _Fact(i, fact, r.t, dict(r.data), [r])
                    known.append(f)
                    facts.append(f)
                break
        return facts

    def _avatar_identity(self) -> str | None:
        recs = self.of("avatar")
        if not recs:
            return None
        for _, r in recs:
            ident = r.data.get("identity")
            if r.event in ("avatar_connected", "video_published", "avatar_left") and ident:
                return str(ident)
        return recs[0][1].instance or "avatar"

    def _ending_index(self, primary: str | None) -> int:
        """The first record showing the job ending: a shutdown asked, the primary session
        closed, or the job leaving its initial state (what closes the avatar by itself)."""
        initial = MACHINES["job"].initial
        for i, r in enumerate(self.records):
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if r.machine == "job" and (r.event == "shutdown" or r.dest != initial):
                return i
            primary_closed = r.machine == "participant" or r.data.get("session") == primary
            if r.event == "session_closed" and r.kind == "transition" and primary_closed:
                return i
        return len(self.records)

    def _primary_label(self) -> str | None:
        for _, r in self.of("session_host"):
            if r.event == "attach" and r.data.get("session"):
                return str(r.data["session"])
        return None

    # -- room facts ------------------------------------------------------------------------
    def _room(self, facts: list[_Fact], replay: set[int], avatar: str | None) -> None:
        first_participant_record = next((i for i, _ in self.of("participant")), None)
        avatar_closed_at = next((i for i, r in self.of("avatar") if r.event == "close"), None)
        # the link's first look, in join order, placed when it happened
        events: list[tuple[int, str, Any]] = [(i, "look", self.records[i]) for i in replay]
        events += [(f.index, "fact", f) for f in facts]
        events.sort(key=lambda e: e[0])
        room_was_up = False
        for index, what, item in events:
            if what == "look":
                r: TraceRecord = item
                ident = str(r.data.get("identity"))
                if ident in self.present:
                    continue  # already in the room by a step: the link saw it there
                self._initial(ident, r.data.get("kind"), r.data.get("attributes") or {})
                continue
            f: _Fact = item
            d = f.data
            ident = str(d.get("identity", ""))
            if f.name == "participant_joined":
                if ident in self.present:
                    continue
                self.present.add(ident)
                self._seen(ident, index, dict(d.get("attributes") or {}))
                fields: dict[str, Any] = {"identity": ident}
                if d.get("kind", "standard") != "standard":
                    fields["kind"] = d["kind"]
                if d.get("attributes"):
                    fields["attributes"] = dict(d["attributes"])
                self.step(index, f.t, "participant_connected", **fields)
                if any(r.machine == "avatar" and r.guards.get("has_video") for r in f.records):
                    self.note(
                        f"t={f.t:g}: the avatar machine saw {ident}'s join with its video "
                        "already published; replayed as the join, then the video, it reaches "
                        "joined on video_published instead (same final state)"
                    )
            elif f.name == "participant_left":
                if (
                    ident == avatar
                    and d.get("reason") == "PARTICIPANT_REMOVED"
                    and avatar_closed_at is not None
                    and index > avatar_closed_at
                ):
                    continue  # the job removed its avatar as it closed: that follows by itself
                # the job saw the last simulator leave: it carried lk.simulator then
                simulator = any(r.machine == "job" for r in f.records)
                if ident not in self.present and (
                    first_participant_record is None or index < first_participant_record
                ):
                    # gone before the link looked: it was in the room from the start
                    attrs = {_SIMULATOR_ATTRIBUTE: "true"} if simulator else {}
                    self._initial(ident, d.get("kind"), attrs)
                if simulator:
                    self._make_simulator(ident, index, f"t={f.t:g}: {ident} left as the simulator")
                self.present.discard(ident)
                self._seen(ident, index, None)
                self.step(
                    index, f.t, "participant_disconnected", identity=ident, reason=d["reason"]
                )
            elif f.name == "track_published":
                self.step(index, f.t, "track_published", identity=ident, kind=d["kind"])
            elif f.name == "track_muted":
                if d.get("muted", True):
                    self.step(index, f.t, "track_muted", identity=ident)
                else:
                    self.note(f"t={f.t:g}: {ident} unmuted a track; scenarios have no unmute step")
            elif f.name == "attributes_changed":
                now = self._attributes_at(index, ident)
                if now is not None:
                    merged = {**now, **d["changed"]}
                    self._seen(ident, index, {k: v for k, v in merged.items() if v != ""})
                self.step(
                    index, f.t, "attributes_changed", identity=ident, attributes=dict(d["changed"])
                )
            elif f.name == "room_connected":
                if not room_was_up:
                    self.config["room_connected"] = False
                room_was_up = True
                self.step(index, f.t, "room.connected")
            elif f.name == "room_disconnected":
                room_was_up = True
                if all(r.kind == "ignore" for r in f.records):
                    continue  # the job's own disconnect as it closed, or one that changed nothing
                self.step(index, f.t, "room.disconnected", reason=d["reason"])
            else:  # reconnecting / reconnected
                self.note(f"t={f.t:g}: the room {f.name}; scenarios have no such step")

    def _initial(self, identity: str, kind: Any, attributes: dict[str, Any]) -> None:
        self.present.add(identity)
        if identity in self.participants:
            return
        self.history.setdefault(identity, []).insert(0, (-1, dict(attributes)))
        p: dict[str, Any] = {"identity": identity}
        if kind and kind != "standard":
            p["kind"] = kind
        if attributes:
            p["attributes"] = dict(attributes)
        self.participants[identity] = p

    def _seen(self, identity: str, index: int, attributes: dict[str, str] | None) -> None:
        self.history.setdefault(identity, []).append((index, attributes))

    def _make_simulator(self, identity: str, index: int, what: str) -> None:
        """``identity`` carried lk.simulator just before record ``index`` (``what`` shows
        it): give it the attribute where the steps leave it without."""
        entries = self.history.get(identity, [])
        k = max((n for n, (at, _) in enumerate(entries) if at < index), default=None)
        if k is None:
            # never seen by a machine: in the room from the start, as the simulator
            self._initial(identity, None, {_SIMULATOR_ATTRIBUTE: "true"})
            self.note(
                f"{what}; no machine saw it join, so it is in the room at t=0 with "
                "lk.simulator (its kind and other attributes are not in the trace)"
            )
            return
        at, attributes = entries[k]
        if attributes is None:
            self.note(f"{what}, but the steps have it out of the room then")
            return
        if _SIMULATOR_ATTRIBUTE in attributes:
            return
        entries[k] = (at, {**attributes, _SIMULATOR_ATTRIBUTE: "true"})
        if at < 0:
            self.participants[identity].setdefault("attributes", {})[_SIMULATOR_ATTRIBUTE] = "true"
        else:
            changed = {_SIMULATOR_ATTRIBUTE: "true"}
            self.step(
                at, self.records[at].t, "attributes_changed", identity=identity, attributes=changed
            )
        when = "t=0" if at < 0 else f"t={self.records[at].t:g}"
        self.note(
            f"{what}; the trace does not show it gaining lk.simulator, so it carries it from "
            f"{when} (the last time the steps set its attributes)"
        )

    def _attributes_at(self, index: int, identity: str) -> dict[str, str] | None:
        """``identity``'s attributes just before record ``index``; None when not in the room."""
        now: dict[str, str] | None = None
        for at, attributes in self.history.get(identity, ()):
            if at >= index:
                break
            now = attributes
        return now

    # -- the agent's own inputs ------------------------------------------------------------
    def _inputs(self, primary: str | None, ending: int) -> None:
        recs = self.records
        attached: set[str] = set()
        closed = False
        timed_out_at: float | None = None
        lifecycle_close_at: float | None = None
        for i, r in enumerate(recs):
            m, e, d = r.machine, r.event, r.data
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if m == "session_host" and e == "attach":
                label = str(d.get("session", ""))
                if label in attached:
                    self.note(f"t={r.t:g}: {label} attached again; a scenario cannot do that")
                    continue
                attached.add(label)
                if label == primary:
                    self.step(i, r.t, "session.start")
                else:
                    self.step(i, r.t, "session.attach", session=label)
            elif e == "session_closed" and m in ("session_host", "participant", "job"):
                reason = str(d.get("reason", ""))
                if m == "session_host" and d.get("session") != primary:
                    if reason not in _CONSEQUENT_CLOSES:
                        self.note(
                            f"t={r.t:g}: {d.get('session')} closed ({reason}); a scenario "
                            "closes only the primary session"
                        )
                    continue
                if closed or reason not in CLOSE_REASONS:
                    continue
                closed = True
                self.session_closed_at = r.t
                if reason not in _CONSEQUENT_CLOSES:
                    self.step(i, r.t, "session.close", reason=reason)
            elif m == "participant" and e == "session_close_timeout":
                timed_out_at = r.t
            elif m == "agent_job" and e in ("close", "abort"):
                # the user's aclose(): the job machine's shutdown (or abort) follows from it
                lifecycle_close_at = r.t
                if e == "close":
                    self.step(i, r.t, "job.aclose")
                else:
                    self.step(i, r.t, "job.aclose", graceful=False)
            elif m == "job" and e == "shutdown":
                if timed_out_at is not None and r.t == timed_out_at:
                    continue  # the job's own answer to a session close that hung
                if lifecycle_close_at == r.t and d.get("reason") == LIFECYCLE_SHUTDOWN:
                    continue  # asked by the user's aclose(), a step already
                self.step(i, r.t, "job.shutdown", reason=str(d.get("reason", "")))
            elif m == "avatar":
                self._avatar_input(i, r, ending)
            elif m == "session_host" and e in REQUESTS:
                self._request(i, r)

    def _avatar_input(self, i: int, r: TraceRecord, ending: int) -> None:
        e = r.event
        if e == "start":
            self._avatar_start(i, r)
        elif e == "close":
            if i < ending:
                self.step(i, r.t, "avatar.close")
        elif e == "interrupt":
            # the plugin's own clear is the task of `clearing` (the avatar is joined)
            if r.dest == "clearing":
                done = self._next_avatar(i, "clear_buffer_done", until="interrupt")
                result = None if done is None else _rpc_result(done.data)
                if done is not None and result is not None:
                    self.step(i, r.t, "rpc_outcome", method="lk.clear_buffer", result=result)
                    if result == "timeout" and done.t > r.t:
                        self.config.setdefault("clear_buffer_timeout", done.t - r.t)
            self.step(i, r.t, "session.interrupt")
        elif e == "playback_finished":
            payload = {k: r.data[k] for k in ("playback_position", "interrupted") if k in r.data}
            self.step(
                i,
                r.t,
                "rpc",
                method="lk.playback_finished",
                caller=self._avatar_identity() or "avatar",
                payload=payload,
            )

    def _avatar_start(self, i: int, r: TraceRecord) -> None:
        """The user's avatar start at ``i``, with the plugin's starts that raised: a
        scenario scripts the first ones (``avatar.start_error {times}``), or every one."""
        attempts = self._plugin_starts(i)
        raised = [a for a in attempts if a is not None]
        leading = next((n for n, a in enumerate(attempts) if a is None), len(attempts))
        if leading < len(raised):  # one raised after a start that did not
            later = raised[leading]
            self.note(
                f"t={later.t:g}: a retry's plugin start raised after an earlier one did "
                "not; a scenario scripts only the first starts' failures, so the replay's "
                "retry starts"
            )
        if leading == 0:
            self.step(i, r.t, "avatar.start")
            return
        first = raised[0]
        # a state task that raised reports no outcome: it is an error
        outcome = first.data.get("outcome", "error")
        if outcome != "error":
            self.note(
                f"t={r.t:g}: the avatar plugin's start ended in {outcome} at t={first.t:g}; "
                "replayed as a start that raises at once"
            )
        if leading == len(attempts):
            self.step(i, r.t, "avatar.start_error")  # every attempt raised
        else:
            self.step(i, r.t, "avatar.start_error", times=leading)

    def _plugin_starts(self, start: int) -> list[TraceRecord | None]:
        """Each plugin start of the user's ``start`` at ``start`` and its retries, in
        order: the ``start_error`` it raised, or None when it returned."""
        out: list[TraceRecord | None] = []
        for r in self.records[start + 1 :]:
            if r.machine != "avatar" or r.kind == "effect":
                continue
            if r.event in ("start", "close"):
                break  # the user's next start, or the end
            if r.event == "start_error" and r.data.get("effect") == "start_plugin":
                out.append(r)
            elif r.event in ("plugin_started", "no_route"):
                out.append(None)
        return out

    def _next_avatar(self, start: int, event: str, *, until: str) -> TraceRecord | None:
        for r in self.records[start + 1 :]:
            if r.machine != "avatar" or r.kind == "effect":
                continue
            if r.event == event:
                return r
            if r.event == until:
                return None
        return None

    def _request(self, i: int, r: TraceRecord) -> None:
        d = r.data
        kind = str(d.get("kind", "unknown"))
        caller = d.get("caller") if isinstance(d.get("caller"), str) and d["caller"] else None
        if r.event in _FINALIZE_REQUESTS:
            caller = self._finalize_caller(i, r, caller)
            payload: dict[str, Any] = {"provisional_success": bool(d.get("provisional_success"))}
            if d.get("provisional_reason"):
                payload["provisional_reason"] = d["provisional_reason"]
            self.step(i, r.t, "session_request", caller=caller, request=kind, payload=payload)
        elif r.event == "request" or kind == "unknown" or kind not in _known_requests():
            # who asked changes nothing here: only a finalize's sender is checked
            caller = caller or _UNNAMED_CALLER
            self.step(i, r.t, "session_request", caller=caller, request=kind)
        else:
            self.note(
                f"t={r.t:g}: a malformed {kind} request ({d.get('error', '')}): its bytes are "
                "not in the trace, so it is left out"
            )

    def _finalize_caller(self, i: int, r: TraceRecord, caller: str | None) -> str:
        """The sender of a finalize, in the room with ``lk.simulator`` exactly when the host
        took it as the simulator's (``from_simulator``)."""
        accepted = r.guards.get("from_simulator")
        if caller is None:
            if accepted is not True:
                self.note(
                    f"t={r.t:g}: who sent this finalize_simulation (not taken as the "
                    f"simulator's) is not in the trace; replayed as sent by {_UNNAMED_CALLER}, "
                    "who is not in the room"
                )
                return _UNNAMED_CALLER
            caller = next(
                (
                    p
                    for p in self.history
                    if _SIMULATOR_ATTRIBUTE in (self._attributes_at(i, p) or {})
                ),
                "simulator",
            )
        if accepted is not True:
            if accepted is False and _SIMULATOR_ATTRIBUTE in (self._attributes_at(i, caller) or {}):
                self.note(
                    f"t={r.t:g}: {caller}'s finalize_simulation was refused as not the "
                    "simulator's, but the steps leave it carrying lk.simulator (its removal is "
                    "not in the trace): the replay answers it"
                )
            return caller
        self._make_simulator(
            caller, i, f"t={r.t:g}: {caller} sent finalize_simulation as the simulator"
        )
        return caller

    # -- settings --------------------------------------------------------------------------
    def _settings(self) -> None:
        entered: dict[tuple[str, str], float] = {}
        held: dict[tuple[str, str], float] = {}
        fired: dict[str, float] = {}
        states_with_timeouts = {(m, s) for (m, _), (s, _, _) in self.timeouts.items()}
        last = max(r.t for r in self.records)
        linked: str | None = None
        refused_eligible = False
        for r in self.records:
            if r.kind != "transition":
                if r.machine == "participant" and r.event == "participant_connected":
                    refused_eligible |= self._refused(r)
                continue
            m = r.machine
            spec = self.timeouts.get((m, r.event))
            if spec is not None and spec[0] == r.source:
                after = r.data.get("after")
                since = entered.get((m, r.source), 0.0)
                value = after if isinstance(after, int | float) else r.t - since
                fired.setdefault(spec[1], float(value))
                if spec[1] not in Config.model_fields and spec[1] != "retry_backoff":
                    self.note(
                        f"t={r.t:g}: {m} left {r.source} on {r.event} after {float(value):g}s; "
                        f"a scenario cannot set {spec[1]}, and what {r.source} waited for "
                        "ends at once in one"
                    )
            if r.source != r.dest:
                if (m, r.source) in entered:
                    start = entered.pop((m, r.source))
                    held[(m, r.source)] = max(held.get((m, r.source), 0.0), r.t - start)
                if (m, r.dest) in states_with_timeouts:
                    entered[(m, r.dest)] = r.t
            g, d = r.guards, r.data
            if (m == "job" and g.get("hold_needed")) or (m == "finalize" and g.get("simulation")):
                self.config["simulation"] = True
            if m == "participant" and r.event == "participant_connected":
                if r.source == "waiting" and r.dest != "waiting" and linked is None:
                    linked = str(d.get("identity"))
                refused_eligible |= self._refused(r)
            if m == "participant" and r.event == "participant_disconnected" and g.get("is_linked"):
                if g.get("closing_reason") is False and d.get("reason") in DEFAULT_CLOSING_REASONS:
                    self.config["close_on_disconnect"] = False
                elif g.get("closing_reason") is False and g.get("grace_enabled") is False:
                    fired.setdefault("grace_period", 0.0)
            if m == "avatar" and r.event == "avatar_connected" and g.get("rejoin"):
                self.config["retry_avatar"] = True
            if m == "playout" and "playout" not in self.config:
                # the job ran the playout machine (on by default with an avatar); a scenario
                # turns it on explicitly
                self.config["playout"] = True
            if m == "finalize" and r.event in _ANSWERED:
                self.config["simulation"] = True
                verdict = d.get("verdict")
                if isinstance(verdict, dict):
                    self.config["agent_verdict"] = {
                        "success": bool(verdict.get("success")),
                        "reason": str(verdict.get("reason", "")),
                    }
        for (m, s), start in entered.items():  # still held when the trace ends
            held[(m, s)] = max(held.get((m, s), 0.0), last - start)
        for (m, _), (s, setting, default) in self.timeouts.items():
            if setting not in Config.model_fields:
                continue
            if setting in fired:
                self.config[setting] = fired[setting]
            elif held.get((m, s), 0.0) >= default:
                # held that long without its timeout: the setting was longer
                self.config[setting] = float(math.floor(held[(m, s)]) + 1)
        if refused_eligible and linked is not None:
            self.config["participant_identity"] = linked

    def _retry(self) -> None:
        """``retry_avatar``'s restarts and backoff, from the avatar's own decisions: each
        ``failed -> backoff`` is a restart the policy allowed, each wait in ``backoff`` one of
        its delays. The rebuilt policy allows exactly the restarts seen (a trace that ends
        before the policy gave up shows no more); a cause refused while restarts were still
        to come was not transient."""
        restarts: list[str] = []
        refused: list[tuple[int, str]] = []  # (restarts done then, cause)
        delays: list[float] = []
        since: float | None = None
        for r in self.records:
            if r.kind != "transition" or r.machine != "avatar":
                continue
            if r.source == "failed" and r.event == "route_restored":
                cause = str(r.data.get("cause", ""))
                if r.dest == "backoff":
                    restarts.append(cause)
                elif r.guards.get("retry_left") is False:
                    refused.append((len(restarts), cause))
            if r.dest == "backoff" and r.source != "backoff":
                since = r.t
            elif r.source == "backoff" and r.event == "backoff_elapsed" and since is not None:
                after = r.data.get("after")
                delays.append(float(after) if isinstance(after, int | float) else r.t - since)
                since = None
        if not restarts:
            return
        policy: dict[str, Any] = {"attempts": len(restarts)}
        if delays:
            initial = delays[0]
            multiplier = delays[1] / initial if len(delays) > 1 and initial > 0 else 2.0
            multiplier = min(10.0, max(1.0, multiplier))
            grown = [initial * multiplier**n for n in range(len(delays))]
            # a delay short of the growth is the cap; otherwise the default cap, or above
            capped = [d for d, g in zip(delays, grown, strict=True) if d < g - 1e-9]
            cap = min(capped) if capped else max(30.0, max(delays))
            policy["backoff"] = {"initial": initial, "multiplier": multiplier, "max": cap}
        not_transient = {c for done, c in refused if done < len(restarts)} - set(restarts)
        if not_transient:
            policy["transient"] = sorted(ALL_CAUSES - not_transient)
        if self.config.get("retry_avatar") is True:
            policy["rejoin"] = True
        self.config["retry_avatar"] = policy

    def _deletion(self) -> None:
        """``delete_room_on_close``, from who asked for the room's deletion. With it, the
        job's close work asks just before it allows the deletion, and the attached session's
        close asks as the host reports it; a request at any other moment is the agent's own
        (``request_room_deletion``), which no scenario step makes."""
        recs = self.of("room_deletion")
        if not recs:
            return
        by_close: set[int] = set()
        allowed_unasked = False
        for k, (_, r) in enumerate(recs):
            if r.event != "allow":
                continue
            before = recs[k - 1][1] if k else None
            if before is not None and before.event == "request" and before.t == r.t:
                by_close.add(recs[k - 1][0])
            else:
                allowed_unasked = True  # the close work allowed it without asking: off
        by_session: set[int] = set()
        reported: int | None = None  # the last session close the host reported, unanswered
        for i, r in enumerate(self.records):
            if r.kind not in ("transition", "ignore", "reject"):
                continue
            if (
                r.machine == "session_host"
                and r.event in _SESSION_CLOSE_REPORTS
                and "report_session_closed" in r.effects
            ):
                reported = i
            elif r.machine == "room_deletion":
                if (
                    r.event == "request"
                    and reported is not None
                    and self.records[reported].t == r.t
                ):
                    by_session.add(i)
                reported = None
        on = not allowed_unasked and bool(by_close or by_session)
        if on:
            self.config["delete_room_on_close"] = True
        for i, r in recs:
            if r.event == "request" and not (on and i in by_close | by_session):
                self.note(
                    f"t={r.t:g}: the agent asked for the room's deletion itself "
                    "(request_room_deletion, as an end-call tool does); no scenario step does "
                    "that, so the replay does not ask"
                )

    def _stand_ins(self) -> None:
        """The work a scenario's runner stands in for ends at once and never fails: the room
        deletion, ``on_simulation_end`` and the verdict's reply. Say where the trace's did
        not."""
        for machine, (result, what) in _STAND_INS.items():
            spec = MACHINES[machine]
            failures = {e.error_event: e.name for e in spec.effects if e.error_event}
            entered: float | None = None
            for _, r in self.of(machine):
                if r.kind != "transition" or r.source == r.dest:
                    continue
                if r.event in failures:
                    self.note(
                        f"t={r.t:g}: {machine} got {r.event} ({failures[r.event]} failed); "
                        f"in a scenario {what}"
                    )
                elif spec.state(r.source).invoke and (
                    r.event not in result or (entered is not None and r.t > entered)
                ):
                    took = f" after {r.t - entered:g}s" if entered is not None else ""
                    self.note(
                        f"t={r.t:g}: {machine} left {r.source} on {r.event}{took}; "
                        f"in a scenario {what}"
                    )
                if spec.state(r.dest).invoke:
                    entered = r.t

    @staticmethod
    def _refused(r: TraceRecord) -> bool:
        """A participant of a linkable kind that was not linked (a configured identity)."""
        attrs = r.data.get("attributes") or {}
        return (
            r.guards.get("eligible") is False
            and r.data.get("kind") in DEFAULT_PARTICIPANT_KINDS
            and _PUBLISH_ON_BEHALF not in attrs
        )

    # -- the file ----------------------------------------------------------------------------
    def _scenario(self, name: str, primary: str | None) -> dict[str, Any]:
        self.steps.sort(key=lambda s: s[0])
        steps = [s for _, s in self.steps]
        end = max(r.t for r in self.records)
        steps.append({"at": end, "event": "end"})
        if self.had_inputs:
            self.note(
                "the trace holds a scenario's own inputs (simulate --trace); they are not "
                "used: the steps are rebuilt from the machines' events, as for a production trace"
            )
        doc: dict[str, Any] = {"name": name}
        identity = self._avatar_identity()
        if identity is not None:
            self.config = {"avatar_identity": identity, **self.config}
        defaults = Config()
        config = {
            k: v
            for k, v in self.config.items()
            if k == "avatar_identity" or getattr(defaults, k, object()) != v
        }
        if isinstance(config.get("agent_verdict"), dict) and config["agent_verdict"] == {
            "success": True,
            "reason": "",
        }:
            del config["agent_verdict"]
        if config:
            doc["config"] = config
        if self.participants:
            doc["participants"] = list(self.participants.values())
        doc["steps"] = steps
        doc["expect"] = self._expect()
        return doc

    def _expect(self) -> dict[str, Any]:
        finals: dict[str, str] = {}
        for r in self.records:
            if r.kind in ("transition", "ignore", "reject") and r.machine in MACHINES:
                finals[r.machine] = r.dest or r.source
        facts: dict[str, Any] = {}
        final_job = {s.name for s in MACHINES["job"].states if s.final}
        closed_at = next(
            (
                r.t
                for r in self.records
                if r.machine == "job" and r.kind == "transition" and r.dest in final_job
            ),
            None,
        )
        if closed_at is not None:
            facts["job_closed_at"] = closed_at
        if self.session_closed_at is not None:
            facts["session_closed_at"] = self.session_closed_at
        deleted_at = next(
            (
                r.t
                for r in self.records
                if r.machine == "room_deletion" and r.kind == "transition" and r.event in _DELETED
            ),
            None,
        )
        if deleted_at is not None:
            facts["room_deleted_at"] = deleted_at
        answered = [
            r
            for r in self.records
            if r.machine == "finalize" and r.kind == "transition" and r.event in _ANSWERED
        ]
        facts["finalize_answered"] = bool(answered)
        if answered:
            facts["verdict"] = answered[0].data.get("verdict")
        return {"final_states": dict(sorted(finals.items())), "facts": facts}


def _rpc_result(data: dict[str, Any]) -> str | None:
    """An ``lk.clear_buffer`` outcome as the scenario's ``rpc_outcome`` result; None when
    the trace says nothing of it (the plugin's own clear settled: its RPC is not traced)."""
    outcome, code = data.get("outcome"), data.get("code")
    if outcome is None and code is None:
        return None
    if outcome == "ok":
        return "ok"
    if outcome == "timeout" or code in _RPC_TIMEOUT_CODES:
        return "timeout"
    return _RPC_GONE.get(code, "error") if isinstance(code, int) else "error"


def record(records: Sequence[TraceRecord], *, name: str) -> Recorded:
    """The scenario that reproduces ``records`` (a trace), and what it cannot reproduce."""
    recorded = _Builder(records).build(name)
    recorded.notes = [*ALWAYS, *recorded.notes]
    return recorded


def render(recorded: Recorded, *, source: str) -> str:
    """The scenario as a YAML file: a header saying where it came from and what could not
    be rebuilt, then the scenario (each step on one line, as the bundled files are)."""
    doc = recorded.scenario
    lines = [
        "# Recorded by `agent-runtime record` from the trace",
        f"#   {source}",
        "# The steps are rebuilt from the events the machines handled (a trace holds no raw",
        "# room inputs). What the trace cannot tell, and what was assumed:",
        *_wrapped(recorded.notes, "#   - ", "#     "),
    ]
    lines.append(_dump({"name": doc["name"]}))
    for key in ("config",):
        if key in doc:
            lines.append(_dump({key: doc[key]}, flow_inner=True))
    if "participants" in doc:
        lines.append("participants:")
        lines += [f"  - {_flow(p)}" for p in doc["participants"]]
    lines.append("steps:")
    lines += [f"  - {_flow(s)}" for s in doc["steps"]]
    lines.append("expect:")
    lines.append(f"  final_states: {_flow(doc['expect']['final_states'])}")
    lines.append(f"  facts: {_flow(doc['expect']['facts'])}")
    return "\n".join(lines) + "\n"


def _flow(value: Any) -> str:
    return str(yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6)).strip()


def _dump(value: dict[str, Any], *, flow_inner: bool = False) -> str:
    if not flow_inner:
        return str(yaml.safe_dump(value, sort_keys=False, width=10**6)).strip()
    ((key, inner),) = value.items()
    return f"{key}: {_flow(inner)}"


def _wrapped(items: Iterable[str], first: str, rest: str, width: int = 92) -> list[str]:
    out: list[str] = []
    for item in items:
        line = first
        for word in item.split():
            if len(line) + len(word) + 1 > width and line.strip("# -"):
                out.append(line.rstrip())
                line = rest
            line += word + " "
        out.append(line.rstrip())
    return out


# -- checking a recorded scenario against its trace -------------------------------------
def compare(records: Sequence[TraceRecord], result: dict[str, Any]) -> list[str]:
    """How a run of the recorded scenario differs from the trace: each machine's final state
    and its transitions (event, source, dest) in order. Empty when they agree."""
    want: dict[str, list[tuple[str, str, str]]] = {}
    finals: dict[str, str] = {}
    for r in records:
        if r.kind == "transition" and _compared(r.machine, r.event, r.source, r.dest):
            want.setdefault(r.machine, []).append((_as_step(r.machine, r.event), r.source, r.dest))
        if r.kind in ("transition", "ignore", "reject") and r.machine in MACHINES:
            finals[r.machine] = r.dest or r.source
    got: dict[str, list[tuple[str, str, str]]] = {}
    for t in result["transitions"]:
        if not _compared(t["machine"], t["event"], t["source"], t["dest"]):
            continue
        got.setdefault(t["machine"], []).append(
            (_as_step(t["machine"], t["event"]), t["source"], t["dest"])
        )
    out: list[str] = []
    for machine, state in sorted(finals.items()):
        ran = result["final_states"].get(machine)
        if ran != state:
            out.append(f"final state of {machine}: the trace ends in {state!r}, the run in {ran!r}")
    for machine in sorted(set(want) | set(got)):
        w, g = want.get(machine, []), got.get(machine, [])
        if w == g:
            continue
        n = next(
            (i for i, (a, b) in enumerate(zip(w, g, strict=False)) if a != b), min(len(w), len(g))
        )
        out.append(f"{machine}: transition {n + 1} differs: trace {_row(w, n)}, run {_row(g, n)}")
    return out


def _compared(machine: str, event: str, source: str, dest: str | None) -> bool:
    """Whether a transition is compared: the further parts of a start in parts are the
    lifecycle's internal rows, which a whole ``AgentJob.start()`` does not make."""
    return not (machine == "agent_job" and event == "start_part" and dest in (None, source))


def _as_step(machine: str, event: str) -> str:
    """A scenario starts its job in parts (``avatar.start``, ``session.start``): the whole
    ``AgentJob.start()`` a trace may hold is its first part, to the lifecycle's table."""
    return "start_part" if (machine, event) == ("agent_job", "start") else event


def _row(rows: list[tuple[str, str, str]], n: int) -> str:
    if n >= len(rows):
        return "(none)"
    event, source, dest = rows[n]
    return f"{source} -> {dest} on {event}"
