"""The shape of ``AgentJob.snapshot()``: what every machine of a job is doing now, as plain
JSON-able data. ``agent_runtime.system.snapshot`` fills it in from the job's system (the
snapshot reads the actors and the system, which sit above ``observe``)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict


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
