"""What every machine of a job is doing now, as plain JSON-able data (``AgentJob.snapshot()``).

The machines are the ones the job's system holds (``JobSystem.actors``). Reading one is a
few attribute look-ups per machine: no copy of the trace, no I/O, cheap enough to log with
every request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from agent_runtime.actor import Actor

if TYPE_CHECKING:
    from agent_runtime.system.job_system import JobSystem


class TimerSnapshot(TypedDict):
    event: str  # what the state's timeout delivers when it fires
    deadline: float  # when, on the job's clock
    remaining: float  # seconds from now


class MachineSnapshot(TypedDict):
    machine: str
    instance: str
    state: str
    since: float | None  # when the state was entered, on the job's clock (None: not started)
    final: bool
    timer: TimerSnapshot | None  # the state's timeout, while armed
    tasks: list[str]  # the state's tasks (invoke) still running
    closed: bool  # the actor takes no more events


class FinalizeSnapshot(TypedDict):
    simulation: bool  # the job is a simulation run
    simulators: list[str]  # identities carrying the lk.simulator attribute
    hold_needed: bool  # would a shutdown now hold for the verdict
    answered: bool
    verdict: dict[str, Any] | None


class JobSnapshot(TypedDict):
    t: float  # now, on the job's clock
    room: str
    room_connected: bool
    machines: dict[str, MachineSnapshot]  # by machine name ("name[instance]" if repeated)
    audio_route: Literal["avatar", "room", "none"]
    linked_identity: str | None
    attached_session: str | None  # the host's label for it (session-1, ...)
    primary_session_attached: bool
    finalize: FinalizeSnapshot
    close_reason: str | None  # the primary session's CloseReason, once it closed
    job_reason: str  # why the job is ending, once asked
    room_deleted_at: float | None
    closed_at: float | None


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
