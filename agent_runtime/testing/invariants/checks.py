"""What must hold in a composed job, written once, over its view (``view.JobView``).

The explorer of the real job and the property tests check a real ``AgentJob`` with these.
Three kinds, by when they apply:

* ``safety``: in every state reached, mid-cascade included;
* ``settled``: where nothing is left to run but inputs (every mailbox empty, no work
  running aside that can end by itself);
* ``eventual``: once time has passed every bound and nothing is left to run.

Two rules say what to mark on the way (``hold_cut``, ``late_timer``): both sides record
their marks with them, and ``safety`` reports any mark.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_runtime.testing.invariants.view import JobView
from statemachines import MachineSpec
from statemachines.avatar import PLUGIN_CLEARS, ROUTED
from statemachines.glue import hold_needed
from statemachines.machines import MACHINES
from statemachines.playout import QUIET

LIVE_JOB = ("serving", "awaiting_finalize")
# per machine and state: whether it declares a timeout, and how many tasks it invokes
_TIMEOUT = {m: {s.name: s.timeout is not None for s in spec.states} for m, spec in MACHINES.items()}
_INVOKED = {m: {s.name: len(s.invoke) for s in spec.states} for m, spec in MACHINES.items()}


@dataclass(frozen=True)
class Invariant:
    number: int
    name: str
    text: str


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        1,
        "audio_route",
        "the agent's audio points at an avatar only while its route may be in (starting, "
        "routing, joined, clearing), and once the bounds have passed only at one that joined "
        "and is still there",
    ),
    Invariant(
        2,
        "finalize_once",
        "a finalize request that arrives before the hold ends is answered, exactly once "
        "(unless the room went before the reply): with the verdict, or with an explicit "
        "error; the verdict goes to the simulator only, and reaches the job once (a "
        "request the simulator sent again gets the same verdict)",
    ),
    Invariant(
        3,
        "deletion_after_hold",
        "the room is never deleted before awaiting_finalize is left (only in closing/closed), "
        "and at most once",
    ),
    Invariant(4, "one_session", "at most one session is attached (and forwarded)"),
    Invariant(
        5,
        "shutdown_closes",
        "once shutdown is asked (or the job left serving) and time passes the bounds, the "
        "job reaches closed, through its close work (host closed, room disconnected unless "
        "livekit's shutdown has it, deleted if asked) unless the close bound ran out, and "
        "not later than that work",
    ),
    Invariant(6, "scoped_timers", "no timer or task outlives its state (or its machine)"),
    Invariant(
        7,
        "hold_when_needed",
        "the job stops holding only when the simulator is gone, the room went, the bound ran "
        "out or the verdict was delivered, and then at once",
    ),
    Invariant(
        8,
        "departure_noticed",
        "a linked participant who left does not keep the session open past the grace bound "
        "(nor does the first one the link could follow since the job started, once the "
        "session started: one who left while it was starting), and a session close that "
        "hangs past its bound, or fails, shuts the job down (a failed one: the link closed "
        "and the job shut down with the failure as its reason)",
    ),
    Invariant(
        9,
        "playout_follows",
        "with the playout machine composed: once the primary session closed, playout is "
        "closed; it never waits for the report of an avatar that is not joined, nor times "
        "the silence of a user who is not linked; and once "
        "time passed every bound, no agent audio is left unreported at the avatar (the agent "
        "never stays speaking)",
    ),
    Invariant(
        10,
        "lifecycle_follows",
        "AgentJob's own lifecycle is never closed while the job machine is not; once the job "
        "machine closed (on its own or asked) the lifecycle closes once its release ends, so "
        "aclose() returns; aclose() closes the job machine within its bounds, and "
        "aclose(graceful=False) never leaves it serving nor holding for the simulator",
    ),
    Invariant(
        11,
        "ends_with_the_session",
        "once the primary session closed, the job does not serve on unless it was no longer "
        "the attached one (detached, or another attached), and its participant link and "
        "avatar are closed; once the job closed "
        "and every bound passed, its avatar and participant link are closed (not only "
        "stopped where they were)",
    ),
    Invariant(
        12,
        "playout_keeps_its_word",
        "the playout machine follows every turn and ends it on the SDK's or the avatar's "
        "report; agent audio at a joined avatar is always waited for; the watchdog is armed "
        "exactly when it is on and the user is there and silent, never over audio, and once "
        "armed its timers alone re-prompt (at most max_reprompts times since the user last "
        "spoke) or hand over; only the session's close ends it, and it moves on nothing else "
        "than what concerns it (judged at each decision: ``invariants.playout``)",
    ),
    Invariant(
        13,
        "off_the_call",
        "with AgentJob's lifecycle composed: while the job holds for the simulator's verdict "
        "(awaiting_finalize), the agent's session is not running (it is off the call), once "
        "the step that entered the hold has settled, whichever way the job was asked to end",
    ),
    Invariant(0, "terminates", "internal steps and timeouts alone never run in a cycle"),
)
BY_NUMBER = {inv.number: inv for inv in INVARIANTS}

Finding = tuple[int, str]  # (invariant number, what is wrong)

# the events that may end a hold: the simulator gone, the room gone, the bound, and the
# user's own abort (aclose(graceful=False): no hold, by the user's choice)
_HOLD_ENDS = frozenset({"simulator_left", "room_disconnected", "hold_timeout", "abort"})
# AgentJob's lifecycle before any close (statemachines.agent_job): the states a close leaves
LIFE_UP = tuple(r.source for r in MACHINES["agent_job"].rows if r.event == "close" and r.dest)


def off_the_call(job: str | None, on_call: bool) -> str:
    """What is wrong when the job holds for the simulator's verdict (``job``, the job
    machine's state) with the agent still on the call (``on_call``: its primary session
    started and not closing), or ``""``. livekit closes the session before the hold; so
    does the runtime (the ``job_holding`` watch's ``hang_up``), whoever asked the job to
    end. It applies where the hold was entered by an ``AgentJob``: a ``JobRuntime`` used
    alone has no session of its own to hang up. Invariant 13, and the fuzzer's "off the
    call" check."""
    if job == "awaiting_finalize" and on_call:
        return (
            "the job holds for the simulator's verdict with the agent's session still "
            "running (the agent is still on the call)"
        )
    return ""


def hold_cut(source: str, dest: str, event: str, needed: bool) -> str:
    """The mark for a job step that stops holding while the hold is needed, or ``""``.
    ``needed`` is ``glue.hold_needed`` just after the step."""
    if source in LIVE_JOB and dest not in LIVE_JOB and event not in _HOLD_ENDS and needed:
        return f"job went {source} -> {dest} on {event} with the hold needed"
    return ""


def late_timer(spec: MachineSpec, state: str, event: str) -> str:
    """The mark for a state's timeout event handled in a state that does not arm it."""
    armers = [s.name for s in spec.states if s.timeout is not None and s.timeout.event == event]
    if armers and state not in armers:
        return f"{spec.name} handled {event} after the state that armed it was left"
    return ""


def safety(v: JobView) -> list[Finding]:
    out: list[Finding] = []
    states = v.states
    if v.audio_route == "avatar" and states.get("avatar") not in ROUTED:
        out.append((1, f"audio goes to the avatar while it is {states.get('avatar')}"))
    for i, r in enumerate(v.requests):
        if len(r.replies) > 1:
            out.append((2, f"finalize request #{i + 1} got {len(r.replies)} replies"))
        if "verdict" in r.replies and not r.simulator:
            out.append((2, f"finalize request #{i + 1}, not from the simulator, got the verdict"))
    if v.verdict_reports > 1:
        out.append((2, f"the verdict was delivered {v.verdict_reports} times"))
    if v.deletions:
        job = states.get("job", "")
        if job in LIVE_JOB:
            out.append((3, f"the room was deleted while the job is {job}"))
        for began in v.deletions:
            if began in LIVE_JOB:
                out.append((3, f"the room deletion began while the job was {began}"))
        if len(v.deletions) > 1:
            out.append((3, f"the room deletion ran {len(v.deletions)} times"))
    if len(v.forwarded) > 1:
        out.append((4, f"sessions {', '.join(v.forwarded)} are all forwarded"))
    attached = v.states.get("session_host") == "attached"
    if attached != (len(v.forwarded) == 1) or attached != (v.attached is not None):
        out.append(
            (4, f"session_host is {v.states.get('session_host')} with "
             f"{list(v.forwarded) or 'no'} session forwarded")
        )  # fmt: skip
    elif v.attached is not None and v.forwarded != (v.attached,):
        out.append((4, f"session {v.attached} is attached but {v.forwarded[0]} is forwarded"))
    if v.timers or v.tasks:
        out.extend(_scoped(v))
    for state in v.clear_rpcs:
        # starting: the plugin's start() has not returned, its sink is its own (the SDK's
        # clear reaches it as without the runtime, and the avatar may already be playing)
        if state not in ("starting", "joined", "clearing"):
            out.append((1, f"lk.clear_buffer went to the avatar while it was {state}"))
    for mark in v.marks:
        out.append((7 if mark.startswith("job went") else 6, mark))
    life = states.get("agent_job")
    if life == "closed" and states.get("job") != "closed":
        out.append(
            (10, f"AgentJob's lifecycle is closed while the job machine is {states.get('job')}")
        )
    return out


def _scoped(v: JobView) -> list[Finding]:
    out: list[Finding] = []
    for machine, armed_in in v.timers.items():
        state = v.states.get(machine, "")
        if armed_in != state:
            out.append((6, f"{machine}: the {armed_in} timer is still armed in {state}"))
        elif not _TIMEOUT[machine].get(state, False):
            out.append((6, f"{machine}: a timer is armed in {state}, which has no timeout"))
        elif machine in v.closed:
            out.append((6, f"{machine}: a timer is still armed after its machine closed"))
    for machine, started in v.tasks.items():
        state = v.states.get(machine, "")
        invoked = _INVOKED[machine].get(state, 0)
        for began in started:
            if began != state:
                out.append((6, f"{machine}: the task of {began} still runs in {state}"))
        if machine in v.closed and started:
            out.append((6, f"{machine}: the task of {started[0]} still runs after close"))
        elif len(started) > invoked:
            out.append((6, f"{machine}: {len(started)} tasks run in {state}"))
    return out


def settled(v: JobView) -> list[Finding]:
    """No internal step is left: every consequence of the inputs so far has landed."""
    out: list[Finding] = []
    job = v.states.get("job")
    if job == "awaiting_finalize" and not hold_needed(v):
        if v.finalize_answered:
            why = "the verdict was delivered"
        elif not v.room_connected:
            why = "the room is gone"
        else:
            why = "the simulator is gone"
        out.append((7, f"{why} but the job still holds"))
    if job == "closing" and not v.tasks.get("job"):
        out.append((5, "the close work is done but the job is still closing"))
    life = v.states.get("agent_job")
    if life is not None:
        # what the job_closed watch, the release and the abort's link must have done by now
        if job == "closed" and life != "closed":
            out.append((10, f"the job machine closed but AgentJob's lifecycle is {life}"))
        if v.aborted and job in LIVE_JOB:
            out.append((10, f"aclose(graceful=False) was called but the job is {job}"))
        # what the job_holding watch's hang_up must have done by now
        if held := off_the_call(job, v.on_call):
            out.append((13, held))
    out.extend(_session_gone(v))
    playout = v.states.get("playout")
    if playout is not None:
        # what the session's close link and the avatar's watch must have done by now
        if v.session == "closed" and playout != "closed":
            out.append((9, f"the session closed but playout is still {playout}"))
        avatar = v.states.get("avatar")
        if playout == "remote_playout" and avatar not in PLUGIN_CLEARS:
            out.append((9, f"playout waits for the report of an avatar that is {avatar}"))
        link = v.states.get("participant")
        if playout in QUIET and link != "linked":
            out.append((9, f"the watchdog is {playout} with the participant link {link}"))
        if v.audio_ended and avatar in PLUGIN_CLEARS and playout != "remote_playout":
            # the sink took audio that a joined avatar has not reported: its end is awaited
            out.append((12, f"agent audio waits at the joined avatar while playout is {playout}"))
    return out


def _session_gone(v: JobView) -> list[Finding]:
    """What the primary session's close must have done by now (its links: the host's report
    to the job, the participant link's and the avatar's close)."""
    if v.session != "closed":
        return []
    out: list[Finding] = []
    # a session detached first (or replaced) is not the job's end: the host's table
    if v.states.get("job") == "serving" and v.attached != "B" and not v.primary_closed_detached:
        out.append((11, "the primary session closed but the job still serves"))
    for machine in ("participant", "avatar"):
        state = v.states.get(machine)
        if state is not None and state != "closed":
            out.append((11, f"the primary session closed but the {machine} is {state}"))
    return out


def eventual(v: JobView) -> list[Finding]:
    """Time has passed every bound and nothing is left to run."""
    out: list[Finding] = []
    avatar, job = v.states.get("avatar"), v.states.get("job")
    if v.audio_route == "avatar" and avatar != "joined":
        out.append((1, f"after every bound the audio still goes to an avatar in {avatar}"))
    elif v.audio_route == "avatar" and not v.avatar_present:
        out.append((1, "after every bound the audio still goes to an avatar that left"))
    serving = job == MACHINES["job"].initial and not v.shutdown_asked
    for i, r in enumerate(v.requests):
        if r.owed and not r.replies and not r.excused:
            if r.answering and serving:
                # on_simulation_end still runs: nothing bounds it while the job serves; the
                # job's end does (the host's drain, then an error reply)
                continue
            out.append((2, f"finalize request #{i + 1} was never answered"))
    if (v.shutdown_asked or job != MACHINES["job"].initial) and job != "closed":
        out.append((5, f"after every bound the job is still {job}"))
    elif job == "closed" and not v.close_timed_out:
        # closed by its close work, which must then have been done
        host = v.states.get("session_host")
        if host != "closed" or not v.room_work_done or (v.deletion_asked and not v.deletions):
            room = "connected" if v.room_connected else "disconnected"
            room = "deleted" if v.deletions else room
            out.append(
                (5, f"the job closed without its close work (session_host {host}, room {room})")
            )
    if job == "closed":
        # its close closed them (the callbacks step), not only the release that stops them
        for machine in ("participant", "avatar"):
            state = v.states.get(machine)
            if state is not None and state != "closed":
                out.append((11, f"after every bound the job closed but the {machine} is {state}"))
    life = v.states.get("agent_job")
    if life is not None and life != "closed" and (life not in LIFE_UP or job == "closed"):
        # the job machine closed, or the user called aclose(): it returns once closed
        out.append((10, f"after every bound AgentJob's lifecycle is {life} (the job {job})"))
    if v.audio_pending:
        playout = v.states.get("playout")
        out.append(
            (
                9,
                "after every bound the agent's audio still waits at the avatar, unreported "
                f"(avatar {v.states.get('avatar')}, playout {playout})",
            )
        )
    who, here = v.linked, v.linked_present
    if who is None and v.states.get("session") in ("started", "ended"):
        # nobody linked once the session started, though someone the link could follow was
        # there after the job started: the link must have heard them leave
        who, here = v.first_eligible, v.first_eligible_present
    if v.close_on_disconnect and who is not None and not here:
        if v.session == "hung":
            # the link gives up on it, and the job does not serve on with it
            serves = job == "serving" and not v.shutdown_asked
            if v.states.get("participant") != "closed" or serves:
                out.append(
                    (
                        8,
                        f"the session's close hangs, the link is {v.states.get('participant')} "
                        f"and the job is {job}",
                    )
                )
        elif v.session == "failed":
            out.extend(_close_failed(v))
        elif v.session != "closed":
            out.append((8, f"{who} left but the session is still {v.session}"))
    return out


def _close_failed(v: JobView) -> list[Finding]:
    """The session's close failed (livekit never says ``close``, so it never stops as a
    closed one does): the link is closed, and when it was the one to hear the failure, the
    job was shut down with that failure as its reason."""
    link, job = v.states.get("participant"), v.states.get("job")
    told = v.close_failed is None or any(v.close_failed in r for r in v.shutdown_reasons)
    if link == "closed" and told and v.shutdown_asked:
        return []
    heard = "never heard" if v.close_failed is None else f"heard ({v.close_failed})"
    return [
        (
            8,
            f"the session's close failed, the link is {link} (the failure {heard}) and the "
            f"job is {job}" + ("" if told else ", shut down for another reason"),
        )
    ]
