"""What only the model says: how the outside world and each effect's outcome are abstracted.

Everything the runtime *decides by* is read from its one declaration: the specs and the
pure ``step`` (``statemachines``), which room fact becomes which event of which machine
(``statemachines.routing``, with the conditions of ``statemachines.glue``), every guard
(``statemachines.glue.GUARDS``) and which effect sends which event to which machine
(``statemachines.glue.LINKS``). This file holds the rest, the part a reviewer must check
against the runtime by reading (and the conformance replay checks by running):

* **who may be in the room** (``PEOPLE``) and the settings a run is explored under
  (``Config``), including the example agent's own (``Config.example``);
* **the facts views**: what the guards read, taken from the abstract world;
* **inputs**: what the outside world can do next (``inputs``), with playout composed the
  session's side of it too: an agent turn's start and end, the hand-off to the avatar's sink
  and the avatar's report, the linked user's speech; with ``Config.aclose`` the user's own
  ``AgentJob.aclose()`` and ``aclose(graceful=False)``;
* **effects**: how each effect changes the abstract world (``EFFECTS``): the audio route,
  a session closing, a reply going out; an effect with links also fires them, generically;
* **work running aside and its outcomes** (``work``): a plugin's start may put its route in,
  fail early or late, return with no route, or hang; ``on_simulation_end`` returns or hangs;
  the room deletion returns or fails; a session's close ends or hangs; the shutdown
  callbacks return or one hangs; the plugin's own clear settles; the steps of the job's
  close (``run_close``) follow one another; the lifecycle's teardown (``run_teardown``)
  releases the followers once the job machine closed;
* **fault injection** (``Glue``): switches that break one of these abstractions, for tests.

Pure: no asyncio, no livekit, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from agent_runtime.testing.invariants.checks import LIVE_JOB
from statemachines.avatar import CAUSES, PLUGIN_CLEARS
from statemachines.glue import (
    DEFAULT_CLOSING_REASONS,
    DEFAULT_PARTICIPANT_KINDS,
    PUBLISH_ON_BEHALF,
    RUN_CLOSE_STEPS,
    SESSION,
    SIMULATOR_ATTRIBUTE,
)
from statemachines.playout import TURN as _PLAYOUT_TURN
from statemachines.system import RELEASE

PLAYOUT_TURN = frozenset(_PLAYOUT_TURN)  # the agent's audio is not done

if TYPE_CHECKING:
    from verification.explore.model import _W, Model, Params, World

AVATAR, JOB, HOST, PART = "avatar", "job", "session_host", "participant"
DEL, FIN, PLAYOUT = "room_deletion", "finalize", "playout"
AGENT_JOB = "agent_job"  # AgentJob's own lifecycle
LIFE_UP = ("new", "starting", "running")  # the lifecycle before any close
# the playout machine's re-prompts in a row before it hands over, when its watchdog is on
# (any limit decides alike past the first: one keeps the worlds few)
MAX_REPROMPTS = 1
CLOSE = "close"  # the token of a close that ends its actor (aclose(): close, then stop)

# -- who may be in the room ----------------------------------------------------------------------

AGENT_IDENTITY = "agent"


@dataclass(frozen=True)
class Person:
    identity: str
    kind: str  # an rtc.ParticipantKind name
    attributes: tuple[tuple[str, str], ...] = ()


PEOPLE: dict[str, Person] = {
    "user": Person("user", "standard"),
    "sip": Person("sip", "sip"),  # a phone leg
    "simulator": Person("simulator", "standard", ((SIMULATOR_ATTRIBUTE, "1"),)),
    "avatar": Person("avatar", "agent", ((PUBLISH_ON_BEHALF, AGENT_IDENTITY),)),
    "stranger": Person("stranger", "standard"),  # sends a finalize; never in the room
}
GRACE_PERIOD = 15.0  # any positive grace period decides alike


@dataclass(frozen=True)
class Config:
    """The runtime settings a run is explored under (one exploration per config), and who
    is in the room when the job starts."""

    simulation: bool = True
    participant_identity: str | None = None  # None: the first eligible participant
    close_on_disconnect: bool = True
    grace: bool = True  # grace_period > 0
    rejoin: bool = False  # retry_avatar's rejoin: a late join routes audio again
    retry_attempts: int = 0  # retry_avatar's attempts (every cause transient)
    delete_room_on_close: bool = False
    present: tuple[str, ...] = ("simulator",)  # in the room at the start, in join order
    max_finalize_requests: int = 2
    # AgentJob's playout: the playout machine composed (its links and watches delivered as
    # the job system delivers them), the agent's turns and the avatar's reports among the
    # avatar's inputs. Off by default: the conformance replay runs its real job without it
    playout: bool = False
    # its re-prompt watchdog: off (PlayoutOptions' default), or on, handing over after
    # MAX_REPROMPTS by waiting for the user or by closing the session
    watchdog: Literal["off", "wait", "close"] = "off"
    # the user's own AgentJob.aclose() and aclose(graceful=False) among the job's inputs
    # (the lifecycle itself is always composed: the job closing on its own closes it). Off
    # by default: two more inputs in every world double the job's explorations
    aclose: bool = False

    @classmethod
    def example(cls, *, simulation: bool = True) -> Config:
        """How ``examples/agent.py`` runs: no participant identity configured (livekit's
        default kinds, SIP included), a grace period, no retry, the room kept; in a
        simulation the simulator is the one who joined."""
        return cls(simulation=simulation, present=("simulator",) if simulation else ())

    def label(self) -> str:
        parts = ["simulation" if self.simulation else "no simulation"]
        if self.participant_identity is not None:
            parts.append(f"identity {self.participant_identity}")
        if not self.close_on_disconnect:
            parts.append("close_on_disconnect off")
        else:
            parts.append("grace_period > 0" if self.grace else "grace_period 0")
        if self.rejoin:
            parts.append("rejoin")
        if self.retry_attempts:
            parts.append(f"{self.retry_attempts} retry")
        if self.delete_room_on_close:
            parts.append("delete_room_on_close")
        if self.playout:
            wd = "" if self.watchdog == "off" else f", watchdog then {self.watchdog}"
            parts.append(f"playout{wd}")
        if self.aclose:
            parts.append("aclose")
        parts.append(f"present: {', '.join(self.present) or 'nobody'}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Glue:
    """Switches that break one abstraction in the model (every one True is the runtime as
    modelled); tests turn one off to show the checks notice. Faults in what is shared (a
    link, a guard, a cell) are injected by changing the shared declaration instead."""

    restore_route: bool = True  # restore_route puts the previous route back
    cancel_timers_on_exit: bool = True  # the actor cancels a state's timer when it leaves
    drop_stale_timeouts: bool = True  # a timer event of a left state is dropped
    unsubscribe_on_replace: bool = True  # attaching B over A stops forwarding A
    defer_room_deletion: bool = True  # an end-call tool's request waits for the job's close
    # the host's drain waits for a verdict in flight, and its close waits for the finalize
    drain_finalize_on_close: bool = True


DEFAULT_GLUE = Glue()

# -- the facts the guards read --------------------------------------------------------------------


def person(who: str) -> Person:
    return PEOPLE[who]


def event_data(params: Params) -> dict[str, Any]:
    """An event's data as the runtime's event carries it: a participant named by ``who``
    comes with its identity, kind and attributes."""
    data = dict(params)
    who = data.pop("who", None)
    if who is not None:
        p = PEOPLE[who]
        data.setdefault("kind", p.kind)  # a track fact's kind is the track's
        data.update(identity=p.identity, attributes=dict(p.attributes))
    return data


class JobFactsView:
    __slots__ = ("_s",)

    def __init__(self, s: _W) -> None:
        self._s = s

    @property
    def is_simulation(self) -> bool:
        return self._s.model.config.simulation

    @property
    def simulator_present(self) -> bool:
        return self._s.simulator

    @property
    def room_connected(self) -> bool:
        return self._s.room == "connected"

    @property
    def finalize_answered(self) -> bool:
        return self._s.fin_answered


class ParticipantFactsView:
    __slots__ = ("_s",)
    participant_kinds = frozenset(DEFAULT_PARTICIPANT_KINDS)
    closing_reasons = frozenset(DEFAULT_CLOSING_REASONS)
    agent_identity = AGENT_IDENTITY

    def __init__(self, s: _W) -> None:
        self._s = s

    @property
    def participant_identity(self) -> str | None:
        return self._s.model.config.participant_identity

    @property
    def linked_identity(self) -> str | None:
        return PEOPLE[self._s.linked].identity if self._s.linked else None

    @property
    def close_on_disconnect(self) -> bool:
        return self._s.model.config.close_on_disconnect

    @property
    def grace_period(self) -> float:
        return GRACE_PERIOD if self._s.model.config.grace else 0.0


class HostFactsView:
    __slots__ = ("_s",)

    def __init__(self, s: _W) -> None:
        self._s = s

    @property
    def attached_session(self) -> str | None:
        return self._s.attached or None

    def is_simulator(self, identity: str) -> bool | None:
        # the job's knowledge: who carries lk.simulator (only the simulator does)
        return self._s.simulator and identity == PEOPLE["simulator"].identity


class FinalizeFactsView:
    __slots__ = ("is_simulation",)

    def __init__(self, s: _W) -> None:
        self.is_simulation = s.model.config.simulation


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int
    transient: frozenset[str]
    rejoin: bool


class AvatarFactsView:
    __slots__ = ("_params", "_s")
    last_cause = ""  # the model's route_restored always says its cause

    def __init__(self, s: _W, params: Params) -> None:
        self._s, self._params = s, params

    @property
    def avatar_present(self) -> bool:
        return self._s.av_present

    @property
    def avatar_has_video(self) -> bool:
        return self._s.av_video

    @property
    def plugin_clear_in_flight(self) -> bool:
        # abstracted: the plugin's own clear holds its sink when something was playing
        return any(k == "playing" and v for k, v in self._params)

    @property
    def route_recorded(self) -> bool:
        return self._s.installed

    @property
    def attempts(self) -> int:
        return self._s.av_attempts

    @property
    def retry(self) -> RetryPolicy:
        cfg = self._s.model.config
        return RetryPolicy(cfg.retry_attempts, frozenset(CAUSES), cfg.rejoin)


class PlayoutFactsView:
    """``glue.PlayoutFacts`` on the world (``agent_runtime.runtimes.playout._Facts`` on the real
    job): the avatar machine's state, the link's, the session's user state."""

    __slots__ = ("_s",)
    max_reprompts = MAX_REPROMPTS

    def __init__(self, s: _W) -> None:
        self._s = s

    @property
    def avatar_state(self) -> str | None:
        return self._s.avatar

    @property
    def audio_at_avatar(self) -> bool:
        # the model hands audio off only to a joined avatar: none waits for a join
        return self._s.pending

    @property
    def watchdog_on(self) -> bool:
        return self._s.model.config.watchdog != "off"

    @property
    def user_linked(self) -> bool:
        return self._s.part == "linked"

    @property
    def user_speaking(self) -> bool:
        return self._s.speaking

    @property
    def reprompts(self) -> int:
        return self._s.reprompts


