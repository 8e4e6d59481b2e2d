"""The mutation tool (``python -m verification.mutation``): the swap reaches the
runtime, the equivalence arguments hold for the code they rely on, and a run on one
machine's cells kills what its tests notice.

The full run (hours on two workers; the tests alone about 25 minutes with
``--props-examples 50 --explore-depth -1``) is not part of the suite; its measured figures
are in docs/guide/verification.md.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from agent_runtime import Actor, Event, MemorySink, Tracer
from agent_runtime.testing.clock import VirtualClock
from statemachines import MachineSpec, Row
from statemachines.machines import MACHINES
from statemachines.routing import ROUTES
from statemachines.system import WATCHES
from verification.mutation.cells import set_cell, set_dest
from verification.mutation.equivalent import (
    API_GUARDED,
    INSTALLED_BY,
    MODULES,
    POSTED,
    PRODUCERS,
    QUEUED_AT_ONCE,
    REPORTED_ONLY,
    SENT,
    SUBSCRIBED_BY,
    argument,
)
from verification.mutation.mutants import Mutant, all_mutants, mutant, mutants_of
from verification.mutation.run import main
from verification.mutation.swap import Visits, swapped

ROOT = Path(__file__).resolve().parents[1]


async def test_a_swapped_spec_is_what_a_runtime_built_meanwhile_runs() -> None:
    import agent_runtime.runtimes.job
    import statemachines.job
    from tests.support.job_rig import JobRig

    job = MACHINES["job"]
    mutant = MachineSpec.model_validate(
        set_dest(job, "serving", "shutdown", "closing", guards=["hold_needed"]).model_dump()
    )
    with swapped(job, mutant) as places:
        assert places >= 3  # MACHINES, statemachines.job, agent_runtime.runtimes.job at least
        assert MACHINES["job"] is mutant and agent_runtime.runtimes.job.JOB is mutant
        rig = JobRig(simulator=True)
        assert rig.runtime.actor.spec is mutant
        visits = Visits()
        visits.watch = (mutant, "serving", "shutdown")
        with visits.installed():
            await rig.runtime.start()
            rig.runtime.shutdown("asked")
            await rig.settle()
        # with the simulator present the real table holds; the mutant closes at once
        assert rig.runtime.state in ("closing", "closed")
        assert ("job", "serving", "shutdown") in visits.cells and visits.watched
        await rig.clock.advance(30)
        await rig.runtime.aclose()
    assert MACHINES["job"] is job and statemachines.job.JOB is job
    assert agent_runtime.runtimes.job.JOB is job


def test_mutants_are_numbered_alike_and_refused_ones_say_why() -> None:
    spec = MACHINES["room_deletion"]
    a, b = mutants_of(spec), mutants_of(spec)
    assert [m.label for m in a] == [m.label for m in b]
    refused = [m for m in a if m.spec is None]
    assert refused and all(m.refused.startswith("machine 'room_deletion'") for m in refused)
    # one built alone is the same mutant, under the same number
    assert mutant(spec, a[7].label) == a[7] and mutant(spec, refused[0].label) == refused[0]
    with pytest.raises(ValueError, match="room_deletion has no mutant 'nope'"):
        mutant(spec, "nope")
    with pytest.raises(ValueError, match="no machine 'nope'"):
        all_mutants(["nope"])


# -- the equivalence arguments, against the code they rely on --------------------------------


def _constructed(machine: str) -> set[tuple[str, str]]:
    """(event, enclosing function) of every ``Event("name", ...)`` and ``self._post("name",
    ...)`` in the runtime module."""
    tree = ast.parse((ROOT / MODULES[machine]).read_text())
    out: set[tuple[str, str]] = set()

    def walk(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            if (
                isinstance(child, ast.Call)
                and (
                    (isinstance(child.func, ast.Name) and child.func.id == "Event")
                    or (isinstance(child.func, ast.Attribute) and child.func.attr == "_post")
                )
                and child.args
                and isinstance(child.args[0], ast.Constant)
            ):
                out.add((str(child.args[0].value), name))
            walk(child, name)

    walk(tree, "")
    return out


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_every_event_a_runtime_constructs_is_posted_or_a_named_producers(machine: str) -> None:
    """An event missing from POSTED (or constructed by another function than PRODUCERS
    says) would make 'never decided there' argue for a cell that can be reached."""
    assert machine in MODULES and machine in POSTED, f"no runtime module listed for {machine}"
    source = (ROOT / MODULES[machine]).read_text()
    for event, fn in _constructed(machine):
        producers = PRODUCERS.get((machine, event))
        if producers is None:
            assert event in POSTED[machine], f"{machine}: {fn} constructs {event!r}"
        else:
            assert fn in producers.values(), f"{machine}: {fn} constructs {event!r}"
    for (m, event), producers in PRODUCERS.items():
        if m != machine:
            continue
        assert event not in POSTED[machine]
        for effect, fn in producers.items():
            assert (event, fn) in _constructed(machine)
            # the function is the handler of that effect (effect_table binds _fx_EFFECT)
            assert fn == f"_fx_{effect}" and "= effect_table(" in source, (effect, fn)
    # an awaited send raises a reject to its caller unless the caller suppresses it
    assert _sent(machine) == {e for m, e in SENT if m == machine}


def _sent(machine: str) -> set[str]:
    """The events the runtime module awaits with ``.send(Event(...))`` outside a
    ``suppress(... EventRejected ...)``: a literal name, either branch of a conditional
    one, or a parameter of the enclosing method, read at every call of that method in
    the package (``self.system.begin("start")``)."""
    tree = ast.parse((ROOT / MODULES[machine]).read_text())
    package = "\n".join(p.read_text() for p in (ROOT / "agent_runtime").rglob("*.py"))
    out: set[str] = set()

    def names(arg: ast.expr, fn: ast.FunctionDef | ast.AsyncFunctionDef | None) -> set[str]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return {arg.value}
        if isinstance(arg, ast.IfExp):
            return names(arg.body, fn) | names(arg.orelse, fn)
        if isinstance(arg, ast.Name) and fn is not None:
            assert arg.id in {a.arg for a in fn.args.args}, (machine, ast.unparse(arg))
            called = set(re.findall(rf'\.{fn.name}\(\s*"(\w+)"', package))
            assert called, f"{machine}: no call of {fn.name}() names its event"
            return called
        raise AssertionError(f"{machine}: cannot tell what {ast.unparse(arg)} sends")

    def walk(node: ast.AST, fn: ast.FunctionDef | ast.AsyncFunctionDef | None, ok: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else fn
            quiet = ok or (
                isinstance(child, ast.With | ast.AsyncWith)
                and any(
                    "suppress(" in ast.unparse(i.context_expr)
                    and "EventRejected" in ast.unparse(i.context_expr)
                    for i in child.items
                )
            )
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "send"
                and child.args
                and isinstance(child.args[0], ast.Call)
                and isinstance(child.args[0].func, ast.Name)
                and child.args[0].func.id == "Event"
                and not quiet
            ):
                out.update(names(child.args[0].args[0], fn))
            walk(child, inner, quiet)

    walk(tree, None, False)
    return out


def test_the_playout_glue_posts_only_events_the_arguments_treat_as_any_time() -> None:
    """The playout runtime also posts names its glue functions compute: none of them may be
    one of its timeouts, which 'never decided there' holds to their own states."""
    from typing import get_args

    from livekit.agents.voice.events import AgentState

    from statemachines.glue import agent_state_event, avatar_change_event, link_change_event

    avatar, link = MACHINES["avatar"].state_names, MACHINES["participant"].state_names
    named = {agent_state_event(s) for s in get_args(AgentState)}
    named |= {avatar_change_event(a, b) for a in avatar for b in avatar}
    named |= {link_change_event(a, b) for a in link for b in link}
    assert named - {None} <= POSTED["playout"]
    timeouts = {s.timeout.event for s in MACHINES["playout"].states if s.timeout is not None}
    assert timeouts and not timeouts & POSTED["playout"]
    assert POSTED["playout"] | timeouts == set(MACHINES["playout"].events)


def test_the_room_routes_only_post_events_the_arguments_treat_as_any_time() -> None:
    from verification.mutation.equivalent import possible_states

    for r in ROUTES:
        routed = frozenset(x.event for x in ROUTES if x.machine == r.machine)
        assert possible_states(MACHINES[r.machine], r.event, routed=routed) is None


async def test_ignore_reject_and_an_internal_no_op_do_the_same_for_a_posted_event() -> None:
    """The premise of 'decision record only': only the trace's kind differs."""
    base = MACHINES["participant"]
    cell = ("linked", "participant_connected")  # an ignore cell
    variants = {
        "ignore": base,
        "reject": set_cell(base, *cell, kind="reject"),
        "internal": set_cell(base, *cell, rows=[Row(source=cell[0], event=cell[1], dest=None)]),
    }
    seen = {}
    for name, spec in variants.items():
        clock, sink = VirtualClock(), MemorySink()
        ran: list[str] = []
        actor = Actor(
            spec,
            effects={e.name: (lambda ev, n=e.name, r=ran: r.append(n)) for e in spec.effects},
            guards={g: (lambda ev: True) for g in spec.guards},
            clock=clock,
            tracer=Tracer(sink),
        )
        actor.post(Event("participant_connected", {"identity": "u"}))
        await actor.join()
        assert actor.state == "linked"
        before = (ran[:], actor.timer_armed, actor.live_tasks, actor.entered_at)
        actor.post(Event("participant_connected", {"identity": "u"}))
        await actor.join()
        seen[name] = (actor.state, ran[len(before[0]) :], actor.timer_armed, actor.live_tasks)
        assert actor.entered_at == before[3]  # not left and entered again
        assert sink.records[-1].kind == ("transition" if name == "internal" else name)
        await actor.aclose()
    assert len(set(map(str, seen.values()))) == 1, seen


