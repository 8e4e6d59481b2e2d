"""The mutants no one can tell apart from the machines as written, and why.

Six arguments, each checked against the code it relies on (``tests/test_mutation.py``):

* **decision record only.** Making an ignore cell reject or an internal transition with no
  effects (or the reverse) changes, for an event that arrives by ``Actor.post``, only the
  record of the decision: the trace's kind and, for a reject, an INFO log line. The actor
  does the same for all three (no state change, no exit or entry, no effect, no timer or
  task touched; ``post`` never raises). The record pins the table as written, as the golden
  tables do. An event some caller awaits with ``Actor.send`` and whose ``EventRejected`` it
  does not suppress (``SENT``) is covered only between ignore and an internal no-op: a
  reject raises to its caller, while both of those return the step, which no caller reads.
* **re-entry record only.** In a machine whose state changes the runtime only reports
  (``REPORTED_ONLY``: forwarded to the user's listeners, the trace, OpenTelemetry; nothing
  in the runtime acts on them), staying in a state that has no timeout and no invoke, or
  leaving it and entering it again with the same effects, differ only in that record: the
  actor's re-entry arms nothing and cancels nothing there, and a ``state_changed`` from the
  state to itself is reported.
* **never decided there.** The actor drops a timeout, or an invoke task's outcome, that
  belongs to a state it has left (a state's generation), and decides an effect's outcome
  event after the events already queued. So an event produced only by state timeouts,
  invoke tasks and row effects (``PRODUCERS``: the functions of the runtime that construct
  it) reaches only the states ``possible_states`` computes; a cell outside them is never
  decided, and no change to it can show. A synchronous effect's outcome
  (``QUEUED_AT_ONCE``) is queued during its own step: only what was queued before it can
  move the machine first, which excludes an outcome consumed in the one state that
  produces it (the avatar's ``route_restored``, pending only while ``failed``).
* **refused by the API.** An event a runtime's method sends only after checking the
  machine's state, in the same synchronous step (``API_GUARDED``: the avatar's ``start``
  from ``start()``, which refuses any state but ``idle``), is decided only in those states
  or where the events already queued can take them; a cell elsewhere is never decided.
  The same method subscribes the machine to the room (``SUBSCRIBED_BY``) right before it
  queues that event: a room fact is decided only in a state reachable once it was decided.
* **never asked there.** An event posted only by a callback the runtime hands out inside
  some effects (``INSTALLED_BY``: the avatar's ``lk.playback_finished`` handler, registered
  once the plugin's sink is known) is decided only in the states those effects' rows and
  tasks lead to, or where the events queued meanwhile take them.
* **by hand**: ``verification.mutation.by_hand.BY_HAND``, a pattern over mutant labels
  (``fnmatch``) and its argument.

A mutant one of them covers is not run (``--check-arguments`` runs them too: a kill then
means the argument is wrong).
"""

from __future__ import annotations

import fnmatch

from statemachines import MachineSpec
from statemachines.machines import MACHINES
from verification.mutation.by_hand import BY_HAND
from verification.mutation.mutants import Mutant