class RoomFactsView:
    __slots__ = ("_s",)
    avatar_identity = PEOPLE["avatar"].identity

    def __init__(self, s: _W) -> None:
        self._s = s

    @property
    def simulators(self) -> frozenset[str]:
        return frozenset({PEOPLE["simulator"].identity}) if self._s.simulator else frozenset()


def facts(s: _W, machine: str, params: Params) -> Any:
    """The facts view ``machine``'s guards read (the model's side of a glue Protocol)."""
    if machine == JOB:
        return JobFactsView(s)
    if machine == PART:
        return ParticipantFactsView(s)
    if machine == HOST:
        return HostFactsView(s)
    if machine == FIN:
        return FinalizeFactsView(s)
    if machine == AVATAR:
        return AvatarFactsView(s, params)
    if machine == PLAYOUT:
        return PlayoutFactsView(s)
    raise KeyError(f"the model has no facts view for machine {machine!r}")


# -- the simulator's requests ----------------------------------------------------------------------
# a request: (owed, from the simulator, status, replies put on the transport)
#   status: queued | not_read (nobody reads) | taken (being answered) | done | abandoned (its
#   answer cut with no reply) | no_room (a reply could not go out: the room was gone) |
#   not_sent (the transport was closed)


def _set_request(s: _W, req: int, status: str, reply: str = "") -> None:
    reqs = list(s.requests)
    owed, sim, _, replies = reqs[req]
    reqs[req] = (owed, sim, status, (*replies, reply) if reply else replies)
    s.requests = tuple(reqs)


