"""An abstract model of one job: the specs composed as the runtime composes them.

Pure (no asyncio, no livekit, no clock). Each machine decides through ``statemachines.step``
on its own spec; what the runtime does around the decisions is mirrored here in the
abstract: guard values from the job's facts, effects as changes to those facts and as
events posted to the machines (the runtimes in ``agent_runtime`` and the scenario runner
are what this copies), one mailbox per machine handled one event at a time, state timers
armed on entry and cancelled on exit, state-scoped tasks (the job's close work, the avatar
plugin's start, the clear-buffer RPC, the room deletion, the host's drain, the finalize's
on_simulation_end), and the work that runs aside (a session closing).

A world is an immutable, hashable ``World``; ``successors`` lists what can happen next:

* ``input``: something outside the runtime (a participant leaves, the room disconnects,
  the simulator asks for its verdict, the job is told to shut down, ...);
* ``time``: a state timeout or a drain bound, enabled only while its timer is armed;
* ``internal``: one machine handles the head of its mailbox, or work running aside ends.

Internal steps interleave freely with inputs and with each other, as the actors' mailboxes
and tasks do on one event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, NamedTuple

from statemachines import MachineSpec, Step, step
from statemachines.machines import MACHINES

AVATAR, JOB, HOST, PART = "avatar", "job", "session_host", "participant"
DEL, FIN = "room_deletion", "finalize"
MACHINE_NAMES = (AVATAR, JOB, HOST, PART, DEL, FIN)
LIVE_JOB = ("serving", "awaiting_finalize")

# a mailbox entry: (machine, event, params, token). Params are sorted (key, value) pairs.
# The token marks what the actor checks at delivery: a timer's or a task's event is "live"
# until its state is left ("stale": dropped); "close" is the close that
# AvatarLifecycle.aclose() or JobSessionHost.aclose() sends
Params = tuple[tuple[str, Any], ...]
Entry = tuple[str, str, Params, str]
NONE, LIVE, STALE, CLOSE = "", "live", "stale", "close"

Kind = Literal["input", "time", "internal"]

# what happened to one finalize_simulation request, as the simulator sees it
ANSWERED = frozenset({"verdict", "error"})
# no reply, for a reason outside the runtime's control: the simulator left or the room went
# before the reply
EXCUSED = frozenset({"unreachable", "no_room"})


@dataclass(frozen=True)
class Config:
    """The runtime settings a run is explored under (one exploration per config)."""

    simulation: bool = True
    close_on_disconnect: bool = True
    grace: bool = True  # grace_period > 0
    rejoin: bool = False  # retry_avatar's rejoin: a late join routes audio again
    retry_attempts: int = 0  # retry_avatar's attempts (every cause transient)
    delete_room_on_close: bool = False
    max_finalize_requests: int = 2

    def label(self) -> str:
        parts = ["simulation" if self.simulation else "no simulation"]
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
        return ", ".join(parts)


@dataclass(frozen=True)
class Glue:
    """What the runtime does around the tables. Every flag is True in the real runtime;
    tests turn one off to show the checker notices (fault injection)."""

    restore_route: bool = True  # avatar restore_route puts the previous route back
    cancel_timers_on_exit: bool = True  # the actor cancels a state's timer when it leaves
    drop_stale_timeouts: bool = True  # a timer event of a left state is dropped
    unsubscribe_on_replace: bool = True  # attaching B over A stops forwarding A
    defer_room_deletion: bool = True  # only closing's room work allows the room deletion
    # closing the host lets an in-flight verdict out, then cuts it with an error reply
    drain_finalize_on_close: bool = True
    # the composed job shuts down when the link gives up on a hung session close (the
    # link's close_timed_out, wired to job.shutdown)
    shutdown_on_close_timeout: bool = True


DEFAULT_GLUE = Glue()


class World(NamedTuple):
    """One reachable state of the composed job (all of it: machines, mailboxes, facts)."""

    # the machines
    avatar: str
    job: str
    host: str
    part: str
    dele: str  # room_deletion
    fin: str  # finalize
    # every machine's mailbox, as one list in the order the events were posted
    queue: tuple[Entry, ...]
    # state timers: the state that armed it, or ""
    t_avatar: str
    t_job: str
    t_part: str
    t_dele: str
    t_host: str
    # state-scoped tasks: "" or "STATE:PHASE" (the job's run_close, the deletion's call,
    # the host's drain, the finalize's on_simulation_end)
    job_task: str
    dele_task: str
    host_task: str
    fin_task: str
    # the room and who is in it
    room: str  # connected | disconnected
    user: bool
    simulator: bool
    av_present: bool
    av_video: bool
    # where the agent's audio goes
    route: str  # room | avatar
    # sessions: A is the primary (linked) one, B may attach later
    sess_a: str  # running | closing | closed | hung (its close never ends)
    sess_b: str  # none | running | closing | closed
    # the job
    shutdown_asked: bool
    deletion_requested: bool
    room_step_done: bool
    deletions: int  # server calls to delete the room started
    # AvatarLifecycle
    installed: bool  # the sink the plugin installed is recorded
    # the avatar's state-scoped task: "" or "STATE:PHASE" (starting:start, the plugin's
    # start() running; starting:routed, its route put in but start() not returned yet;
    # starting:hung, a start() that never returns, its route in or not; clearing:clear, the
    # lk.clear_buffer RPC in flight)
    av_task: str
    avatar_actor_closed: bool
    av_attempts: int  # restarts of the plugin made (the retry policy's count)
    # ParticipantLink
    linked: bool
    # JobSessionHost and its FinalizeAnswer
    attached: str  # "" | A | B
    subscribed: tuple[str, ...]  # sessions whose events are forwarded
    fin_req: int  # the finalize request being answered, or -1
    fin_answered: bool  # a verdict reached the transport
    transport_open: bool
    reading: bool  # the host reads requests
    host_actor_closed: bool  # host.aclose() returned: both actors closed
    # the simulator's side: per finalize request (owed, status)
    requests: tuple[tuple[bool, str], ...]
    stranger_req: int  # the request a participant who is not the simulator sent, or -1
    verdicts: int
    # marks for the checks
    hold_cut: str  # why the job closed while the simulator could still ask
    late: str  # a timer event handled after its state was left
    close_timed_out: bool  # the job's close bound ran out


FIELDS = World._fields
_STATE = {AVATAR: "avatar", JOB: "job", HOST: "host", PART: "part", DEL: "dele", FIN: "fin"}
_TIMER = {AVATAR: "t_avatar", JOB: "t_job", PART: "t_part", DEL: "t_dele", HOST: "t_host"}
_TASK = {JOB: "job_task", DEL: "dele_task", HOST: "host_task", FIN: "fin_task"}


Mailboxes = Literal["settle", "turns", "any"]
Inputs = Literal["all", "job", "avatar"]


class Move(NamedTuple):
    kind: Kind
    label: str
    world: World
    # with mailboxes="settle": the events handled on the way to ``world``, in order
    handled: tuple[Entry, ...] = ()
    # the first of those after which ``Model.watch`` saw something wrong (0: right after
    # the move itself, before any mail), or -1
    flagged: int = -1
    # to replay it world by world (``Model.passed``)
    redo: tuple[World, Callable[[_W], None]] | None = None


class _W:
    """A world being changed by one move (copied from a ``World``, frozen back after).

    The copy in and out is spelled out field by field: it runs for every move explored.
    """

    __slots__ = (*FIELDS, "model")

    avatar: str
    job: str
    host: str
    part: str
    dele: str
    fin: str
    queue: tuple[Entry, ...]
    t_avatar: str
    t_job: str
    t_part: str
    t_dele: str
    t_host: str
    job_task: str
    dele_task: str
    host_task: str
    fin_task: str
    room: str
    user: bool
    simulator: bool
    av_present: bool
    av_video: bool
    route: str
    sess_a: str
    sess_b: str
    shutdown_asked: bool
    deletion_requested: bool
    room_step_done: bool
    deletions: int
    installed: bool
    av_task: str
    avatar_actor_closed: bool
    av_attempts: int
    linked: bool
    attached: str
    subscribed: tuple[str, ...]
    fin_req: int
    fin_answered: bool
    transport_open: bool
    reading: bool
    host_actor_closed: bool
    requests: tuple[tuple[bool, str], ...]
    stranger_req: int
    verdicts: int
    hold_cut: str
    late: str
    close_timed_out: bool

    def __init__(self, model: Model, w: World) -> None:
        self.model = model
        (
            self.avatar,
            self.job,
            self.host,
            self.part,
            self.dele,
            self.fin,
            self.queue,
            self.t_avatar,
            self.t_job,
            self.t_part,
            self.t_dele,
            self.t_host,
            self.job_task,
            self.dele_task,
            self.host_task,
            self.fin_task,
            self.room,
            self.user,
            self.simulator,
            self.av_present,
            self.av_video,
            self.route,
            self.sess_a,
            self.sess_b,
            self.shutdown_asked,
            self.deletion_requested,
            self.room_step_done,
            self.deletions,
            self.installed,
            self.av_task,
            self.avatar_actor_closed,
            self.av_attempts,
            self.linked,
            self.attached,
            self.subscribed,
            self.fin_req,
            self.fin_answered,
            self.transport_open,
            self.reading,
            self.host_actor_closed,
            self.requests,
            self.stranger_req,
            self.verdicts,
            self.hold_cut,
            self.late,
            self.close_timed_out,
        ) = w

    def freeze(self) -> World:
        return World(
            self.avatar,
            self.job,
            self.host,
            self.part,
            self.dele,
            self.fin,
            self.queue,
            self.t_avatar,
            self.t_job,
            self.t_part,
            self.t_dele,
            self.t_host,
            self.job_task,
            self.dele_task,
            self.host_task,
            self.fin_task,
            self.room,
            self.user,
            self.simulator,
            self.av_present,
            self.av_video,
            self.route,
            self.sess_a,
            self.sess_b,
            self.shutdown_asked,
            self.deletion_requested,
            self.room_step_done,
            self.deletions,
            self.installed,
            self.av_task,
            self.avatar_actor_closed,
            self.av_attempts,
            self.linked,
            self.attached,
            self.subscribed,
            self.fin_req,
            self.fin_answered,
            self.transport_open,
            self.reading,
            self.host_actor_closed,
            self.requests,
            self.stranger_req,
            self.verdicts,
            self.hold_cut,
            self.late,
            self.close_timed_out,
        )

    def state_of(self, m: str) -> str:
        value: str = getattr(self, _STATE[m])
        return value

    def post(self, m: str, event: str, params: Params = (), token: str = NONE) -> None:
        """``actor.post``: dropped once the actor is closed, or when its state is final
        and answers nothing (a final state only ignores or rejects)."""
        if m == AVATAR and self.avatar_actor_closed:
            return
        if m in (HOST, FIN) and self.host_actor_closed:
            return
        if self.state_of(m) in self.model.inert[m]:
            return
        self.queue = (*self.queue, (m, event, params, token))

    def drop_mailbox(self, m: str) -> None:
        self.queue = tuple(e for e in self.queue if e[0] != m)


# the scratch copy and the world must list the same fields in the same order
assert tuple(_W.__annotations__) == FIELDS

# what the checks read: a world, or one being changed (checked on the way)
Facts = World | _W


def _p(**kw: Any) -> Params:
    return tuple(sorted(kw.items()))


def _get(params: Params, key: str, default: Any = None) -> Any:
    for k, v in params:
        if k == key:
            return v
    return default


class Model:
    """The composed job under one ``Config``; ``specs`` may replace any machine's spec."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        specs: Mapping[str, MachineSpec] | None = None,
        glue: Glue = DEFAULT_GLUE,
        mailboxes: Mailboxes = "settle",
        inputs: Inputs = "all",
    ) -> None:
        if mailboxes not in ("settle", "turns", "any"):
            raise ValueError(f"mailboxes must be settle, turns or any, not {mailboxes!r}")
        if inputs not in ("all", "job", "avatar"):
            raise ValueError(f"inputs must be all, job or avatar, not {inputs!r}")
        # which inputs arrive (the room's disconnect and the timeouts always do): the
        # avatar's inputs and the job's touch disjoint facts, so each group can be explored
        # to a depth on its own, every machine and every check still in place
        self.inputs: Inputs = inputs
        self.config = config or Config()
        self.glue = glue
        # settle: after each input, timeout or piece of work done aside, the mail it caused
        #   is handled at once, actors taking turns in posting order (as asyncio runs ready
        #   tasks); every world on the way is still checked
        # turns: the same order, but inputs may arrive between any two events handled
        # any: any actor with mail may go next (every order; far larger)
        self.mailboxes: Mailboxes = mailboxes
        # called on each world a settling move passes through; True flags the move
        self.watch: Callable[[_W], bool] | None = None
        chosen = dict(MACHINES)
        for name, spec in (specs or {}).items():
            if name not in MACHINE_NAMES:
                raise ValueError(f"unknown machine {name!r}: one of {list(MACHINE_NAMES)}")
            chosen[name] = spec
        self.specs: dict[str, MachineSpec] = chosen
        # final states with no rows out: a post there is a no-op, so it is not even queued
        self.inert: dict[str, frozenset[str]] = {
            m: frozenset(
                s.name
                for s in spec.states
                if s.final and not any(r.source == s.name for r in spec.rows)
            )
            for m, spec in chosen.items()
        }
        self._timeouts: dict[str, dict[str, tuple[str, bool]]] = {}
        for m in _TIMER:
            armed: dict[str, tuple[str, bool]] = {}
            for s in chosen[m].states:
                if s.timeout is not None:
                    armed[s.name] = (s.timeout.event, self._timer_set(s.timeout.setting))
            self._timeouts[m] = armed
        self._invokes: dict[str, dict[str, tuple[str, ...]]] = {
            m: {s.name: s.invoke for s in chosen[m].states if s.invoke} for m in (AVATAR, *_TASK)
        }
        self._effects: dict[str, Callable[[_W, str, Params], None]] = {
            # avatar: start_plugin and follow_plugin_clear are state-scoped tasks, see _enter
            "start_plugin": _noop,
            "record_route": self._fx_record_route,
            "check_presence": self._fx_check_presence,
            "restore_route": self._fx_restore_route,
            "release_attempt": self._fx_release_attempt,
            "reinstall_route": self._fx_reinstall_route,
            "follow_plugin_clear": _noop,
            "clear_local_buffer": _noop,
            "mark_playout_done": _noop,
            "put_route_back": self._fx_put_route_back,
            "unhook": _noop,  # the room listener goes: modelled as the actor taking no input
            "close_plugin": self._fx_close_plugin,
            # participant
            "link": self._fx_link,
            "relink": _noop,
            "close_session": self._fx_close_session,
            "report_close_timed_out": self._fx_close_timed_out,
            # job: run_close is a state-scoped task, see _enter
            "run_close": _noop,
            # room deletion: delete_room is its state-scoped task; the rest only log (as the
            # job's report_cut does)
            "delete_room": _noop,
            "record_deleted": _noop,
            "report_failure": _noop,
            "report_cut": _noop,
            "report_never_allowed": _noop,
            # session host
            "subscribe": self._fx_subscribe,
            "unsubscribe": self._fx_unsubscribe,
            "delegate_request": _noop,
            "reply_no_session": _noop,
            "reply_error": _noop,
            "forward_finalize": self._fx_forward_finalize,
            "refuse_stranger": self._fx_reply_error,
            "report_session_closed": self._fx_report_session_closed,
            "drain": _noop,  # closing's state task, see _internal
            "reply_closing": self._fx_reply_error,
            "close_finalize": self._fx_close_finalize,
            "close_transport": self._fx_close_transport,
            # finalize: compute_verdict is answering's state task, see _internal
            "take_request": self._fx_take_request,
            "compute_verdict": _noop,
            "send_verdict": self._fx_send_verdict,
            "report_answered": self._fx_report_answered,
            "refuse_busy": self._fx_reply_error,
            "refuse_answered": self._fx_reply_error,
            "refuse_not_simulation": self._fx_reply_error,
            "reply_unfinished": self._fx_reply_unfinished,
        }

    def _timer_set(self, setting: str) -> bool:
        """Whether the runtime arms this timeout at all (ParticipantLink passes
        ``grace_period=None`` without close_on_disconnect: grace then has no timer)."""
        return not (setting == "grace_period" and not self.config.close_on_disconnect)

    # -- the start -------------------------------------------------------------------------
    def initial(self) -> World:
        """The job just started: room connected, session A started and attached, the
        participant link following the room (a SIP leg present, and the simulator in a
        simulation), the avatar configured but not started, the user not yet there.
        With mailboxes="settle" the start-up mail is already handled."""
        w = self._start()
        if self.mailboxes == "settle":
            w = self._move("internal", "the job starts", w, _no_input).world
        return w

    def _start(self) -> World:
        cfg, sp = self.config, self.specs
        queue: tuple[Entry, ...] = (
            (HOST, "attach", _p(session="A"), NONE),
            (PART, "participant_connected", _p(who="sip"), NONE),
        )
        if cfg.simulation:
            queue += ((PART, "participant_connected", _p(who="simulator"), NONE),)
        return World(
            avatar=sp[AVATAR].initial,
            job=sp[JOB].initial,
            host=sp[HOST].initial,
            part=sp[PART].initial,
            dele=sp[DEL].initial,
            fin=sp[FIN].initial,
            queue=queue,
            t_avatar="",
            t_job="",
            t_part="",
            t_dele="",
            t_host="",
            job_task="",
            dele_task="",
            host_task="",
            fin_task="",
            room="connected",
            user=False,
            simulator=cfg.simulation,
            av_present=False,
            av_video=False,
            route="room",
            sess_a="running",
            sess_b="none",
            shutdown_asked=False,
            deletion_requested=False,
            room_step_done=False,
            deletions=0,
            installed=False,
            av_task="",
            avatar_actor_closed=False,
            av_attempts=0,
            linked=False,
            attached="",
            subscribed=(),
            fin_req=-1,
            fin_answered=False,
            transport_open=True,
            reading=True,
            host_actor_closed=False,
            requests=(),
            stranger_req=-1,
            verdicts=0,
            hold_cut="",
            late="",
            close_timed_out=False,
        )

    # -- what can happen next ----------------------------------------------------------------
    def successors(self, w: World, *, kinds: frozenset[Kind] | None = None) -> list[Move]:
        out: list[Move] = []
        want_inputs = kinds is None or "input" in kinds
        want_time = kinds is None or "time" in kinds
        want_internal = kinds is None or "internal" in kinds
        if want_internal:
            out.extend(self._internal(w))
        if want_time:
            out.extend(self._time(w))
        if want_inputs:
            out.extend(self._inputs(w))
        return out

    def _move(self, kind: Kind, label: str, w: World, fn: Callable[[_W], None]) -> Move:
        s = _W(self, w)
        fn(s)
        if self.mailboxes != "settle" or not s.queue:
            return Move(kind, label, s.freeze())
        # the worlds on the way are checked as they pass (``watch``), not kept: most
        # moves end in a world seen before, and freezing each one would double the cost
        # (the world it ends in is checked by the caller, once per new world)
        watch = self.watch
        flagged = -1
        handled: list[Entry] = []
        while True:
            if not s.queue:
                break
            k = 0
            if flagged < 0 and watch is not None and watch(s):
                flagged = len(handled)
            handled.append(s.queue[k])
            self._deliver(s, k)
        return Move(kind, label, s.freeze(), tuple(handled), flagged, (w, fn))

    def passed(self, mv: Move) -> list[tuple[str, World]]:
        """Each world ``mv`` went through (with mailboxes="settle"), labelled by what
        led to it: the move itself first, then each event handled."""
        if mv.redo is None:
            return [(mv.label, mv.world)]
        w, fn = mv.redo
        s = _W(self, w)
        fn(s)
        out = [(mv.label, s.freeze())]
        for entry in mv.handled:
            self._deliver(s, 0)
            out.append((mail_label(entry), s.freeze()))
        return out

    def _internal(self, w: World) -> Iterator[Move]:
        if self.mailboxes == "any":
            seen: set[str] = set()
            for k, entry in enumerate(w.queue):
                if entry[0] in seen:
                    continue
                seen.add(entry[0])
                yield self._move("internal", mail_label(entry), w, partial(self._deliver, k=k))
        else:
            if w.queue:
                yield self._move(
                    "internal", mail_label(w.queue[0]), w, lambda s: self._deliver(s, 0)
                )
        if w.fin_task.endswith(":start"):
            yield self._move(
                "internal",
                f"on_simulation_end returns for request #{w.fin_req + 1}",
                w,
                _verdict_ready,
            )
            yield self._move(
                "internal",
                f"on_simulation_end never returns for request #{w.fin_req + 1}",
                w,
                _verdict_hangs,
            )
        if w.host_task.endswith(":start") and (
            not self.glue.drain_finalize_on_close
            or (w.fin not in ("answering", "replying") and not any(e[0] == FIN for e in w.queue))
        ):
            yield self._move("internal", "the host's drain ends: nothing in flight", w, _drained)
        if w.av_task.endswith(":start"):
            yield self._move("internal", "avatar plugin puts its route in", w, _plugin_routed)
            yield self._move(
                "internal",
                "avatar plugin start() fails early",
                w,
                partial(_plugin_returns, routed=False, error=True),
            )
            yield self._move(
                "internal",
                "avatar plugin start() returns with no route (its error swallowed)",
                w,
                partial(_plugin_returns, routed=False),
            )
            yield self._move("internal", "avatar plugin start() hangs", w, _plugin_hangs)
        elif w.av_task.endswith(":routed"):
            yield self._move(
                "internal",
                "avatar plugin start() returns",
                w,
                partial(_plugin_returns, routed=True),
            )
            yield self._move(
                "internal",
                "avatar plugin start() fails late",
                w,
                partial(_plugin_returns, routed=True, error=True),
            )
            yield self._move(
                "internal", "avatar plugin start() hangs, its route in", w, _plugin_hangs
            )
        elif w.av_task.endswith(":clear"):
            # whatever its RPC's outcome, the plugin's own clear ends (bounded by the SDK)
            yield self._move("internal", "the plugin's own clear settles", w, _clear_done)
        if w.sess_a == "closing":
            yield self._move("internal", "session A finishes closing", w, _a_closed)
            if w.part == "closing":  # the close the link started and bounds
                yield self._move("internal", "session A's close hangs", w, _a_hangs)
        if w.sess_b == "closing":
            yield self._move("internal", "session B finishes closing", w, _b_closed)
        if w.dele_task.endswith(":start"):
            yield self._move("internal", "the room deletion returns", w, _deletion_returns)
            yield self._move("internal", "the room deletion fails", w, _deletion_fails)
        if w.job_task.endswith(":host") and (
            w.host_actor_closed
            or (w.host == "closed" and not any(e[0] == HOST and e[3] == CLOSE for e in w.queue))
        ):
            yield self._move(
                "internal", "run_close: room work, room deletion allowed", w, _run_close_room
            )
        elif (
            w.job_task.endswith(":deletion")
            and w.dele != "deleting"
            and not any(e[0] == DEL for e in w.queue)
        ):
            yield self._move(
                "internal",
                "run_close: shutdown callbacks",
                w,
                partial(_run_close_callbacks, hang=False),
            )
            yield self._move(
                "internal",
                "run_close: a shutdown callback hangs",
                w,
                partial(_run_close_callbacks, hang=True),
            )

    def _time(self, w: World) -> Iterator[Move]:
        for m in _TIMER:
            armed_in = getattr(w, _TIMER[m])
            if armed_in:
                event = self._timeouts[m][armed_in][0]
                yield self._move("time", f"time passes: {event}", w, partial(_fire, m=m))

    def _inputs(self, w: World) -> Iterator[Move]:
        cfg = self.config
        if w.job in self.inert[JOB]:
            # the job is over: only what may still come before its process exits
            yield from self._late_inputs(w, cfg)
            return
        up = w.room == "connected"
        if up:
            yield self._move("input", "room disconnects", w, _room_disconnects)
        if self.inputs != "avatar":
            yield from self._job_inputs(w, cfg, up)
        else:
            # the user, so that the avatar's comings and goings reach a linked participant
            # and one in grace too
            yield from self._user_inputs(w, up)
        if self.inputs != "job":
            yield from self._avatar_inputs(w, up)

    def _late_inputs(self, w: World, cfg: Config) -> Iterator[Move]:
        # an end-call tool may still ask for the deletion until the runtime is released
        if self.inputs == "avatar" or w.dele in self.inert[DEL]:
            return
        if any(e[0] == DEL and e[3] == CLOSE for e in w.queue):
            return
        if not w.deletion_requested and not cfg.delete_room_on_close:
            yield self._move("input", "end-call tool asks for room deletion", w, _request_deletion)
        yield self._move("input", "JobRuntime.aclose(): the deletion released", w, _release)

    def _user_inputs(self, w: World, up: bool) -> Iterator[Move]:
        if up and not w.user:
            yield self._move("input", "user joins", w, _user_joins)
        if up and w.user:
            yield self._move(
                "input", "user leaves (CLIENT_INITIATED)", w, lambda s: _user_leaves(s, True)
            )
            yield self._move(
                "input", "user leaves (SIGNAL_CLOSE)", w, lambda s: _user_leaves(s, False)
            )

    def _job_inputs(self, w: World, cfg: Config, up: bool) -> Iterator[Move]:
        yield from self._user_inputs(w, up)
        if up:
            yield self._move("input", "SIP participant joins", w, _sip_joins)
            yield self._move("input", "SIP participant leaves", w, _sip_leaves)
        if up and w.simulator:
            yield self._move("input", "simulator leaves", w, _simulator_leaves)
        if up and cfg.simulation and not w.simulator:
            yield self._move("input", "simulator joins", w, _simulator_joins)
        asked = len(w.requests) - (w.stranger_req >= 0)
        if up and w.simulator and asked < cfg.max_finalize_requests:
            yield self._move("input", "finalize_simulation request", w, _finalize_request)
        if up and w.reading and w.stranger_req < 0 and w.job in LIVE_JOB:
            yield self._move(
                "input", "finalize_simulation from someone not the simulator", w, _stranger_asks
            )
        if w.sess_b == "none" and not w.host_actor_closed and w.host != "closed":
            yield self._move("input", "session B attaches", w, _attach_b)
        if w.sess_a == "running":
            yield self._move("input", "session A closes", w, _close_a)
        if w.sess_b == "running":
            yield self._move("input", "session B closes", w, _close_b)
        if not w.shutdown_asked:
            yield self._move("input", "job.shutdown", w, _shutdown)

        if not w.deletion_requested and not cfg.delete_room_on_close:  # else it is implied
            yield self._move("input", "end-call tool asks for room deletion", w, _request_deletion)

    def _avatar_inputs(self, w: World, up: bool) -> Iterator[Move]:
        if w.avatar_actor_closed:
            return
        if w.avatar == self.specs[AVATAR].initial:
            yield self._move("input", "avatar.start", w, _avatar_start)
        elif up and not w.av_present:
            yield self._move("input", "avatar joins", w, _avatar_joins)
        if up and w.av_present and not w.av_video:
            yield self._move("input", "avatar publishes video", w, _avatar_video)
        if up and w.av_present:
            yield self._move("input", "avatar leaves", w, _avatar_leaves)
        yield self._move("input", "interrupt", w, partial(_interrupt, playing=True))
        if w.avatar == "joined":
            # the session's own clear with nothing playing
            yield self._move(
                "input", "interrupt (nothing playing)", w, partial(_interrupt, playing=False)
            )
        if not any(e[0] == AVATAR and e[3] == CLOSE for e in w.queue):
            yield self._move(
                "input", "avatar.close", w, lambda s: s.post(AVATAR, "close", (), CLOSE)
            )

    # -- one machine handles one event ---------------------------------------------------------
    def _deliver(self, s: _W, k: int) -> None:
        m, event, params, token = s.queue[k]
        s.queue = s.queue[:k] + s.queue[k + 1 :]
        if token == STALE:
            if self.glue.drop_stale_timeouts:
                return
            s.late = s.late or f"{m} handled {event} after the state that armed it was left"
        if m == JOB and event == "close_timeout":
            s.close_timed_out = True  # the bound ran out, whatever the table does with it
        spec = self.specs[m]
        source = s.state_of(m)
        st = step(spec, source, event, lambda g: self._guard(s, m, g, params))
        if st.outcome == "transition":
            if st.changed:
                self._leave(s, m)
            setattr(s, _STATE[m], st.dest)
            if st.changed:
                self._enter(s, m)
                if m == JOB:
                    self._job_changed(s, st)
            for name in st.effects:
                self._effects[name](s, m, params)
        if token == CLOSE and m == AVATAR:
            # AvatarLifecycle.aclose(): after its close step the actor closes, dropping the
            # rest of its mailbox and cancelling its tasks
            s.avatar_actor_closed = True
            s.drop_mailbox(AVATAR)
            s.av_task = ""

    def _leave(self, s: _W, m: str) -> None:
        if m in _TIMER and self.glue.cancel_timers_on_exit:
            setattr(s, _TIMER[m], "")
        if m in _TASK:
            setattr(s, _TASK[m], "")  # cancelled with its state
        elif m == AVATAR:
            s.av_task = ""
        # timer and task events already queued belong to the state being left
        if any(e[0] == m and e[3] == LIVE for e in s.queue):
            s.queue = tuple(
                (mm, e, p, STALE if mm == m and t == LIVE else t) for mm, e, p, t in s.queue
            )

    def _enter(self, s: _W, m: str) -> None:
        state = s.state_of(m)
        if m in _TIMER:
            armed = self._timeouts[m].get(state)
            if armed is not None and armed[1]:
                setattr(s, _TIMER[m], state)
        if m in _TASK and self._invokes[m].get(state):
            setattr(s, _TASK[m], f"{state}:start")
            # a task's first turn comes before any timer can fire: what it does first is
            # done here (the deletion's server call starts, run_close asks the host to close)
            if m == DEL:
                s.deletions += 1
            elif m == JOB:
                _run_close_host(s)
        elif m == AVATAR:
            invoke = self._invokes[m].get(state, ())
            if "start_plugin" in invoke:
                s.av_task = f"{state}:start"
            elif "follow_plugin_clear" in invoke:
                s.av_task = f"{state}:clear"

    def _job_changed(self, s: _W, st: Step) -> None:
        # the hold ends on the simulator leaving, the room going or the bound; leaving the
        # live states for any other reason while the simulator could still ask cuts it short
        if (
            st.source in LIVE_JOB
            and st.dest not in LIVE_JOB
            and st.event not in ("simulator_left", "room_disconnected", "hold_timeout")
            and self.hold_needed(s)
            and not s.hold_cut
        ):
            s.hold_cut = f"job went {st.source} -> {st.dest} on {st.event} with the hold needed"

    def hold_needed(self, s: _W | World) -> bool:
        """JobRuntime.hold_needed."""
        return (
            self.config.simulation and s.simulator and s.room == "connected" and not s.fin_answered
        )

    # -- guards --------------------------------------------------------------------------------
    def _guard(self, s: _W, m: str, g: str, params: Params) -> bool:
        cfg = self.config
        if m == AVATAR:
            if g == "has_video":
                return s.av_present and s.av_video
            if g == "avatar_present":
                return s.av_present
            if g == "rejoin":
                return cfg.rejoin and s.installed
            if g == "retry_left":
                return s.av_attempts < cfg.retry_attempts
            if g == "delivered":
                return bool(_get(params, "delivered", False))
            if g == "clear_pending":
                # the plugin's own clear holds its sink: something was playing to it
                return bool(_get(params, "delivered", False)) and bool(_get(params, "playing"))
        elif m == PART:
            who = _get(params, "who")
            if g == "eligible":
                return bool(who == "user")  # the configured identity; others never link
            if g in ("is_linked", "same_identity"):
                return s.linked and who == "user"
            if g == "closing_reason":
                return cfg.close_on_disconnect and bool(_get(params, "closing", False))
            if g == "grace_enabled":
                return not cfg.close_on_disconnect or cfg.grace
        elif m == JOB:
            if g == "hold_needed":
                return self.hold_needed(s)
        elif m == HOST:
            if g == "is_current":
                return bool(s.attached) and s.attached == _get(params, "session")
            if g == "from_simulator":
                return bool(_get(params, "who", "simulator") == "simulator")
        elif m == FIN and g == "simulation":
            return cfg.simulation
        raise KeyError(f"the model has no value for guard {g!r} of machine {m!r}")

    # -- effects -------------------------------------------------------------------------------
    def _fx_record_route(self, s: _W, m: str, params: Params) -> None:
        # the start was cut short: a route the plugin put in is recorded from the chain
        if s.route == "avatar" and not s.installed:
            s.installed = True

    def _fx_check_presence(self, s: _W, m: str, params: Params) -> None:
        if s.av_present:
            s.post(AVATAR, "avatar_connected")

    def _restore(self, s: _W) -> None:
        # identity-guarded: only our own recorded route (the table calls it once per route)
        if s.installed and s.route == "avatar" and self.glue.restore_route:
            s.route = "room"

    def _fx_restore_route(self, s: _W, m: str, params: Params) -> None:
        self._restore(s)
        s.post(AVATAR, "route_restored")

    def _fx_release_attempt(self, s: _W, m: str, params: Params) -> None:
        # the failed attempt's plugin closed, its sink forgotten, its participant removed
        s.av_attempts += 1
        s.installed = False
        if s.av_present and s.room == "connected":
            s.av_present = False
            s.av_video = False
            s.post(PART, "participant_disconnected", _p(who="avatar", closing=False))

    def _fx_reinstall_route(self, s: _W, m: str, params: Params) -> None:
        s.route = "avatar"
        if s.av_present:
            s.post(AVATAR, "avatar_connected")

    def _fx_put_route_back(self, s: _W, m: str, params: Params) -> None:
        self._restore(s)

    def _fx_close_plugin(self, s: _W, m: str, params: Params) -> None:
        if s.av_present and s.room == "connected":
            # the avatar participant is removed; our own room listener is gone already
            s.av_present = False
            s.av_video = False
            s.post(PART, "participant_disconnected", _p(who="avatar", closing=False))

    def _fx_link(self, s: _W, m: str, params: Params) -> None:
        s.linked = True

    def _fx_close_session(self, s: _W, m: str, params: Params) -> None:
        # session._close_soon(): a close under way or done is not started again; its end
        # (the task's done callback) reports to the link either way
        if s.sess_a == "running":
            s.sess_a = "closing"
        elif s.sess_a == "closed":
            s.post(PART, "session_closed")

    def _fx_close_timed_out(self, s: _W, m: str, params: Params) -> None:
        # ParticipantLink emits close_timed_out; the composed job shuts down on it
        if self.glue.shutdown_on_close_timeout:
            s.shutdown_asked = True
            s.post(JOB, "shutdown")

    def _fx_subscribe(self, s: _W, m: str, params: Params) -> None:
        session = str(_get(params, "session"))
        s.attached = session
        if session not in s.subscribed:
            s.subscribed = tuple(sorted((*s.subscribed, session)))

    def _fx_unsubscribe(self, s: _W, m: str, params: Params) -> None:
        att, s.attached = s.attached, ""
        replaced = _get(params, "session", att) != att  # another session attaches over it
        if att and (self.glue.unsubscribe_on_replace or not replaced):
            s.subscribed = tuple(x for x in s.subscribed if x != att)

    def _fx_forward_finalize(self, s: _W, m: str, params: Params) -> None:
        s.post(FIN, "request", params)

    def _fx_reply_error(self, s: _W, m: str, params: Params) -> None:
        req = _get(params, "req")
        if req is not None:  # the model's requests are all finalize requests
            _reply(s, int(req), "error")

    def _fx_take_request(self, s: _W, m: str, params: Params) -> None:
        s.fin_req = int(_get(params, "req"))
        _set_request(s, s.fin_req, "taken")

    def _fx_send_verdict(self, s: _W, m: str, params: Params) -> None:
        delivered = _reply(s, s.fin_req, "verdict")
        s.post(FIN, "delivered" if delivered else "undelivered")

    def _fx_report_answered(self, s: _W, m: str, params: Params) -> None:
        s.fin_answered = True
        s.post(JOB, "finalize_answered")

    def _fx_reply_unfinished(self, s: _W, m: str, params: Params) -> None:
        _reply(s, s.fin_req, "error")  # FINALIZE_UNFINISHED, rather than silence

    def _fx_report_session_closed(self, s: _W, m: str, params: Params) -> None:
        # JobRuntime._on_session_closed
        if self.config.delete_room_on_close:
            _request_deletion(s)
        s.post(JOB, "session_closed")

    def _fx_close_finalize(self, s: _W, m: str, params: Params) -> None:
        # FinalizeAnswer.close(): `await actor.send(close)`: the host waits while the
        # finalize handles what it already had, then the close
        if not self.glue.drain_finalize_on_close or s.fin in self.inert[FIN]:
            return
        s.queue = (*s.queue, (FIN, "close", (), CLOSE))
        while True:
            k = next(i for i, e in enumerate(s.queue) if e[0] == FIN)
            entry = s.queue[k]
            self._deliver(s, k)
            if entry[1:] == ("close", (), CLOSE):
                break

    def _fx_close_transport(self, s: _W, m: str, params: Params) -> None:
        s.reading = False
        s.transport_open = False


