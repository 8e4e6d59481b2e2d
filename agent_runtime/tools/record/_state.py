"""What every pass of the recorder shares: the trace's records, the steps made so far, the
participants in the room at t=0 and each one's attributes over time (the room facts put
them there, a session request may need one to carry ``lk.simulator``), the config and the
notes; and the events of the specs whose rows say what they mean."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.result import seconds_text as secs
from statemachines.machines import MACHINES

_SIMULATOR_ATTRIBUTE = "lk.simulator"


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


class RecordError(ValueError):
    """The trace holds nothing a scenario could be rebuilt from."""


@dataclass
class Recorded:
    """The rebuilt scenario (a mapping ``parse_scenario`` accepts) and what could not be."""

    scenario: dict[str, Any]
    notes: list[str] = field(default_factory=list)


class _State:
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
        # when the primary session closed (any reason), and when the playout watchdog's
        # hand-over closed it: what either causes at that instant follows by itself
        self.primary_closed_at: float | None = None
        self.watchdog_closed_at: float | None = None
        self.linked: set[int] = set()  # records a declared link delivered (no input)
        self.playout: dict[str, Any] = {}  # the playout options the trace shows
        self._held_starts: bool | None = None  # the avatar's starts are held (_AvatarPass)

    # -- helpers -------------------------------------------------------------------------
    def of(self, machine: str) -> list[tuple[int, TraceRecord]]:
        """The events ``machine`` handled (not its effects' outcomes), with their index."""
        return [
            (i, r)
            for i, r in enumerate(self.records)
            if r.machine == machine and r.kind in ("transition", "ignore", "reject")
        ]

    def _primary_close(self, primary: str | None) -> TraceRecord | None:
        """The first record of the primary session's close (any reason)."""
        return next(
            (
                r
                for r in self.records
                if r.event == "session_closed"
                and r.kind == "transition"
                and (r.machine == "participant" or r.data.get("session") == primary)
            ),
            None,
        )

    def step(self, index: int, t: float, event: str, **fields: Any) -> None:
        self.steps.append((index, {"at": t, "event": event, **fields}))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _avatar_identity(self) -> str | None:
        recs = self.of("avatar")
        if not recs:
            return None
        for _, r in recs:
            ident = r.data.get("identity")
            if r.event in ("avatar_connected", "video_published", "avatar_left") and ident:
                return str(ident)
        return recs[0][1].instance or "avatar"

    # -- who is in the room, with which attributes -------------------------------------------
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
        when = "t=0" if at < 0 else f"t={secs(self.records[at].t)}"
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
