"""The session-request channel: the requests the session host handled, with their sender
(a finalize taken as the simulator's needs its sender to carry ``lk.simulator``)."""

from __future__ import annotations

import functools
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.tools.record._state import _FINALIZE_REQUESTS, _SIMULATOR_ATTRIBUTE, _State

# who sent a request, when the trace does not say (a transport that cannot tell)
_UNNAMED_CALLER = "unnamed-caller"


@functools.cache
def _known_requests() -> frozenset[str]:
    """The session request kinds of the protocol this build speaks."""
    from livekit.protocol.agent_pb import agent_session as agent_pb

    oneof = agent_pb.SessionRequest.DESCRIPTOR.oneofs_by_name["request"]
    return frozenset(f.name for f in oneof.fields)


class _RequestPass(_State):
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
                f"t={secs(r.t)}: a malformed {kind} request ({d.get('error', '')}): its bytes are "
                "not in the trace, so it is left out"
            )

    def _finalize_caller(self, i: int, r: TraceRecord, caller: str | None) -> str:
        """The sender of a finalize, in the room with ``lk.simulator`` exactly when the host
        took it as the simulator's (``from_simulator``)."""
        accepted = r.guards.get("from_simulator")
        if caller is None:
            if accepted is not True:
                self.note(
                    f"t={secs(r.t)}: who sent this finalize_simulation (not taken as the "
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
                    f"t={secs(r.t)}: {caller}'s finalize_simulation was refused as not the "
                    "simulator's, but the steps leave it carrying lk.simulator (its removal is "
                    "not in the trace): the replay answers it"
                )
            return caller
        self._make_simulator(
            caller, i, f"t={secs(r.t)}: {caller} sent finalize_simulation as the simulator"
        )
        return caller
