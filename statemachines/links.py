"""The links between the machines: an effect of one machine posting an event to another.

Pure, like the rest of ``statemachines``. ``LINKS`` is what the runtime's wiring
(``agent_runtime.runtimes.routing.Wiring``) posts: when an effect succeeds (its ``Output``,
as XState's ``onDone``), or as a step of a task that works in steps begins. With
``routing.ROUTES`` (room facts to events), ``system.WATCHES`` (state changes to events) and
``system.REPORTS`` (a runtime's reports of its livekit part to events) they are every
channel of a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, model_validator

from .machines import MACHINES
from .system import RELEASE, TEARDOWN

# the conditions a link may carry, each a flag the runtime knows
LINK_FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "delete_room_on_close": "the job deletes the room when it closes",
    }
)
# the tasks that work in steps (statemachines.system's declared teardowns): a link may post
# as one of their steps begins. The job's run_close: the avatar's step begins once the
# session closed, or after the session step's share of the bound if its close still runs
# (livekit's order: the session's speech ends on the route it has, and the avatar's restore
# builds no room track for a session going away). The lifecycle's run_teardown releases
# what followed the job once it closed.
RUN_CLOSE_STEPS: tuple[str, ...] = tuple(s.name for s in TEARDOWN)
STEPPED: dict[tuple[str, str], tuple[str, ...]] = {
    ("job", "run_close"): RUN_CLOSE_STEPS,
    ("agent_job", "run_teardown"): tuple(s.name for s in RELEASE),
}


class Link(BaseModel):
    """When ``source``'s effect ``on`` runs (at ``step`` of a task that works in steps),
    ``target`` gets ``event`` with the effect's data, if every flag in ``when`` holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    on: str
    step: str = ""
    target: str
    event: str
    when: tuple[str, ...] = ()
    note: str = ""

    @model_validator(mode="after")
    def _known(self) -> Link:
        where = f"link {self.source}.{self.on}{'/' + self.step if self.step else ''}"
        spec = MACHINES.get(self.source)
        if spec is None:
            raise ValueError(f"{where}: unknown machine {self.source!r}")
        if self.on not in {e.name for e in spec.effects}:
            raise ValueError(f"{where}: machine {self.source!r} has no effect {self.on!r}")
        steps = STEPPED.get((self.source, self.on))
        if self.step and steps is None:
            raise ValueError(f"{where}: {self.source}.{self.on} does not work in steps")
        if self.step and steps is not None and self.step not in steps:
            raise ValueError(f"{where}: {self.on} has no step {self.step!r}")
        target = MACHINES.get(self.target)
        if target is None:
            raise ValueError(f"{where}: unknown target machine {self.target!r}")
        if self.event not in target.events:
            raise ValueError(f"{where}: machine {self.target!r} has no event {self.event!r}")
        for flag in self.when:
            if flag not in LINK_FLAGS:
                raise ValueError(f"{where}: unknown flag {flag!r}")
        return self


LINKS: tuple[Link, ...] = (
    # a session of the job closed (the session machine hears the SDK's close event)
    Link(source="session", on="report_closed", target="session_host", event="session_closed"),
    Link(source="session", on="report_own_closed", target="participant", event="session_closed"),
    Link(
        source="session",
        on="report_own_closed",
        target="avatar",
        event="close",
        note="the avatar goes with the session, while the room is still connected",
    ),
    Link(
        source="session",
        on="report_own_closed",
        target="playout",
        event="close",
        note="nothing more to follow",
    ),
    Link(source="session_host", on="report_session_closed", target="job", event="session_closed"),
    Link(
        source="session_host",
        on="report_session_closed",
        when=("delete_room_on_close",),
        target="room_deletion",
        event="request",
        note="deferred: it runs once the job's close allows it",
    ),
    Link(source="session_host", on="forward_finalize", target="finalize", event="request"),
    Link(source="session_host", on="close_finalize", target="finalize", event="close"),
    Link(source="finalize", on="report_answered", target="job", event="finalize_answered"),
    Link(
        source="participant",
        on="report_close_timed_out",
        target="job",
        event="shutdown",
        note="the session will not say it closed: nothing else would end the job",
    ),
    Link(source="job", on="run_close", step="host", target="session_host", event="close"),
    Link(source="job", on="run_close", step="avatar", target="avatar", event="close"),
    Link(
        source="job",
        on="run_close",
        step="room",
        when=("delete_room_on_close",),
        target="room_deletion",
        event="request",
    ),
    Link(source="job", on="run_close", step="room", target="room_deletion", event="allow"),
    Link(source="job", on="run_close", step="callbacks", target="participant", event="close"),
    Link(source="job", on="run_close", step="callbacks", target="avatar", event="close"),
    # the job's own lifecycle (statemachines.agent_job): aclose() and aclose(graceful=False)
    Link(source="agent_job", on="ask_shutdown", target="job", event="shutdown"),
    Link(
        source="agent_job",
        on="ask_abort",
        target="job",
        event="abort",
        note="the same close, no hold",
    ),
    Link(
        source="playout",
        on="finish_playout",
        target="avatar",
        event="playback_finished",
        note="no report in time: the avatar's own row ends the sink's segment (no RPC)",
    ),
)


def links_from(
    source: str, on: str, step: str = "", *, links: tuple[Link, ...] = LINKS
) -> tuple[Link, ...]:
    """The links that fire when ``source``'s ``on`` runs (at ``step``), in table order."""
    return tuple(k for k in links if k.source == source and k.on == on and k.step == step)


def without(links: tuple[Link, ...], source: str, on: str, target: str) -> tuple[Link, ...]:
    """``links`` less the ones from ``source``'s ``on`` to ``target`` (for fault tests)."""
    return tuple(k for k in links if (k.source, k.on, k.target) != (source, on, target))
