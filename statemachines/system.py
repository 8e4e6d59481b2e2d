"""The system between the machines, as data: who follows the room in which order, which
state change of one machine is an event of another, which report of a runtime about the
livekit part it drives is an event of another machine, and the job's teardown.

With ``routing.ROUTES`` (room facts to events) and ``links.LINKS`` (effects to events) these
are every channel of a job: the runtime delivers them, the diagrams draw them, the explorer
imports them. Nothing here runs anything.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .avatar import PLUGIN_CLEARS
from .machines import MACHINES

# the order in which the machines of one job hear one room fact, whatever order their
# runtimes were started in (the job first: a simulator leaving ends its hold before anything
# else reacts; the avatar before the participant: a departure that is the avatar's is never
# taken for the user's)
FOLLOW_ORDER: tuple[str, ...] = ("job", "avatar", "participant")


class Watch(BaseModel):
    """When ``source`` changes state ``leaving`` one of ``leaving`` for a state outside it,
    or ``entering`` one of ``entering`` from a state outside it, ``target`` gets ``event``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    leaving: tuple[str, ...] = ()
    entering: tuple[str, ...] = ()
    target: str
    event: str
    note: str = ""

    @model_validator(mode="after")
    def _known(self) -> Watch:
        where = f"watch {self.source} -> {self.target}.{self.event}"
        if bool(self.leaving) == bool(self.entering):
            raise ValueError(f"{where}: give exactly one of leaving or entering")
        spec = MACHINES.get(self.source)
        if spec is None:
            raise ValueError(f"{where}: unknown machine {self.source!r}")
        for s in (*self.leaving, *self.entering):
            if s not in spec.state_names:
                raise ValueError(f"{where}: machine {self.source!r} has no state {s!r}")
        target = MACHINES.get(self.target)
        if target is None:
            raise ValueError(f"{where}: unknown target machine {self.target!r}")
        if self.event not in target.events:
            raise ValueError(f"{where}: machine {self.target!r} has no event {self.event!r}")
        return self

    def fires(self, source: str, dest: str) -> bool:
        """Whether a change of ``self.source`` from ``source`` to ``dest`` fires it."""
        if self.leaving:
            return source in self.leaving and dest not in self.leaving
        return dest in self.entering and source not in self.entering


WATCHES: tuple[Watch, ...] = (
    Watch(
        source="avatar",
        leaving=tuple(PLUGIN_CLEARS),
        target="playout",
        event="avatar_left",
        note="the avatar's sink no longer reports: what it held is not heard",
    ),
    Watch(
        source="avatar",
        entering=tuple(PLUGIN_CLEARS),
        target="playout",
        event="avatar_joined",
        note="what its sink took before it joined is played from now: await it",
    ),
    Watch(
        source="participant",
        leaving=("linked",),
        target="playout",
        event="user_left",
        note="nobody to re-prompt",
    ),
    Watch(
        source="job",
        entering=("closed",),
        target="agent_job",
        event="job_closed",
        note="the job closed on its own (the user left, the room went away): release the rest",
    ),
    Watch(
        source="job",
        entering=("awaiting_finalize",),
        target="agent_job",
        event="job_holding",
        note="livekit closes the session before the hold: the agent is off the call",
    ),
)


def watched(
    source: str,
    from_state: str,
    to_state: str,
    target: str,
    *,
    watches: tuple[Watch, ...] = WATCHES,
) -> tuple[str, ...]:
    """The events ``target`` gets when ``source`` moves from ``from_state`` to ``to_state``
    (``watches``: another table, for the explorer's fault tests)."""
    return tuple(
        w.event
        for w in watches
        if w.source == source and w.target == target and w.fires(from_state, to_state)
    )


class Report(BaseModel):
    """When ``source``'s runtime reports ``report`` (a fact of the livekit part it drives,
    not a change of its machine: what its audio sink was handed, what the avatar said it
    played), ``target`` gets ``event``. The target's runtime makes the event's data from the
    report (its handler of ``report``); who hears it, as which event, is said here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    report: str
    target: str
    event: str
    note: str = ""

    @model_validator(mode="after")
    def _known(self) -> Report:
        where = f"report {self.source}.{self.report} -> {self.target}.{self.event}"
        if self.source not in MACHINES:
            raise ValueError(f"{where}: unknown machine {self.source!r}")
        if not self.report.isidentifier() or self.report == "state_changed":
            raise ValueError(
                f"{where}: a report is named by what the runtime emits, other than "
                "state_changed (a state change is a watch)"
            )
        target = MACHINES.get(self.target)
        if target is None:
            raise ValueError(f"{where}: unknown target machine {self.target!r}")
        if self.target == self.source:
            raise ValueError(f"{where}: a report goes to another machine")
        if self.event not in target.events:
            raise ValueError(f"{where}: machine {self.target!r} has no event {self.event!r}")
        return self


REPORTS: tuple[Report, ...] = (
    Report(
        source="avatar",
        report="segment_flushed",
        target="playout",
        event="handed_off",
        note="the session ended a segment at the avatar's sink: all its audio is pushed",
    ),
    Report(
        source="avatar",
        report="playback_finished",
        target="playout",
        event="playback_finished",
        note="the avatar's lk.playback_finished, accepted: it played a segment",
    ),
)


def check_reports(reports: tuple[Report, ...]) -> None:
    """``ValueError`` if two of ``reports`` say the same report to the same machine (it
    would hear it twice)."""
    seen: set[tuple[str, str, str]] = set()
    for r in reports:
        key = (r.source, r.report, r.target)
        if key in seen:
            raise ValueError(f"report {r.source}.{r.report} -> {r.target} declared twice")
        seen.add(key)


check_reports(REPORTS)


class TeardownStep(BaseModel):
    """One step of the job's close. It begins once every step in ``after`` has ended (or
    been cut at its bound); ``bound`` is its share of ``close_timeout``. A cut step never
    keeps the ones after it from running."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    after: tuple[str, ...] = ()
    bound: float = Field(gt=0, le=1)
    what: str
    # a machine whose own timeouts bound this step (its hold, its close): no share applied
    timed_by: str = ""