async def test_a_sent_event_ignored_or_taken_by_an_internal_no_op_returns_alike() -> None:
    """The premise of 'decision record only' for a sent event: ``send`` returns for an
    ignore and an internal no-op alike (a reject raises), and no caller in the runtime
    reads what it returns (every ``.send(`` is awaited as a statement of its own)."""
    base = MACHINES["agent_job"]
    cell = ("starting", "start_part")  # an internal no-op
    assert [(r.dest, r.guards, r.effects) for r in base.rows if (r.source, r.event) == cell] == [
        (None, (), ())
    ]
    variants = {"internal": base, "ignore": set_cell(base, *cell, kind="ignore")}
    seen = {}
    for name, spec in variants.items():
        actor = Actor(
            spec,
            effects={e.name: (lambda ev: None) for e in spec.effects},
            guards={},
            clock=VirtualClock(),
        )
        await actor.send(Event("start"))
        entered = actor.entered_at
        await actor.send(Event("start_part"))  # returns: no EventRejected
        assert actor.entered_at == entered  # not left and entered again
        seen[name] = (actor.state, actor.timer_armed, actor.live_tasks)
        await actor.aclose()
    assert seen["internal"] == seen["ignore"] == ("starting", False, 0), seen
    for path in (ROOT / "agent_runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign | ast.Return):
                continue
            value = node.value
            if (
                isinstance(value, ast.Await)
                and isinstance(value.value, ast.Call)
                and isinstance(value.value.func, ast.Attribute)
                and value.value.func.attr == "send"
            ):
                assert isinstance(node, ast.Expr), f"{path}: {ast.unparse(node)} reads the step"


def test_the_job_lifecycle_hears_started_only_once_it_left_new() -> None:
    """The premise of the by-hand argument for (new, started) and (held, started): no row
    enters new, only new's job_holding enters held; start and start_part leave them for
    starting and starting_held; only run_part(session=True) sends started, and each
    AgentJob method that calls it so first awaits begin() with start or start_part."""
    spec = MACHINES["agent_job"]
    assert spec.initial == "new" and not [r for r in spec.rows if r.dest == "new"]
    assert [(r.source, r.event) for r in spec.rows if r.dest == "held"] == [("new", "job_holding")]
    for state, dest in (("new", "starting"), ("held", "starting_held")):
        for event in ("start", "start_part"):
            assert [r.dest for r in spec.rows if (r.source, r.event) == (state, event)] == [dest]
    assert {fn for e, fn in _constructed("agent_job") if e == "started"} == {"run_part"}
    system = importlib.import_module("agent_runtime.system.job_system")
    run_part = inspect.getsource(system.JobSystem.run_part)
    assert run_part.index("if session:") < run_part.index('Event("started")')
    tree = ast.parse((ROOT / "agent_runtime/system/agent_job.py").read_text())
    callers = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.AsyncFunctionDef):
            continue
        source = ast.unparse(fn)
        if "run_part(" not in source or "session=True" not in source:
            continue
        callers += 1
        begin = re.search(r"await self\.system\.begin\('(\w+)'\)", source)
        assert begin is not None and begin.group(1) in ("start", "start_part"), fn.name
        assert begin.start() < source.index("session=True"), fn.name
    assert callers == 2  # start() and start_session()
    assert "session=True" not in (ROOT / "agent_runtime/system/job_system.py").read_text()