def reply(s: _W, req: int, kind: str) -> bool:
    """A reply to request ``req``; returns whether it went out (the transport took it)."""
    if not s.transport_open:
        _set_request(s, req, "not_sent")
        return False
    if s.room != "connected":  # the room's byte stream needs the room
        _set_request(s, req, "no_room")
        return False
    _set_request(s, req, "done", kind)
    return True


def _req(params: Params) -> int | None:
    for k, v in params:
        if k == "req":
            return int(v)
    return None


# -- effects: how each changes the abstract world --------------------------------------------------
# Called after the step changed the state, in the row's order; the mechanics then fire the
# effect's declared links (statemachines.glue.LINKS) with the event's data.

Effect = Callable[["_W", str, "Params"], None]


def _nothing(s: _W, event: str, params: Params) -> None:
    return None


def _restore(s: _W) -> None:
    # identity-guarded: only our own recorded route (the table calls it once per route)
    if s.installed and s.route == "avatar" and s.model.glue.restore_route:
        s.route = "room"
        s.pending = False  # the sink swapped out finishes its segments


def _remove_avatar_participant(s: _W) -> None:
    # through the server API, as AvatarLifecycle does it: the room reports the departure
    if s.av_present and s.room == "connected":
        s.av_present = s.av_video = False
        s.room_fact("participant_left", who="avatar", reason="PARTICIPANT_REMOVED")


def _record_route(s: _W, event: str, params: Params) -> None:
    # the start was cut short: a route the plugin put in is recorded from the chain
    if s.route == "avatar":
        s.installed = True


def _check_presence(s: _W, event: str, params: Params) -> None:
    if s.av_present:  # an avatar already there produces no join for us
        s.post(AVATAR, "avatar_connected", (("who", "avatar"),))


def _restore_route(s: _W, event: str, params: Params) -> None:
    _restore(s)
    s.post(AVATAR, "route_restored", (("cause", event),))


def _release_attempt(s: _W, event: str, params: Params) -> None:
    # the failed attempt's plugin closed, its sink forgotten, its participant removed
    s.av_attempts += 1
    s.installed = False
    _remove_avatar_participant(s)


def _reinstall_route(s: _W, event: str, params: Params) -> None:
    s.route = "avatar"
    _check_presence(s, event, params)


def _put_route_back(s: _W, event: str, params: Params) -> None:
    _restore(s)


def _close_plugin(s: _W, event: str, params: Params) -> None:
    _remove_avatar_participant(s)


def _playout_ends_here(s: _W, event: str, params: Params) -> None:
    # clear_local_buffer (the avatar not joined: what it held ends here) and
    # mark_playout_done (the avatar's sink ends its segment, as the avatar's report or the
    # playout machine's finish asks)
    s.pending = False


def _reprompt(s: _W, event: str, params: Params) -> None:
    # counted one past the limit at most: the worlds stay finite for a faulty table
    s.reprompts = min(s.reprompts + 1, MAX_REPROMPTS + 1)


def _reset_reprompts(s: _W, event: str, params: Params) -> None:
    s.reprompts = 0


def _hand_over(s: _W, event: str, params: Params) -> None:
    # PlayoutTracker._fx_hand_over: "close" asks a live session to close (its close's end
    # reaches every machine through the session's links); "wait" does nothing
    if s.model.config.watchdog == "close" and s.sess_a == "running":
        s.sess_a = "closing"


def _ask_shutdown(s: _W, event: str, params: Params) -> None:
    # JobSystem._fx_ask_shutdown: livekit's order, the primary session closes first (its
    # close's end reaches the job through the session's links), then the job may hold
    if s.sess_a == "running":
        s.sess_a = "closing"


def _link(s: _W, event: str, params: Params) -> None:
    s.linked = str(dict(params)["who"])


def _close_session(s: _W, event: str, params: Params) -> None:
    # session._close_soon(): a close under way or done is not started again; the close
    # task's end reports to the link (at once when it has ended already)
    if s.sess_a == "running":
        s.sess_a = "closing"
    elif s.sess_a == "closed":
        s.post(PART, "session_closed")


