"""Every (state, event) cell of the avatar spec, exercised through the actor.

Effects are recorders and guards are set per case, so each cell is checked for exactly
what the table says: the destination, the effects run in order, the trace record, the
state tasks running afterwards (a state's ``invoke`` runs while it lasts and is cancelled
when it is left), and for a reject the error to the sender with nothing changed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_runtime import Actor, Event, EventRejected, MemorySink, Tracer
from agent_runtime.runtimes.avatar import AvatarLifecycle
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.scripted_avatar import ScriptedAvatar
from statemachines.avatar import AVATAR

# a hand-written case per cell: any cell change fails here by construction
pytestmark = pytest.mark.snapshot

# how to reach each state from idle, with the guard values that path needs
_ROUTING = [("start", {}), ("plugin_started", {})]
_JOINED = [*_ROUTING, ("avatar_connected", {"has_video": True})]
_FAILED = [*_ROUTING, ("join_timeout", {})]
_BACKOFF = [*_FAILED, ("route_restored", {"retry_left": True})]
PATHS: dict[str, list[tuple[str, dict[str, bool]]]] = {
    "idle": [],
    "starting": [("start", {})],
    "routing": _ROUTING,
    "joined": _JOINED,
    "clearing": [*_JOINED, ("interrupt", {"clear_pending": True})],
    "failed": _FAILED,
    "backoff": _BACKOFF,
    "releasing": [*_BACKOFF, ("backoff_elapsed", {})],
    "retiring": [*_FAILED, ("route_restored", {})],
    "restored": [*_FAILED, ("route_restored", {}), ("released", {})],
    "closed": [("close", {})],
}
INVOKED = {name for st in AVATAR.states for name in st.invoke}


def _cases() -> list[Any]:
    cases = []
    for state in AVATAR.state_names:
        for event in AVATAR.events:
            kind = AVATAR.cell_kind(state, event)
            if kind != "transition":
                cases.append(pytest.param(state, event, kind, None, id=f"{state}-{event}-{kind}"))
                continue
            rows = [r for r in AVATAR.rows if r.source == state and r.event == event]
            for i, r in enumerate(rows):
                guards = {g: False for earlier in rows[:i] for g in earlier.guards}
                guards.update({g: True for g in r.guards})
                cases.append(
                    pytest.param(state, event, kind, (r, guards), id=f"{state}-{event}-row{i}")
                )
    return cases


class Recorder:
    def __init__(self) -> None:
        self.clock = VirtualClock()
        self.sink = MemorySink()
        self.ran: list[str] = []
        self.tasks: list[str] = []
        self.guards: dict[str, bool] = {}

        def effect(name: str) -> Any:
            def run(ev: Event) -> None:
                self.ran.append(name)  # no follow-up event: every state holds still

            return run

        def task(name: str) -> Any:
            async def run(ev: Event) -> None:
                self.tasks.append(name)
                await asyncio.Event().wait()  # runs for as long as its state

            return run

        self.actor = Actor(
            AVATAR,
            instance="cells",
            effects={
                e.name: task(e.name) if e.name in INVOKED else effect(e.name)
                for e in AVATAR.effects
            },
            guards={g: (lambda _ev, g=g: self.guards.get(g, False)) for g in AVATAR.guards},
            clock=self.clock,
            tracer=Tracer(self.sink),
        )

    async def drive(self, state: str) -> None:
        for event, guards in PATHS[state]:
            self.guards = dict(guards)
            await self.actor.send(Event(event))
        assert self.actor.state == state
        await asyncio.sleep(0)  # the state's own task starts
        self.ran.clear()
        self.tasks.clear()
        self.sink.records.clear()

    async def running(self) -> list[str]:
        """The state tasks alive now: what the current state invokes, nothing else."""
        await asyncio.sleep(0)
        assert self.actor.live_tasks == len(AVATAR.state(self.actor.state).invoke)
        return list(self.tasks)


def test_every_cell_has_a_case() -> None:
    ids = {(p.values[0], p.values[1]) for p in _cases()}
    assert ids == {(s, e) for s in AVATAR.state_names for e in AVATAR.events}
    assert len(AVATAR.state_names) * len(AVATAR.events) == 11 * 18


@pytest.mark.parametrize(("state", "event", "kind", "row"), _cases())
async def test_cell(state: str, event: str, kind: str, row: Any) -> None:
    rec = Recorder()
    await rec.drive(state)
    if kind == "reject":
        with pytest.raises(EventRejected, match=f"rejects event '{event}' in state '{state}'"):
            await rec.actor.send(Event(event))
        assert rec.actor.state == state and rec.ran == []
        assert [r.kind for r in rec.sink.records] == ["reject"]
        rec.actor.post(Event(event))  # fire and forget never raises
        await rec.actor.join()
        assert await rec.running() == []  # the state's task was left alone
        return
    if kind == "ignore":
        step = await rec.actor.send(Event(event))
        assert step.outcome == "ignore"
        assert rec.actor.state == state and rec.ran == []
        assert [r.kind for r in rec.sink.records] == ["ignore"]
        assert await rec.running() == []
        return
    r, guards = row
    rec.guards = guards
    step = await rec.actor.send(Event(event))
    assert step.outcome == "transition"
    assert rec.actor.state == (r.dest or state)
    assert rec.ran == list(r.effects)
    trans = [x for x in rec.sink.records if x.kind == "transition"]
    assert len(trans) == 1 and trans[0].dest == (r.dest or state)
    assert {g: trans[0].guards[g] for g in r.guards} == {g: True for g in r.guards}
    # a state entered starts its task; one left has its task cancelled; an internal row
    # leaves the state's task running, not started again; a self-transition leaves and
    # enters again: its task cancelled and started anew
    entered = r.dest is not None
    assert await rec.running() == (list(AVATAR.state(r.dest).invoke) if entered else [])
    await rec.actor.aclose()


def test_lifecycle_handles_every_effect_and_guard_of_the_spec() -> None:
    lc = AvatarLifecycle(ScriptedAvatar())  # the actor refuses a missing handler
    assert set(lc.actor._effects) == {e.name for e in AVATAR.effects}
    assert set(lc.actor._guards) == set(AVATAR.guards)


def test_decisions_the_issue_asks_for() -> None:
    from statemachines import step

    # the plugin's start is a task of starting, bounded like the join
    starting = AVATAR.state("starting")
    assert starting.invoke == ("start_plugin",)
    assert starting.timeout is not None and starting.timeout.setting == "join_timeout"
    assert step(AVATAR, "idle", "start").dest == "starting"
    assert step(AVATAR, "starting", "plugin_started").dest == "routing"
    # joined needs the participant and its video, in either order
    assert step(AVATAR, "routing", "avatar_connected", {"has_video": True}).dest == "joined"
    assert step(AVATAR, "routing", "video_published", {"avatar_present": True}).dest == "joined"
    # every failure restores (a start cut short records its route first), and failed always
    # ends in restored (through retiring unless the attempt is kept for a rejoin)
    for s, ev in (
        ("routing", "join_timeout"),
        ("starting", "start_error"),
        ("routing", "start_error"),
    ):
        assert step(AVATAR, s, ev).effects == ("restore_route",)
    assert step(AVATAR, "starting", "start_timeout").effects == ("record_route", "restore_route")
    for s in ("routing", "joined", "clearing"):
        assert step(AVATAR, s, "avatar_left").dest == "failed"
    assert step(AVATAR, "failed", "route_restored", {"rejoin": True}).dest == "restored"
    assert step(AVATAR, "failed", "route_restored").dest == "retiring"
    # a start that returns with no route in fails at once, not after join_timeout
    assert step(AVATAR, "starting", "no_route").dest == "failed"
    assert step(AVATAR, "starting", "no_route").effects == ("restore_route",)
    # the plugin's own clear: clearing follows it while it holds the sink, then joined
    assert AVATAR.state("clearing").invoke == ("follow_plugin_clear",)
    assert step(AVATAR, "clearing", "clear_buffer_done").dest == "joined"
    for s in AVATAR.state_names:
        st = step(AVATAR, s, "interrupt", {"clear_pending": True, "delivered": True})
        assert (st.changed and st.dest == "clearing") is (s == "joined")
    assert step(AVATAR, "clearing", "interrupt").outcome == "ignore"
    held_nothing = step(AVATAR, "joined", "interrupt", {"delivered": True})
    assert (held_nothing.dest, held_nothing.effects) == ("joined", ())
    # everywhere else (and an interrupt asked before the join was seen): locally, no RPC
    for s in ("idle", "starting", "routing", "joined", "failed", "backoff", "releasing"):
        assert step(AVATAR, s, "interrupt").effects == ("clear_local_buffer",)
    assert step(AVATAR, "retiring", "interrupt").effects == ("clear_local_buffer",)
    assert step(AVATAR, "restored", "interrupt").effects == ("clear_local_buffer",)
    # retry: a transient cause with attempts left waits in backoff (on room audio, the
    # route restored on the way), then releases the attempt in a state of its own (bounded
    # by a join_timeout of its own, so the next start gets its whole join_timeout) and
    # starts the plugin again, whether the release ended or was cut
    assert step(AVATAR, "failed", "route_restored", {"retry_left": True}).dest == "backoff"
    backoff = AVATAR.state("backoff")
    assert backoff.timeout is not None and backoff.timeout.event == "backoff_elapsed"
    again = step(AVATAR, "backoff", "backoff_elapsed")
    assert (again.dest, again.effects) == ("releasing", ())
    releasing = AVATAR.state("releasing")
    assert releasing.invoke == ("release_attempt",)
    assert releasing.timeout is not None
    assert (releasing.timeout.event, releasing.timeout.setting) == (
        "release_timeout",
        "join_timeout",
    )
    for ended in ("released", "release_timeout"):
        assert (
            step(AVATAR, "releasing", ended).dest,
            step(AVATAR, "releasing", ended).effects,
        ) == (
            "starting",
            (),
        )
    # given up for good with no rejoin: the attempt is closed (its plugin session and sink,
    # its participant removed) in a state of its own, bounded as a retry's release, and
    # the machine rests in restored however that close ended
    retiring = AVATAR.state("retiring")
    assert retiring.invoke == ("retire_attempt",)
    assert retiring.timeout is not None
    assert (retiring.timeout.event, retiring.timeout.setting) == ("release_timeout", "join_timeout")
    assert AVATAR.effect("retire_attempt").error_event == "released"
    for ended in ("released", "release_timeout"):
        assert (step(AVATAR, "retiring", ended).dest, step(AVATAR, "retiring", ended).effects) == (
            "restored",
            ("look_for_late_avatar",),  # one that joined while the close ran is retired too
        )
    # a late join while waiting or after giving up: routed again with rejoin; without it,
    # ignored while waiting (the next release removes it), retired after giving up; while
    # retiring it does not cut the close under way (restored looks for it on entry)
    for s in ("backoff", "restored"):
        back = step(AVATAR, s, "avatar_connected", {"rejoin": True})
        assert (back.dest, back.effects) == ("routing", ("reinstall_route",))
    late = step(AVATAR, "backoff", "avatar_connected", {"rejoin": False})
    assert (late.dest, late.effects, late.changed) == ("backoff", (), False)
    late = step(AVATAR, "restored", "avatar_connected", {"rejoin": False})
    assert (late.dest, late.effects, late.changed) == ("retiring", (), True)
    assert step(AVATAR, "retiring", "avatar_connected", {"rejoin": False}).outcome == "ignore"
    # close from every live state, undoing what that state says is there
    plugin = ("put_route_back", "unhook", "close_plugin")
    closes = {
        "idle": ("unhook",),
        "starting": ("record_route", *plugin),
        "routing": plugin,
        "joined": plugin,
        "clearing": plugin,
        "failed": ("unhook", "close_plugin"),
        "backoff": ("unhook", "close_plugin"),
        "releasing": ("unhook", "close_plugin"),
        "retiring": ("unhook", "close_plugin"),
        "restored": ("unhook", "close_plugin"),
    }
    for s, effects in closes.items():
        assert (step(AVATAR, s, "close").dest, step(AVATAR, s, "close").effects) == (
            "closed",
            effects,
        )