def test_the_job_lifecycle_hears_job_holding_once_and_only_that_leads_to_a_held_state() -> None:
    """The premise of the by-hand argument for (held, job_holding) and (starting_held,
    job_holding): the watch fires on the job machine entering awaiting_finalize, which
    only serving's rows enter and none leads back to serving; held and starting_held are
    entered on job_holding, or by a start from held."""
    job = MACHINES["job"]
    assert {r.source for r in job.rows if r.dest == "awaiting_finalize"} == {"serving"}
    assert not [r for r in job.rows if r.dest == "serving"]
    holding = [w for w in WATCHES if (w.target, w.event) == ("agent_job", "job_holding")]
    assert [(w.source, w.entering, w.leaving) for w in holding] == [
        ("job", ("awaiting_finalize",), ())
    ]
    spec = MACHINES["agent_job"]
    into = {(r.source, r.event) for r in spec.rows if r.dest in ("held", "starting_held")}
    assert into == {
        ("new", "job_holding"),
        ("starting", "job_holding"),
        ("held", "start"),
        ("held", "start_part"),
    }


def test_the_job_lifecycle_hears_started_once_and_never_once_closed() -> None:
    """The premise of the by-hand arguments for (running, started) and (closed, started):
    started is the only way into running and is sent by run_part(session=True) alone, whose
    callers each claim the session first (a second claim raises); the session part links
    the participant after the session starts, the link refuses to start once its machine
    is closed (its release steps the close before it returns), and the release closes
    the link before it ends (released is what leads to closed)."""
    spec = MACHINES["agent_job"]
    assert {(r.source, r.event) for r in spec.rows if r.dest == "running"} == {
        ("starting", "started"),
        ("starting_held", "started"),
    }
    assert {fn for e, fn in _constructed("agent_job") if e == "started"} == {"run_part"}
    tree = ast.parse((ROOT / "agent_runtime/system/agent_job.py").read_text())
    callers = 0
    for fn in ast.walk(tree):
        if isinstance(fn, ast.AsyncFunctionDef) and "session=True" in ast.unparse(fn):
            source = ast.unparse(fn)
            callers += 1
            assert source.index("await self.system.claim_session()") < source.index("session=True")
    assert callers == 2  # start() and start_session()
    system = importlib.import_module("agent_runtime.system.job_system")
    claim = inspect.getsource(system.JobSystem.claim_session)
    assert "await self.sessions.claim()" in claim
    # the claim is the session machine's start: it leaves new for good, and a reject raises
    session = MACHINES["session"]
    assert {(r.source, r.event, r.dest) for r in session.rows if r.event == "start"} == {
        ("new", "start", "started")
    }
    assert not any(r.dest == "new" for r in session.rows)
    sessions = importlib.import_module("agent_runtime.runtimes.sessions")
    claims = inspect.getsource(sessions.JobSessions.claim)
    assert claims.index('send(Event("start"))') < claims.index("except (EventRejected")
    assert "raise RuntimeError" in claims
    start_session = inspect.getsource(system.JobSystem.start_session)
    assert start_session.index("await self.session.start(") < start_session.index(
        "self.link.start()"
    )
    link = importlib.import_module("agent_runtime.runtimes.participant")
    start = inspect.getsource(link.ParticipantLink.start)
    assert start.index("if self._finished:") < start.index("raise RuntimeError")
    # the close is stepped before the release returns: from then on the state is closed
    base = importlib.import_module("agent_runtime.runtimes._base")
    release = inspect.getsource(link.ParticipantLink.release)
    close_now = inspect.getsource(base.MachineRuntime._close_now)
    # synchronous (no await): the close is stepped before it returns
    for source in (release, close_now):
        assert not any(isinstance(n, ast.Await) for n in ast.walk(ast.parse(source.strip())))
    assert "return self._close_now(" in release
    assert close_now.index('actor.post_now(Event("close"))') < close_now.index("return after(")
    from statemachines.system import RELEASE

    assert "participant" in [s.name for s in RELEASE]
    teardown = inspect.getsource(system.JobSystem._fx_run_teardown)
    assert '"participant": self.link.release' in teardown
    assert teardown.index("teardown.run(works, None)") < teardown.index('Event("released")')
    assert [(r.source, r.dest) for r in spec.rows if r.dest == "closed"] == [("closing", "closed")]
    assert [r.event for r in spec.rows if r.dest == "closed"] == ["released"]