def _noop(s: _W, m: str, params: Params) -> None:
    return None


def _no_input(s: _W) -> None:
    return None


def mail_label(entry: Entry) -> str:
    m, event, params, token = entry
    args = ", ".join(f"{a}={v}" for a, v in params)
    stale = " [stale]" if token == STALE else ""
    return f"{m} handles {event}" + (f"({args})" if args else "") + stale


# -- the simulator's view of its requests -----------------------------------------------------


def _set_request(s: _W, req: int, status: str) -> None:
    reqs = list(s.requests)
    owed, _ = reqs[req]
    reqs[req] = (owed, status)
    s.requests = tuple(reqs)


def _reply(s: _W, req: int, kind: str) -> bool:
    """Send a reply to request ``req``; returns what the runtime sees (the send worked)."""
    sent = s.transport_open and s.room == "connected"
    _, before = s.requests[req]
    if not sent:
        status = "no_room" if s.room != "connected" else "not_sent"
    elif not s.simulator and req != s.stranger_req:
        status = "unreachable"  # sent into a room the simulator has left
    else:
        status = "twice" if before in ANSWERED else kind
        if kind == "verdict":
            s.verdicts += 1
    _set_request(s, req, status)
    return sent


# -- internal steps ----------------------------------------------------------------------------


def _verdict_ready(s: _W) -> None:
    s.fin_task = ""
    s.post(FIN, "verdict_ready", _p(req=s.fin_req), LIVE)


