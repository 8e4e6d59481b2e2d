"""The result of a scenario's run: the contract's object ``agent-runtime simulate --json``
prints (``final_states``, ``transitions``, ``effects``, ``facts``)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agent_runtime.observe.trace import TraceRecord

if TYPE_CHECKING:
    from agent_runtime.testing.runner import _Simulation


def seconds_text(t: float) -> str:
    """A time in seconds as a reader writes it: a plain decimal (``0.0000001``,
    ``1733450000.25``; ``%g`` wrote ``1e-07`` and ``1.73345e+09``), to the 15 significant
    digits a float holds (``0.1 + 0.2`` is ``0.3``), with no trailing zeros (``10``)."""
    if not math.isfinite(t):
        return str(t)
    text = format(Decimal(f"{t:.15g}"), "f")
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text in ("", "-0") else text


def refusal(at: float, event: str, error: BaseException) -> str:
    """A step the runtime refused, as the result's ``step_errors`` lists it."""
    return f"t={seconds_text(at)} {event}: {type(error).__name__}: {error}"


def scenario_result(sim: _Simulation, records: list[TraceRecord]) -> dict[str, Any]:
    """The contract's result object of a scenario's run (``agent-runtime simulate --json``)."""
    finals = sim.agent_job.states
    playout = sim.agent_job.playout
    attached = sim.agent_job.system.host.session
    attached_name = next((n for n, s in sim.sessions.items() if s is attached), None)
    facts: dict[str, Any] = {
        "audio_output": sim.agent_job.audio_route(),
        "rpcs_sent": [
            {"t": c.t, "method": c.method, "destination": c.destination, "outcome": c.outcome}
            for c in sim.room.local_participant.rpc_calls
        ],
        "finalize_answered": sim.job.finalize_answered,
        "verdict": sim.job.verdict,
        "room_deleted_at": sim.job.room_deleted_at,
        "job_closed_at": sim.job.closed_at,
        "session_closed_at": sim.session_closed_at.get("a"),
        # extensions of the contract
        "session_close_reason": sim.session_close_reason.get("a"),
        "attached_session": attached_name,
        "linked_participant": sim.link.linked_identity,
        "session_replies": sim.session_replies,
        "rpc_replies": sim.rpc_replies,
        "step_errors": sim.errors,
        # the agent's audio: the session's own state, and the playout machine's view
        "agent_state": sim.sessions["a"].agent_state,
        "agent_listening_at": list(sim.agent_listening_at),
        "playout_done": [{"t": d.t, "cause": d.cause} for d in (playout.done if playout else [])],
        "reprompts": [r.t for r in (playout.reprompted if playout else [])],
    }
    if sim.watch is not None:
        # only when the expect block asks for the invariants
        facts["invariant_violations"] = list(sim.watch.violations)
    return {
        "name": sim.scenario.name,
        "final_states": finals,
        "transitions": [
            {
                "t": r.t,
                "machine": r.machine,
                "event": r.event,
                "source": r.source,
                "dest": r.dest,
            }
            for r in records
            if r.kind == "transition"
        ],
        "effects": [
            {"t": r.t, "machine": r.machine, "effect": r.effect, "outcome": r.outcome}
            for r in records
            if r.kind == "effect"
        ],
        "facts": facts,
    }