async def test_nothing_in_the_runtime_acts_on_the_state_changes_of_a_reported_only_machine() -> (
    None
):
    """The premise of 're-entry record only': in a composed job, a REPORTED_ONLY machine's
    state changes go only through forwarders (each re-emits the change, nothing else) to
    the job's own listeners, the user's; the job system's forwarder acts on the avatar's alone
    (and on the declared watches, none of which a reported-only machine fires)."""
    from tests.support.playout_rig import PlayoutRig

    rig = PlayoutRig()
    await rig.start()
    job, agent_job = rig.job.job, rig.job
    assert job.host is not None
    host, tracker = job.host, rig.playout
    link = agent_job.link
    actors = {
        "session_host": host.actor,
        "finalize": host.finalize.actor,
        "room_deletion": job.deletion.actor,
        "playout": tracker.actor,
        "participant": link.actor,
        "session": agent_job.system.sessions.actor,
    }
    assert set(actors) == REPORTED_ONLY
    # each runtime forwards its machine's changes (MachineRuntime._on_state), the job and
    # the host those of the parts they own too (_emit_state)
    forwarders = {
        host._on_state: host,
        host._emit_state: host,
        job._emit_state: job,
        tracker._on_state: tracker,
        link._on_state: link,
        agent_job.system._forward_state: agent_job.system,
        agent_job._forward_state: agent_job,
    }
    # the job system delivers the declared watches (the playout follows the link): a
    # watch never fires on a re-entry
    from statemachines.system import WATCHES

    for w in WATCHES:
        assert not any(w.fires(s, s) for s in MACHINES[w.source].state_names), w
    for machine, actor in actors.items():
        todo, seen = [actor], set()
        while todo:
            emitter = todo.pop()
            # who owns it hears first (set_owner), then its listeners
            owner = getattr(emitter, "_owner", None)
            listeners = emitter._events.get("state_changed", ())
            for listener in (*([owner] if owner else []), *listeners):
                assert listener in forwarders, f"{machine}: {listener} acts on its changes"
                if listener not in seen:
                    seen.add(listener)
                    todo.append(forwarders[listener])
        assert agent_job._forward_state in seen, machine  # it reaches the user, nothing else
    assert not agent_job._events.get("state_changed")  # nobody but a user listens there
    source = inspect.getsource(type(agent_job.system)._forward_state)
    assert 'sc.machine == "avatar"' in source  # the only change it acts on (and the watches)
    assert "watched(sc.machine" in source
    # the user's front acts on the job's own lifecycle alone (its close ends the tracing)
    source = inspect.getsource(type(agent_job)._forward_state)
    assert 'if sc.machine == "agent_job"' in source
    await rig.aclose()


@pytest.mark.parametrize(("machine", "event"), sorted(API_GUARDED))
def test_an_api_guarded_event_is_sent_only_after_its_state_check(machine: str, event: str) -> None:
    """The premise of 'refused by the API': the method refuses every other state, then
    sends the event with no await in between (nothing can move the machine first but the
    events already queued), and it is the only place the runtime constructs the event."""
    method, states = API_GUARDED[(machine, event)]
    assert {fn for e, fn in _constructed(machine) if e == event} == {method}
    source = (ROOT / MODULES[machine]).read_text()
    body = source[source.index(f"    async def {method}(") :]
    # (a check may refuse more besides, ``or ...``: a start already queued)
    check = re.search(
        r"if self\.state not in \(([^)]*)\):|if self\.state != \"(\w+)\"(?: or [^:\n]*)?:", body
    )
    assert check is not None, f"{method}() checks no state"
    checked = {x.strip().strip('"') for x in (check.group(1) or check.group(2)).split(",") if x}
    assert checked == states
    assert "raise" in body[check.end() : body.index("\n", check.end() + 1) + 120]
    send = body.index(f'.send(Event("{event}"')
    between = body[check.end() : body.rindex("\n", 0, send)]  # up to the send's own line
    assert "await" not in between, f"{method}() awaits between its check and the send"
    if SUBSCRIBED_BY.get(machine) == event:
        # it subscribes the machine to the room in that same step, and nowhere else
        assert between.count("follow(") == 1 and source.count("follow(") == 1