def _verdict_hangs(s: _W) -> None:
    s.fin_task = f"{s.fin}:hung"  # stuck until its state is left


def _drained(s: _W) -> None:
    s.host_task = ""
    s.post(HOST, "drained", (), LIVE)


def _plugin_routed(s: _W) -> None:
    # the plugin's start() replaced the audio tail and goes on (its last lines, or a wait)
    state = s.av_task.split(":")[0]
    s.av_task = f"{state}:routed"
    s.route = "avatar"


def _plugin_hangs(s: _W) -> None:
    # stuck until its state is left (start_timeout or close cancels it)
    state = s.av_task.split(":")[0]
    s.av_task = f"{state}:hung"


def _plugin_returns(s: _W, routed: bool, error: bool = False) -> None:
    # the task records the sink right after start() returns or raises, then reports
    s.av_task = ""
    if routed:
        s.installed = True
    event = "start_error" if error else "plugin_started" if routed else "no_route"
    s.post(AVATAR, event, (), LIVE)


def _clear_done(s: _W) -> None:
    s.av_task = ""
    s.post(AVATAR, "clear_buffer_done", (), LIVE)


def _a_closed(s: _W) -> None:
    s.sess_a = "closed"
    s.post(HOST, "session_closed", _p(session="A"))  # JobRuntime.attach's close hook
    s.post(PART, "session_closed")  # the link follows session A