# the job machine's run_close: its steps (each link of run_close/STEP fires as the step
# begins: statemachines.links.LINKS). Their shares add up to less than the whole, so even
# when every earlier step hangs to its share the shutdown callbacks get the rest of
# close_timeout; the state's own close_timeout only ever cuts what overran.
TEARDOWN: tuple[TeardownStep, ...] = (
    TeardownStep(
        name="host",
        bound=0.3,
        what="the session host answers what it was answering, then stops reading",
    ),
    TeardownStep(
        name="session",
        after=("host",),
        bound=0.15,
        what="the session closes (its speech ends on the route it has)",
    ),
    TeardownStep(
        name="avatar",
        after=("session",),
        bound=0.15,
        what="the avatar closes while the room is connected (its participant removed)",
    ),
    TeardownStep(
        name="disconnect",
        after=("avatar",),
        bound=0.1,
        what="the room disconnects (livekit's, after on_session_end, once ctx.shutdown() ran)",
    ),
    TeardownStep(
        name="room",
        after=("disconnect",),
        bound=0.15,
        what="a room deletion asked for is allowed and runs",
    ),
    TeardownStep(
        name="callbacks",
        after=("room",),
        bound=0.15,
        timed_by="job",
        what="the shutdown callbacks, all at once, until the close's own bound",
    ),
)
# what AgentJob's closing does around the job machine's close: the start still running
# is cut first; the followers of the room and the session are released at once, then let go
RELEASE: tuple[TeardownStep, ...] = (
    TeardownStep(name="starts", bound=0.1, what="the parts of a start still running are cut"),
    TeardownStep(
        name="job",
        after=("starts",),
        bound=1.0,
        timed_by="job",
        what="the job machine closes (after its hold, if any): TEARDOWN",
    ),
    TeardownStep(
        name="session",
        after=("job",),
        bound=0.3,
        what=(
            "a session still running is asked to close (the job's bound cut its close); "
            "what a start cut or failed half-way left (its RoomIO) is released"
        ),
    ),
    TeardownStep(
        name="playout",
        after=("job",),
        bound=0.3,
        what="playout stops following the session",
    ),
    TeardownStep(
        name="participant",
        after=("job",),
        bound=0.3,
        what="the participant link lets the room go",
    ),
    TeardownStep(
        name="avatar",
        after=("job",),
        bound=0.3,
        what="the avatar's close, if nothing asked it yet",
    ),
    # a supervisor past a child's shutdown bound: a follower whose close ran past its share
    # (a server call that hangs) has its work cancelled here, not left behind aclose()
    TeardownStep(
        name="let_go",
        after=("session", "playout", "participant", "avatar"),
        bound=0.1,
        what="the job machine and any follower still closing are let go, their work cancelled",
    ),
)


def _check_order(steps: tuple[TeardownStep, ...]) -> None:
    seen: set[str] = set()
    for s in steps:
        missing = [a for a in s.after if a not in seen]
        if missing:
            raise ValueError(f"teardown step {s.name!r} comes after unknown {missing}")
        seen.add(s.name)


_check_order(TEARDOWN)
_check_order(RELEASE)
if sum(s.bound for s in TEARDOWN) > 1.0:
    raise ValueError("the teardown's bounds add up to more than close_timeout")


def bound_of(step: str, close_timeout: float) -> float:
    """The seconds ``step`` of ``TEARDOWN`` may take."""
    for s in TEARDOWN:
        if s.name == step:
            return s.bound * close_timeout
    raise KeyError(f"no teardown step {step!r}")


# the part of the host step's share its own drain may take: the rest is for what the drain's
# end sends (the error reply of a finalize it cut) and the transport's close
HOST_DRAIN = 0.8


def host_drain(close_timeout: float) -> float:
    """The session host's ``drain_timeout`` in a job closed within ``close_timeout``: at
    most 3 s, and inside the host step's share, so the host's own cut comes before the
    step's cut and the room's disconnect, and the error reply it owes has the rest of the
    share to go out (0.6 s at the defaults; at an equal deadline the step's cut came first
    and the reply found the room gone). The replies are bounded by the drain too."""
    return min(3.0, HOST_DRAIN * bound_of("host", close_timeout))