def _subscribe(s: _W, event: str, params: Params) -> None:
    session = str(dict(params)["session"])
    s.attached = session
    if session not in s.subscribed:
        s.subscribed = tuple(sorted((*s.subscribed, session)))


def _unsubscribe(s: _W, event: str, params: Params) -> None:
    att, s.attached = s.attached, ""
    replaced = dict(params).get("session", att) != att  # another session attaches over it
    if att and (s.model.glue.unsubscribe_on_replace or not replaced):
        s.subscribed = tuple(x for x in s.subscribed if x != att)


def _reply_error(s: _W, event: str, params: Params) -> None:
    req = _req(params)
    if req is not None:  # the model's requests are all finalize requests
        reply(s, req, "error")


def _close_finalize(s: _W, event: str, params: Params) -> None:
    # its link posted the finalize's close; the host (its close_transport, the same step)
    # waits while the finalize handles what it had, then the close (its actor.join())
    if s.model.glue.drain_finalize_on_close:
        s.handle_all(FIN)


def _close_transport(s: _W, event: str, params: Params) -> None:
    s.reading = False
    s.transport_open = False


def _take_request(s: _W, event: str, params: Params) -> None:
    req = _req(params)
    assert req is not None
    s.fin_req = req
    _set_request(s, req, "taken")


def _send_verdict(s: _W, event: str, params: Params) -> None:
    sent = reply(s, s.fin_req, "verdict")
    s.post(FIN, "delivered" if sent else "undelivered")


def _report_answered(s: _W, event: str, params: Params) -> None:
    s.fin_answered = True


def _reply_unfinished(s: _W, event: str, params: Params) -> None:
    reply(s, s.fin_req, "error")  # FINALIZE_UNFINISHED, rather than silence


EFFECTS: dict[str, Effect] = {
    # avatar: start_plugin and follow_plugin_clear are state tasks (TASKS)
    "start_plugin": _nothing,
    "record_route": _record_route,
    "check_presence": _check_presence,
    "restore_route": _restore_route,
    "release_attempt": _release_attempt,
    "reinstall_route": _reinstall_route,
    "follow_plugin_clear": _nothing,
    "clear_local_buffer": _playout_ends_here,
    "mark_playout_done": _playout_ends_here,
    "put_route_back": _put_route_back,
    "unhook": _nothing,  # it stops following the room: its closed state takes nothing
    "close_plugin": _close_plugin,
    # participant
    "link": _link,
    "relink": _nothing,
    "close_session": _close_session,
    "report_close_timed_out": _nothing,  # its link shuts the job down
    # job: run_close is a state task (TASKS)
    "run_close": _nothing,
    "report_cut": _nothing,  # the job's and the deletion's: both only log
    # room deletion: delete_room is a state task; the rest only log
    "delete_room": _nothing,
    "record_deleted": _nothing,
    "report_failure": _nothing,
    "report_never_allowed": _nothing,
    # session host
    "open_transport": _nothing,  # the model's transport is read from the start
    "subscribe": _subscribe,
    "unsubscribe": _unsubscribe,
    "delegate_request": _nothing,
    "reply_no_session": _reply_error,
    "reply_error": _reply_error,
    "forward_finalize": _nothing,  # its link hands it to the finalize
    "refuse_stranger": _reply_error,
    "report_session_closed": _nothing,  # its links tell the job (and ask the deletion)
    "drain": _nothing,  # closing's state task (TASKS)
    "reply_closing": _reply_error,
    "close_finalize": _close_finalize,
    "close_transport": _close_transport,
    # finalize: compute_verdict is answering's state task (TASKS)
    "take_request": _take_request,
    "compute_verdict": _nothing,
    "send_verdict": _send_verdict,
    "report_answered": _report_answered,  # its link tells the job
    "refuse_busy": _reply_error,
    "refuse_answered": _reply_error,
    "refuse_not_simulation": _reply_error,
    "reply_unfinished": _reply_unfinished,
    # playout: finish_playout's link ends the avatar sink's segment (the avatar's
    # mark_playout_done); the re-prompt's reply is the agent's next turn, an input
    "playout_done": _nothing,
    "finish_playout": _nothing,
    "reprompt": _reprompt,
    "reset_reprompts": _reset_reprompts,
    "hand_over": _hand_over,
    # the job's own lifecycle: its asks reach the job machine through their links;
    # run_teardown is closing's state task (TASKS)
    "ask_shutdown": _ask_shutdown,
    "ask_abort": _nothing,
    "run_teardown": _nothing,
}


# -- state tasks: what a task does on its first turn, before any timer can fire -------------------


def _start_plugin(s: _W) -> None:
    s.av_task = f"{s.avatar}:start"


def _follow_clear(s: _W) -> None:
    s.av_task = f"{s.avatar}:clear"


def _run_close(s: _W) -> None:
    _close_step(s, RUN_CLOSE_STEPS[0])


def _delete_room(s: _W) -> None:
    s.dele_task = f"{s.dele}:start"
    s.deletions = (*s.deletions, s.job)  # the server call begins


def _drain(s: _W) -> None:
    s.host_task = f"{s.host}:start"


def _compute_verdict(s: _W) -> None:
    s.fin_task = f"{s.fin}:start"


def _run_teardown(s: _W) -> None:
    # RELEASE's first step (the parts of a start still running cut) changes nothing the
    # model follows (the caller of a cut start gets its error); then it waits for the job
    # machine's close (``job_closed`` below), or finds it closed already
    s.life_task = f"{s.life}:job"
    if s.job in s.model.inert[JOB]:
        _released(s)