def _a_hangs(s: _W) -> None:
    s.sess_a = "hung"  # AgentSession.aclose() never returns: no close event, no task end


def _b_closed(s: _W) -> None:
    s.sess_b = "closed"
    s.post(HOST, "session_closed", _p(session="B"))


def _run_close_host(s: _W) -> None:
    state = s.job_task.split(":")[0]
    s.job_task = f"{state}:host"
    if not s.host_actor_closed and s.host != "closed":
        s.post(HOST, "close", (), CLOSE)


def _run_close_room(s: _W) -> None:
    # host.aclose() returned: its actor is closed, and its finalize's once it handled its
    # mail; then the room work, then the room deletion is allowed (asked for first with
    # delete_room_on_close) and waited for
    while any(e[0] == FIN for e in s.queue):
        s.model._deliver(s, next(i for i, e in enumerate(s.queue) if e[0] == FIN))
    if s.fin_task:
        _set_request(s, s.fin_req, "abandoned")  # cancelled with its actor, no reply
    s.fin_task = s.host_task = s.t_host = ""
    s.host_actor_closed = True
    s.drop_mailbox(HOST)
    s.reading = False
    if s.room == "connected":
        s.room = "disconnected"
        s.post(JOB, "room_disconnected")
    s.room_step_done = True
    if s.model.config.delete_room_on_close:
        s.post(DEL, "request")
    s.post(DEL, "allow")
    s.job_task = f"{s.job}:deletion"


