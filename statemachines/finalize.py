"""The answer to the simulator's ``finalize_simulation``: given once, never silence.

The session host forwards each well-formed finalize (``request``). The first one is
answered: ``answering`` runs the agent's ``on_simulation_end`` as its task (it often calls
a model) and reports ``verdict_ready``; ``replying`` sends the verdict, which is
``delivered`` (``answered``: the job is told) or ``undelivered`` (back to ``idle`` with the
verdict kept: a retry gets the same one, ``on_simulation_end`` does not run twice). The
simulator asking again (its own wait for the reply ran out, and livekit's ``RemoteSession``
forgets a request it stopped waiting for) gets the same verdict: while it is computed, the
new request waits for it with the first; once it is known, the kept verdict is sent at
once. A finalize in a job that is not a simulation gets an explicit error reply. ``close``
comes from the host closing, after its drain: an answer still being computed is cut and
each request waiting for it gets its one error reply.
"""

from .spec import Effect, MachineSpec, State, cells, row

EVENTS = ("request", "verdict_ready", "delivered", "undelivered", "close")

FINALIZE = MachineSpec(
    name="finalize",
    description="One per job: the simulation verdict, computed once, for the simulator only.",
    initial="idle",
    states=(
        State(name="idle", description="no finalize answered yet"),
        State(
            name="answering",
            invoke=("compute_verdict",),
            description="on_simulation_end runs for the request in hand",
        ),
        State(name="replying", description="the verdict is being sent"),
        State(name="answered", description="the verdict reached the transport; the job knows"),
        State(name="closed", final=True, description="the host closed; nothing is answered"),
    ),
    events=EVENTS,
    guards=("simulation",),  # the job is a simulation
    effects=(
        Effect(name="take_request", description="remember the request being answered"),
        Effect(
            name="compute_verdict",
            # a failed on_simulation_end is answered too, so its failure leads where a
            # verdict does; the runtime traces it as the effect's error
            error_event="verdict_ready",
            description=(
                "run on_simulation_end once (a retry reuses its verdict): verdict_ready, "
                "also when it raised (the reply then carries its error)"
            ),
        ),
        Effect(
            name="send_verdict",
            error_event="undelivered",
            description="reply with the verdict (reported as delivered)",
        ),
        Effect(name="report_answered", description="tell the job the verdict was delivered"),
        Effect(
            name="await_verdict",
            description="the simulator asked again: the verdict, once ready, answers this too",
        ),
        Effect(
            name="resend_verdict",
            description="the simulator asked again: reply with the kept verdict (not run again)",
        ),
        Effect(name="refuse_not_simulation", description="error reply: not a simulation"),
        Effect(
            name="reply_unfinished",
            description=(
                "error reply to each waiting request: on_simulation_end did not finish "
                "before the host closed"
            ),
        ),
    ),
    rows=(
        *row("idle", "request", "answering", guards=["simulation"], effects=["take_request"]),
        *row("idle", "request", None, effects=["refuse_not_simulation"]),
        *row("answering", "request", None, effects=["await_verdict"]),
        *row(["replying", "answered"], "request", None, effects=["resend_verdict"]),
        *row("answering", "verdict_ready", "replying", effects=["send_verdict"]),
        *row("replying", "delivered", "answered", effects=["report_answered"]),
        *row("replying", "undelivered", "idle"),  # the verdict is kept for a retry
        *row(["idle", "answered"], "close", "closed"),
        *row("answering", "close", "closed", effects=["reply_unfinished"]),
    ),
    ignore=(
        *cells(["idle", "replying", "answered"], "verdict_ready", "stale task"),
        *cells(["idle", "answering", "answered"], ["delivered", "undelivered"], "stale reply"),
        *cells("replying", "close", "the reply is going out: delivered or undelivered follows"),
        *cells("closed", EVENTS, "the host is closed"),
    ),
)