def _callers(machine: str) -> dict[str, set[str]]:
    """function -> the functions of the runtime module that call it as ``self.<name>(...)``
    or refer to it as ``self.<name>`` (a callback handed out)."""
    tree = ast.parse((ROOT / MODULES[machine]).read_text())
    out: dict[str, set[str]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                out.setdefault(node.attr, set()).add(fn.name)
    return out


@pytest.mark.parametrize(("machine", "event"), sorted(INSTALLED_BY))
def test_an_installed_callback_is_handed_out_only_by_its_effects(machine: str, event: str) -> None:
    """The premise of 'never asked there': the callback alone constructs the event, only
    the handing-out function refers to it (to register it, and to check it is still ours
    before taking it back), and every chain of calls to that function starts in the
    handler of one of the named effects."""
    callback, hands_out, effects = INSTALLED_BY[(machine, event)]
    assert {fn for e, fn in _constructed(machine) if e == event} == {callback}
    callers = _callers(machine)
    assert callers[callback] <= {hands_out, "_release_playback_rpc"}
    source = (ROOT / MODULES[machine]).read_text()
    roots, todo, seen = set(), [hands_out], {hands_out}
    while todo:
        fn = todo.pop()
        if fn.startswith("_fx_"):
            roots.add(fn)
            continue
        up = callers.get(fn, set())
        assert up, f"{fn} is called from outside the runtime's own methods"
        for caller in up - seen:
            seen.add(caller)
            todo.append(caller)
    assert "= effect_table(" in source  # effect x's handler is _fx_x
    assert roots == {f"_fx_{name}" for name in effects}


def test_the_local_clear_finds_nothing_in_idle() -> None:
    """The premise of the by-hand argument for the avatar's ``(idle, interrupt)`` made
    ignore or reject: ``clear_local_buffer`` does nothing unless the route recorded the
    plugin's sink, which only ``record_installed`` does, reached only from the handlers of
    ``start_plugin`` (the task of ``starting``) and ``record_route`` (on rows leaving
    ``starting``); no row enters ``idle``."""
    lifecycle = ast.parse((ROOT / MODULES["avatar"]).read_text())
    route = ast.parse((ROOT / "agent_runtime/runtimes/avatar/_route.py").read_text())

    def fn(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        (found,) = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
        ]
        return found

    (only,) = fn(lifecycle, "_fx_clear_local_buffer").body
    assert isinstance(only, ast.If) and not only.orelse
    assert ast.unparse(only.test) == "self._route.installed is not None"
    assigns = {
        (f.name, ast.unparse(a.value))
        for f in ast.walk(route)
        if isinstance(f, ast.FunctionDef)
        for a in ast.walk(f)
        if (isinstance(a, ast.Assign) and ast.unparse(a.targets[0]) == "self.installed")
        or (isinstance(a, ast.AnnAssign) and ast.unparse(a.target) == "self.installed")
    }
    assert assigns == {("__init__", "None"), ("record_installed", "tail"), ("forget", "None")}
    for path in (ROOT / "agent_runtime").rglob("*.py"):  # nothing else writes the route's
        if path.name != "_route.py":
            assert not re.search(r"route\.installed\s*(:[^=]*)?=[^=]", path.read_text()), path
    callers = _callers("avatar")
    assert callers["_record_installed"] == {"_fx_start_plugin", "_fx_record_route"}
    source = (ROOT / MODULES["avatar"]).read_text()
    assert source.count("record_installed()") == 4  # the method's one call, and its three
    avatar = MACHINES["avatar"]
    assert [s.name for s in avatar.states if "start_plugin" in s.invoke] == ["starting"]
    assert {r.source for r in avatar.rows if {"start_plugin", "record_route"} & set(r.effects)} == {
        "starting"
    }
    assert not [r for r in avatar.rows if r.dest == "idle"]


def test_a_reinstall_never_fails_in_clearing() -> None:
    """The premise of the by-hand argument for the avatar's ``(clearing, start_error)``:
    ``start_error`` comes from the plugin's start, a task of ``starting`` only, or from the
    reinstall, a synchronous effect of the rejoin rows, which leave ``backoff`` and
    ``restored``; those are entered only after ``failed``: on its ``route_restored``, or
    from ``retiring``, itself entered only from ``failed`` and ``restored``. The one
    row into ``clearing`` takes an interrupt its guard reads as delivered, and the runtime
    marks an interrupt delivered only in the one place that posts it in ``joined`` or
    ``clearing``."""
    from statemachines import glue
    from statemachines.avatar import PLUGIN_CLEARS, WAITING

    avatar = MACHINES["avatar"]
    assert "start_error" not in POSTED["avatar"] and ("avatar", "start_error") not in PRODUCERS
    assert {e.name for e in avatar.effects if e.error_event == "start_error"} == {
        "start_plugin",
        "reinstall_route",
    }
    assert [s.name for s in avatar.states if "start_plugin" in s.invoke] == ["starting"]
    assert not [r for r in avatar.rows if "start_plugin" in r.effects]
    reinstalls = [r for r in avatar.rows if "reinstall_route" in r.effects]
    assert reinstalls and {r.source for r in reinstalls} == set(WAITING)
    assert ("avatar", "reinstall_route") in QUEUED_AT_ONCE
    into_waiting = [r for r in avatar.rows if r.dest in WAITING and r.source != r.dest]
    assert {(r.source, r.event) for r in into_waiting} == {
        ("failed", "route_restored"),
        ("retiring", "released"),
        ("retiring", "release_timeout"),
    }
    assert {r.source for r in avatar.rows if r.dest == "retiring"} == {"failed", "restored"}
    (into_clearing,) = [r for r in avatar.rows if r.dest == "clearing"]
    assert (into_clearing.source, into_clearing.event) == ("joined", "interrupt")
    assert into_clearing.guards == ("clear_pending",)
    assert 'data.get("delivered")' in inspect.getsource(glue.clear_pending)
    assert sorted(PLUGIN_CLEARS) == ["clearing", "joined"]
    source = (ROOT / MODULES["avatar"]).read_text()
    assert source.count('"delivered"') == 1 and "delivered=" not in source
    tree = ast.parse(source)
    marked = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "delivered" for k in n.keys)
    ]
    assert len(marked) == 1
    guarded = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "self.actor.state in PLUGIN_CLEARS"
        and any(m is marked[0] for stmt in n.body for m in ast.walk(stmt))
    ]
    assert guarded, "an interrupt is marked delivered outside joined and clearing"


@pytest.mark.parametrize(("machine", "effect"), sorted(QUEUED_AT_ONCE))
def test_an_effect_queued_at_once_has_a_synchronous_handler(machine: str, effect: str) -> None:
    """The premise of 'queued during its own step': the handler is a plain function whose
    declared result is an event or nothing (never an awaitable), so the actor queues its
    outcome before it takes the next event."""
    source = (ROOT / MODULES[machine]).read_text()
    assert "= effect_table(" in source  # effect x's handler is _fx_x
    tree = ast.parse(source)
    (fn,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == f"_fx_{effect}"
    ]
    assert isinstance(fn, ast.FunctionDef), f"{fn.name} is a coroutine function"
    assert fn.returns is not None and ast.unparse(fn.returns) in ("Event | None", "Event", "None")