def _run_close_callbacks(s: _W, hang: bool) -> None:
    # the shutdown callbacks, one of which may never return (only close_timeout ends that)
    if hang:
        s.job_task = f"{s.job}:hung"  # stuck until its state is left
        return
    s.job_task = ""
    s.post(JOB, "close_done", (), LIVE)


def _fire(s: _W, m: str) -> None:
    armed_in = getattr(s, _TIMER[m])
    event = s.model._timeouts[m][armed_in][0]
    setattr(s, _TIMER[m], "")
    token = LIVE if armed_in == s.state_of(m) else STALE
    s.post(m, event, (), token)


# -- inputs ------------------------------------------------------------------------------------


def _user_joins(s: _W) -> None:
    s.user = True
    s.post(PART, "participant_connected", _p(who="user"))


def _user_leaves(s: _W, closing: bool) -> None:
    s.user = False
    s.post(PART, "participant_disconnected", _p(who="user", closing=closing))


def _sip_joins(s: _W) -> None:
    s.post(PART, "participant_connected", _p(who="sip"))


def _sip_leaves(s: _W) -> None:
    # stateless: SIP legs come and go; none is ever linked or a simulator
    s.post(PART, "participant_disconnected", _p(who="sip", closing=True))


def _simulator_leaves(s: _W) -> None:
    s.simulator = False
    s.post(JOB, "simulator_left")
    s.post(PART, "participant_disconnected", _p(who="simulator", closing=True))


