"""The glue between the machines is declared once, and the runtime runs on that declaration.

Guards, room conditions and links (``statemachines.glue``) are what both the runtime and the
explorer's model read; these tests pin that every spec's guards and every route's conditions
have their one definition there, that links name real effects and events, and that the
runtime's wiring posts what a link says and nothing a missing link would have.
"""

from __future__ import annotations

import pytest
from livekit.agents.types import ATTRIBUTE_SIMULATOR
from pydantic import ValidationError

from agent_runtime.actor import Event
from agent_runtime.runtimes.participant import ATTRIBUTE_PUBLISH_ON_BEHALF
from agent_runtime.runtimes.routing import Wiring
from statemachines.glue import (
    GUARDS,
    PUBLISH_ON_BEHALF,
    ROOM_CONDITIONS,
    SIMULATOR_ATTRIBUTE,
    simulators_after,
)
from statemachines.links import LINKS, Link, links_from, without
from statemachines.machines import MACHINES
from statemachines.routing import CONDITIONS


def test_every_guard_of_every_spec_has_its_one_definition() -> None:
    for name, spec in MACHINES.items():
        assert set(GUARDS.get(name, {})) == set(spec.guards), name


def test_every_route_condition_has_its_one_definition() -> None:
    assert set(ROOM_CONDITIONS) == set(CONDITIONS)


def test_the_attributes_are_livekits_own() -> None:
    assert SIMULATOR_ATTRIBUTE == ATTRIBUTE_SIMULATOR
    assert ATTRIBUTE_PUBLISH_ON_BEHALF == PUBLISH_ON_BEHALF


def test_links_name_real_effects_steps_events_and_flags() -> None:
    assert {(k.source, k.on, k.target) for k in LINKS} >= {
        ("session_host", "report_session_closed", "job"),
        ("finalize", "report_answered", "job"),
        ("participant", "report_close_timed_out", "job"),
        ("job", "run_close", "room_deletion"),
        ("session", "report_closed", "session_host"),
        ("session", "report_own_closed", "participant"),
    }
    bad = [
        ({"source": "job", "on": "explode", "target": "job", "event": "shutdown"}, "no effect"),
        ({"source": "job", "on": "run_close", "target": "job", "event": "boom"}, "no event"),
        ({"source": "robot", "on": "x", "target": "job", "event": "shutdown"}, "unknown machine"),
        (
            {"source": "job", "on": "run_close", "step": "lunch", "target": "job",
             "event": "shutdown"},
            "no step",
        ),
        (
            {"source": "finalize", "on": "send_verdict", "step": "room", "target": "job",
             "event": "shutdown"},
            "does not work in steps",
        ),
        (
            {"source": "job", "on": "run_close", "target": "job", "event": "shutdown",
             "when": ("sunny",)},
            "unknown flag",
        ),
        ({"source": "session", "on": "close", "target": "job", "event": "shutdown"}, "no effect"),
    ]  # fmt: skip
    for fields, message in bad:
        with pytest.raises(ValidationError, match=message):
            Link(**fields)


async def test_reports_name_real_machines_events_and_what_the_runtimes_emit_and_hear() -> None:
    """Each declared report is one its source's runtime emits and its target's runtime has
    a handler for (and no handler waits for a report nobody declared); a report that names
    a machine or an event that does not exist, or a state change, is refused."""
    from livekit.agents import AgentSession

    from agent_runtime.emitter import Emitter
    from agent_runtime.runtimes.avatar import AvatarLifecycle
    from agent_runtime.runtimes.playout import PlayoutTracker
    from agent_runtime.runtimes.routing import hear_reports
    from statemachines.system import REPORTS, Report, check_reports

    emits = {"avatar": AvatarLifecycle._EVENT_NAMES or frozenset()}
    for r in REPORTS:
        assert r.report in emits[r.source], r
    handlers = PlayoutTracker(AgentSession()).hearer()[1]
    assert set(handlers) == {(r.source, r.report) for r in REPORTS if r.target == "playout"}
    ok = {"source": "avatar", "report": "segment_flushed", "target": "playout"}
    bad = [
        ({**ok, "event": "flushed"}, "machine 'playout' has no event 'flushed'"),
        ({**ok, "source": "robot", "event": "handed_off"}, "unknown machine 'robot'"),
        ({**ok, "target": "robot", "event": "handed_off"}, "unknown target machine 'robot'"),
        ({**ok, "target": "avatar", "event": "close"}, "goes to another machine"),
        ({**ok, "report": "state_changed", "event": "handed_off"}, "a state change is a watch"),
    ]
    for fields, message in bad:
        with pytest.raises(ValidationError, match=message):
            Report(**fields)
    with pytest.raises(ValueError, match="declared twice"):
        check_reports((REPORTS[0], REPORTS[0]))
    # no runtime subscribes to a report by hand: the table is the one way one is heard
    from pathlib import Path

    import agent_runtime

    package = Path(agent_runtime.__file__).parent
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] in ("testing", "tools"):
            continue  # what users run beside a job, not the job
        text = path.read_text()
        for r in REPORTS:
            assert f'.on("{r.report}"' not in text, f"{path} hears {r.report} by hand"
    # a report its target's runtime has no handler for is refused, and nothing connected
    source: Emitter[str] = Emitter()
    got: list[Event] = []
    with pytest.raises(ValueError, match="the playout runtime has no handler for it"):
        hear_reports({"avatar": source}, {"playout": (got.append, {})})
    assert not source._events


