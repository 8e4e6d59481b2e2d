"""What a test sees of a real ``AgentJob`` from outside (``Observed``), and the job's view
(``runtime_view``): the ``JobView`` the shared invariants (``checks``) read, for the
explorer of the real job, the property tests and a scenario's ``expect`` block."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from livekit import rtc
from livekit.agents import AgentSession
from livekit.agents.voice.remote_session import SessionHost

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.runtimes.room_events import kind_name
from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.sdk.session_close import session_close_failed
from agent_runtime.system.agent_job import AgentJob
from agent_runtime.testing.invariants.checks import hold_cut, late_timer
from agent_runtime.testing.invariants.view import JobView, Request
from statemachines.glue import eligible
from statemachines.machines import MACHINES


@dataclass
class Sent:
    """A finalize_simulation a participant sent, as the test saw it."""

    request_id: str
    simulator: bool
    owed: bool  # from the simulator, while the job was serving or holding


@dataclass
class Observed:
    """What a test saw of a job from outside: its requests and their replies, the room
    deletions it was asked for, the lk.clear_buffer RPCs, and marks of what went wrong."""

    sent: list[Sent] = field(default_factory=list)
    replies: dict[str, list[str]] = field(default_factory=dict)
    excused: set[str] = field(default_factory=set)
    deletions: list[str] = field(default_factory=list)
    clear_rpcs: list[str] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    # the room's participants from the job's start on (those there then, then each join),
    # as the joins that brought them: who the link could follow, seen from outside the job
    joined: list[dict[str, Any]] = field(default_factory=list)

    def watch_job(self, job: AgentJob) -> None:
        """Mark a job step that stops holding while the hold is needed (``checks.hold_cut``
        with the job's own facts, just after the step), and note who was in the room from
        the job's start on."""

        def on_change(sc: Any) -> None:
            if sc.machine == "job":
                mark = hold_cut(sc.source, sc.dest, sc.event, job.job.hold_needed)
                if mark and mark not in self.marks:
                    self.marks.append(mark)

        job.job.actor.on("state_changed", on_change)
        started: list[bool] = []

        def following(leaving: Any = None) -> bool:
            """Whether the job follows the room; its participants are noted the first
            time that is seen (one leaving then among them)."""
            if not started and job.system.events.started:
                started.append(True)
                there = list(job.room.remote_participants.values())
                if isinstance(leaving, rtc.RemoteParticipant):
                    there.insert(0, leaving)
                self.joined += [_joined(p) for p in there]
                return False  # noted now
            return bool(started)

        def on_life(sc: Any) -> None:
            following()
            if sc.dest == "closed":  # the job leaves no listener on the room
                job.room.off("participant_connected", on_join)
                job.room.off("participant_disconnected", on_leave)

        def on_join(*args: Any) -> None:
            # the room's own listeners come after this one: a malformed emit is theirs
            if following() and args and isinstance(args[0], rtc.RemoteParticipant):
                self.joined.append(_joined(args[0]))

        def on_leave(*args: Any) -> None:
            following(args[0] if args else None)

        job.system.lifecycle.on("state_changed", on_life)
        job.room.on("participant_connected", on_join)
        job.room.on("participant_disconnected", on_leave)

    def watch_rpcs(self, job: AgentJob) -> None:
        """Record the avatar's state at each ``lk.clear_buffer`` the agent sends."""
        lp = job.room.local_participant
        perform = lp.perform_rpc

        async def recorded(**kw: Any) -> str:
            if kw["method"] == "lk.clear_buffer":
                self.clear_rpcs.append(job.avatar.state if job.avatar is not None else "none")
            reply: str = await perform(**kw)
            return reply

        lp.perform_rpc = recorded  # type: ignore[method-assign]


def _joined(p: rtc.RemoteParticipant) -> dict[str, Any]:
    return {"identity": p.identity, "kind": kind_name(p.kind), "attributes": dict(p.attributes)}


def forwarding(session: AgentSession[Any]) -> bool:
    """Whether some livekit ``SessionHost`` forwards this session's events."""
    return any(
        isinstance(getattr(cb, "__self__", None), SessionHost)
        for cbs in lk.listeners(session).values()
        for cb in cbs
    )


def session_state(session: AgentSession[Any], *, hung: bool = False) -> str:
    """The session's close as the view reads it: running (never asked), closing (under
    way; ``hung`` when the world said it never ends), closed, or failed (it ended without
    closing: livekit never said ``close``)."""
    task = lk.session_closing_task(session)
    if task is None:
        return "running"
    if not task.done():
        return "hung" if hung else "closing"
    return "failed" if session_close_failed(session) else "closed"


def runtime_view(
    job: AgentJob,
    observed: Observed,
    records: list[TraceRecord],
    *,
    sessions: Mapping[str, AgentSession[Any]],
    session: str,
) -> JobView:
    """The ``JobView`` of a real job: its machines and facts, what the test observed
    (``observed``), its trace (``records``), its sessions by name (``A`` the
    primary) and the primary session's close as the test knows it (``session``)."""
    # every machine of the job, its own lifecycle among them, and playout when it runs
    actors = {a.spec.name: a for a in job.actors if a.spec.name in MACHINES}
    states = {name: a.state for name, a in actors.items()}
    host = job.system.host
    attached = host.session
    names = {id(s): name for name, s in sessions.items()}
    answering = job.system.host.finalize
    # every request the verdict being computed (or sent) answers
    answering_ids = (
        set(answering._waiting) | {str(answering._request.get("request_id", ""))}
        if answering.state in ("answering", "replying")
        else set()
    )
    linked = job.link.linked_identity
    # the first of them the link's own rule (its ``eligible`` guard) lets it follow
    first = next((j["identity"] for j in observed.joined if eligible(job.link, j)), None)
    room = job.room
    marks = list(observed.marks)
    asked = job.settings.delete_room_on_close
    shutdown = room_work = timed_out = aborted = detached_close = False
    reports = 0
    reasons: list[str] = []
    close_failed: str | None = None
    # the host's label of the primary session, if it ever had one (read, not made: the
    # host's label_of would make one)
    primary = sessions.get("A")
    primary_label = host.known_label(primary) if primary is not None else None
    for r in records:
        if r.kind not in ("transition", "ignore", "reject"):
            continue
        if (
            r.machine == "session_host"
            and r.event == "session_closed"
            and "report_session_closed" not in r.effects  # heard, not the job's end
            and r.data.get("session") == primary_label
        ):
            detached_close = True
        spec = MACHINES.get(r.machine)
        if spec is not None and r.source:
            mark = late_timer(spec, r.source, r.event)
            if mark and mark not in marks:
                marks.append(mark)
        if r.machine == "job" and r.event == "shutdown":
            shutdown = True
            reasons.append(str(r.data.get("reason", "")))
        if r.machine == "participant" and r.event == "close_failed" and r.kind == "transition":
            # (heard while closing: once closed, on the timeout or the job's close, it is
            # ignored, and the job was told something else)
            close_failed = str(r.data.get("detail", ""))
        if r.machine == "agent_job" and r.event == "abort":
            aborted = True  # aclose(graceful=False) was called
        if r.machine == "job" and r.event == "close_timeout":
            timed_out = True
        if r.machine == "room_deletion" and r.event == "request":
            asked = True
        if r.machine == "room_deletion" and r.event == "allow":
            room_work = True
        if r.machine == "finalize" and "report_answered" in r.effects:
            reports += 1
    shutdown = shutdown or states.get("job") != "serving"
    return JobView(
        states=states,
        audio_route=job.audio_route(),
        room_connected=room.isconnected(),
        is_simulation=job.job.simulation is not None,
        simulator_present=bool(job.job.simulators),
        finalize_answered=job.finalize_answered,
        avatar_present=job.avatar is not None
        and job.avatar.avatar.avatar_identity in room.remote_participants,
        linked=linked,
        linked_present=linked is not None and linked in room.remote_participants,
        first_eligible=first,
        first_eligible_present=first is not None and first in room.remote_participants,
        close_on_disconnect=job.settings.close_on_disconnect,
        session=session,
        on_call=lk.session_live(job.session),
        attached=names.get(id(attached)) if attached is not None else None,
        primary_closed_detached=detached_close,
        forwarded=tuple(sorted(name for name, s in sessions.items() if forwarding(s))),
        requests=tuple(
            Request(
                owed=s.owed,
                simulator=s.simulator,
                replies=tuple(observed.replies.get(s.request_id, ())),
                excused=s.request_id in observed.excused,
                answering=s.request_id in answering_ids,
            )
            for s in observed.sent
        ),
        verdict_reports=reports,
        deletions=tuple(observed.deletions),
        deletion_asked=asked,
        shutdown_asked=shutdown,
        room_work_done=room_work,
        close_timed_out=timed_out,
        closed=frozenset(name for name, a in actors.items() if a.closed),
        timers={name: a.state for name, a in actors.items() if a.timer_armed},
        tasks={name: (a.state,) * a.live_tasks for name, a in actors.items() if a.live_tasks},
        clear_rpcs=tuple(observed.clear_rpcs),
        marks=tuple(marks),
        aborted=aborted,
        audio_pending=_audio_pending(job),
        audio_ended=_audio_pending(job, ended=True),
        close_failed=close_failed,
        shutdown_reasons=tuple(reasons),
    )


def _audio_pending(job: AgentJob, *, ended: bool = False) -> bool:
    """Agent audio the avatar's sink took and nobody reported played nor finished, the
    agent "speaking" on it (what only playout bounds: without it the SDK waits for the
    avatar's word). A closed session's leftover count keeps nobody speaking. ``ended``:
    only segments whose end was pushed (one still being captured is not handed off yet)."""
    if job.playout is None or job.session.agent_state != "speaking":
        return False
    sink = job.avatar.installed_sink if job.avatar is not None else None
    if sink is None:
        return False
    return (lk.ended_unreported(sink) if ended else lk.pending_playbacks(sink)) > 0
