"""The session host, owned by the job rather than by a session.

It begins ``new``: nothing is read until ``start`` opens the transport (a second ``start``
changes nothing). Attaching a session before ``start`` starts the host too, so a session
attached first is served as soon as requests arrive; closing a host that never started
ends it all the same (nothing was read, the transport is closed).
At most one session is attached; attaching another detaches the first (and its event
subscriptions). A session that is not the attached one detaching or closing changes
nothing (A replaced by B, then A closes: B stays attached). With nothing attached a
session request gets an explicit ``no active session`` error reply; ``finalize_simulation``
needs only the job: it is forwarded to the ``finalize`` machine in every open state, when
it comes from the simulator participant; anyone else's gets an error reply and changes
nothing (the verdict decides the job's fate).
Unknown request kinds and malformed requests get an error reply. A session whose
subscription fails (``subscribe_failed``: livekit's per-session host could not be built)
is not forwarded: the host is detached again and answers ``no active session``; an event
queued before that outcome sees the session attached but unserved (a request to it gets
``no active session``). A transport that cannot start (``transport_failed``: a topic
another host holds, a server that refuses) leaves nothing to read or answer with: the host
closes at once, and a later attach is refused. Closing lets the replies
in flight go out (``drain``, bounded by ``drain_timeout``; a request that still arrives
gets an error reply), cuts a finalize answer still being computed (the simulator gets its
error reply), then closes the transport.
"""

from .spec import Effect, MachineSpec, State, StateTimeout, cells, row

OPEN = ["detached", "attached"]
ENDING = ["closing", "closed"]
REQUESTS = ["request", "finalize", "bad_request"]
DRAIN = ["drained", "drain_timeout"]

SESSION_HOST = MachineSpec(
    name="session_host",
    description="One per job: forwards the attached session, answers the simulator.",
    initial="new",
    states=(
        State(name="new", description="not started: the transport is not read yet"),
        State(name="detached", description="no session; requests get 'no active session'"),
        State(name="attached", description="one session's events are forwarded"),
        State(
            name="closing",
            timeout=StateTimeout(event="drain_timeout", setting="drain_timeout", default=3.0),
            invoke=("drain",),
            description="replies in flight go out, bounded; new requests get an error",
        ),
        State(name="closed", final=True, description="transport closed; nothing is answered"),
    ),
    events=(
        "start",
        "attach",  # {session}
        "detach",  # {session}
        "session_closed",  # {session, reason}: an attached-at-some-point session closed
        "request",  # {request_id, kind}: an ordinary, well-formed session request
        "finalize",  # {request_id, ...}: a well-formed finalize_simulation request
        "bad_request",  # {request_id, kind, error}: unknown kind or malformed payload
        "close",
        "drained",
        "drain_timeout",
        "subscribe_failed",  # {session, error}: the subscribe effect's failure
        "transport_failed",  # {error}: the transport's start (open_transport) failed
    ),
    guards=(
        "is_current",  # the event's session is the attached one
        "from_simulator",  # the request's sender carries the lk.simulator attribute
    ),
    effects=(
        Effect(name="open_transport", description="start the transport and read requests"),
        Effect(
            name="subscribe", description="forward the new session's events, serve its requests"
        ),
        Effect(name="unsubscribe", description="stop forwarding the attached session's events"),
        Effect(name="delegate_request", description="answer from the attached session"),
        Effect(name="reply_no_session", description="error reply: no active session"),
        Effect(name="reply_error", description="error reply naming what is wrong"),
        Effect(name="forward_finalize", description="hand it to the finalize machine"),
        Effect(name="refuse_stranger", description="error reply: only from the simulator"),
        Effect(name="report_session_closed", description="tell the job its session closed"),
        Effect(
            name="drain",
            description="wait for the replies in flight and the finalize answer (drained)",
        ),
        Effect(name="reply_closing", description="error reply: the session host is closing"),
        Effect(name="close_finalize", description="close the finalize machine (cuts an answer)"),
        Effect(name="close_transport", description="close the transport"),
    ),
    rows=(
        *row("new", "start", "detached", effects=["open_transport"]),
        *row("new", "attach", "attached", effects=["open_transport", "subscribe"]),
        *row("new", "close", "closing"),
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
        *row(
            "attached",
            "subscribe_failed",
            "detached",
            guards=["is_current"],
            effects=["unsubscribe"],
        ),
        *row("attached", "subscribe_failed", None),
        *row(
            "detached", "transport_failed", "closed", effects=["close_finalize", "close_transport"]
        ),
        *row(
            "attached",
            "transport_failed",
            "closed",
            effects=["unsubscribe", "close_finalize", "close_transport"],
        ),
        *row("detached", "request", None, effects=["reply_no_session"]),
        *row("attached", "request", None, effects=["delegate_request"]),
        *row(OPEN, "bad_request", None, effects=["reply_error"]),
        *row(OPEN, "finalize", None, guards=["from_simulator"], effects=["forward_finalize"]),
        *row(OPEN, "finalize", None, effects=["refuse_stranger"]),
        *row("detached", "close", "closing"),
        *row("attached", "close", "closing", effects=["unsubscribe"]),
        *row("closing", "request", None, effects=["reply_closing"]),
        *row("closing", "finalize", None, effects=["reply_closing"]),
        *row("closing", "bad_request", None, effects=["reply_closing"]),
        *row("closing", "drained", "closed", effects=["close_finalize", "close_transport"]),
        *row("closing", "drain_timeout", "closed", effects=["close_finalize", "close_transport"]),
    ),
    ignore=(
        *cells("new", ["detach", "session_closed"], "nothing attached"),
        *cells("new", REQUESTS, "nothing is read before start"),
        *cells("new", [*DRAIN, "subscribe_failed", "transport_failed"], "nothing ran yet"),
        *cells(ENDING, "transport_failed", "closing already: the transport is closed next"),
        *cells([*OPEN, *ENDING], "start", "started already (or ending)"),
        *cells("detached", "subscribe_failed", "detached before its subscribe's outcome"),
        *cells(ENDING, "subscribe_failed", "already unsubscribed"),
        *cells("detached", "detach", "nothing attached"),
        *cells("detached", "session_closed", "a detached session closing is not the job's end"),
        *cells(OPEN, DRAIN, "stale task/timer"),
        *cells("closing", ["detach", "session_closed"], "already unsubscribed"),
        *cells("closing", "close", "already closing"),
        *cells(
            "closed",
            ["detach", "session_closed", *REQUESTS, *DRAIN],
            "the transport is gone: nothing can be answered",
        ),
        *cells("closed", "close", "already closed"),
    ),
    reject=(
        *cells("closing", "attach", "the host is closing"),
        *cells("closed", "attach", "the host is closed"),
    ),
)
