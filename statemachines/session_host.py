"""The session host, owned by the job rather than by a session.

At most one session is attached; attaching another detaches the first (and its event
subscriptions). With nothing attached a session request gets an explicit error reply;
``finalize_simulation`` needs only the job and is answered in every state but ``closed``.
"""

from .spec import Effect, MachineSpec, State, cells, row

OPEN = ["detached", "attached"]

SESSION_HOST = MachineSpec(
    name="session_host",
    description="One per job: forwards the attached session, answers the simulator.",
    initial="detached",
    states=(
        State(name="detached", description="no session; requests get 'no active session'"),
        State(name="attached", description="one session's events are forwarded"),
        State(name="closed", final=True),
    ),
    events=("attach", "detach", "request", "finalize", "close"),
    guards=("is_current", "finalized"),
    effects=(
        Effect(name="subscribe", description="forward the new session's events"),
        Effect(name="unsubscribe", description="stop forwarding the attached session's events"),
        Effect(name="handle_request", description="answer a session request"),
        Effect(name="reply_no_session", description="error reply: no active session"),
        Effect(
            name="answer_finalize",
            description="run on_simulation_end, reply with the verdict, tell the job",
        ),
        Effect(name="reply_already_finalized", description="error reply: already finalized"),
        Effect(name="close_transport", description="drain replies, close the transport"),
    ),
    rows=(
        *row("detached", "attach", "attached", effects=["subscribe"]),
        *row("attached", "attach", None, effects=["unsubscribe", "subscribe"]),
        *row("attached", "detach", "detached", guards=["is_current"], effects=["unsubscribe"]),
        *row("attached", "detach", None),
        *row("detached", "request", None, effects=["reply_no_session"]),
        *row("attached", "request", None, effects=["handle_request"]),
        *row(OPEN, "finalize", None, guards=["finalized"], effects=["reply_already_finalized"]),
        *row(OPEN, "finalize", None, effects=["answer_finalize"]),
        *row("detached", "close", "closed", effects=["close_transport"]),
        *row("attached", "close", "closed", effects=["unsubscribe", "close_transport"]),
    ),
    ignore=(
        *cells("detached", "detach", "nothing attached"),
        *cells("closed", ["detach", "request", "finalize", "close"], "the transport is gone"),
    ),
    reject=(*cells("closed", "attach", "the host is closed"),),
)
