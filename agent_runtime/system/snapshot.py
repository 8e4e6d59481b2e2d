"""What every machine of a job is doing now (``AgentJob.snapshot()``), in the shape
``agent_runtime.observe.snapshot`` declares.

The machines are the ones the job's system holds (``JobSystem.actors``). Reading one is a
few attribute look-ups per machine: no copy of the trace, no I/O, cheap enough to log with
every request.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent_runtime.actor import Actor
from agent_runtime.observe.snapshot import JobSnapshot, MachineSnapshot, TimerSnapshot
from agent_runtime.system.job_system import JobSystem


def job_snapshot(system: JobSystem) -> JobSnapshot:
    """What every machine of the job is doing now, with the facts around them."""
    job = system.job
    host = system.host
    attached = host.session
    return {
        "t": system.clock.now(),
        "room": system.room.name,
        "room_connected": system.room.isconnected(),
        "machines": machines_snapshot(system.actors),
        "audio_route": system.audio_route(),
        "linked_identity": system.link.linked_identity,
        "attached_session": host.label_of(attached) if attached is not None else None,
        "primary_session_attached": attached is system.session,
        "finalize": {
            "simulation": job.simulation is not None,
            "simulators": sorted(job.simulators),
            "hold_needed": job.hold_needed,
            "answered": system.finalize.answered,
            "verdict": system.finalize.verdict,
        },
        "close_reason": system.close_reason,
        "job_reason": job.reason,
        "room_deleted_at": system.deletion.deleted_at,
        "closed_at": job.closed_at,
    }


def machine_snapshot(actor: Actor) -> MachineSnapshot:
    now = actor.clock.now()
    st = actor.spec.state(actor.state)
    deadline = actor.timer_deadline
    timer: TimerSnapshot | None = None
    if deadline is not None and st.timeout is not None:
        timer = {"event": st.timeout.event, "deadline": deadline, "remaining": deadline - now}
    return {
        "machine": actor.spec.name,
        "instance": actor.instance,
        "state": actor.state,
        "since": actor.entered_at,
        "final": st.final,
        "timer": timer,
        "tasks": list(st.invoke) if actor.live_tasks else [],
        "closed": actor.closed,
    }


def machines_snapshot(actors: Iterable[Actor]) -> dict[str, MachineSnapshot]:
    out: dict[str, MachineSnapshot] = {}
    for actor in actors:
        key = actor.spec.name
        if key in out:
            key = f"{key}[{actor.instance}]"
        out[key] = machine_snapshot(actor)
    return out
