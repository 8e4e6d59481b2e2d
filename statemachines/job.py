"""The job shutdown: the simulation verdict is never lost, and nothing waits on a
participant who cannot answer.

Shutdown (asked, or the attached session closing) holds in ``awaiting_finalize`` only while
a simulator is there to ask: ``hold_needed`` = the job is a simulation, a participant with
the ``lk.simulator`` attribute is present, the room is connected and no finalize was
answered yet. The hold ends on the first of: finalize answered, the simulator left (other
participants such as a SIP leg or an avatar do not count), the room disconnected,
``session_end_timeout``, or an ``abort`` (``AgentJob.aclose(graceful=False)``: no hold).
``closing`` closes the host, then the room work (disconnect; a room whose livekit job was
asked to shut down is livekit's to disconnect, after ``on_session_end``), then
allows the room deletion (``room_deletion``) and waits for it, then runs the shutdown
callbacks, all bounded by ``close_timeout``.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

ENDS = ["shutdown", "session_closed"]
EVENTS = (
    "shutdown",  # {reason}
    "abort",  # AgentJob.aclose(graceful=False): close now, no hold
    "session_closed",  # {reason}: the attached session closed
    "finalize_answered",  # the verdict reply went out
    "simulator_left",  # the last lk.simulator participant left (or lost the attribute)
    "room_disconnected",  # {reason}
    "hold_timeout",
    "close_done",
    "close_timeout",
)

JOB = MachineSpec(
    name="job",
    description="One per job: serving until shutdown, holding for the simulator, closing.",
    initial="serving",
    states=(
        State(name="serving", description="the session is live"),
        State(
            name="awaiting_finalize",
            timeout=StateTimeout(
                event="hold_timeout", setting="session_end_timeout", default=300.0
            ),
            description="host answering, room kept, deletion deferred until the simulator is done",
        ),
        State(
            name="closing",
            timeout=StateTimeout(event="close_timeout", setting="close_timeout", default=10.0),
            invoke=("run_close",),
            description="close the host, the room work, then the shutdown callbacks, bounded",
        ),
        State(name="closed", final=True),
    ),
    events=EVENTS,
    guards=("hold_needed",),
    effects=(
        Effect(
            name="run_close",
            error_event="close_done",
            description="close host, disconnect, allow the room deletion, shutdown callbacks",
        ),
        Effect(name="report_cut", description="log what the close bound cut off, and when"),
    ),
    rows=(
        *row("serving", "shutdown", "awaiting_finalize", guards=["hold_needed"]),
        *row("serving", "shutdown", "closing"),
        *row(["serving", "awaiting_finalize"], "abort", "closing"),
        *row("serving", "session_closed", "awaiting_finalize", guards=["hold_needed"]),
        *row("serving", "session_closed", "closing"),
        # as upstream's JobContext: the simulator leaving ends the run
        *row("serving", "simulator_left", "closing"),
        *row("serving", "room_disconnected", "closing"),
        *row("awaiting_finalize", "finalize_answered", "closing"),
        *row("awaiting_finalize", "simulator_left", "closing"),
        *row("awaiting_finalize", "room_disconnected", "closing"),
        *row("awaiting_finalize", "hold_timeout", "closing"),
        *row("closing", "close_done", "closed"),
        *row("closing", "close_timeout", "closed", effects=["report_cut"]),
    ),
    ignore=(
        *cells("serving", "finalize_answered", "answered early: no hold will be needed"),
        *cells("serving", ["hold_timeout", "close_done", "close_timeout"], "stale timer/task"),
        *cells("awaiting_finalize", ENDS, "already ending"),
        *cells("awaiting_finalize", ["close_done", "close_timeout"], "stale timer/task"),
        *cells(
            "closing",
            [
                *ENDS,
                "abort",
                "finalize_answered",
                "simulator_left",
                "room_disconnected",
                "hold_timeout",
            ],
            "already closing",
        ),
        *cells("closed", list(EVENTS), "the job is over"),
    ),
)
