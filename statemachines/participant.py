"""The linked participant: a user who leaves is noticed at once, a user who drops and
comes back is heard again.

A closing disconnect reason closes the session (reason ``participant_disconnected``), which
drives the job; any other reason opens a ``grace`` period in which the same identity
relinks; the grace timer ends it. A session whose close hangs is given up after
``session_close_timeout``; one that ends without the session saying it closed (it failed,
or could not even be asked: ``close_failed``) at once. The link is ``closed`` and says so,
and the job shuts down without the session.

Guards (evaluated by the runtime on the event's data):

- ``eligible``: the joining participant may be linked (its identity matches the configured
  one, or none is configured; its kind is allowed; it does not publish on the agent's behalf).
- ``is_linked`` / ``same_identity``: the event is about the identity the link follows.
- ``closing_reason``: ``close_on_disconnect`` is on and the reason is a closing reason.
- ``grace_enabled``: a departure for another reason waits for a rejoin: ``grace_period > 0``,
  or ``close_on_disconnect`` is off (then grace has no timer: a departure never closes).
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

LIVE = ["waiting", "linked", "grace"]
EVENTS = (
    "participant_connected",
    "participant_disconnected",
    "grace_timeout",
    "session_close_timeout",
    "close_failed",
    "session_closed",
    "close",
)

PARTICIPANT = MachineSpec(
    name="participant",
    description="The participant the session is linked to.",
    initial="waiting",
    states=(
        State(name="waiting", description="nobody linked yet"),
        State(name="linked", description="the session hears this participant"),
        State(
            name="grace",
            timeout=StateTimeout(event="grace_timeout", setting="grace_period", default=15.0),
            description="dropped for a non-closing reason; the same identity may rejoin",
        ),
        State(
            name="closing",
            # livekit bounds AgentSession.aclose() by 60 s at job shutdown; so does the link
            timeout=StateTimeout(
                event="session_close_timeout", setting="session_close_timeout", default=60.0
            ),
            description="the session is closing: participant_disconnected",
        ),
        State(name="closed", final=True, description="the session closed or the link did"),
    ),
    events=EVENTS,
    guards=("eligible", "is_linked", "closing_reason", "grace_enabled", "same_identity"),
    effects=(
        Effect(name="link", description="follow this identity; point the room input at it"),
        Effect(name="relink", description="point the room input at the rejoined participant"),
        Effect(
            name="close_session",
            # a close that cannot even be asked leaves nothing to wait for; the session
            # did not close, so the link gives up on it as on a close that hangs (the
            # runtime posts close_failed too for a close that ends without `close`)
            error_event="close_failed",
            description="close the session with reason participant_disconnected",
        ),
        Effect(
            name="report_close_timed_out",
            description=(
                "log and emit close_timed_out (the close hung, or could not be asked): the "
                "job shuts down without the session"
            ),
        ),
    ),
    rows=(
        *row("waiting", "participant_connected", "linked", guards=["eligible"], effects=["link"]),
        *row("waiting", "participant_connected", None),  # not eligible: keep waiting
        *row(
            "linked",
            "participant_disconnected",
            "closing",
            guards=["is_linked", "closing_reason"],
            effects=["close_session"],
        ),
        *row("linked", "participant_disconnected", "grace", guards=["is_linked", "grace_enabled"]),
        *row(
            "linked",
            "participant_disconnected",
            "closing",
            guards=["is_linked"],  # grace_period=0: no grace, close at once
            effects=["close_session"],
        ),
        *row("linked", "participant_disconnected", None),  # someone else left: nothing
        *row(
            "grace", "participant_connected", "linked", guards=["same_identity"], effects=["relink"]
        ),
        *row("grace", "participant_connected", None),  # someone else joined: keep waiting
        *row("grace", "grace_timeout", "closing", effects=["close_session"]),
        *row("closing", "session_close_timeout", "closed", effects=["report_close_timed_out"]),
        *row("closing", "close_failed", "closed", effects=["report_close_timed_out"]),
        *row([*LIVE, "closing"], "session_closed", "closed"),
        *row([*LIVE, "closing"], "close", "closed"),
    ),
    ignore=(
        *cells("waiting", "participant_disconnected", "nobody is linked"),
        *cells(
            "linked",
            "participant_connected",
            "already linked; rtc.Room delivers a same-identity rejoin only after its leave",
        ),
        *cells("grace", "participant_disconnected", "the linked identity is already gone"),
        *cells(["waiting", "linked", "closing"], "grace_timeout", "only grace arms the timer"),
        *cells(LIVE, "session_close_timeout", "only closing arms the timer"),
        *cells(LIVE, "close_failed", "only closing asks the session to close"),
        *cells(
            "closing",
            ["participant_connected", "participant_disconnected"],
            "the close is under way; a rejoin cannot undo it",
        ),
        *cells("closed", EVENTS, "final"),
    ),
)
