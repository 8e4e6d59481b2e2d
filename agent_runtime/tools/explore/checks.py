"""What must hold in the composed job, as predicates over a ``World``.

Three kinds of check, by when they apply:

* ``safety``: in every reached world, mid-cascade included;
* ``settled``: in every world where no internal step is left to run (every mailbox empty,
  no work running aside), however the inputs arrived;
* ``eventual``: in every world reached from any explored one by letting time pass alone
  (internal steps and every enabled timeout, in every order) until nothing is left to run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import ANSWERED, EXCUSED, LIVE_JOB, Facts, Model

# the avatar states in which our route may be in
ROUTED = ("starting", "routing", "joined", "clearing")


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
        "(unless the simulator left or the room went first): with the verdict, or with an "
        "explicit error; the verdict goes to the simulator only",
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
        "job reaches closed, through its close work (host closed, room disconnected, deleted "
        "if asked) unless the close bound ran out, and not later than that work",
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
        "a linked user who left does not keep the session open past the grace bound, and a "
        "session close that hangs past its bound shuts the job down",
    ),
    Invariant(0, "terminates", "internal steps and timeouts alone never run in a cycle"),
)
BY_NUMBER = {inv.number: inv for inv in INVARIANTS}

Finding = tuple[int, str]  # (invariant number, what is wrong)


def holds(w: Facts) -> bool:
    """``safety`` is empty: the same predicates in one expression (it runs on every world
    every move passes through)."""
    attached = w.host == "attached"
    return not (
        (w.route == "avatar" and w.avatar not in ROUTED)
        or w.verdicts > 1
        or (w.deletions and w.job in LIVE_JOB)
        or w.deletions > 1
        or len(w.subscribed) > 1
        or attached != (len(w.subscribed) == 1)
        or attached != bool(w.attached)
        or (w.t_avatar and w.t_avatar != w.avatar)
        or (w.t_job and w.t_job != w.job)
        or (w.t_part and w.t_part != w.part)
        or (w.t_dele and w.t_dele != w.dele)
        or (w.t_host and w.t_host != w.host)
        or (w.job_task and not w.job_task.startswith(w.job + ":"))
        or (w.dele_task and not w.dele_task.startswith(w.dele + ":"))
        or (w.host_task and not w.host_task.startswith(w.host + ":"))
        or (w.fin_task and not w.fin_task.startswith(w.fin + ":"))
        or w.late
        or (w.av_task and not w.av_task.startswith(w.avatar + ":"))
        or (w.avatar_actor_closed and w.av_task)
        or (w.host_actor_closed and w.fin_task)
        or w.hold_cut
        or any(status == "twice" for _, status in w.requests)
        or (w.stranger_req >= 0 and w.requests[w.stranger_req][1] == "verdict")
    )


def safety(model: Model, w: Facts) -> list[Finding]:
    if holds(w):
        return []
    out: list[Finding] = []
    if w.route == "avatar" and w.avatar not in ROUTED:
        out.append((1, f"audio goes to the avatar while it is {w.avatar}"))
    for i, (_, status) in enumerate(w.requests):
        if status == "twice":
            out.append((2, f"finalize request #{i + 1} got two replies"))
    if w.verdicts > 1:
        out.append((2, f"the verdict was delivered {w.verdicts} times"))
    if w.stranger_req >= 0 and w.requests[w.stranger_req][1] == "verdict":
        n = w.stranger_req + 1
        out.append((2, f"finalize request #{n}, not from the simulator, got the verdict"))
    if w.deletions and w.job in LIVE_JOB:
        out.append((3, f"the room was deleted while the job is {w.job}"))
    if w.deletions > 1:
        out.append((3, f"the room deletion ran {w.deletions} times"))
    if len(w.subscribed) > 1:
        out.append((4, f"sessions {', '.join(w.subscribed)} are all forwarded"))
    if (w.host == "attached") != (len(w.subscribed) == 1) or (w.host == "attached") != bool(
        w.attached
    ):
        out.append(
            (4, f"session_host is {w.host} with {list(w.subscribed) or 'no'} session forwarded")
        )
    out.extend(_scoped(model, w))
    if w.hold_cut:
        out.append((7, w.hold_cut))
    return out


def _scoped(model: Model, w: Facts) -> list[Finding]:
    out: list[Finding] = []
    for machine, armed_in, state in (
        ("avatar", w.t_avatar, w.avatar),
        ("job", w.t_job, w.job),
        ("participant", w.t_part, w.part),
        ("room_deletion", w.t_dele, w.dele),
        ("session_host", w.t_host, w.host),
    ):
        if armed_in and armed_in != state:
            out.append((6, f"{machine}: the {armed_in} timer is still armed in {state}"))
    for machine, task, state in (
        ("job", w.job_task, w.job),
        ("avatar", w.av_task, w.avatar),
        ("room_deletion", w.dele_task, w.dele),
        ("session_host", w.host_task, w.host),
        ("finalize", w.fin_task, w.fin),
    ):
        if task and task.split(":")[0] != state:
            out.append((6, f"{machine}: the task of {task.split(':')[0]} still runs in {state}"))
    if w.late:
        out.append((6, w.late))
    if w.avatar_actor_closed and w.av_task:
        out.append((6, f"avatar: the task of {w.av_task.split(':')[0]} still runs after close"))
    if w.host_actor_closed and w.fin_task:
        out.append((6, "finalize: on_simulation_end still runs after the host closed"))
    return out


def settled(model: Model, w: Facts) -> list[Finding]:
    """No internal step is left: every consequence of the inputs so far has landed."""
    out: list[Finding] = []
    if w.job == "awaiting_finalize" and not model.hold_needed(w):
        if w.fin_answered:
            why = "the verdict was delivered"
        elif w.room != "connected":
            why = "the room is gone"
        else:
            why = "the simulator is gone"
        out.append((7, f"{why} but the job still holds"))
    if w.job == "closing" and not w.job_task:
        out.append((5, "the close work is done but the job is still closing"))
    return out


def eventual(model: Model, w: Facts) -> list[Finding]:
    """Time has passed every bound and nothing is left to run."""
    out: list[Finding] = []
    if w.route == "avatar" and w.avatar != "joined":
        out.append((1, f"after every bound the audio still goes to an avatar in {w.avatar}"))
    elif w.route == "avatar" and not w.av_present:
        out.append((1, "after every bound the audio still goes to an avatar that left"))
    serving = w.job == model.specs["job"].initial and not w.shutdown_asked
    for i, (owed, status) in enumerate(w.requests):
        if owed and status not in ANSWERED and status not in EXCUSED:
            if status == "taken" and serving:
                # on_simulation_end still runs: nothing bounds it while the job serves; the
                # job's end does (the host's drain, then an error reply)
                continue
            out.append((2, f"finalize request #{i + 1} was never answered ({status})"))
    if (w.shutdown_asked or w.job != model.specs["job"].initial) and w.job != "closed":
        out.append((5, f"after every bound the job is still {w.job}"))
    elif w.job == "closed" and not w.close_timed_out:
        # closed by its close work, which must then have been done
        asked = w.deletion_requested or model.config.delete_room_on_close
        if w.host != "closed" or not w.room_step_done or (asked and not w.deletions):
            out.append(
                (
                    5,
                    f"the job closed without its close work (session_host {w.host}, room "
                    f"{'deleted' if w.deletions else w.room})",
                )
            )
    if model.config.close_on_disconnect and w.linked and not w.user:
        if w.sess_a == "hung":
            if w.part != "closed" or not w.shutdown_asked:
                out.append(
                    (8, f"session A's close hangs, the link is {w.part} and the job is {w.job}")
                )
        elif w.sess_a != "closed":
            out.append((8, f"the user left but session A is still {w.sess_a}"))
    return out