TASKS: dict[str, Callable[[_W], None]] = {
    "start_plugin": _start_plugin,
    "follow_plugin_clear": _follow_clear,
    "run_close": _run_close,
    "delete_room": _delete_room,
    "drain": _drain,
    "compute_verdict": _compute_verdict,
    "run_teardown": _run_teardown,
}

# -- the job's close (run_close): its steps, in RUN_CLOSE_STEPS order ----------------------------


def _close_step(s: _W, step: str) -> None:
    """Begin ``step`` of run_close: its links fire first (statemachines.glue.LINKS), then
    what the step does itself."""
    s.job_task = f"{s.job}:{step}"
    s.fire(JOB, "run_close", (), step=step)
    if step in ("session", "callbacks"):
        # the session is closed if it is still up (and waited for, with the avatar, in its
        # own step; at the release, when the bound cut the close before it, not waited for)
        if s.sess_a == "running":
            s.sess_a = "closing"
    elif step == "disconnect":
        if s.room == "connected":
            s.room = "disconnected"
            s.room_fact("room_disconnected")
    elif step == "room":
        s.room_step_done = True


def _host_closed(s: _W) -> None:
    # host.wait_closed() returned: the host's actor is closed, and its finalize's once it
    # handled its mail (an answer still computed is cancelled with its actor, no reply)
    s.handle_all(FIN)
    if s.fin_task:
        _set_request(s, s.fin_req, "abandoned")
    s.fin_task = s.host_task = s.t_host = ""
    s.host_actor_closed = True
    s.drop_mailbox(HOST)
    s.reading = False
    _close_step(s, "session")


def _avatar_step(s: _W) -> None:
    _close_step(s, "avatar")  # the session closed, or the wait for it ran out


def _session_step_done(s: _W) -> None:
    _close_step(s, "disconnect")
    _close_step(s, "room")  # then the deletion it allowed (if asked) is waited for


def _deletion_settled(s: _W) -> None:
    _close_step(s, "callbacks")


def _callbacks(s: _W, hang: bool) -> None:
    # the shutdown callbacks, one of which may never return (only close_timeout ends that)
    if hang:
        s.job_task = f"{s.job}:hung"
        return
    s.job_task = ""
    s.post(JOB, "close_done", (), "live")


def job_closed(s: _W) -> None:
    """The job machine reached its final state: a lifecycle's teardown waiting for it goes
    on (its ``job`` step's wait returns)."""
    if s.life_task.endswith(":job"):
        _released(s)


def _released(s: _W) -> None:
    """run_teardown's steps after the job machine closed (``statemachines.system.RELEASE``),
    at once: each step's declared links (run_teardown/STEP), a session still running asked
    to close, playout, the participant link and the avatar stopped through their runtimes
    (each close runs once: what the job's close did not get to), each awaited; then
    ``released``. Done as the wait returns, as a task's first turn is (the releases end
    without a bound of their own in the model: each actor handles what it was sent)."""
    for step in _RELEASE_AFTER_JOB:
        s.fire(AGENT_JOB, "run_teardown", (), step=step)
        if step == "session" and s.sess_a == "running":
            s.sess_a = "closing"
        elif step == PLAYOUT and s.model.playout:
            s.post(PLAYOUT, "close")  # PlayoutTracker.aclose(): it stops following the session
        elif step in (PART, AVATAR) and step in s.model.machines:
            s.post(step, "close", (), CLOSE)
    for m in (PART, AVATAR, PLAYOUT):
        s.handle_all(m)  # each release awaited: its actor handles what it was sent
    s.life_task = ""
    s.post(AGENT_JOB, "released", (), "live")


_RELEASE_AFTER_JOB = tuple(st.name for st in RELEASE if "job" in st.after)


# -- inputs: what the outside world can do next ----------------------------------------------------

Input = tuple[str, str, Callable[["_W"], None]]  # (action, label, what it does)
Inputs = Literal["all", "job", "avatar"]


def _joins(s: _W, who: str) -> None:
    setattr(s, who, True)
    s.room_fact("participant_joined", who=who)


def _leaves(s: _W, who: str, reason: str) -> None:
    setattr(s, who, False)
    if who == s.linked:
        s.speaking = False  # nobody there to speak
    s.room_fact("participant_left", who=who, reason=reason)


def _people_inputs(w: World, cfg: Config, who: str) -> Iterator[Input]:
    if w.room != "connected":
        return
    if who == "simulator" and not cfg.simulation:
        return
    if not getattr(w, who):
        yield f"{who}_joins", f"{who} joins", partial(_joins, who=who)
    else:
        for reason in ("CLIENT_INITIATED", "SIGNAL_CLOSE"):
            yield (
                f"{who}_leaves:{reason}",
                f"{who} leaves ({reason})",
                partial(_leaves, who=who, reason=reason),
            )


def _room_disconnects(s: _W) -> None:
    s.room = "disconnected"
    s.room_fact("room_disconnected")


def _finalize_request(s: _W) -> None:
    req = len(s.requests)
    owed = s.job in LIVE_JOB
    if not s.reading and not owed:
        return  # nobody reads it and nobody owes it an answer: nothing to follow
    s.requests = (*s.requests, (owed, True, "queued" if s.reading else "not_read", ()))
    if s.reading:
        s.post(HOST, "finalize", (("caller", "simulator"), ("req", req)))