def test_the_wiring_posts_exactly_the_declared_links_whose_flags_hold() -> None:
    got: list[tuple[str, str, dict[str, object]]] = []
    wiring = Wiring(flags={"delete_room_on_close": True})
    for machine in MACHINES:
        wiring.connect(machine, lambda ev, m=machine: got.append((m, ev.name, dict(ev.data))))
    wiring.fire("session_host", "report_session_closed", {"reason": "user_initiated"})
    assert got == [
        ("job", "session_closed", {"reason": "user_initiated"}),
        ("room_deletion", "request", {"reason": "user_initiated"}),
    ]
    got.clear()
    Wiring().fire("session_host", "report_session_closed")  # nobody connected: nothing
    wiring.fire("session", "report_closed", {"session": "session-2"})
    assert got == [("session_host", "session_closed", {"session": "session-2"})]
    got.clear()
    wiring.fire("session", "report_own_closed", {"session": "session-1"})
    assert [(m, e) for m, e, _ in got] == [
        ("participant", "session_closed"),
        ("avatar", "close"),
        ("playout", "close"),
    ]
    # a link left out of the table is a post that never happens
    got.clear()
    cut = Wiring(links=without(LINKS, "participant", "report_close_timed_out", "job"))
    cut.connect("job", lambda ev: got.append(("job", ev.name, {})))
    cut.fire("participant", "report_close_timed_out", {"reason": "hung"})
    assert got == []
    assert len(links_from("job", "run_close", "room")) == 2


def test_one_failing_target_does_not_keep_the_others_from_hearing() -> None:
    got: list[str] = []
    wiring = Wiring(flags={"delete_room_on_close": True})

    def broken(ev: Event) -> None:
        raise RuntimeError("a poster with a bug")

    wiring.connect("job", broken)
    wiring.connect("room_deletion", lambda ev: got.append(ev.name))
    wiring.fire("session_host", "report_session_closed")
    assert got == ["request"]


def test_the_job_follows_which_participants_carry_the_simulator_attribute() -> None:
    joined = {"fact": "participant_joined", "identity": "sim", "attributes": {"lk.simulator": "1"}}
    removed = {"fact": "attributes_changed", "identity": "sim", "attributes": {}}
    left = {"fact": "participant_left", "identity": "sim", "attributes": {}}
    s = simulators_after(frozenset(), joined)
    assert s == {"sim"}
    assert simulators_after(s, removed) == frozenset()
    assert simulators_after(s, left) == frozenset()
    assert simulators_after(s, {"fact": "room_connected"}) == s


def test_a_report_whose_handler_fails_is_logged_naming_it_and_the_others_still_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A runtime's report handler that raises is logged once, naming the handler (whose it
    was), and heard no more; the other reports still reach their target, and what
    ``hear_reports`` returns takes every listener back."""
    import logging

    from agent_runtime.emitter import Emitter
    from agent_runtime.runtimes.routing import hear_reports
    from statemachines.system import REPORTS

    calls: list[object] = []

    def segment_flushed(payload: object) -> dict[str, object]:
        calls.append(payload)
        raise RuntimeError("handler broke")

    def playback_finished(payload: object) -> dict[str, object]:
        return {"heard": payload}

    source: Emitter[str] = Emitter()
    got: list[Event] = []
    handlers = {
        ("avatar", "segment_flushed"): segment_flushed,
        ("avatar", "playback_finished"): playback_finished,
    }
    unhear = hear_reports({"avatar": source}, {"playout": (got.append, handlers)})
    with caplog.at_level(logging.ERROR):
        source.emit("segment_flushed", "first")
        source.emit("segment_flushed", "second")
        source.emit("playback_finished", "report")
    assert calls == ["first"]  # removed at its failure
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failed) == 1
    assert getattr(failed[0], "listener", None) == segment_flushed.__qualname__
    assert "segment_flushed listener failed (RuntimeError: handler broke)" in failed[0].message
    event = next(r.event for r in REPORTS if r.report == "playback_finished")
    assert [(e.name, dict(e.data)) for e in got] == [(event, {"heard": "report"})]
    unhear()
    assert not source._events