def _simulator_joins(s: _W) -> None:
    s.simulator = True
    s.post(PART, "participant_connected", _p(who="simulator"))


def _room_disconnects(s: _W) -> None:
    s.room = "disconnected"
    s.post(JOB, "room_disconnected")


def _avatar_start(s: _W) -> None:
    s.post(AVATAR, "start")


def _interrupt(s: _W, playing: bool) -> None:
    # AvatarLifecycle._on_sink_clear: where the plugin's own clear runs (joined, clearing)
    # it has run by the time the machine hears of it
    delivered = s.avatar in ("joined", "clearing")
    s.post(AVATAR, "interrupt", _p(playing=playing, delivered=delivered))


def _avatar_joins(s: _W) -> None:
    s.av_present = True
    s.post(AVATAR, "avatar_connected")
    s.post(PART, "participant_connected", _p(who="avatar"))


def _avatar_video(s: _W) -> None:
    s.av_video = True
    s.post(AVATAR, "video_published")


def _avatar_leaves(s: _W) -> None:
    s.av_present = False
    s.av_video = False
    s.post(AVATAR, "avatar_left")
    s.post(PART, "participant_disconnected", _p(who="avatar", closing=False))


def _finalize_request(s: _W) -> None:
    req = len(s.requests)
    owed = s.job in LIVE_JOB
    if not s.reading and not owed:
        return  # nobody reads it and nobody owes it an answer: nothing to follow
    s.requests = (*s.requests, (owed, "queued" if s.reading else "not_read"))
    if s.reading:
        s.post(HOST, "finalize", _p(req=req))