# events a runtime awaits with Actor.send without suppressing EventRejected (a reject
# raises to the caller); the closes the avatar, the participant link and the playout
# tracker send suppress it: there a reject is the record alone. AgentJob's starts turn a
# reject into the user's clear error (JobSystem.begin), its closes and its start's outcomes
# are awaited as they are: every event of its lifecycle but the watch and the teardown's end
SENT: frozenset[tuple[str, str]] = frozenset(
    {
        ("avatar", "start"),
        ("session_host", "start"),
        ("session", "start"),  # a start of the job claims its session: a reject raises
        *(
            ("agent_job", e)
            for e in ("start", "start_part", "follow_room", "started", "start_failed")
        ),
        ("agent_job", "close"),
        ("agent_job", "abort"),
    }
)
# sent events a trace's reproduction cannot make (``agent-runtime record --check`` compares
# the transitions of the trace with those of its scenario's run): start_runtime() has no
# scenario step, so an internal follow_room row is a transition the reproduction lacks,
# where an ignore is none (tests/test_record.py tells them apart)
NOT_REPLAYED: frozenset[tuple[str, str]] = frozenset({("agent_job", "follow_room")})
# (machine, event) -> (the method that sends it, the only states it sends it in)
API_GUARDED: dict[tuple[str, str], tuple[str, frozenset[str]]] = {
    ("avatar", "start"): ("start", frozenset({"idle"})),
}
# machine -> the API-guarded event whose method subscribes it to the room facts
SUBSCRIBED_BY: dict[str, str] = {"avatar": "start"}
# machines whose state changes nothing in the runtime acts on (see "re-entry record only"):
# the session host, its finalize and the room deletion are forwarded by the host and the
# job, the playout by its tracker, the participant link by itself, then by AgentJob to the
# user; the playout follows the link only when it leaves ``linked`` (system.WATCHES, which
# the job system delivers), which a re-entry never does; the job and the avatar (the
# route, the playout) are acted on
REPORTED_ONLY: frozenset[str] = frozenset(
    {"session_host", "finalize", "room_deletion", "playout", "participant", "session"}
)

