"""An abstract model of one job: the machines composed as the runtime composes them.

What the runtime decides by is read, not re-typed: each machine decides through
``statemachines.step`` on its own spec; a room fact reaches the machines its routes name
(``statemachines.routing.ROUTES``) when the routes' conditions hold; guards are the
shared ones (``statemachines.glue.GUARDS``), evaluated on facts views of the world; an
effect's declared links (``statemachines.glue.LINKS``) post their events, and so does a
state change that a declared watch names (``statemachines.system.WATCHES``: what the playout
machine, composed when ``Config.playout`` says, hears of the avatar and the participant
link; what AgentJob's own lifecycle, composed always, hears of the job machine's close).
What the model says on its own (who is in the room, each effect's outcome on the abstract
world, what work running aside may do) is in ``abstract``, reviewed as such.

This file is the mechanics the actors provide: one mailbox per machine handled one event
at a time, state timers armed on entry and cancelled on exit (a timer's event that outlives
its state is dropped), state-scoped tasks started on entry and cancelled on exit, an actor
that closes after its ``aclose()``'s close.

A world is an immutable, hashable ``World``; ``successors`` lists what can happen next:

* ``input``: something outside the runtime (a participant leaves, the room disconnects,
  the simulator asks for its verdict, the job is told to shut down, ...);
* ``time``: a state timeout (enabled only while its timer is armed) or a task's own bound;
* ``internal``: one machine handles the head of its mailbox, or work running aside ends.

Internal steps interleave freely with inputs and with each other, as the actors' mailboxes
and tasks do on one event loop. With ``eager``, work the runtime finishes by itself (the
host's drain, the steps of the job's close) is done as soon as it can be, as on the loop
with nothing else ready: the conformance replay walks such a model beside the runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, Literal, NamedTuple

from agent_runtime.testing.invariants.checks import LIVE_JOB, hold_cut, late_timer
from agent_runtime.testing.invariants.view import JobView, Request
from statemachines import MachineSpec, step
from statemachines.delivery import FOLLOWERS, index_links, links_fired, routes_by_fact, routes_fired
from statemachines.glue import GUARDS, LINKS, Link, simulators_after
from statemachines.glue import hold_needed as _hold_needed
from statemachines.machines import MACHINES
from statemachines.system import WATCHES, Watch, watched
from verification.explore import abstract
from verification.explore.abstract import (
    AGENT_JOB,
    AVATAR,
    CLOSE,
    DEFAULT_GLUE,
    DEL,
    FIN,
    HOST,
    JOB,
    PART,
    PEOPLE,
    PLAYOUT,
    Config,
    Glue,
    Inputs,
    JobFactsView,
    RoomFactsView,
    event_data,
)

__all__ = [
    "DEFAULT_GLUE",
    "LIVE_JOB",
    "Config",
    "Glue",
    "Inputs",
    "Model",
    "Move",
    "World",
    "mail_label",
]

# the machines every model composes (and the conformance replay compares), the job's own
# lifecycle among them; playout is composed too when the config runs it (``Config.playout``)
MACHINE_NAMES = (AVATAR, JOB, HOST, PART, DEL, FIN, AGENT_JOB)

# a mailbox entry: (machine, event, params, token). Params are sorted (key, value) pairs.
# The token marks what the actor checks at delivery: a timer's or a task's event is "live"
# until its state is left ("stale": dropped); "close" is the close an aclose() sends
Params = tuple[tuple[str, Any], ...]
Entry = tuple[str, str, Params, str]
NONE, LIVE, STALE = "", "live", "stale"
AUTO = ""  # the machine of a handled entry that is work the runtime did by itself

Kind = Literal["input", "time", "internal"]
Mailboxes = Literal["settle", "turns", "any"]


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
    # state-scoped tasks: "" or "STATE:PHASE"
    job_task: str
    dele_task: str
    host_task: str
    fin_task: str
    av_task: str
    # the room and who is in it
    room: str  # connected | disconnected
    user: bool
    sip: bool
    simulator: bool  # present, and known to the job as carrying lk.simulator
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
    deletions: tuple[str, ...]  # the job's state when each deletion call began
    # AvatarLifecycle
    installed: bool  # the sink the plugin installed is recorded
    avatar_actor_closed: bool
    av_attempts: int  # restarts of the plugin made (the retry policy's count)
    # ParticipantLink
    linked: str  # who the link follows, or ""
    # JobSessionHost and its FinalizeAnswer
    attached: str  # "" | A | B
    subscribed: tuple[str, ...]  # sessions whose events are forwarded
    fin_req: int  # the finalize request being answered, or -1
    fin_answered: bool  # a verdict reached the transport
    transport_open: bool
    reading: bool  # the host reads requests
    host_actor_closed: bool  # host.wait_closed() returned: both actors closed
    # the simulator's requests: (owed, from the simulator, status, replies)
    requests: tuple[tuple[bool, bool, str, tuple[str, ...]], ...]
    stranger_req: int  # the request a participant who is not the simulator sent, or -1
    # marks for the checks
    hold_cut: str  # why the job stopped holding while the simulator could still ask
    late: str  # a timer event handled after its state was left
    close_timed_out: bool  # the job's close bound ran out
    # playout (``Config.playout``; else it stays as it starts)
    play: str  # the playout machine's state
    t_play: str
    speaking: bool  # the session's user state is speaking
    reprompts: int  # the playout machine's count of re-prompts in a row
    pending: bool  # agent audio handed to the avatar's sink, not reported nor finished
    # AgentJob's own lifecycle (statemachines.agent_job), always composed
    life: str  # its state
    life_task: str  # closing's run_teardown: "" or "closing:STEP" (RELEASE's job step)
    aborted: bool  # the user called aclose(graceful=False)
    waiting: bool  # a call of the user's aclose() waits for the lifecycle's close


FIELDS = World._fields
_STATE = {
    AVATAR: "avatar",
    JOB: "job",
    HOST: "host",
    PART: "part",
    DEL: "dele",
    FIN: "fin",
    PLAYOUT: "play",
    AGENT_JOB: "life",
}
_TIMER = {
    AVATAR: "t_avatar",
    JOB: "t_job",
    PART: "t_part",
    DEL: "t_dele",
    HOST: "t_host",
    PLAYOUT: "t_play",
}
_TASK = {
    AVATAR: "av_task",
    JOB: "job_task",
    DEL: "dele_task",
    HOST: "host_task",
    FIN: "fin_task",
    AGENT_JOB: "life_task",
}


class Move(NamedTuple):
    kind: Kind
    label: str
    world: World
    # with mailboxes="settle": the events handled on the way to ``world``, in order (and
    # with ``eager``, work done by itself: machine AUTO, the work's action as the event)
    handled: tuple[Entry, ...] = ()
    # the first of those after which ``Model.watch`` saw something wrong (0: right after
    # the move itself, before any mail), or -1
    flagged: int = -1
    # to replay it world by world (``Model.passed``)
    redo: tuple[World, Callable[[_W], object]] | None = None
    # what caused it, stable across worlds: an input's, a work's or a timeout's name
    action: str = ""
    # with ``Model.taken`` on: the transition rows taken, as (machine, row index, whether
    # the state was left); the conformance walk reads them
    rows: tuple[tuple[str, int, bool], ...] = ()


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
    av_task: str
    room: str
    user: bool
    sip: bool
    simulator: bool
    av_present: bool
    av_video: bool
    route: str
    sess_a: str
    sess_b: str
    shutdown_asked: bool
    deletion_requested: bool
    room_step_done: bool
    deletions: tuple[str, ...]
    installed: bool
    avatar_actor_closed: bool
    av_attempts: int
    linked: str
    attached: str
    subscribed: tuple[str, ...]
    fin_req: int
    fin_answered: bool
    transport_open: bool
    reading: bool
    host_actor_closed: bool
    requests: tuple[tuple[bool, bool, str, tuple[str, ...]], ...]
    stranger_req: int
    hold_cut: str
    late: str
    close_timed_out: bool
    play: str
    t_play: str
    speaking: bool
    reprompts: int
    pending: bool
    life: str
    life_task: str
    aborted: bool
    waiting: bool

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
            self.av_task,
            self.room,
            self.user,
            self.sip,
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
            self.hold_cut,
            self.late,
            self.close_timed_out,
            self.play,
            self.t_play,
            self.speaking,
            self.reprompts,
            self.pending,
            self.life,
            self.life_task,
            self.aborted,
            self.waiting,
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
            self.av_task,
            self.room,
            self.user,
            self.sip,
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
            self.hold_cut,
            self.late,
            self.close_timed_out,
            self.play,
            self.t_play,
            self.speaking,
            self.reprompts,
            self.pending,
            self.life,
            self.life_task,
            self.aborted,
            self.waiting,
        )

    def state_of(self, m: str) -> str:
        value: str = getattr(self, _STATE[m])
        return value

    # -- what effects and inputs do, through the declarations ------------------------------
    def post(self, m: str, event: str, params: Params = (), token: str = NONE) -> None:
        """``actor.post``: dropped once the actor is closed, or when its state is final
        and answers nothing (a final state only ignores or rejects)."""
        if m == JOB and event == "shutdown":
            self.shutdown_asked = True
        elif m == AGENT_JOB and event == "abort":
            self.aborted = True  # the user's call, whatever the lifecycle's table does with it
        elif m == DEL and event == "request":
            self.deletion_requested = True
        if m == AVATAR and self.avatar_actor_closed:
            return
        if m in (HOST, FIN) and self.host_actor_closed:
            return
        if self.state_of(m) in self.model.inert[m]:
            return
        self.queue = (*self.queue, (m, event, params, token))

    def fire(self, source: str, on: str, params: Params, step: str = "", **flags: bool) -> None:
        """Post every declared link of ``source``'s ``on`` whose flags hold."""
        model = self.model
        # the runtime's own choice of links (``agent_runtime.runtimes.routing.Wiring`` calls it too)
        for link in links_fired(model._links, (source, on, step), flags, model.flags):
            if link.target not in model.machines:
                continue  # a machine the model does not compose (playout when off): as the
                # runtime's Wiring skips a target nobody connected
            # a close to playout is a plain event (PlayoutTracker posts it), not an aclose()
            close = link.event == "close" and link.target != PLAYOUT
            self.post(link.target, link.event, params, CLOSE if close else NONE)

    def room_fact(self, fact: str, *, who: str = "", reason: str = "", kind: str = "") -> None:
        """A room fact reaches every machine whose route names it and whose conditions hold
        on what the job knew just before it; then who is in the room follows it."""
        params: Params = tuple(
            (k, v) for k, v in (("kind", kind), ("reason", reason), ("who", who)) if v
        )
        data = {"fact": fact, **event_data(params)}
        known = RoomFactsView(self)
        # the runtime's delivery (``agent_runtime.runtimes.routing.follow`` calls the same
        # functions): the machines in their declared follow order, each route's conditions
        # evaluated on what was known just before the fact
        fired = [
            r
            for machine in FOLLOWERS
            for r in routes_fired(routes_by_fact(machine).get(fact, ()), known, data)
        ]
        simulators = simulators_after(known.simulators, data)
        if who in ("user", "sip"):
            setattr(self, who, fact == "participant_joined")
        elif who == "simulator":
            self.simulator = PEOPLE["simulator"].identity in simulators
        for r in fired:
            self.post(r.machine, r.event, params)

    def drop_mailbox(self, m: str) -> None:
        self.queue = tuple(e for e in self.queue if e[0] != m)

    def handle_all(self, m: str) -> None:
        """``await actor.join()`` from another machine's effect: ``m`` handles its mail."""
        while True:
            k = next((i for i, e in enumerate(self.queue) if e[0] == m), None)
            if k is None:
                return
            self.model.deliver(self, k)