def _stranger_asks(s: _W) -> None:
    # a participant without the lk.simulator attribute
    s.stranger_req = len(s.requests)
    s.requests = (*s.requests, (False, False, "queued", ()))
    s.post(HOST, "finalize", (("caller", "stranger"), ("req", s.stranger_req)))


def _ping(s: _W) -> None:
    s.post(HOST, "request", (("caller", "simulator"),))


def _malformed(s: _W) -> None:
    s.post(HOST, "bad_request", (("caller", "simulator"),))


def _attach_b(s: _W) -> None:
    s.sess_b = "running"
    s.post(HOST, "attach", (("session", "B"),))


def _close_a(s: _W) -> None:
    s.sess_a = "closing"


def _close_b(s: _W) -> None:
    s.sess_b = "closing"


def _shutdown(s: _W) -> None:
    # livekit's order, as the scenario runner does it: the primary session closes, then
    # the job is told (on_session_end)
    if s.sess_a == "running":
        s.sess_a = "closing"
    s.post(JOB, "shutdown")


def _request_deletion(s: _W) -> None:
    s.post(DEL, "request")
    if not s.model.glue.defer_room_deletion:
        s.post(DEL, "allow")


def _release(s: _W) -> None:
    # JobRuntime.aclose(): the deletion is released (a call under way ends first)
    s.post(DEL, "close", (), CLOSE)


def _avatar_start(s: _W) -> None:
    # AgentJob.start_avatar(): a part of the start, the lifecycle asked first
    s.post(AGENT_JOB, "start_part")
    s.post(AVATAR, "start")


def _aclose(s: _W) -> None:
    s.waiting = True
    s.post(AGENT_JOB, "close")


def _abort(s: _W) -> None:
    s.waiting = True
    s.post(AGENT_JOB, "abort")


def aclose_returns(s: _W) -> None:
    """The lifecycle closed: a call of AgentJob.aclose() waiting for it goes on, and lets a
    room deletion still under way run to its end or its bound (``JobSystem.aclose``)."""
    s.waiting = False
    s.post(DEL, "close", (), CLOSE)


def _avatar_video(s: _W) -> None:
    s.av_video = True
    s.room_fact("track_published", who="avatar", kind="video")


def _avatar_leaves(s: _W) -> None:
    s.av_present = s.av_video = False
    s.room_fact("participant_left", who="avatar", reason="CLIENT_INITIATED")


def _avatar_joins(s: _W) -> None:
    s.av_present = True
    s.room_fact("participant_joined", who="avatar")


def _interrupt(s: _W, playing: bool) -> None:
    # AvatarLifecycle._on_sink_clear: where the plugin's own clear runs (PLUGIN_CLEARS) it
    # has run by the time the machine hears of it
    delivered = s.avatar in PLUGIN_CLEARS
    s.post(AVATAR, "interrupt", (("delivered", delivered), ("playing", playing)))
    if playing and s.model.playout:
        # the speech handle's interruption reaches the playout machine after the sink's
        # clear; a cut while the joined avatar has (or is about to have) the agent's audio
        # leaves it to the avatar's word on the cut
        if delivered and s.route == "avatar" and s.play in PLAYOUT_TURN:
            s.pending = True
        s.post(PLAYOUT, "interrupted")


def _avatar_close(s: _W) -> None:
    s.post(AVATAR, "close", (), CLOSE)


def inputs(model: Model, w: World) -> Iterator[Input]:
    cfg = model.config
    if w.job in model.inert[JOB]:
        # the job is over: only what may still come before its process exits
        if model.inputs == "avatar" or w.dele in model.inert[DEL]:
            return
        if any(e[0] == DEL and e[3] == CLOSE for e in w.queue):
            return
        if not w.deletion_requested and not cfg.delete_room_on_close:
            yield "request_deletion", "end-call tool asks for room deletion", _request_deletion
        yield "release", "JobRuntime.aclose(): the deletion released", _release
        return
    up = w.room == "connected"
    if up:
        yield "room_disconnects", "room disconnects", _room_disconnects
    if model.inputs != "avatar":
        yield from _job_inputs(model, w, cfg, up)
    else:
        # the user, so that the avatar's comings and goings reach a linked participant
        yield from _people_inputs(w, cfg, "user")
    if model.inputs != "job":
        yield from _avatar_inputs(model, w, up)
        if model.playout:
            yield from _playout_inputs(model, w, up)


def _job_inputs(model: Model, w: World, cfg: Config, up: bool) -> Iterator[Input]:
    for who in ("user", "sip", "simulator"):
        yield from _people_inputs(w, cfg, who)
    asked = len(w.requests) - (w.stranger_req >= 0)
    if up and w.simulator and asked < cfg.max_finalize_requests:
        yield "finalize", "finalize_simulation request", _finalize_request
    if up and w.reading and w.stranger_req < 0 and w.job in LIVE_JOB:
        yield (
            "stranger_finalize",
            "finalize_simulation from someone not the simulator",
            (_stranger_asks),
        )
    if up and w.reading and model.inputs == "all":
        # the host's other doors: no world of the model's changes (a self-loop in every
        # world, left to the deep plans and the conformance replay)
        yield "ping", "the simulator sends another session request (ping)", _ping
        yield "malformed", "the simulator sends a malformed finalize_simulation", _malformed
    if w.sess_b == "none" and not w.host_actor_closed and w.host != "closed":
        yield "attach_b", "session B attaches", _attach_b
    if w.sess_a == "running":
        yield "close_a", "session A closes", _close_a
    if w.sess_b == "running":
        yield "close_b", "session B closes", _close_b
    if not w.shutdown_asked:
        yield "shutdown", "job.shutdown", _shutdown
    if not w.deletion_requested and not cfg.delete_room_on_close:  # else it is implied
        yield "request_deletion", "end-call tool asks for room deletion", _request_deletion
    if not cfg.aclose:
        return
    # the user's own calls on AgentJob, each returning once the job is closed: a graceful
    # close, and an abort (also while a graceful close holds for the simulator)
    if w.life in LIFE_UP:
        yield "aclose", "AgentJob.aclose()", _aclose
    if not w.aborted and (w.life in LIFE_UP or w.job in LIVE_JOB):
        yield "abort", "AgentJob.aclose(graceful=False)", _abort