# (machine, event) -> {effect: the runtime function that constructs the event}, for every
# event the runtime constructs only inside effect handlers (the actor itself constructs
# timeouts and effects' error events); any other constructed event may come at any time
PRODUCERS: dict[tuple[str, str], dict[str, str]] = {
    ("avatar", "plugin_started"): {"start_plugin": "_fx_start_plugin"},
    ("avatar", "no_route"): {"start_plugin": "_fx_start_plugin"},
    ("avatar", "route_restored"): {"restore_route": "_fx_restore_route"},
    ("avatar", "clear_buffer_done"): {"follow_plugin_clear": "_fx_follow_plugin_clear"},
    ("avatar", "released"): {
        "release_attempt": "_fx_release_attempt",
        "retire_attempt": "_fx_retire_attempt",
    },
    ("job", "close_done"): {"run_close": "_fx_run_close"},
    ("session_host", "drained"): {"drain": "_fx_drain"},
    ("session_host", "subscribe_failed"): {"subscribe": "_fx_subscribe"},
    ("room_deletion", "delete_done"): {"delete_room": "_fx_delete_room"},
    ("finalize", "verdict_ready"): {"compute_verdict": "_fx_compute_verdict"},
    ("finalize", "delivered"): {"send_verdict": "_fx_send_verdict"},
    ("agent_job", "released"): {"run_teardown": "_fx_run_teardown"},
}
# (machine, effect) whose handler is synchronous (it neither is a coroutine function nor
# returns an awaitable): its outcome is queued during the step that ran it
QUEUED_AT_ONCE: frozenset[tuple[str, str]] = frozenset(
    {("avatar", "reinstall_route"), ("session_host", "subscribe")}
)
# events the runtimes construct outside effect handlers (their API, callbacks from the
# session, the host or the room): these may come at any time
POSTED: dict[str, frozenset[str]] = {
    "avatar": frozenset({"start", "close", "interrupt", "playback_finished", "avatar_connected"}),
    "job": frozenset({"shutdown", "abort", "session_closed", "finalize_answered"}),
    "session_host": frozenset(
        {
            "start",
            "attach",
            "detach",
            "session_closed",
            "request",
            "finalize",
            "bad_request",
            "close",
            "transport_failed",  # once open_transport started the transport (INSTALLED_BY)
        }
    ),
    "participant": frozenset(
        {
            "participant_connected",
            "session_closed",
            "close",
            "close_failed",  # from the end of the close close_session asked (INSTALLED_BY)
        }
    ),
    # from the sessions' close listeners, a start's claim and the job's release
    "session": frozenset({"start", "session_closed", "close"}),
    "room_deletion": frozenset({"request", "allow", "close"}),
    "finalize": frozenset({"request", "close"}),
    # from AgentJob's API (start, its parts, aclose: JobSystem's begin, run_part, aclose)
    # and the job machine's watch
    "agent_job": frozenset(
        {
            "start",
            "start_part",
            "follow_room",
            "started",
            "start_failed",
            "close",
            "abort",
            "job_closed",
        }
    ),
    # from the session's, the avatar's and the link's callbacks (its timeouts only from
    # the actor)
    "playout": frozenset(
        {
            "speech_created",
            "agent_thinking",
            "agent_speaking",
            "agent_listening",
            "speech_done",
            "handed_off",
            "playback_finished",
            "interrupted",
            "avatar_left",
            "avatar_joined",
            "user_speaking",
            "user_left",
            "close",
        }
    ),
}
# (machine, event) -> (the callback that alone posts it, the function that hands it out,
# the effects whose handlers call that function): before any of them ran, nothing can ask
INSTALLED_BY: dict[tuple[str, str], tuple[str, str, frozenset[str]]] = {
    ("avatar", "playback_finished"): (
        "_on_playback_finished_rpc",
        "_claim_playback_rpc",
        frozenset({"start_plugin", "record_route", "check_presence", "reinstall_route"}),
    ),
    # the host's requests: posted only through the reader open_transport starts with it
    # (the transport's listen() or sdk.session_transport.read_requests, which know nothing
    # of the machine)
    **{
        ("session_host", e): ("_on_request", "_fx_open_transport", frozenset({"open_transport"}))
        for e in ("request", "finalize", "bad_request")
    },
    # how the transport's start went: the callback open_transport hangs on that start
    ("session_host", "transport_failed"): (
        "_on_opened",
        "_fx_open_transport",
        frozenset({"open_transport"}),
    ),
    # the link follows the end of the close it asked: the callback close_session
    # hangs on the session's closing task (its own failure is the effect's error event)
    ("participant", "close_failed"): (
        "_on_close_task_done",
        "_fx_close_session",
        frozenset({"close_session"}),
    ),
}
# where each machine's runtime lives, for the checks
MODULES = {
    "avatar": "agent_runtime/runtimes/avatar/_lifecycle.py",
    "job": "agent_runtime/runtimes/job.py",
    "session_host": "agent_runtime/runtimes/session_host.py",
    "participant": "agent_runtime/runtimes/participant.py",
    "room_deletion": "agent_runtime/runtimes/room_deletion.py",
    "finalize": "agent_runtime/runtimes/finalize.py",
    "playout": "agent_runtime/runtimes/playout.py",
    "session": "agent_runtime/runtimes/sessions.py",
    "agent_job": "agent_runtime/system/job_system.py",
}


def possible_states(spec: MachineSpec, event: str, *, routed: frozenset[str]) -> set[str] | None:
    """The states in which ``event`` can be decided, when every producer of it is a state
    timeout, an invoke task or a row effect; None when something else may post it
    (``routed``: the events room facts post)."""
    if event in routed or event in POSTED.get(spec.name, ()):
        return None
    effects = {e.name for e in spec.effects if e.error_event == event}
    effects |= set(PRODUCERS.get((spec.name, event), {}))
    timers = {s.name for s in spec.states if s.timeout is not None and s.timeout.event == event}
    if not effects and not timers:
        return None  # nothing produces it: not a cell the argument can speak for
    # every event an effect of those can end with: one run yields one of them
    outcomes = {event}
    for name in effects:
        err = spec.effect(name).error_event
        if err is not None:
            outcomes.add(err)
        outcomes |= {e for (m, e), by in PRODUCERS.items() if m == spec.name and name in by}
    states = set(timers)
    consumed = _consumed_in_place(spec)
    for name in effects:
        states |= {s.name for s in spec.states if name in s.invoke}
        at_once = (spec.name, name) in QUEUED_AT_ONCE
        for r in spec.rows:
            if name in r.effects:
                skip = set(outcomes)
                if at_once:
                    # queued during its own step: an outcome consumed where it was produced
                    # is not pending then (the row does not start there), and any produced
                    # later is queued behind this one
                    skip |= {e for e, where in consumed.items() if where != r.source}
                states |= _closure(spec, r.dest or r.source, skip)
    return states


