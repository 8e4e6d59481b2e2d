"""The session host, owned by the job rather than by a session.

At most one session is attached; attaching another detaches the first (and its event
subscriptions). A session that is not the attached one detaching or closing changes
nothing (A replaced by B, then A closes: B stays attached). With nothing attached a
session request gets an explicit ``no active session`` error reply; ``finalize_simulation``
needs only the job and is answered in every state but ``closed``, once: a second one gets an
error reply. Unknown request kinds and malformed requests get an error reply.
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
        State(name="closed", final=True, description="transport closed; nothing is answered"),
    ),
    events=(
        "attach",  # {session}
        "detach",  # {session}
        "session_closed",  # {session, reason}: an attached-at-some-point session closed
        "request",  # {request_id, kind}: an ordinary, well-formed session request
        "finalize",  # {request_id, ...}: a well-formed finalize_simulation request
        "bad_request",  # {request_id, kind, error}: unknown kind or malformed payload
        "finalize_done",  # {request_id, delivered, verdict}: the finalize reply went out (or not)
        "close",
    ),
    guards=(
        "is_current",  # the event's session is the attached one
        "finalize_taken",  # a finalize is being answered or was answered
    ),
    effects=(
        Effect(
            name="subscribe", description="forward the new session's events, serve its requests"
        ),
        Effect(name="unsubscribe", description="stop forwarding the attached session's events"),
        Effect(name="delegate_request", description="answer from the attached session"),
        Effect(name="reply_no_session", description="error reply: no active session"),
        Effect(name="reply_error", description="error reply naming what is wrong"),
        Effect(
            name="answer_finalize",
            description="run on_simulation_end, reply with the verdict (reported as finalize_done)",
        ),
        Effect(name="refuse_finalize", description="error reply: already answered / in progress"),
        Effect(name="report_finalize", description="tell the job the verdict was delivered"),
        Effect(name="report_session_closed", description="tell the job its session closed"),
        Effect(name="close_transport", description="drain in-flight replies, close the transport"),
    ),
    rows=(
        *row("detached", "attach", "attached", effects=["subscribe"]),
        *row("attached", "attach", None, guards=["is_current"]),
        *row("attached", "attach", None, effects=["unsubscribe", "subscribe"]),
        *row("attached", "detach", "detached", guards=["is_current"], effects=["unsubscribe"]),
        *row("attached", "detach", None),
        *row(
            "attached",
            "session_closed",
            "detached",
            guards=["is_current"],
            effects=["unsubscribe", "report_session_closed"],
        ),
        *row("attached", "session_closed", None),
        *row("detached", "request", None, effects=["reply_no_session"]),
        *row("attached", "request", None, effects=["delegate_request"]),
        *row(OPEN, "bad_request", None, effects=["reply_error"]),
        *row(OPEN, "finalize", None, guards=["finalize_taken"], effects=["refuse_finalize"]),
        *row(OPEN, "finalize", None, effects=["answer_finalize"]),
        *row(OPEN, "finalize_done", None, effects=["report_finalize"]),
        *row("detached", "close", "closed", effects=["close_transport"]),
        *row("attached", "close", "closed", effects=["unsubscribe", "close_transport"]),
    ),
    ignore=(
        *cells("detached", "detach", "nothing attached"),
        *cells("detached", "session_closed", "a detached session closing is not the job's end"),
        *cells(
            "closed",
            ["detach", "session_closed", "request", "finalize", "bad_request", "finalize_done"],
            "the transport is gone: nothing can be answered",
        ),
        *cells("closed", "close", "already closed"),
    ),
    reject=(*cells("closed", "attach", "the host is closed"),),
)
