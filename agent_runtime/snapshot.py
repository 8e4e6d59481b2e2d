"""What every machine of a job is doing now, as plain JSON-able data (``AgentJob.snapshot()``).

The machines are found by walking the runtime objects the job holds (every ``Actor`` among
their attributes, and among those of the runtime objects they hold in turn), so a machine a
runtime adds shows up here without a change. Reading one is a few attribute look-ups per
machine: no copy of the trace, no I/O, cheap enough to log with every request.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, TypedDict

from statemachines.machines import MACHINES

from .actor import Actor


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


@functools.cache
def _is_runtime(module: str) -> bool:
    """A module of the production runtime (not the testing kit's stand-ins, not the tools)."""
    return module.startswith(f"{__package__}.") and module.count(".") == 1


def find_actors(*roots: object, depth: int = 3) -> list[Actor]:
    """Every ``Actor`` held by ``roots`` or by the runtime objects (this package's classes)
    they hold, ``depth`` levels down; in ``MACHINES`` order, then by instance."""
    found: dict[int, Actor] = {}
    seen: set[int] = set()

    def walk(obj: object, level: int) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Actor):
            found[id(obj)] = obj
            return
        if level >= depth:
            return
        for value in getattr(obj, "__dict__", {}).values():
            if isinstance(value, Actor) or _is_runtime(type(value).__module__):
                walk(value, level + 1)

    for root in roots:
        if root is not None:
            walk(root, 0)
    order = {name: i for i, name in enumerate(MACHINES)}
    return sorted(
        found.values(), key=lambda a: (order.get(a.spec.name, len(order)), a.spec.name, a.instance)
    )


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


def machines_snapshot(actors: list[Actor]) -> dict[str, MachineSnapshot]:
    out: dict[str, MachineSnapshot] = {}
    for actor in actors:
        key = actor.spec.name
        if key in out:
            key = f"{key}[{actor.instance}]"
        out[key] = machine_snapshot(actor)
    return out