def _consumed_in_place(spec: MachineSpec) -> dict[str, str]:
    """event -> state, for each event only row effects produce whose rows all enter that
    one state, which nothing leaves but that event (or a final state): at most one such
    event is ever pending, and only while the machine is in that state."""
    out: dict[str, str] = {}
    finals = {s.name for s in spec.states if s.final}
    for (machine, event), by in PRODUCERS.items():
        if machine != spec.name or any(
            s.timeout is not None and s.timeout.event == event for s in spec.states
        ):
            continue
        producers = set(by) | {e.name for e in spec.effects if e.error_event == event}
        if any(name in s.invoke for s in spec.states for name in producers):
            continue
        rows = [r for r in spec.rows if set(r.effects) & producers]
        dests = {r.dest for r in rows}
        if len(dests) != 1 or None in dests:
            continue
        (state,) = dests
        assert state is not None
        if any(r.source == state for r in rows):
            continue  # produced again from there: two could be pending
        leaving = [r for r in spec.rows if r.source == state and r.dest not in (None, state)]
        if all(r.event == event or r.dest in finals for r in leaving):
            out[event] = state
    return out


def _closure(spec: MachineSpec, start: str, outcomes: set[str]) -> set[str]:
    """The states reachable from ``start`` on events other than ``outcomes`` (any of which
    may be queued before the effect's outcome)."""
    seen = {start}
    todo = [start]
    while todo:
        cur = todo.pop()
        for r in spec.rows:
            if r.source == cur and r.event not in outcomes and r.dest and r.dest not in seen:
                seen.add(r.dest)
                todo.append(r.dest)
    return seen


RECORD_ONLY = (
    " ignore -> reject",
    " reject -> ignore",
    " ignore -> internal",
    " reject -> internal",
)


def _routed(machine: str) -> frozenset[str]:
    from statemachines.routing import routes_for

    return frozenset(r.event for r in routes_for(machine))


def _re_entry(m: Mutant) -> bool:
    """``m`` turns staying in a state (an ignore, a reject of a posted event, or an
    internal row) into leaving it and entering it again, with the same guards and effects."""
    if m.machine not in REPORTED_ONLY or m.spec is None:
        return False
    original = MACHINES[m.machine]
    st = original.state(m.state)
    if st.timeout is not None or st.invoke:
        return False
    cell = (m.state, m.event)
    old = [r for r in original.rows if (r.source, r.event) == cell]
    new = [r for r in m.spec.rows if (r.source, r.event) == cell]
    if not old:
        kind = original.cell_kind(*cell)
        stayed = kind == "ignore" or (kind == "reject" and (m.machine, m.event) not in SENT)
        return stayed and bool(new) and all(r.dest == m.state and not r.effects for r in new)
    if len(old) != len(new):
        return False
    changed = [(o, n) for o, n in zip(old, new, strict=True) if o != n]
    return len(changed) == 1 and all(
        o.dest is None and n.dest == m.state and (o.guards, o.effects) == (n.guards, n.effects)
        for o, n in changed
    )


