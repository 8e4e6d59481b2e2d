"""The room channel: the facts the room delivered (joins, departures, tracks, attributes,
the room's connection), found through the declared routing table, become steps; the
participants the link found in the room at its first look are in the room at t=0; the
avatar participant's removal the avatar asked for (a retry's release, its close) is no step:
the replay's avatar removes it by itself."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.tools.record._state import _SIMULATOR_ATTRIBUTE, RecordError, _State
from statemachines.machines import MACHINES
from statemachines.routing import ROUTES

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


# the avatar's effects that remove its participant from the room (a retry's release, a
# retirement, the close): the PARTICIPANT_REMOVED departure that follows is the runtime's
# own, no room input
REMOVING_EFFECTS = frozenset({"release_attempt", "retire_attempt", "close_plugin"})
_REMOVING_STATES = frozenset(
    s.name for s in MACHINES["avatar"].states if REMOVING_EFFECTS & set(s.invoke)
)
# the rows that enter their own state anew (its invoked work asked again)
_REENTERING = frozenset((r.source, r.event) for r in MACHINES["avatar"].rows if r.dest == r.source)


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


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _asks_removal(r: TraceRecord) -> bool:
    """Whether the avatar machine's record ``r`` starts an effect that removes its
    participant (a row running it, or a state invoking it)."""
    if r.machine != "avatar" or r.kind != "transition":
        return False
    return bool(REMOVING_EFFECTS & set(r.effects)) or (
        r.dest in _REMOVING_STATES
        and (r.source != r.dest or (str(r.source), r.event) in _REENTERING)
    )


class _RoomPass(_State):
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
        routes = _routes()
        for i, r in enumerate(self.records):
            if i in skip or r.kind not in ("transition", "ignore", "reject"):
                continue
            for fact in routes.get((r.machine, r.event), ()):
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

    def _room(self, facts: list[_Fact], replay: set[int], avatar: str | None) -> None:
        first_participant_record = next((i for i, _ in self.of("participant")), None)
        # the link's first look, in join order, placed when it happened
        events: list[tuple[int, str, Any]] = [(i, "look", self.records[i]) for i in replay]
        events += [(f.index, "fact", f) for f in facts]
        # the avatar asking its participant's removal (a retry's release, its close)
        events += [(i, "remove", None) for i, r in enumerate(self.records) if _asks_removal(r)]
        events.sort(key=lambda e: e[0])
        room_was_up = False
        removing = False  # a removal asked while the avatar participant was in the room
        for index, what, item in events:
            if what == "remove":
                # in the room, or never seen by the steps (there before the link looked)
                there = avatar in self.present or avatar not in self.history
                removing = removing or (avatar is not None and there)
                continue
            if what == "look":
                r: TraceRecord = item
                ident = str(r.data.get("identity"))
                if ident in self.present:
                    continue  # already in the room by a step: the link saw it there
                self._initial(ident, r.data.get("kind"), _attributes(r.data, r.t))
                continue
            f: _Fact = item
            d = f.data
            ident = str(d.get("identity", ""))
            if f.name == "participant_joined":
                if ident in self.present:
                    continue
                self.present.add(ident)
                attributes = _attributes(d, f.t)
                self._seen(ident, index, attributes)
                fields: dict[str, Any] = {"identity": ident}
                if d.get("kind", "standard") != "standard":
                    fields["kind"] = d["kind"]
                if attributes:
                    fields["attributes"] = dict(attributes)
                self.step(index, f.t, "participant_connected", **fields)
                if any(r.machine == "avatar" and r.guards.get("has_video") for r in f.records):
                    self.note(
                        f"t={secs(f.t)}: the avatar machine saw {ident}'s join with its video "
                        "already published; replayed as the join, then the video, it reaches "
                        "joined on video_published instead (same final state)"
                    )
            elif f.name == "participant_left":
                if removing and ident == avatar and d.get("reason") == "PARTICIPANT_REMOVED":
                    # the avatar removed its participant (a retry's release, its close):
                    # the replay's avatar does that by itself
                    removing = False
                    self.present.discard(ident)
                    self._seen(ident, index, None)
                    continue
                # the job saw the last simulator leave: it carried lk.simulator then
                simulator = any(r.machine == "job" for r in f.records)
                if ident not in self.present and (
                    first_participant_record is None or index < first_participant_record
                ):
                    # gone before the link looked: it was in the room from the start
                    attrs = {_SIMULATOR_ATTRIBUTE: "true"} if simulator else {}
                    self._initial(ident, d.get("kind"), attrs)
                if simulator:
                    self._make_simulator(
                        ident, index, f"t={secs(f.t)}: {ident} left as the simulator"
                    )
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
                    self.note(
                        f"t={secs(f.t)}: {ident} unmuted a track; scenarios have no unmute step"
                    )
            elif f.name == "attributes_changed":
                changed = _attributes(d, f.t, "changed")
                now = self._attributes_at(index, ident)
                if now is not None:
                    merged = {**now, **changed}
                    self._seen(ident, index, {k: v for k, v in merged.items() if v != ""})
                self.step(index, f.t, "attributes_changed", identity=ident, attributes=changed)
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
                self.note(f"t={secs(f.t)}: the room {f.name}; scenarios have no such step")


def _attributes(data: Mapping[str, Any], t: float, key: str = "attributes") -> dict[str, Any]:
    """A participant's attributes (or those changed) as a record carries them: a mapping,
    or none. Anything else is a trace no runtime wrote (edited or damaged): refused naming
    the time."""
    attributes = data.get(key) or {}
    if not isinstance(attributes, Mapping):
        what = "attributes" if key == "attributes" else f"{key} attributes"
        raise RecordError(
            f"t={secs(t)}: {data.get('identity')!r}'s {what} are "
            f"{type(attributes).__name__}, not a mapping (an edited or damaged trace)"
        )
    return dict(attributes)