def test_what_the_arguments_cover() -> None:
    def m(machine: str, label: str) -> Mutant:
        return mutant(MACHINES[machine], label)

    assert argument(m("job", "job (serving, close_done) ignore -> closing")) is not None
    assert argument(m("job", "job (closing, close_done) -> serving")) is None
    assert argument(m("job", "job (closing, shutdown) ignore -> reject")) is not None
    # a sent event: a reject would raise to the caller
    # reachable: a close the job's link queued, then start() (its reject is start()'s error)
    assert argument(m("avatar", "avatar (closed, start) reject -> ignore")) is None
    assert argument(m("avatar", "avatar (routing, start) reject -> ignore")) is not None  # API
    assert argument(m("avatar", "avatar (idle, start) -> ignore")) is None
    # ... but an ignore and an internal no-op both return the step
    assert argument(m("agent_job", "agent_job (starting, start_part) -> ignore"))
    assert argument(m("agent_job", "agent_job (running, started) ignore -> internal"))
    # ... unless a trace's reproduction cannot make it (start_runtime() has no step)
    assert argument(m("agent_job", "agent_job (new, follow_room) ignore -> internal")) is None
    assert argument(m("agent_job", "agent_job (running, start) reject -> ignore")) is None
    assert argument(m("agent_job", "agent_job (closed, abort) ignore -> reject")) is None
    assert argument(m("agent_job", "agent_job (closed, started) ignore -> reject"))  # by hand
    assert argument(m("agent_job", "agent_job (running, started) ignore -> closing"))
    assert argument(m("agent_job", "agent_job (starting, start_part) -> starting")) is None
    # the host's close reaches the finalize answer through its link: posted
    assert argument(m("finalize", "finalize (replying, close) ignore -> reject"))
    # the same made posted (the job's links post allow): ignore and reject act alike
    assert argument(m("room_deletion", "room_deletion (allowed, allow) ignore -> reject"))
    # sent, but the tracker's close suppresses a reject
    assert argument(m("playout", "playout (closed, close) ignore -> reject"))
    # re-entering a state with no timer, same effects: only the record differs
    assert argument(m("playout", "playout (idle, handed_off) -> idle"))
    assert argument(m("playout", "playout (agent_turn, speech_created) ignore -> agent_turn"))
    # ... but not a state with a timer (it restarts), nor a row that changed its destination
    assert argument(m("playout", "playout (settling, agent_listening) ignore -> settling")) is None
    assert argument(m("playout", "playout (exhausted, user_left) -> exhausted")) is None
    # start() sends start in idle only: elsewhere the cell is never decided
    assert argument(m("avatar", "avatar (joined, start) reject -> starting"))
    assert argument(m("avatar", "avatar (idle, start) -> routing")) is None
    # the room is followed only from start(): no room fact is decided in idle
    assert argument(m("avatar", "avatar (idle, avatar_connected) ignore -> joined"))
    assert argument(m("avatar", "avatar (routing, avatar_connected) [has_video] -> failed")) is None
    # a reinstall's failure is queued at once: no later restore's report can precede it
    assert argument(m("avatar", "avatar (restored, start_error) ignore -> idle"))
    assert argument(m("avatar", "avatar (failed, start_error) ignore -> idle")) is None
    # nobody can report a playback before the sink's handler was handed out
    assert argument(m("avatar", "avatar (idle, playback_finished) ignore -> failed"))
    assert argument(m("avatar", "avatar (starting, playback_finished) -> failed")) is None
    # nor in a machine whose state changes the runtime acts on
    assert argument(m("avatar", "avatar (routing, avatar_connected) -> routing")) is None


# -- the tool, on a few cells of one machine ---------------------------------------------------