def _ignore_vs_no_op(m: Mutant) -> bool:
    """``m`` swaps an ignore cell and an unguarded internal row with no effects, either
    way: what ``send`` answers alike (neither raises)."""
    if m.spec is None or (m.machine, m.event) in NOT_REPLAYED:
        return False
    cell = (m.state, m.event)
    kinds: list[str] = []
    for spec in (MACHINES[m.machine], m.spec):
        rows = [r for r in spec.rows if (r.source, r.event) == cell]
        if not rows:
            kinds.append(spec.cell_kind(*cell))
        elif len(rows) == 1 and rows[0].dest is None and not rows[0].guards + rows[0].effects:
            kinds.append("no-op")
        else:
            return False
    return sorted(kinds) == ["ignore", "no-op"]


def _after_subscribing(m: Mutant) -> set[str] | None:
    """The states a room fact can be decided in, for a machine the room is followed for
    only once an API-guarded event was queued; None when that does not apply."""
    first = SUBSCRIBED_BY.get(m.machine)
    if first is None or m.event not in _routed(m.machine):
        return None
    original = MACHINES[m.machine]
    _, states = API_GUARDED[(m.machine, first)]
    where: set[str] = set()
    for r in original.rows:
        if r.event == first and r.source in states:
            where |= _closure(original, r.dest or r.source, set())
    # queued before it, close can end the machine first
    return where | {s.name for s in original.states if s.final}


def _after_installing(m: Mutant) -> set[str] | None:
    """The states an ``INSTALLED_BY`` event can be decided in: those the effects that hand
    out its callback run in or lead to, and on from there on anything queued; None when
    that does not apply."""
    installed = INSTALLED_BY.get((m.machine, m.event))
    if installed is None:
        return None
    original = MACHINES[m.machine]
    where: set[str] = set()
    for name in installed[2]:
        for st in original.states:
            if name in st.invoke:
                where |= _closure(original, st.name, set())
        for r in original.rows:
            if name in r.effects:
                where |= _closure(original, r.dest or r.source, set())
    return where


def argument(m: Mutant) -> str | None:
    """Why no one can tell ``m`` from the machine as written, or None."""
    for pattern, why in BY_HAND:
        if fnmatch.fnmatchcase(m.label, pattern):
            return why
    if m.label.endswith(RECORD_ONLY) and (m.machine, m.event) not in SENT:
        return "decision record only: the event is posted, ignore/reject/internal no-op act alike"
    if _ignore_vs_no_op(m):
        return (
            "decision record only: the event is sent; an ignore and an internal no-op both "
            "return its step (only a reject raises), and no caller reads the step"
        )
    guarded = API_GUARDED.get((m.machine, m.event))
    if guarded is not None:
        original = MACHINES[m.machine]
        sent_in: set[str] = set()
        for state in guarded[1]:
            sent_in |= _closure(original, state, {m.event})  # what queued events can do first
        if m.state not in sent_in:
            return (
                f"refused by the API: {guarded[0]}() sends {m.event!r} only in "
                f"{', '.join(sorted(guarded[1]))}; queued events reach "
                f"{', '.join(sorted(sent_in))}"
            )
    after = _after_subscribing(m)
    if after is not None and m.state not in after:
        return (
            f"never decided there: {m.event!r} is a room fact, followed only once "
            f"{SUBSCRIBED_BY[m.machine]!r} was queued; that reaches {', '.join(sorted(after))}"
        )
    asked = _after_installing(m)
    if asked is not None and m.state not in asked:
        return (
            f"never asked there: {m.event!r} is posted only by "
            f"{INSTALLED_BY[(m.machine, m.event)][0]}, handed out in {', '.join(sorted(asked))}"
        )
    if _re_entry(m):
        return (
            f"re-entry record only: {m.state!r} has no timer or task, and the runtime only "
            f"reports {m.machine}'s state changes"
        )
    spec = m.spec or MACHINES.get(m.machine)
    if spec is not None:
        where = possible_states(spec, m.event, routed=_routed(m.machine))
        if where is not None and m.state not in where:
            return (
                f"never decided there: {m.event!r} comes only from timeouts, tasks and "
                f"effects of {', '.join(sorted(where))}"
            )
    return None