def _avatar_inputs(model: Model, w: World, up: bool) -> Iterator[Input]:
    if w.avatar_actor_closed:
        return
    if w.avatar == model.specs[AVATAR].initial and w.life in LIFE_UP:
        # (once the job is closing, start_avatar() is refused and changes nothing)
        yield "avatar_start", "avatar.start", _avatar_start
    elif up and not w.av_present:
        yield "avatar_joins", "avatar joins", _avatar_joins
    if up and w.av_present and not w.av_video:
        yield "avatar_video", "avatar publishes video", _avatar_video
    if up and w.av_present:
        yield "avatar_leaves", "avatar leaves", _avatar_leaves
    yield "interrupt", "interrupt", partial(_interrupt, playing=True)
    if w.avatar == "joined":
        # the session's own clear with nothing playing
        yield "interrupt_idle", "interrupt (nothing playing)", partial(_interrupt, playing=False)
    if not any(e[0] == AVATAR and e[3] == CLOSE for e in w.queue):
        yield "avatar_close", "avatar.close", _avatar_close


# the session's and the avatar's side of playout (PlayoutTracker follows them): the agent's
# turns reduced to their start, the hand-off of its audio to the avatar's sink, the avatar's
# report, the SDK's own playout report, the linked user's speech


def _post_playout(s: _W, event: str) -> None:
    s.post(PLAYOUT, event)


def _handed_off(s: _W) -> None:
    s.pending = True  # at the joined avatar, until it reports or the sink finishes it
    s.post(PLAYOUT, "handed_off")


def _playback_report(s: _W) -> None:
    # AvatarLifecycle's lk.playback_finished handler: the avatar machine, then playout
    s.post(AVATAR, "playback_finished")
    s.post(PLAYOUT, "playback_finished")


def _user_speaks(s: _W, speaking: bool) -> None:
    s.speaking = speaking
    if speaking:
        s.post(PLAYOUT, "user_speaking")


def _playout_inputs(model: Model, w: World, up: bool) -> Iterator[Input]:
    if w.play in model.inert[PLAYOUT] or w.sess_a != "running":
        return  # a session closing or closed takes no new turn
    turn = w.play in PLAYOUT_TURN
    if not turn:
        # a new turn: a reply queued, the agent thinking, or speaking at once
        for event in ("speech_created", "agent_thinking", "agent_speaking"):
            yield f"turn:{event}", f"a new agent turn: {event}", partial(_post_playout, event=event)
    elif w.route == "avatar" and w.avatar in PLUGIN_CLEARS:
        yield "handed_off", "the avatar's sink takes the agent's audio", _handed_off
    if up and w.av_present and (w.pending or w.play == "remote_playout"):
        yield "playback_report", "the avatar reports lk.playback_finished", _playback_report
    if turn and not w.pending:
        # the SDK's wait ends only once nothing is left at the avatar's sink: the agent
        # state back to listening, or the speech's end where it never reached the output
        for event, label in (
            ("agent_listening", "the agent's audio played (the SDK's report)"),
            ("speech_done", "the agent's speech ends"),
        ):
            yield f"turn:{event}", label, partial(_post_playout, event=event)
    if model.config.watchdog != "off" and w.part == "linked":
        if w.speaking:
            yield (
                "user_quiet",
                "the linked user stops speaking",
                partial(_user_speaks, speaking=False),
            )
        else:
            yield "user_speaks", "the linked user speaks", partial(_user_speaks, speaking=True)


# -- work running aside, and its outcomes ------------------------------------------------------
# (action, label, auto, what it does): ``auto`` work ends by itself with one outcome as soon
# as it can (the runtime does it unasked); the rest are outcomes the outside world chooses.

Work = tuple[str, str, bool, Callable[["_W"], None]]
# the work the runtime finishes by itself, by action (the rest is chosen from outside)
AUTO_WORK = {
    "drained": "the host's drain ends: nothing in flight",
    "close_host_done": "run_close: the session host closed",
    "close_session_closed": "run_close: the session closed, the avatar's step begins",
    "close_session_done": "run_close: the session and the avatar closed",
    "close_deletion_done": "run_close: the room deletion settled",
}


def _verdict_ready(s: _W) -> None:
    s.fin_task = ""
    s.post(FIN, "verdict_ready", (("req", s.fin_req),), "live")


def _verdict_hangs(s: _W) -> None:
    s.fin_task = f"{s.fin}:hung"  # stuck until its state is left


def _drained(s: _W) -> None:
    s.host_task = ""
    s.post(HOST, "drained", (), "live")


def _plugin_routed(s: _W) -> None:
    # the plugin's start() replaced the audio tail and goes on (its last lines, or a wait)
    s.av_task = f"{s.av_task.split(':')[0]}:routed"
    s.route = "avatar"


def _plugin_hangs(s: _W) -> None:
    # stuck until its state is left (start_timeout or close cancels it)
    s.av_task = f"{s.av_task.split(':')[0]}:hung"