# the scratch copy and the world must list the same fields in the same order
assert tuple(_W.__annotations__) == FIELDS

# what the checks and views read: a world, or one being changed (checked on the way)
Facts = World | _W


class Model:
    """The composed job under one ``Config``; ``specs`` may replace any machine's spec and
    ``links`` the declared links (to show a fault in either is noticed)."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        specs: Mapping[str, MachineSpec] | None = None,
        links: tuple[Link, ...] = LINKS,
        watches: tuple[Watch, ...] = WATCHES,
        glue: Glue = DEFAULT_GLUE,
        mailboxes: Mailboxes = "settle",
        inputs: Inputs = "all",
        eager: bool = False,
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
        self.links = links
        self.watches = watches
        # the machines composed: playout when the config runs it (as AgentJob builds it)
        self.playout = self.config.playout
        self.machines: tuple[str, ...] = (*MACHINE_NAMES, *((PLAYOUT,) if self.playout else ()))
        # which composed machines a state change may send an event to (statemachines.system
        # WATCHES: playout's, and the job's own lifecycle's job_closed)
        self._watch_targets = tuple(
            t for t in dict.fromkeys(w.target for w in watches) if t in self.machines
        )
        self.flags = {"delete_room_on_close": self.config.delete_room_on_close}
        self._links = index_links(links)
        # settle: after each input, timeout or piece of work done aside, the mail it caused
        #   is handled at once, actors taking turns in posting order (as asyncio runs ready
        #   tasks); every world on the way is still checked
        # turns: the same order, but inputs may arrive between any two events handled
        # any: any actor with mail may go next (every order; far larger)
        self.mailboxes: Mailboxes = mailboxes
        self.eager = eager
        # called on each world a settling move passes through; True flags the move
        self.watch: Callable[[_W], bool] | None = None
        # when a list: every transition row taken is appended (see ``Move.rows``)
        self.taken: list[tuple[str, int, bool]] | None = None
        chosen = dict(MACHINES)
        for name, spec in (specs or {}).items():
            if name not in (*MACHINE_NAMES, PLAYOUT):
                known = [*MACHINE_NAMES, PLAYOUT]
                raise ValueError(f"unknown machine {name!r}: one of {known}")
            chosen[name] = spec
        self.specs: dict[str, MachineSpec] = chosen
        # (machine, source, event, guards) -> the row's index, for ``taken`` (the
        # conformance walk looks one up for every event handled)
        self._rows: dict[tuple[str, str, str, tuple[str, ...]], int] = {}
        for name, spec in chosen.items():
            for i, r in enumerate(spec.rows):
                self._rows.setdefault((name, r.source, r.event, r.guards), i)
        # final states with no rows out: a post there is a no-op, so it is not even queued
        self.inert: dict[str, frozenset[str]] = {
            m: frozenset(
                s.name
                for s in spec.states
                if s.final and not any(r.source == s.name for r in spec.rows)
            )
            for m, spec in chosen.items()
        }
        self._final = {
            m: frozenset(s.name for s in spec.states if s.final) for m, spec in chosen.items()
        }
        self._timeouts: dict[str, dict[str, tuple[str, bool]]] = {}
        for m in _TIMER:
            armed: dict[str, tuple[str, bool]] = {}
            for s in chosen[m].states:
                if s.timeout is not None:
                    armed[s.name] = (s.timeout.event, self._timer_set(s.timeout.setting))
            self._timeouts[m] = armed
        # the lifecycle as the job starts: start_runtime() (following the room is no part of
        # it), then start_session(), whose part AgentJob awaits the lifecycle's answer to
        # before anything else runs, and whose end is ``started``. Decided here by its table,
        # not posted: start mail of its own would only multiply the finer interleavings
        life = chosen[AGENT_JOB].initial
        rows: list[tuple[str, int, bool]] = []
        for event in ("start_part", "started"):
            st = step(chosen[AGENT_JOB], life, event, lambda g: False)
            if st.outcome == "transition":
                rows.append(
                    (AGENT_JOB, self._rows[(AGENT_JOB, life, event, st.guards)], st.changed)
                )
                life = st.dest
        self._life_started = life
        # the rows that start took (the conformance walk counts them as the job's start's)
        self.start_rows: tuple[tuple[str, int, bool], ...] = tuple(rows)
        self._invokes: dict[str, dict[str, tuple[str, ...]]] = {
            m: {s.name: s.invoke for s in chosen[m].states if s.invoke} for m in _TASK
        }

    def _timer_set(self, setting: str) -> bool:
        """Whether the runtime arms this timeout at all (ParticipantLink passes
        ``grace_period=None`` without close_on_disconnect: grace then has no timer)."""
        return not (setting == "grace_period" and not self.config.close_on_disconnect)

    def timeout_event(self, machine: str, state: str) -> str:
        return self._timeouts[machine][state][0]

    # -- the start -------------------------------------------------------------------------
    def initial(self) -> World:
        """The job just started: room connected, session A started and attached, the
        participant link following the room (with ``config.present`` in it), the avatar
        configured but not started. With mailboxes="settle" the start-up mail is handled."""
        w = self._start()
        if self.mailboxes == "settle":
            w = self._move("internal", "", "the job starts", w, _no_input).world
        return w

    def _start(self) -> World:
        cfg, sp = self.config, self.specs
        present = set(cfg.present)
        # JobRuntime.start() starts the host, then the session attaches
        queue: list[Entry] = [
            (HOST, "start", (), NONE),
            (HOST, "attach", (("session", "A"),), NONE),
        ]
        # ParticipantLink.start(): whoever is in the room, in join order
        queue += [(PART, "participant_connected", (("who", who),), NONE) for who in cfg.present]
        return World(
            avatar=sp[AVATAR].initial,
            job=sp[JOB].initial,
            host=sp[HOST].initial,
            part=sp[PART].initial,
            dele=sp[DEL].initial,
            fin=sp[FIN].initial,
            queue=tuple(queue),
            t_avatar="",
            t_job="",
            t_part="",
            t_dele="",
            t_host="",
            job_task="",
            dele_task="",
            host_task="",
            fin_task="",
            av_task="",
            room="connected",
            user="user" in present,
            sip="sip" in present,
            simulator="simulator" in present,
            av_present=False,
            av_video=False,
            route="room",
            sess_a="running",
            sess_b="none",
            shutdown_asked=False,
            deletion_requested=False,
            room_step_done=False,
            deletions=(),
            installed=False,
            avatar_actor_closed=False,
            av_attempts=0,
            linked="",
            attached="",
            subscribed=(),
            fin_req=-1,
            fin_answered=False,
            transport_open=True,
            reading=True,
            host_actor_closed=False,
            requests=(),
            stranger_req=-1,
            hold_cut="",
            late="",
            close_timed_out=False,
            play=sp[PLAYOUT].initial,
            t_play="",
            speaking=False,
            reprompts=0,
            pending=False,
            life=self._life_started,
            life_task="",
            aborted=False,
            waiting=False,
        )

    # -- what can happen next ----------------------------------------------------------------
    def successors(self, w: World, *, kinds: frozenset[Kind] | None = None) -> list[Move]:
        out: list[Move] = []
        if kinds is None or "internal" in kinds:
            out.extend(self._internal(w))
        if kinds is None or "time" in kinds:
            out.extend(self._time(w))
        if kinds is None or "input" in kinds:
            out.extend(
                self._move("input", action, label, w, fn)
                for action, label, fn in abstract.inputs(self, w)
            )
        return out

    def _move(
        self, kind: Kind, action: str, label: str, w: World, fn: Callable[[_W], object]
    ) -> Move:
        taken = self.taken
        mark = len(taken) if taken is not None else 0
        s = _W(self, w)
        fn(s)
        if self.mailboxes != "settle" or (not s.queue and not self.eager):
            rows = tuple(taken[mark:]) if taken is not None else ()
            return Move(kind, label, s.freeze(), redo=(w, fn), action=action, rows=rows)
        # the worlds on the way are checked as they pass (``watch``), not kept: most
        # moves end in a world seen before, and freezing each one would double the cost
        # (the world it ends in is checked by the caller, once per new world)
        watch = self.watch
        flagged = -1
        handled: list[Entry] = []
        changed = True  # a world that is the last one checked but for its mail is not
        while True:
            if not s.queue:
                auto = self._auto(s) if self.eager else None
                if auto is None:
                    break
                if flagged < 0 and changed and watch is not None and watch(s):
                    flagged = len(handled)
                work_action, work_label, work = auto
                handled.append((AUTO, work_action, (("label", work_label),), NONE))
                work(s)
                changed = True
                continue
            if flagged < 0 and changed and watch is not None and watch(s):
                flagged = len(handled)
            handled.append(s.queue[0])
            changed = self.deliver(s, 0)
        rows = tuple(taken[mark:]) if taken is not None else ()
        return Move(kind, label, s.freeze(), tuple(handled), flagged, (w, fn), action, rows)

    def _auto(self, s: _W) -> tuple[str, str, Callable[[_W], None]] | None:
        """Work the runtime finishes by itself, that can end now (with ``eager``)."""
        for action, label, auto, fn in abstract.work(self, s):
            if auto:
                return action, label, fn
        return None

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
            if entry[0] == AUTO:
                auto = self._auto(s)
                assert auto is not None and auto[0] == entry[1]
                auto[2](s)
            else:
                self.deliver(s, 0)
            out.append((mail_label(entry), s.freeze()))
        return out

    def _internal(self, w: World) -> Iterator[Move]:
        if self.mailboxes == "any":
            seen: set[str] = set()
            for k, entry in enumerate(w.queue):
                if entry[0] in seen:
                    continue
                seen.add(entry[0])
                yield self._move("internal", "", mail_label(entry), w, partial(self.deliver, k=k))
        elif w.queue:
            yield self._move(
                "internal", "", mail_label(w.queue[0]), w, lambda s: self.deliver(s, 0)
            )
        for action, label, auto, fn in abstract.work(self, w):
            if not (auto and self.eager):
                yield self._move("internal", action, label, w, fn)

    def _time(self, w: World) -> Iterator[Move]:
        if not (
            w.t_avatar or w.t_job or w.t_part or w.t_dele or w.t_host or w.t_play or w.job_task
        ):
            return  # no timer armed, no bound running (most worlds: asked of each one)
        for m, field_name in _TIMER.items():
            armed_in = getattr(w, field_name)
            if armed_in:
                event = self._timeouts[m][armed_in][0]
                yield self._move(
                    "time", f"timeout:{m}", f"time passes: {event}", w, partial(_fire, m=m)
                )
        for action, label, fn in abstract.bounds(self, w):
            yield self._move("time", action, label, w, fn)

    # -- one machine handles one event ---------------------------------------------------------
    def deliver(self, s: _W, k: int) -> bool:
        """``m`` handles entry ``k`` of the mail; whether anything but the mail changed."""
        m, event, params, token = s.queue[k]
        s.queue = s.queue[:k] + s.queue[k + 1 :]
        spec = self.specs[m]
        source = s.state_of(m)
        if token == STALE:
            if self.glue.drop_stale_timeouts:
                return False
            s.late = s.late or late_timer(spec, source, event)
        if m == JOB and event == "close_timeout":
            s.close_timed_out = True  # the bound ran out, whatever the table does with it
        st = step(spec, source, event, lambda g: self._guard(s, m, g, params))
        changed = token != NONE or (st.outcome == "transition" and (st.changed or bool(st.effects)))
        if st.outcome == "transition":
            if self.taken is not None:
                row = self._rows[(m, source, event, st.guards)]
                self.taken.append((m, row, st.changed))
            if st.changed:
                self._leave(s, m)
            setattr(s, _STATE[m], st.dest)
            if st.changed:
                self._enter(s, m)
                if self._watch_targets:
                    # JobSystem._forward_state: the declared watches, posted as the state
                    # changes, before the transition's effects run
                    dest = st.dest
                    for target in self._watch_targets:
                        for ev in watched(m, source, dest, target, watches=self.watches):
                            s.post(target, ev, ((m, dest),))
                if m == JOB:
                    self._job_changed(s, source, st.dest, event)
                elif m == AGENT_JOB and s.waiting and st.dest in self._final[m]:
                    abstract.aclose_returns(s)
            links = self._links
            for name in st.effects:
                # an effect's declared links, then its outcome on the world (the runtime
                # fires them as the handler returns: no linked effect's outcome here reads
                # what its own links posted; a later effect of the step may wait for it)
                if (m, name, "") in links:
                    s.fire(m, name, params)
                abstract.EFFECTS[name](s, event, params)
        if token == CLOSE and m == AVATAR:
            # AvatarLifecycle.aclose(): after its close step the actor closes, dropping the
            # rest of its mailbox and cancelling its tasks
            s.avatar_actor_closed = True
            s.drop_mailbox(AVATAR)
            s.av_task = ""
        return changed

    def _leave(self, s: _W, m: str) -> None:
        if m in _TIMER and self.glue.cancel_timers_on_exit:
            setattr(s, _TIMER[m], "")
        if m in _TASK:
            setattr(s, _TASK[m], "")  # cancelled with its state
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
        # a task's first turn comes before any timer can fire: what it does first is done
        # here (the deletion's server call starts, run_close asks the host to close, ...)
        for name in self._invokes.get(m, {}).get(state, ()):
            abstract.TASKS[name](s)

    def _job_changed(self, s: _W, source: str, dest: str, event: str) -> None:
        if not s.hold_cut:
            s.hold_cut = hold_cut(source, dest, event, _hold_needed(JobFactsView(s)))
        if dest in self._final[JOB]:
            abstract.job_closed(s)

    def _guard(self, s: _W, m: str, g: str, params: Params) -> bool:
        fn = GUARDS[m].get(g)
        if fn is None:
            raise KeyError(f"no definition of guard {g!r} of machine {m!r}")
        return fn(abstract.facts(s, m, params), _data(params))

    # -- the view every check reads --------------------------------------------------------
    def view(self, w: Facts) -> JobView:
        """The world as a ``JobView`` (``checks`` read it; the conformance replay compares
        it with the runtime's). Spelled out: it runs for every world the exploration
        passes."""
        final = self._final
        timers: dict[str, str] = {}
        if w.t_avatar:
            timers[AVATAR] = w.t_avatar
        if w.t_job:
            timers[JOB] = w.t_job
        if w.t_part:
            timers[PART] = w.t_part
        if w.t_dele:
            timers[DEL] = w.t_dele
        if w.t_host:
            timers[HOST] = w.t_host
        if w.t_play:
            timers[PLAYOUT] = w.t_play
        tasks: dict[str, tuple[str, ...]] = {}
        if w.av_task:
            tasks[AVATAR] = (w.av_task.partition(":")[0],)
        if w.job_task:
            tasks[JOB] = (w.job_task.partition(":")[0],)
        if w.dele_task:
            tasks[DEL] = (w.dele_task.partition(":")[0],)
        if w.host_task:
            tasks[HOST] = (w.host_task.partition(":")[0],)
        if w.fin_task:
            tasks[FIN] = (w.fin_task.partition(":")[0],)
        if w.life_task:
            tasks[AGENT_JOB] = (w.life_task.partition(":")[0],)
        closed = _closed(
            w.avatar in final[AVATAR] or w.avatar_actor_closed,
            w.job in final[JOB],
            w.host in final[HOST] or w.host_actor_closed,
            w.part in final[PART],
            w.dele in final[DEL],
            w.fin in final[FIN] or w.host_actor_closed,
            w.life in final[AGENT_JOB],
        )
        linked = w.linked
        cfg = self.config
        states = {
            AVATAR: w.avatar,
            JOB: w.job,
            HOST: w.host,
            PART: w.part,
            DEL: w.dele,
            FIN: w.fin,
            AGENT_JOB: w.life,
        }
        if self.playout:
            states[PLAYOUT] = w.play
        return JobView(
            states,
            # the session's close tears its outputs down
            "none" if w.sess_a == "closed" else w.route,
            w.room == "connected",
            cfg.simulation,
            w.simulator,
            w.fin_answered,
            w.av_present,
            PEOPLE[linked].identity if linked else None,
            bool(linked) and bool(getattr(w, linked)),
            cfg.close_on_disconnect,
            w.sess_a,
            w.attached or None,
            w.subscribed,
            _requests(w.requests, w.fin_req) if w.requests else (),
            w.deletions,
            w.deletion_requested or cfg.delete_room_on_close,
            w.shutdown_asked,
            w.room_step_done,
            w.close_timed_out,
            closed,
            timers,
            tasks,
            (),
            _marks(w.hold_cut, w.late) if w.hold_cut or w.late else (),
            w.pending,
            w.aborted,
        )


@functools.lru_cache(maxsize=4096)
def _data(params: Params) -> dict[str, Any]:
    # read only (the guards read it): one per distinct event data
    return event_data(params)


@functools.cache
def _closed(*flags: bool) -> frozenset[str]:
    return frozenset(m for m, f in zip(MACHINE_NAMES, flags, strict=True) if f)


@functools.lru_cache(maxsize=4096)
def _requests(
    requests: tuple[tuple[bool, bool, str, tuple[str, ...]], ...], fin_req: int
) -> tuple[Request, ...]:
    return tuple(
        Request(owed, sim, replies, status == "no_room", i == fin_req and status == "taken")
        for i, (owed, sim, status, replies) in enumerate(requests)
    )


def _marks(*marks: str) -> tuple[str, ...]:
    return tuple(m for m in marks if m)


def _no_input(s: _W) -> None:
    return None


def _fire(s: _W, m: str) -> None:
    armed_in = getattr(s, _TIMER[m])
    event = s.model.timeout_event(m, armed_in)
    setattr(s, _TIMER[m], "")
    token = LIVE if armed_in == s.state_of(m) else STALE
    s.post(m, event, (), token)


@functools.lru_cache(maxsize=65536)  # one per distinct entry: asked for every move
def mail_label(entry: Entry) -> str:
    m, event, params, token = entry
    if m == AUTO:
        return str(dict(params).get("label", event))
    args = ", ".join(f"{a}={v}" for a, v in params)
    stale = " [stale]" if token == STALE else ""
    return f"{m} handles {event}" + (f"({args})" if args else "") + stale
