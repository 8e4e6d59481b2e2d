"""What the real system offers as its next inputs (``enabled``): read from the job and its
stand-ins after each input of a run (``verification.explore.real``), never planned ahead.

The room's comings and goings, the requests that may still be sent, the user's calls that
would still do something, the outcomes of each stand-in that waits for the world's word
now, and time passing to the clock's next deadline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from livekit import rtc

from agent_runtime.sdk import livekit_compat as lk
from agent_runtime.testing.invariants.checks import LIFE_UP, LIVE_JOB
from agent_runtime.testing.invariants.view import JobView
from verification.explore.config import PEOPLE
from verification.explore.harness import Harness

Inputs = Literal["all", "job", "avatar", "playout"]
TIME = "time"  # the input "time passes to the clock's next deadline"
_REASONS = ("CLIENT_INITIATED", "SIGNAL_CLOSE")


def _traced(h: Harness, machine: str, event: str) -> bool:
    return any(r.machine == machine and r.event == event for r in h.trace.records)


def has_video(h: Harness, identity: str) -> bool:
    p = h.room.remote_participants.get(identity)
    if p is None:
        return False
    return any(t.kind == rtc.TrackKind.KIND_VIDEO for t in p.track_publications.values())


def running_aside(h: Harness) -> tuple[str, ...]:
    return tuple(sorted(t.get_name() for t in h._bg if not t.done()))


def enabled(h: Harness, view: JobView, inputs: Inputs = "all") -> tuple[str, ...]:
    """The inputs that may come next, as the real system and its stand-ins show them."""
    out: list[str] = []
    states = view.states
    life = states.get("agent_job", "")
    up = h.room.isconnected()
    # once AgentJob's lifecycle closed (aclose() returned, the process may exit) nothing
    # from outside reaches the job; the stand-ins' work and the clock still run
    if life != "closed":
        if up:
            out.append("room_disconnects")
        if _session_may_start(h, life):
            out.append("session_start")
        if inputs != "avatar":
            out += _job_inputs(h, view, up)
        else:
            out += _people(h, "user", up)  # the avatar's comings and goings reach a link
        if inputs != "job":
            out += _avatar_inputs(h, view, up)
    out += outcomes(h, states)
    if h.clock.next_deadline() is not None:
        out.append(TIME)
    if inputs == "playout":
        return tuple(t for t in out if t in PLAYOUT_INPUTS)
    return tuple(out)


# what the playout machine hears of, and what gets it there: the session's start (when it
# is an input), the avatar's start and its comings and goings, the user's, the agent's
# speech and the avatar's report of it, time.
# (Only the outcomes that let an avatar join: a failed one is the avatar's inputs' business.)
PLAYOUT_INPUTS = frozenset(
    {
        "user_joins",
        "user_leaves:CLIENT_INITIATED",
        "avatar_start",
        "session_start",
        "plugin_routed",
        "plugin_returns",
        "avatar_joins",
        "avatar_video",
        "avatar_leaves",
        "interrupt",
        "agent_says",
        "user_interrupts",
        "avatar_reports",
        "user_speaks",
        "user_listens",
        "clear_settles",
        "close_a",
        "a_closed",
        TIME,
    }
)


def _session_may_start(h: Harness, life: str) -> bool:
    """The user's ``job.start_session()`` would start it: never started nor starting, and
    the job not closing (a start is refused then)."""
    return (
        life in LIFE_UP
        and not h.session_began()
        and "harness:session.start" not in running_aside(h)
    )


def _people(h: Harness, who: str, up: bool) -> list[str]:
    if not up or (who == "simulator" and not h.config.simulation):
        return []
    if PEOPLE[who].identity not in h.room.remote_participants:
        return [f"{who}_joins"]
    return [f"{who}_leaves:{r}" for r in _REASONS]


def _job_inputs(h: Harness, view: JobView, up: bool) -> list[str]:
    cfg, states = h.config, view.states
    out = [i for who in ("user", "sip", "simulator") for i in _people(h, who, up)]
    present = h.room.remote_participants
    sent = h.observed.sent
    asked = sum(s.simulator for s in sent)
    if up and PEOPLE["simulator"].identity in present and asked < cfg.max_finalize_requests:
        out.append("finalize")
    if up and not any(not s.simulator for s in sent):
        out.append("stranger_finalize")
    if up:
        # the host's other doors: a state they change nothing of dedups them away
        out += ["ping", "malformed"]
    host = states.get("session_host")
    if (
        "B" not in h.sessions
        and host not in ("closing", "closed")
        and "session_host" not in view.closed
    ):
        # (attach() refuses, raising, once the host closes: a call no user makes twice)
        out.append("attach_b")
    for name in ("A", "B"):
        # (the view reads a session never started as running: nothing to close yet)
        session = h.sessions.get(name)
        if session is not None and lk.session_live(session):
            out.append(f"close_{name.lower()}")
    if states.get("job") in LIVE_JOB and not _traced(h, "job", "shutdown"):
        out.append("ctx_shutdown")  # livekit's order: the session closed first
        if cfg.simulation:
            # the agent's own call, which must hang up by itself before the hold; outside
            # a simulation nothing holds, and the close goes as aclose()'s
            out.append("job_shutdown")
    if not cfg.delete_room_on_close and not view.deletion_asked:
        out.append("request_deletion")
    if cfg.aclose:
        life = states.get("agent_job", "")
        if life in LIFE_UP:
            out.append("aclose")
        if not view.aborted and (life in LIFE_UP or states.get("job") in LIVE_JOB):
            out.append("abort")
    return out


def _avatar_inputs(h: Harness, view: JobView, up: bool) -> list[str]:
    avatar = h.job.avatar
    state = view.states.get("avatar", "closed")
    if avatar is None or state == "closed":
        return []
    out: list[str] = []
    identity = PEOPLE["avatar"].identity
    present = identity in h.room.remote_participants
    if state == "idle":
        if view.states.get("agent_job") in LIFE_UP:
            out.append("avatar_start")
    elif up and not present:
        out.append("avatar_joins")
    if up and present and not has_video(h, identity):
        out.append("avatar_video")
    if up and present:
        out.append("avatar_leaves")
    out.append("interrupt")
    if state == "joined":
        out.append("interrupt_idle")
    if "harness:avatar.aclose" not in running_aside(h):
        out.append("avatar_close")
    return out + _playout_inputs(h, view)


def _playout_inputs(h: Harness, view: JobView) -> list[str]:
    """The agent's speech and the user's, and the avatar's report of what it played: what
    the playout machine follows, as the session and the avatar show them."""
    session, out = h.sessions["A"], []
    live = lk.session_live(session)
    # the agent replies, to the avatar or on the room's track (the harness's speaker)
    if live and session.current_speech is None and h.job.audio_route() != "none":
        out.append("agent_says")
    if live and session.current_speech is not None:
        out.append("user_interrupts")
    # the avatar's report of what it played, once it was given audio and while it can
    # send one: a report may come late, after the wait for it ended (its bound, a cut,
    # the SDK's own end)
    sink = h.job.avatar.installed_sink if h.job.avatar is not None else None
    if (
        view.avatar_present
        and h.room.isconnected()
        and sink is not None
        and sink.captured_playout_segments > 0
    ):
        out.append("avatar_reports")
    playout = h.job.playout
    if live and playout is not None and playout.options.reprompt:
        out.append("user_listens" if session.user_state == "speaking" else "user_speaks")
    return out


# the stand-ins' outcomes (``_outcomes``): work running aside ending, the world's word
OUTCOMES = frozenset(
    {
        "verdict_ready",
        "plugin_routed",
        "plugin_fails",
        "plugin_no_route",
        "plugin_returns",
        "plugin_fails_late",
        "clear_settles",
        "a_closed",
        "a_hangs",
        "a_fails",
        "b_closed",
        "deletion_returns",
        "deletion_fails",
        "callbacks_return",
    }
)


def outcomes(h: Harness, states: Mapping[str, str]) -> list[str]:
    """The world's word to each stand-in that waits for it now. A hang is no input (the
    stand-in goes on waiting), except a session's close, which the job's view tells apart."""
    out: list[str] = []
    if h.verdicts and h.verdicts[-1].waiting:
        out.append("verdict_ready")
    if h.plugin.waits == "start":
        out += ["plugin_routed", "plugin_fails", "plugin_no_route"]
    elif h.plugin.waits == "routed":
        out += ["plugin_returns", "plugin_fails_late"]
    if states.get("avatar") == "clearing":
        out.append("clear_settles")
    if h.closes["A"].waiting:
        out += ["a_closed", "a_hangs", "a_fails"]
    if "B" in h.closes and h.closes["B"].waiting:
        out.append("b_closed")
    if h.deletion_gates and h.deletion_gates[-1].waiting:
        out += ["deletion_returns", "deletion_fails"]
    if h.callback.waiting:
        out.append("callbacks_return")
    return out
