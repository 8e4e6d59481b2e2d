"""The linked participant: a user who leaves is noticed at once, a user who drops and
comes back is heard again.

A closing disconnect reason closes the session (reason ``participant_disconnected``), which
drives the job; any other reason opens a ``grace`` period in which the same identity
relinks; the grace timer ends it.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

LIVE = ["waiting", "linked", "grace"]

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
        State(name="closing", description="the session is closing: participant_disconnected"),
        State(name="closed", final=True),
    ),
    events=(
        "participant_connected",
        "participant_disconnected",
        "grace_timeout",
        "session_closed",
        "close",
    ),
    guards=("eligible", "is_linked", "closing_reason", "grace_enabled", "same_identity"),
    effects=(
        Effect(name="link", description="link the session's room input to the participant"),
        Effect(name="relink", description="point the room input at the rejoined participant"),
        Effect(
            name="close_session",
            error_event="session_closed",
            description="close the session with reason participant_disconnected",
        ),
    ),
    rows=(
        *row("waiting", "participant_connected", "linked", guards=["eligible"], effects=["link"]),
        *row("waiting", "participant_connected", None),
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
            guards=["is_linked"],
            effects=["close_session"],
        ),
        *row("linked", "participant_disconnected", None),
        *row(
            "grace", "participant_connected", "linked", guards=["same_identity"], effects=["relink"]
        ),
        *row("grace", "participant_connected", None),
        *row("grace", "grace_timeout", "closing", effects=["close_session"]),
        *row([*LIVE, "closing"], "session_closed", "closed"),
        *row([*LIVE, "closing"], "close", "closed"),
    ),
    ignore=(
        *cells("waiting", "participant_disconnected", "nobody is linked"),
        *cells("linked", "participant_connected", "already linked"),
        *cells("grace", "participant_disconnected", "the linked participant is already gone"),
        *cells(["waiting", "linked", "closing"], "grace_timeout"),
        *cells("closing", ["participant_connected", "participant_disconnected"]),
        *cells(
            "closed",
            [
                "participant_connected",
                "participant_disconnected",
                "grace_timeout",
                "session_closed",
                "close",
            ],
        ),
    ),
)