def test_a_run_on_one_machine_kills_what_its_tests_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "verdicts.json"
    code = main(
        [
            "--machine",
            "room_deletion",
            "--cell",
            "requested,allow",
            "--cell",
            "kept,delete_done",
            "--tests",
            "tests/test_room_deletion.py",
            "--explore-depth",
            "-1",
            "--workers",
            "1",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    verdicts = {v["label"]: v for v in doc["mutants"]}
    # every other destination of (requested, allow) is noticed by a room-deletion test
    moved = verdicts["room_deletion (requested, allow) -> kept"]
    assert moved["status"] == "killed" and "tests/test_room_deletion.py::" in moved["by"]
    # a deletion result never reaches 'kept': the actor drops its stale task's outcome
    stale = verdicts["room_deletion (kept, delete_done) ignore -> requested"]
    assert stale["status"] == "equivalent" and stale["by"].startswith("never decided there")
    # a final state cannot be left: the spec model refuses it
    assert verdicts["room_deletion (requested, allow) -> deleted"]["status"] in (
        "killed",
        "refused",
    )
    assert "behaviour-only mutation score" in printed and "room_deletion" in printed
    assert code == (1 if any(v["status"] == "survived" for v in doc["mutants"]) else 0)


def test_a_cut_short_run_is_resumed_from_its_workers_logs(tmp_path: Path) -> None:
    from verification.mutation.run import read_logs

    log = tmp_path / "mutants-0.out.json.log"
    log.write_text(
        "job#3 killed after 2 tests, 0.4s: job (serving, shutdown) -> serving  "
        "tests/test_job.py::test_x (failed)\n"
        "job#4 survived after 9 tests, 51.0s: job (serving, shutdown) -> ignore  \n"
        "half a line\n"
    )
    assert read_logs([log]) == {
        "job#3": ("killed", "tests/test_job.py::test_x (failed)", 0.4),
        "job#4": ("survived", "", 51.0),
    }


# -- the mutants of the system between the machines --------------------------------------------


def _what_the_runtime_reads() -> tuple[object, ...]:
    """Each declaration (or delivery) where the runtime reads it."""
    import agent_runtime.runtimes.job_close as job_close
    import agent_runtime.system.job_system as job_system
    from agent_runtime._perform import Performer
    from agent_runtime.runtimes.routing import Wiring, hear_reports
    from statemachines import delivery

    watched = vars(job_system)["watched"]
    assert Wiring.__init__.__kwdefaults__ and watched.__kwdefaults__
    assert hear_reports.__kwdefaults__
    return (
        vars(job_close)["TEARDOWN"],  # run_close's steps
        vars(job_system)["RELEASE"],  # run_teardown's steps
        watched.__kwdefaults__["watches"],
        hear_reports.__kwdefaults__["reports"],
        Wiring.__init__.__kwdefaults__["links"],
        vars(delivery)["FOLLOW_ORDER"],
        *(delivery.routes_by_fact(m) for m in ("job", "avatar", "participant")),
        Performer._run_effects_now,  # an effect's links, fired after it succeeded
        delivery.FOLLOWERS,  # the order the followers hear a room fact
    )


def test_each_system_mutant_changes_what_the_runtime_reads_and_is_undone() -> None:
    from verification.mutation.system import applied, by_name, system_mutants

    mutants = system_mutants()
    names = [m.name for m in mutants]
    assert len(names) == len(set(names)) >= 12 and by_name(names[:2]) == mutants[:2]
    with pytest.raises(ValueError, match="no system mutant 'nope'"):
        by_name(["nope"])
    before = _what_the_runtime_reads()
    for m in mutants:
        with applied(m) as places:
            inside = _what_the_runtime_reads()
        after = _what_the_runtime_reads()
        changed = [i for i, (a, b) in enumerate(zip(before, inside, strict=True)) if a != b]
        assert places and changed, f"{m.name} changes nothing the runtime reads"
        # the routes by fact are built again (the cache cleared): equal, not the same
        assert all(
            a is b or (isinstance(a, dict) and a == b) for a, b in zip(before, after, strict=True)
        ), f"{m.name} not undone"


def test_a_system_mutant_runs_only_the_behaviour_tests_that_reach_what_it_changes() -> None:
    from verification.mutation.system import by_name
    from verification.mutation.system_run import DECLARATION_TESTS, selected_tests

    coverage = {
        "tests": {
            "t.py::reaches": {"outcome": "passed", "seconds": 2.0, "system": ["watch a->b.c"]},
            "t.py::fast": {"outcome": "passed", "seconds": 0.1, "system": ["watch a->b.c"]},
            "t.py::failing": {"outcome": "failed", "seconds": 0.1, "system": ["watch a->b.c"]},
            "t.py::elsewhere": {"outcome": "passed", "seconds": 0.1, "system": ["follow job"]},
            DECLARATION_TESTS[0]: {"outcome": "passed", "seconds": 0.1, "system": ["watch a"]},
        }
    }
    (m,) = by_name(["watch-removed:job->agent_job.job_closed"])
    m = dataclasses.replace(m, touches=("watch a->b.c",))
    assert selected_tests(m, coverage) == [("t.py::fast", 0.1), ("t.py::reaches", 2.0)]
    (order,) = by_name(["follow-order-reversed"])  # two followers or more
    coverage["tests"]["t.py::two"] = {
        "outcome": "passed",
        "seconds": 1.0,
        "system": ["follow job", "follow avatar"],
    }
    assert selected_tests(order, coverage) == [("t.py::two", 1.0)]


# each a system mutant and a fast behaviour test that kills it (found by `python3 dev.py
# mutation --system`; the guide's "Mutants of the system" lists every verdict)
SYSTEM_KILLS = {
    "links-before-effects": "tests/test_agent_job.py::test_a_session_close_that_hangs_still_"
    "ends_the_job",
    "teardown-avatar-before-session": "tests/test_agent_job.py::test_the_session_closes_before"
    "_the_avatar_goes_and_holds_it_at_most_its_share[closes]",
    "teardown-session-unbounded": "tests/test_agent_job.py::test_the_session_closes_before_the"
    "_avatar_goes_and_holds_it_at_most_its_share[hangs]",
    "release-followers-before-job": "tests/test_agent_job.py::test_the_session_closes_before"
    "_the_avatar_goes_and_holds_it_at_most_its_share[aborted]",
    "teardown-disconnect-no-after": "tests/test_job.py::test_a_finalize_cut_by_the_close_gets_"
    "its_error_reply_before_the_room_goes",
    "watch-removed:participant->playout.user_left": "tests/test_playout.py::test_exhausted_"
    "waits_for_the_user_whose_speech_starts_the_count_again[leaves]",
    "report-removed:avatar.segment_flushed->playout.handed_off": "tests/test_playout.py::test_a"
    "_silent_avatar_gets_the_audio_plus_the_margin_then_the_agent_listens_again",
    "report-removed:avatar.playback_finished->playout.playback_finished": "tests/test_playout.py"
    "::test_a_late_report_for_audio_finished_here_does_not_end_the_next_reply",
    "link-removed:session_host.report_session_closed->job.session_closed": "tests/test_job.py::"
    "test_ordinary_shutdown_without_simulation_does_not_hold",
    "route-removed:room_disconnected->job.room_disconnected": "tests/test_job.py::test_the_room_"
    "disconnecting_while_serving_ends_the_job_at_once",
}


def test_system_mutants_are_killed_by_their_named_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker, as a ``--system`` run starts it: each mutant in force, its test fails;
    the same test passes on the system as declared (or the kill would not count)."""
    from verification.mutation.run import _wait, _worker

    monkeypatch.chdir(ROOT)
    job = {
        "mode": "mutants",
        "system": True,
        "explore_depth": -1,
        "mutants": [
            {"key": name, "tests": [[test, 0.1]], "explore": False}
            for name, test in SYSTEM_KILLS.items()
        ],
    }
    _wait([("kills", _worker(job, tmp_path, "kills"))], tmp_path)
    results = json.loads((tmp_path / "kills.out.json").read_text())
    assert {r["key"]: (r["status"], r["by"].split(" (")[0]) for r in results} == {
        name: ("killed", test) for name, test in SYSTEM_KILLS.items()
    }


def test_the_exploration_stage_kills_a_mutant_no_test_noticed(tmp_path: Path) -> None:
    """A mutant whose tests all pass is explored on the real job with it in force, from
    the runs that decided its cell: the shutdown that skips the hold for the simulator
    breaks invariant 7 on the run that asks for the shutdown; the verdict says how to
    replay it."""
    from verification.mutation.worker import _Mutants

    label = "job (serving, shutdown) [hold_needed] -> closing"
    job = MACHINES["job"]
    m = mutant(job, label)
    judge = _Mutants({"explore_depth": 0, "out": str(tmp_path / "out.json")})
    want = {"tests": [], "explore": True, "paths": [["example", "ctx_shutdown"]]}
    result = judge.judge(m, want, lambda nodeid, budget: "passed")
    assert result["status"] == "killed", result
    assert result["by"] == (
        "exploration: example, breadth first: invariant 7 (job went serving -> closing on "
        "shutdown with the hold needed); replay: python3 dev.py explore --replay ctx_shutdown "
        "--config example"
    )
    assert MACHINES["job"] is job  # the swap was undone
    # a run that cannot happen (an input of it not enabled where it comes: the mutant may
    # change what a kept run can do) is passed over, not an error of the stage
    gone = [["example", "ctx_shutdown", "plugin_routed"], ["example", "ctx_shutdown"]]
    again = judge.judge(m, {**want, "paths": gone}, lambda n, b: "passed")
    assert again["status"] == "killed" and again["by"] == result["by"]


def test_an_exploration_kill_counts_only_if_the_run_passes_without_the_mutant() -> None:
    """The stage re-runs a violation's path on the machines as written, as a test's kill is
    re-run: a fault that is there either way (here a link the runtime does not deliver,
    in force for both runs) is not the mutant's."""
    from verification.explore.config import CONFIGS
    from verification.explore.realsearch import bfs
    from verification.mutation.explored import confirmed
    from verification.mutation.system import applied, by_name

    (m,) = by_name(["link-removed:finalize.report_answered->job.finalize_answered"])
    with applied(m):
        # from the simulator's request (a search from the start finds the same run, later)
        report = bfs(
            CONFIGS["example"],
            "example",
            inputs="job",
            depth=1,
            prefix=("finalize",),
            stop_at_first=True,
        )
        (v,) = report.violations
        assert v.invariant == 7
        assert not confirmed(v)  # it breaks there too
    assert confirmed(v)  # the system as declared runs the same path without breaking


def test_the_coverage_keeps_the_shortest_runs_that_decided_each_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from verification.mutation import explored
    from verification.mutation.explored import PATHS, reach

    # the two whose runs the assertions name (every config: several times as long, and
    # the mutation run itself reaches them all): more runs decide (serving, shutdown) in
    # one input than are kept
    monkeypatch.setattr(
        explored, "CONFIGS", {c: explored.CONFIGS[c] for c in ("example", "aclose")}
    )
    found, broke = reach(1, walks_=0)
    assert broke == []  # the machines as written break nothing on the way
    shutdown = found["job|serving|shutdown"]
    assert 1 <= len(shutdown) <= PATHS
    # one input, the shortest: either shutdown, or the user's aclose() that asks for it
    assert {path for _, path in shutdown} == {("ctx_shutdown",), ("job_shutdown",), ("aclose",)}
    # the job's start decides cells before any input: their runs are the empty path
    assert ("example", ()) in found["agent_job|new|follow_room"]
    assert "room_deletion|kept|close" not in found  # the job allows before it releases


def test_the_coverage_run_records_each_cell_with_the_runs_that_decided_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a mutant's exploration is planned from: the cells the real job's runs decided
    (with those runs) and the playout table's, as JSON the run can hand to its workers."""
    from verification.mutation import explored
    from verification.mutation.worker import _Coverage

    runs = {"job|serving|shutdown": [("example", ("ctx_shutdown",))]}
    monkeypatch.setattr(explored, "reach", lambda depth: (runs, []))
    out = _Coverage({"explore_depth": 1}).finish()["explore"]
    out = json.loads(json.dumps(out))
    assert ["job", "serving", "shutdown"] in out["cells"]
    assert any(c[0] == "playout" for c in out["cells"])  # its table's exploration
    assert out["paths"] == {"job|serving|shutdown": [["example", "ctx_shutdown"]]}
    assert out["ok"] is True and out["depth"] == 1


def test_the_session_machine_is_closed_only_by_the_release_and_claimed_after_begin() -> None:
    """The premise of the by-hand argument for the session machine's ``(closed, start)``:
    its close is posted only by ``JobSessions.release_now`` (``_close_now``), called only
    by the job runtime's release, after the host's; its start only by ``claim``, called
    only by ``JobSystem.claim_session``, which ``AgentJob`` calls only after ``begin``; a
    claim on a closed machine says what a start part the job closed under says; the
    session part attaches the session (which a closed host refuses) before it starts it."""
    sessions = importlib.import_module("agent_runtime.runtimes.sessions")
    assert {e for e, _ in _constructed("session")} == {"start", "session_closed"}
    assert inspect.getsource(sessions).count("self._close_now(") == 1
    callers = {
        p.relative_to(ROOT).as_posix(): p.read_text()
        for p in (ROOT / "agent_runtime").rglob("*.py")
        if "sessions.release_now()" in p.read_text()
    }
    # a runtime used alone releases the session machine of its own (own_sessions), which
    # nothing claims (claim_session is the job's, on the job's machine): no start meets it
    alone = {"agent_runtime/runtimes/participant.py", "agent_runtime/runtimes/playout.py"}
    assert set(callers) == {"agent_runtime/runtimes/job.py", *alone}
    for path in alone:
        text = callers[path]
        assert text.count("sessions.release_now()") == text.count("_own_sessions.release_now()")
        assert "claim" not in text
    job = importlib.import_module("agent_runtime.runtimes.job")
    release = inspect.getsource(job.JobRuntime._release_host)
    assert release.index("self.host.release()") < release.index("self.sessions.release_now()")
    claims = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "agent_runtime").rglob("*.py")
        if "sessions.claim()" in p.read_text()
    ]
    assert claims == ["agent_runtime/system/job_system.py"]
    claim = inspect.getsource(sessions.JobSessions.claim)
    assert "the job was closed before it finished starting" in claim
    system = importlib.import_module("agent_runtime.system.job_system")
    assert "the job was closed before it finished starting" in inspect.getsource(
        system.JobSystem.run_part
    )
    start_session = inspect.getsource(system.JobSystem.start_session)
    assert start_session.index("self.job.attach(") < start_session.index("self.session.start(")
    host = importlib.import_module("agent_runtime.runtimes.session_host")
    assert "no session can attach" in inspect.getsource(host.JobSessionHost.attach)
    tree = ast.parse((ROOT / "agent_runtime/system/agent_job.py").read_text())
    checked = 0
    for fn in ast.walk(tree):
        if isinstance(fn, ast.AsyncFunctionDef) and "claim_session()" in ast.unparse(fn):
            source = ast.unparse(fn)
            assert source.index("await self.system.begin(") < source.index("claim_session()")
            checked += 1
    assert checked == 2  # start() and start_session()
