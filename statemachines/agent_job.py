"""The job's own lifecycle: what ``AgentJob.start()``, ``aclose()`` and an abort do, in any
order and at once.

``start`` is the whole start (``AgentJob.start()``); ``start_part`` one of the agent's
parts of it (``start_avatar``, ``start_session``: the avatar may start before or after the
session; ``follow_room`` is ``start_runtime()``, which moves nothing and is refused once
the job is closing, like every start). The job is
``running`` once its session runs. ``close`` is a graceful ``aclose()``: the ``job``
machine shuts down (holding for a simulator if one can still ask); ``abort`` is
``aclose(graceful=False)``: the same teardown with no hold. Either way ``closing`` runs the
declared teardown (``statemachines.system.TEARDOWN``) as its task: the parts of a start
still running are cut, the ``job`` machine closes (host, session, avatar, room,
callbacks), then the followers are released; ``released`` ends it. The ``job`` machine
closing on its own (the user left, the room went away, or before the job started) is
``job_closed``. The ``job`` machine holding for the simulator's verdict is ``job_holding``:
the agent hangs up first (livekit closes the primary session before ``on_session_end``),
whoever asked the job to end. A session still starting cannot close yet: the lifecycle
remembers the hold (``held`` before any part started, ``starting_held`` while one runs) and
hangs up once the session runs.
"""

from .spec import Cell, Effect, MachineSpec, State, cells, row

STARTS = ["start", "start_part", "follow_room"]
EVENTS = (
    "start",  # AgentJob.start(): the whole start
    "start_part",  # one of the agent's parts of it: the avatar, the session
    "follow_room",  # start_runtime(): follow the room, start the job machine and its host
    "started",  # the session runs under the job
    "start_failed",  # a part of the start raised, or its caller cancelled it
    "close",  # aclose(): shut down, honouring the bounded hold
    "abort",  # aclose(graceful=False): the same teardown, no hold
    "job_closed",  # the job machine closed on its own
    "job_holding",  # the job machine holds for the simulator's verdict
    "released",  # the teardown's steps have all run (or been cut at their bounds)
)
# before any part of the agent started; once one did, before the job closes
IDLE = ["new", "held"]
STARTING = ["starting", "starting_held"]
UP = [*STARTING, "running"]


def _refused(states: list[str], note: str) -> list[Cell]:
    return cells(states, STARTS, note)


AGENT_JOB = MachineSpec(
    name="agent_job",
    description="One per AgentJob: started once, closed once, whatever the order of the calls.",
    initial="new",
    states=(
        State(name="new", description="built; no part of the agent started"),
        State(
            name="held",
            description="nothing started and the job already holds: a session would hang up",
        ),
        State(name="starting", description="the runtime, the avatar and the session start"),
        State(
            name="starting_held",
            description="starting while the job holds: its session hangs up once it runs",
        ),
        State(name="running", description="the session runs under the job"),
        State(
            name="closing",
            invoke=("run_teardown",),
            description="the declared teardown: starts cut, the job closed, followers released",
        ),
        State(name="closed", final=True, description="every listener and task released"),
    ),
    events=EVENTS,
    effects=(
        Effect(
            name="run_teardown",
            error_event="released",
            description="cut the start, close the job machine, release (each step bounded)",
        ),
        Effect(
            name="ask_shutdown",
            description="the session closes (livekit's order), then the job machine: shutdown",
        ),
        Effect(name="ask_abort", description="the job machine: abort (no hold)"),
        Effect(name="hang_up", description="close the session: nobody's call during a hold"),
    ),
    rows=(
        *row("new", "start", "starting"),
        *row("new", "start_part", "starting"),
        # the job held before its agent started (start_runtime(), then a shutdown): a start
        # goes on, as livekit lets it, and hangs up once its session runs
        *row("held", "start", "starting_held"),
        *row("held", "start_part", "starting_held"),
        *row([*IDLE, *UP], "close", "closing", effects=["ask_shutdown"]),
        *row([*IDLE, *UP], "abort", "closing", effects=["ask_abort"]),
        # another part of the start (the avatar before or after the session) goes on
        *row(UP, "start_part", None),
        *row("starting", "started", "running"),
        # the end was asked while the session started (its agent's on_enter, a watchdog
        # during a slow avatar): a session still starting cannot close yet, so it does now
        *row("starting_held", "started", "running", effects=["hang_up"]),
        # what did start is released; start() raises the part's error
        *row(STARTING, "start_failed", "closing", effects=["ask_abort"]),
        # the job closed on its own (never started, or its room went away): release the rest
        *row([*IDLE, *UP], "job_closed", "closing"),
        # however the job was asked to end (the agent's job.shutdown(), the job machine's
        # own shutdown), it holds off the call, as livekit's end does: at once if the
        # session runs, else once it does
        *row("new", "job_holding", "held"),
        *row("starting", "job_holding", "starting_held"),
        *row(["running", "closing"], "job_holding", None, effects=["hang_up"]),
        # an abort while a graceful close holds ends the hold: the close goes on without it
        *row("closing", "abort", None, effects=["ask_abort"]),
        *row("closing", "released", "closed"),
    ),
    ignore=(
        *cells([*IDLE, *UP], "follow_room", "following the room is no part of the agent"),
        *cells(IDLE, ["started", "start_failed", "released"], "nothing runs"),
        *cells(["held", "starting_held"], "job_holding", "the job already holds"),
        *cells(UP, "released", "no teardown runs"),
        *cells("running", "started", "the session already runs"),
        *cells("running", "start_failed", "a later part's failure is its caller's to handle"),
        *cells("closing", ["started", "start_failed"], "the start was cut"),
        *cells("closing", ["close", "job_closed"], "already closing"),
        *cells("closed", [e for e in EVENTS if e not in STARTS], "the job is over"),
    ),
    reject=(
        *cells(STARTING, "start", "the job is already starting"),
        *cells("running", "start", "the job is already started"),
        *_refused(["closing", "closed"], "the job is closed"),
    ),
)
