"""One view of a job's state: what the invariants read.

A ``JobView`` is plain data, built from a real ``AgentJob`` and what the test saw
(``observe.runtime_view``): by the explorer of the real job, the property tests and a
scenario's ``expect: invariants``. The invariants (``checks``) are written once, over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Request:
    """One ``finalize_simulation`` a participant sent, as the agent's side handled it."""

    owed: bool  # from the simulator, while the job was serving or holding: it needs an answer
    simulator: bool  # its sender is the simulator participant
    replies: tuple[str, ...] = ()  # "verdict" | "error", each as put on the transport
    excused: bool = False  # a reply could not go out: the room was gone
    answering: bool = False  # on_simulation_end runs for it now


@dataclass(slots=True)
class JobView:
    """A job's state: every machine, the room, the audio route, the simulator's requests,
    and the marks of what happened on the way. (Not frozen: building one is on the
    explorer's hot path, and a frozen dataclass builds several times slower.)"""

    states: Mapping[str, str]  # every machine's state, by machine name
    audio_route: str = "room"  # where the agent's audio goes: avatar | room | none
    room_connected: bool = True
    is_simulation: bool = False
    simulator_present: bool = False  # a participant carries lk.simulator
    finalize_answered: bool = False  # a verdict reached the transport
    avatar_present: bool = False
    linked: str | None = None  # the identity the participant link follows
    linked_present: bool = False
    # the first participant the link could follow, seen from outside from the job's start
    first_eligible: str | None = None
    first_eligible_present: bool = False
    close_on_disconnect: bool = True
    # the primary session: running | closing | closed | hung | failed (its close ended
    # without closing it: livekit never said `close`)
    session: str = "running"
    on_call: bool = False  # the primary session started and is not closing
    attached: str | None = None  # the attached session: "A" (primary) or "B"
    forwarded: tuple[str, ...] = ()  # sessions whose events are forwarded
    requests: tuple[Request, ...] = ()
    verdict_reports: int = 0  # times the finalize machine told the job a verdict went out
    deletions: tuple[str, ...] = ()  # the job's state when each deletion call began
    deletion_asked: bool = False  # someone asked for the room deletion
    shutdown_asked: bool = False
    room_work_done: bool = False  # the job's close disconnected and allowed the deletion
    close_timed_out: bool = False  # the job's close bound ran out
    closed: frozenset[str] = frozenset()  # machines whose actor is closed
    timers: Mapping[str, str] = field(default_factory=lambda: _NONE)  # machine -> armed in
    tasks: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _NONE)  # -> started in
    clear_rpcs: tuple[str, ...] = ()  # the avatar's state at each lk.clear_buffer sent
    marks: tuple[str, ...] = ()  # what went wrong on the way (a hold cut short, ...)
    # agent audio handed to the avatar's sink that it has neither reported nor been
    # finished locally (the SDK's playout wait, so the agent's "speaking", hangs on it)
    audio_pending: bool = False
    aborted: bool = False  # the user called aclose(graceful=False)
    # the primary session closed while not the attached one (the user detached it, or
    # another replaced it): the host heard its close and, as its table says, did not report
    # it to the job
    primary_closed_detached: bool = False
    # of the audio pending, segments whose end was pushed (handed off)
    audio_ended: bool = False
    # the participant link heard the session's close end without closing it (its trace's
    # close_failed): what it said went wrong; and the reason of each shutdown the job heard
    close_failed: str | None = None
    shutdown_reasons: tuple[str, ...] = ()
