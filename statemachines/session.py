"""The job's sessions, as the job hears them: one actor per job.

The job's own session (the one ``AgentJob`` starts and the participant link follows) is
``new`` until a start of the job takes it (``start``); from then on another start is
refused, whether the first one is still running, finished or failed. A session of the job
closing (``session_closed``, the SDK's close event, heard once per session) is told to the
session host, which decides whether it was the attached one; the job's own session closing
is also told to the participant link, the avatar and playout, and ends the own session's
life here (``ended``). A session attached in its place is still heard after that. ``close``
is the job letting its sessions go: nothing is heard any more.
"""

from .spec import Effect, MachineSpec, State, cells, row

HEARING = ["new", "started", "ended"]

SESSION = MachineSpec(
    name="session",
    description="One per job: a session of the job closing, told to whoever follows it.",
    initial="new",
    states=(
        State(name="new", description="the job's own session is not started: a start takes it"),
        State(
            name="started",
            description="a start of the job took its session: another start is refused",
        ),
        State(
            name="ended",
            description="the job's own session closed; a session attached in its place is heard",
        ),
        State(name="closed", final=True, description="let go: no session's close is heard"),
    ),
    events=(
        "start",  # a start of the job takes its own session
        "session_closed",  # {session, reason}: a session of the job closed (the SDK's event)
        "close",
    ),
    guards=("is_own",),  # the closed session is the job's own
    effects=(
        Effect(name="report_closed", description="tell the session host a session closed"),
        Effect(
            name="report_own_closed",
            description="tell the participant link, the avatar and playout: the session ended",
        ),
    ),
    rows=(
        *row("new", "start", "started"),
        *row(
            ["new", "started"],
            "session_closed",
            "ended",
            guards=["is_own"],
            effects=["report_closed", "report_own_closed"],
        ),
        # the SDK says a session closed once; a second word of the own one changes nothing
        *row("ended", "session_closed", None, guards=["is_own"]),
        *row(HEARING, "session_closed", None, effects=["report_closed"]),
        *row(HEARING, "close", "closed"),
    ),
    ignore=(*cells("closed", ["session_closed", "close"], "let go: nothing is heard"),),
    reject=(
        *cells(["started", "ended"], "start", "the job's session is already started (or closed)"),
        *cells("closed", "start", "the job is closed"),
    ),
)
