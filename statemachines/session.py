"""The job's sessions, as the job hears them: one actor per job.

The job's own session (the one ``AgentJob`` starts and the participant link follows) is
``new`` until a start of the job takes it (``start``); from then on another start is
refused, whether the first one is still running, finished or failed. Each time a session
of the job closes (``session_closed``: livekit's ``close`` event, which one listener per
session hears), the session host is told, and decides whether it was the attached one; the
job's own session closing is also told to the participant link, the avatar and playout,
and once it was started that ends its life here (``ended``). A session attached in its
place is still heard after that. A job with no own session (``JobRuntime`` used alone)
stays ``new``. ``close`` is the job letting its sessions go: nothing is heard any more.
"""

from .spec import Effect, MachineSpec, State, cells, row

HEARING = ["new", "started", "ended"]

SESSION = MachineSpec(
    name="session",
    description="One per job: a session of the job closing, told to whoever follows it.",
    initial="new",
    states=(
        State(
            name="new",
            description="the job's own session is not started (or it has none): a start takes it",
        ),
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
        # closed before any start: livekit lets it start again, and so does the job
        *row(
            "new",
            "session_closed",
            None,
            guards=["is_own"],
            effects=["report_closed", "report_own_closed"],
        ),
        *row(
            "started",
            "session_closed",
            "ended",
            guards=["is_own"],
            effects=["report_closed", "report_own_closed"],
        ),
        # any other session, or the own one closing again (started by hand and attached
        # again): only the host can tell whether it mattered
        *row(HEARING, "session_closed", None, effects=["report_closed"]),
        *row(HEARING, "close", "closed"),
    ),
    ignore=(*cells("closed", ["session_closed", "close"], "let go: nothing is heard"),),
    reject=(
        *cells(["started", "ended"], "start", "the job's session is already started (or closed)"),
        *cells("closed", "start", "the job is closed"),
    ),
)