def _stranger_asks(s: _W) -> None:
    # a participant without the lk.simulator attribute; it stays in the room
    s.stranger_req = len(s.requests)
    s.requests = (*s.requests, (False, "queued"))
    s.post(HOST, "finalize", _p(req=s.stranger_req, who="stranger"))


def _attach_b(s: _W) -> None:
    s.sess_b = "running"
    s.post(HOST, "attach", _p(session="B"))


def _close_a(s: _W) -> None:
    s.sess_a = "closing"


def _close_b(s: _W) -> None:
    s.sess_b = "closing"


def _shutdown(s: _W) -> None:
    # livekit's order, as the scenario runner does it: the primary session closes, then
    # the job is told (on_session_end)
    s.shutdown_asked = True
    if s.sess_a == "running":
        s.sess_a = "closing"
    s.post(JOB, "shutdown")


def _request_deletion(s: _W) -> None:
    s.deletion_requested = True
    s.post(DEL, "request")
    if not s.model.glue.defer_room_deletion:
        s.post(DEL, "allow")


def _release(s: _W) -> None:
    # JobRuntime.aclose(): the deletion is released (a call under way ends first)
    s.post(DEL, "close", (), CLOSE)


def _deletion_returns(s: _W) -> None:
    s.dele_task = ""
    s.post(DEL, "delete_done", (), LIVE)


def _deletion_fails(s: _W) -> None:
    s.dele_task = ""
    s.post(DEL, "delete_failed", (), LIVE)