def _plugin_returns(s: _W, routed: bool, error: bool = False) -> None:
    # the task records the sink right after start() returns or raises, then reports
    s.av_task = ""
    if routed:
        s.installed = True
    event = "start_error" if error else "plugin_started" if routed else "no_route"
    s.post(AVATAR, event, (), "live")


def _clear_done(s: _W) -> None:
    s.av_task = ""
    s.post(AVATAR, "clear_buffer_done", (), "live")


def _session_closed(s: _W, session: str) -> None:
    setattr(s, "sess_a" if session == "A" else "sess_b", "closed")
    s.fire(SESSION, "close", (("session", session),), primary=session == "A")


def _a_hangs(s: _W) -> None:
    s.sess_a = "hung"  # AgentSession.aclose() never returns: no close event, no task end


def _deletion_returns(s: _W, ok: bool) -> None:
    s.dele_task = ""
    s.post(DEL, "delete_done" if ok else "delete_failed", (), "live")


def work(model: Model, w: World | _W) -> Iterator[Work]:
    if not (
        w.fin_task or w.host_task or w.av_task or w.dele_task or w.job_task or w.life_task
    ) and "closing" not in (w.sess_a, w.sess_b):
        return  # nothing runs aside (asked of every world explored: the common answer first)
    if w.fin_task.endswith(":start"):
        n = w.fin_req + 1
        yield "verdict_ready", f"on_simulation_end returns for request #{n}", False, _verdict_ready
        yield (
            "verdict_hangs",
            f"on_simulation_end never returns for request #{n}",
            False,
            (_verdict_hangs),
        )
    if w.host_task.endswith(":start") and (
        not model.glue.drain_finalize_on_close
        or (w.fin not in ("answering", "replying") and not any(e[0] == FIN for e in w.queue))
    ):
        yield "drained", AUTO_WORK["drained"], True, _drained
    if w.av_task.endswith(":start"):
        yield "plugin_routed", "avatar plugin puts its route in", False, _plugin_routed
        yield (
            "plugin_fails",
            "avatar plugin start() fails early",
            False,
            partial(_plugin_returns, routed=False, error=True),
        )
        yield (
            "plugin_no_route",
            "avatar plugin start() returns with no route (its error swallowed)",
            False,
            partial(_plugin_returns, routed=False),
        )
        yield "plugin_hangs", "avatar plugin start() hangs", False, _plugin_hangs
    elif w.av_task.endswith(":routed"):
        yield (
            "plugin_returns",
            "avatar plugin start() returns",
            False,
            partial(_plugin_returns, routed=True),
        )
        yield (
            "plugin_fails_late",
            "avatar plugin start() fails late",
            False,
            partial(_plugin_returns, routed=True, error=True),
        )
        yield (
            "plugin_hangs_routed",
            "avatar plugin start() hangs, its route in",
            False,
            (_plugin_hangs),
        )
    elif w.av_task.endswith(":clear"):
        # whatever its RPC's outcome, the plugin's own clear ends (bounded by the SDK)
        yield "clear_settles", "the plugin's own clear settles", False, _clear_done
    if w.sess_a == "closing":
        yield "a_closed", "session A finishes closing", False, partial(_session_closed, session="A")
        if w.part == "closing":  # the close the link started and bounds
            yield "a_hangs", "session A's close hangs", False, _a_hangs
    if w.sess_b == "closing":
        yield "b_closed", "session B finishes closing", False, partial(_session_closed, session="B")
    if w.dele_task.endswith(":start"):
        yield (
            "deletion_returns",
            "the room deletion returns",
            False,
            partial(_deletion_returns, ok=True),
        )
        yield (
            "deletion_fails",
            "the room deletion fails",
            False,
            partial(_deletion_returns, ok=False),
        )
    step = w.job_task.partition(":")[2]
    if step == "host" and (
        w.host_actor_closed
        or (w.host == "closed" and not any(e[0] == HOST and e[3] == CLOSE for e in w.queue))
    ):
        yield "close_host_done", AUTO_WORK["close_host_done"], True, _host_closed
    elif step == "session" and w.sess_a not in ("closing", "hung"):
        yield "close_session_closed", AUTO_WORK["close_session_closed"], True, _avatar_step
    elif step == "avatar" and w.sess_a not in ("closing", "hung"):
        yield "close_session_done", AUTO_WORK["close_session_done"], True, _session_step_done
    elif step == "room" and w.dele != "deleting" and not any(e[0] == DEL for e in w.queue):
        yield "close_deletion_done", AUTO_WORK["close_deletion_done"], True, _deletion_settled
    elif step == "callbacks":
        yield (
            "callbacks_return",
            "run_close: shutdown callbacks return",
            False,
            partial(_callbacks, hang=False),
        )
        yield (
            "callback_hangs",
            "run_close: a shutdown callback hangs",
            False,
            partial(_callbacks, hang=True),
        )


# run_close's bounds on the session's close: the session and avatar steps' shares of
# close_timeout (timers of the job's task, not of a state): the time moves of the model
def bounds(model: Model, w: World) -> Iterator[tuple[str, str, Callable[[_W], None]]]:
    if not w.job_task:
        return
    step = w.job_task.partition(":")[2]
    if step == "session" and w.sess_a in ("closing", "hung"):
        # the session step's share: the avatar's close is held back no longer
        yield (
            "close_session_wait",
            "time passes: run_close's wait for the session's close",
            (_avatar_step),
        )
    if step == "avatar" and w.sess_a in ("closing", "hung"):
        yield (
            "close_session_bound",
            "time passes: run_close's bound on the session's close",
            (_session_step_done),
        )
