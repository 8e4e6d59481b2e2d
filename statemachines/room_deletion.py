"""Room deletion: asked for by anyone, run once, and only when the job allows it.

Deletion is asked for (``request``) by an end-call tool (``request_room_deletion``), or,
with ``delete_room_on_close``, by the attached session closing or by the job closing. The
job allows it (``allow``) from ``closing``, once the hold is over and its room work (host
closed, room disconnected, or left to livekit's shutdown when that was asked) is done. It
then runs once, as the task of ``deleting``, bounded by ``close_timeout``; a request that
arrives after ``allow`` runs at once. Its failure and its cut-off are logged. ``close`` is
the job runtime being released (``aclose()``): a deletion asked for but never allowed is
abandoned then; one under way runs on to its own bound, and ``aclose()`` returns once it
ends (the job itself closed before: its room step waits only its share of
``close_timeout``, so a hung deletion costs the shutdown callbacks nothing).
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

WAITING = ["kept", "requested", "allowed"]
FINAL = ["deleted", "failed", "abandoned", "closed"]
RESULTS = ["delete_done", "delete_failed", "delete_timeout"]
EVENTS = ("request", "allow", *RESULTS, "close")

ROOM_DELETION = MachineSpec(
    name="room_deletion",
    description="One per job: the room is deleted once asked and allowed, never before.",
    initial="kept",
    states=(
        State(name="kept", description="nobody asked; the job does not allow it yet"),
        State(name="requested", description="asked for; waits for the job to allow it"),
        State(name="allowed", description="the hold is over and the room work done; not asked"),
        State(
            name="deleting",
            timeout=StateTimeout(event="delete_timeout", setting="close_timeout", default=10.0),
            invoke=("delete_room",),
            description="the server call runs, bounded",
        ),
        State(name="deleted", final=True, description="the server deleted the room"),
        State(name="failed", final=True, description="the server call failed (logged)"),
        State(
            name="abandoned",
            final=True,
            description="cut at its bound, or asked for but never allowed (logged)",
        ),
        State(name="closed", final=True, description="released; nobody asked, the room stays"),
    ),
    events=EVENTS,
    effects=(
        Effect(
            name="delete_room",
            error_event="delete_failed",
            description="delete the room through the server (reported as delete_done)",
        ),
        Effect(name="record_deleted", description="room_deleted_at: now"),
        Effect(name="report_failure", description="log why the server call failed"),
        Effect(name="report_cut", description="log that the call was cut off, and after how long"),
        Effect(name="report_never_allowed", description="log that the asked deletion never ran"),
    ),
    rows=(
        *row("kept", "request", "requested"),
        *row("kept", "allow", "allowed"),
        *row("requested", "allow", "deleting"),
        *row("allowed", "request", "deleting"),  # asked after the room work: at once
        *row("deleting", "delete_done", "deleted", effects=["record_deleted"]),
        *row("deleting", "delete_failed", "failed", effects=["report_failure"]),
        *row("deleting", "delete_timeout", "abandoned", effects=["report_cut"]),
        *row(["kept", "allowed"], "close", "closed"),
        # the job closed before its room work was done (its own bound ran out)
        *row("requested", "close", "abandoned", effects=["report_never_allowed"]),
    ),
    ignore=(
        *cells("requested", "request", "asked already: it runs once"),
        *cells("allowed", "allow", "allowed already"),
        *cells(WAITING, RESULTS, "only deleting runs the call and arms its bound"),
        *cells("deleting", ["request", "allow"], "it runs once"),
        *cells(
            "deleting",
            "close",
            "bounded by its own timeout: it runs on to that bound; aclose() returns once it ends",
        ),
        *cells(FINAL, EVENTS, "final"),
    ),
)
