"""The job shutdown: the simulation verdict is never lost, and nothing waits on a
participant who cannot answer.

Shutdown holds in ``awaiting_finalize`` only while a simulator is there to ask; the hold
ends on the first of: finalize answered, the simulator left, the room disconnected,
``session_end_timeout``. ``closing`` is the one place the room is deleted.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

ENDS = ["shutdown", "session_closed"]

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
    events=(
        "shutdown",
        "session_closed",
        "finalize_answered",
        "simulator_left",
        "room_disconnected",
        "hold_timeout",
        "close_done",
        "close_timeout",
    ),
    guards=("hold_needed",),
    effects=(
        Effect(
            name="run_close",
            error_event="close_done",
            description="close host, disconnect, deferred room deletion, shutdown callbacks",
        ),
    ),
    rows=(
        *row("serving", "shutdown", "awaiting_finalize", guards=["hold_needed"]),
        *row("serving", "shutdown", "closing"),
        *row("serving", "session_closed", "awaiting_finalize", guards=["hold_needed"]),
        *row("serving", "session_closed", "closing"),
        *row("serving", "simulator_left", "closing"),
        *row("serving", "room_disconnected", "closing"),
        *row("awaiting_finalize", "finalize_answered", "closing"),
        *row("awaiting_finalize", "simulator_left", "closing"),
        *row("awaiting_finalize", "room_disconnected", "closing"),
        *row("awaiting_finalize", "hold_timeout", "closing"),
        *row("closing", "close_done", "closed"),
        *row("closing", "close_timeout", "closed"),
    ),
    ignore=(
        *cells("serving", "finalize_answered", "answered early: no hold will be needed"),
        *cells("serving", ["hold_timeout", "close_done", "close_timeout"]),
        *cells("awaiting_finalize", [*ENDS, "close_done", "close_timeout"], "already ending"),
        *cells(
            "closing",
            [*ENDS, "finalize_answered", "simulator_left", "room_disconnected", "hold_timeout"],
        ),
        *cells(
            "closed",
            [
                "shutdown",
                "session_closed",
                "finalize_answered",
                "simulator_left",
                "room_disconnected",
                "hold_timeout",
                "close_done",
                "close_timeout",
            ],
        ),
    ),
)
