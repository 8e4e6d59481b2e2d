"""Room deletion as its own machine, through the real ``JobRuntime``: asked for by anyone,
run once the job allows it, bounded, its failure logged.

Same stand-ins as ``test_job``: an ``InMemoryRoom`` (a real ``rtc.Room`` with no server),
virtual time, and the server-side deletion injected (it needs a server): one that returns,
raises, or waits on a gate the test opens (or never does).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agent_runtime import Event
from statemachines.room_deletion import ROOM_DELETION
from statemachines.system import bound_of
from tests.support.job_rig import JobRig


class Deleter:
    """The server call: ``ok`` returns at once, ``raise`` fails, ``gate`` waits for
    ``gate`` to be set (``fail_at_gate`` then decides how it ends)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.calls: list[float] = []
        self.gate = asyncio.Event()
        self.fail_at_gate = False
        self.rig: JobRig | None = None

    async def __call__(self) -> None:
        assert self.rig is not None
        self.calls.append(self.rig.clock.now())
        if self.mode == "raise":
            raise RuntimeError("server said no")
        if self.mode == "gate":
            await self.gate.wait()
            if self.fail_at_gate:
                raise RuntimeError("server said no")


def rig_with(deleter: Deleter, **opts: Any) -> JobRig:
    rig = JobRig(simulation=None, delete_room=deleter, close_timeout=10.0, **opts)
    deleter.rig = rig
    return rig


async def hung_disconnect(**_: Any) -> None:
    """A disconnect that hangs and swallows the cut at its step's share: only the job's
    whole close bound ends it (the second cancellation, as ``closing`` is left)."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await asyncio.Event().wait()


async def slow_disconnect(**_: Any) -> None:
    await asyncio.Event().wait()  # hangs, but can be cut


def deletion_path(rig: JobRig) -> list[tuple[float, str, str, str]]:
    return [
        (r.t, r.event, r.source, r.dest)
        for r in rig.sink.records
        if r.machine == "room_deletion" and r.kind == "transition"
    ]


# -- the guarantees -------------------------------------------------------------------------


async def test_a_request_waits_for_the_job_then_runs_once() -> None:
    deleter = Deleter()
    rig = rig_with(deleter)
    rt = rig.runtime
    await rt.start()
    rt.request_room_deletion()
    rt.request_room_deletion()  # asked twice (an end-call tool and the session closing)
    await rig.clock.advance(5)
    assert deleter.calls == [] and rt.deletion.state == "requested"
    rt.shutdown("done")
    await rig.settle()
    assert deleter.calls == [5.0] and rt.room_deleted_at == 5.0
    assert rig.callbacks == [(5.0, "done")]  # the shutdown callbacks after the deletion
    assert deletion_path(rig) == [
        (0.0, "request", "kept", "requested"),
        (5.0, "allow", "requested", "deleting"),
        (5.0, "delete_done", "deleting", "deleted"),
    ]
    rt.request_room_deletion()  # once deleted, asking again changes nothing
    await rt.aclose()
    assert deleter.calls == [5.0]


async def test_the_shutdown_callbacks_wait_for_the_deletion() -> None:
    deleter = Deleter("gate")
    rig = rig_with(deleter, delete_room_on_close=True)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("done")
    at = bound_of("room", 10.0) - 0.5  # within the room step's share of close_timeout
    await rig.clock.advance(at)
    assert rt.state == "closing" and rt.deletion.state == "deleting" and rig.callbacks == []
    deleter.gate.set()
    await rig.settle()
    assert rig.callbacks == [(at, "done")] and rt.room_deleted_at == at
    assert (rt.state, rt.closed_at) == ("closed", at)
    await rt.aclose()


async def test_asked_and_allowed_again_while_it_runs_the_deletion_runs_once() -> None:
    """An end-call tool asks again, the job's room work allows again, while the server
    call is under way: it still runs once, and ends as that one call ends."""
    deleter = Deleter("gate")
    rig = rig_with(deleter, delete_room_on_close=True)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("done")
    await rig.clock.advance(3)
    assert rt.deletion.state == "deleting"
    rt.request_room_deletion()
    rt.deletion.post(Event("allow"))
    await rig.clock.advance(2)
    assert rt.deletion.state == "deleting" and deleter.calls == [0.0]
    deleter.gate.set()
    await rig.settle()
    assert rt.deletion.state == "deleted" and rt.room_deleted_at == 5.0
    assert deleter.calls == [0.0]
    await rt.aclose()


async def test_allowed_twice_then_asked_the_deletion_runs_once_at_the_ask() -> None:
    deleter = Deleter()
    rig = rig_with(deleter)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("done")  # the room work allows it; nobody asked
    await rig.settle()
    assert rt.deletion.state == "allowed"
    rt.deletion.post(Event("allow"))  # allowed again (a second path of the job's close)
    await rig.clock.advance(4)
    assert rt.deletion.state == "allowed" and deleter.calls == []
    rt.request_room_deletion()
    await rig.settle()
    assert deleter.calls == [4.0] and rt.deletion.state == "deleted"
    await rt.aclose()


async def test_a_request_after_the_room_work_runs_at_once_and_the_release_waits_for_it() -> None:
    deleter = Deleter("gate")
    rig = rig_with(deleter)
    rt = rig.runtime
    await rt.start()
    rt.shutdown("done")
    await rig.settle()
    assert rt.state == "closed" and rt.deletion.state == "allowed"
    await rig.clock.advance(2)
    rt.request_room_deletion()
    await rig.settle()
    assert deleter.calls == [2.0]
    closing = asyncio.ensure_future(rt.aclose())
    await rig.clock.advance(1)
    assert not closing.done()
    deleter.gate.set()
    await rig.settle()
    assert closing.done() and rt.room_deleted_at == 3.0
    assert rt.deletion.state == "deleted" and rt.deletion.actor.closed


async def test_a_failing_deletion_is_logged_and_the_close_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deleter = Deleter("raise")
    rig = rig_with(deleter, delete_room_on_close=True)
    rt = rig.runtime
    await rt.start()
    rt.deletion.actor.labels = {"job_id": "J", "room": "sim-room"}  # as a job labels it
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        rt.shutdown("done")
        await rig.settle()
    # the log policy: one line per failure, naming the job, the machine and the cause
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.getMessage() == (
        "job J (room sim-room), room_deletion[sim-room]: deleting the room failed: "
        "RuntimeError: server said no"
    )
    assert (line.job_id, line.machine) == ("J", "room_deletion")
    assert rt.deletion.state == "failed" and rt.room_deleted_at is None
    assert rt.state == "closed" and rig.callbacks == [(0.0, "done")]
    await rt.aclose()


@pytest.mark.parametrize("asked", [True, False])
async def test_a_hung_disconnect_is_cut_at_its_share_and_the_room_work_goes_on(
    asked: bool,
) -> None:
    deleter = Deleter()
    rig = rig_with(deleter)
    rt = rig.runtime
    rig.room.disconnect = slow_disconnect  # type: ignore[method-assign]
    await rt.start()
    if asked:
        rt.request_room_deletion()
    rt.shutdown("done")
    await rig.clock.advance(10)
    # cut at its share of close_timeout: the deletion and the callbacks still ran
    share = bound_of("disconnect", 10.0)
    assert rt.state == "closed" and rt.closed_at == share
    assert rt.deletion.state == ("deleted" if asked else "allowed")
    assert deleter.calls == ([share] if asked else [])
    assert rig.callbacks == [(share, "done")]
    await rt.aclose()


@pytest.mark.parametrize("asked", [True, False])
async def test_a_disconnect_that_swallows_its_cut_never_holds_the_room_work_back(
    asked: bool,
) -> None:
    """A disconnect that hangs and swallows the cancellation at its step's share: the cut
    step has ended all the same (the runner does not wait on it), so the room work runs at
    the disconnect's share, and the disconnect is cancelled once more as the close ends:
    it does not outlive the job's close."""
    deleter = Deleter()
    rig = rig_with(deleter)
    rt = rig.runtime
    rig.room.disconnect = hung_disconnect  # type: ignore[method-assign]
    await rt.start()
    if asked:
        rt.request_room_deletion()
    rt.shutdown("done")
    await rig.clock.advance(10)
    share = bound_of("disconnect", 10.0)
    assert rt.state == "closed" and rt.closed_at == share
    assert rt.deletion.state == ("deleted" if asked else "allowed")
    assert deleter.calls == ([share] if asked else [])
    assert rig.callbacks == [(share, "done")]
    assert not [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "hung_disconnect"]  # type: ignore[union-attr]
    await rt.aclose()


# -- every cell of the table, through the runtime -------------------------------------------

# (state, event) -> (outcome, dest); written out by hand: a changed cell fails here
WAITING = ("kept", "requested", "allowed")
FINAL = ("deleted", "failed", "abandoned", "closed")
CELLS: dict[tuple[str, str], tuple[str, str]] = {
    ("kept", "request"): ("transition", "requested"),
    ("kept", "allow"): ("transition", "allowed"),
    ("kept", "close"): ("transition", "closed"),
    ("requested", "request"): ("ignore", "requested"),
    ("requested", "allow"): ("transition", "deleting"),
    ("requested", "close"): ("transition", "abandoned"),
    ("allowed", "request"): ("transition", "deleting"),
    ("allowed", "allow"): ("ignore", "allowed"),
    ("allowed", "close"): ("transition", "closed"),
    **{
        (s, e): ("ignore", s)
        for s in WAITING
        for e in ("delete_done", "delete_failed", "delete_timeout")
    },
    ("deleting", "request"): ("ignore", "deleting"),
    ("deleting", "allow"): ("ignore", "deleting"),
    ("deleting", "delete_done"): ("transition", "deleted"),
    ("deleting", "delete_failed"): ("transition", "failed"),
    ("deleting", "delete_timeout"): ("transition", "abandoned"),
    ("deleting", "close"): ("ignore", "deleting"),
    **{(s, e): ("ignore", s) for s in FINAL for e in ROOM_DELETION.events},
}


@pytest.mark.snapshot  # pins each cell as written
def test_every_cell_of_the_spec_is_in_the_cell_table() -> None:
    assert set(CELLS) == {(s, e) for s in ROOM_DELETION.state_names for e in ROOM_DELETION.events}


async def _reach(rig: JobRig, state: str, event: str) -> None:
    """Drive the runtime into ``state`` through its public API and the world."""
    rt = rig.runtime
    await rt.start()
    if state in ("kept", "requested"):
        if state == "requested":
            rt.request_room_deletion()
    elif state in ("deleted", "failed"):
        rt.request_room_deletion()
        rt.shutdown("setup")
    else:  # the job closes and allows the deletion; asked for after that, it runs at once
        rt.shutdown("setup")
        await rig.settle()
        if state in ("deleting", "abandoned"):
            rt.request_room_deletion()
        if state == "abandoned":
            await rig.settle()
            await rig.clock.advance(10)  # the server never answers
        elif state == "closed":
            await rt.deletion.actor.send(Event("close"))  # what the release sends
    await rig.settle()


async def _cause(rig: JobRig, deleter: Deleter, state: str, event: str) -> asyncio.Future[Any]:
    """Make ``event`` reach the deletion as the world would; where nothing in the world
    sends it in this state any more, post it as a late one. Returns the release if the
    event is the release's ``close``."""
    rt = rig.runtime
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    if event == "request":
        rt.request_room_deletion()
    elif event == "allow" and state in ("kept", "requested"):
        rt.shutdown("now")  # the job's closing work allows it
    elif event == "delete_done" and state == "deleting":
        deleter.gate.set()
    elif event == "delete_failed" and state == "deleting":
        deleter.fail_at_gate = True
        deleter.gate.set()
    elif event == "delete_timeout" and state == "deleting":
        await rig.clock.advance(10)
    elif event == "close" and state in ("allowed", "deleting"):
        done = asyncio.ensure_future(rt.aclose())
    else:
        rt.deletion.actor.post(Event(event, {"late": True}))
    await rig.settle()
    return done


@pytest.mark.snapshot  # pins each cell as written
@pytest.mark.parametrize(("state", "event"), list(CELLS), ids=[f"{s}-{e}" for s, e in CELLS])
async def test_cell(state: str, event: str) -> None:
    outcome, dest = CELLS[(state, event)]
    deleter = Deleter("gate" if state == "deleting" else "ok")
    if state == "failed":
        deleter.mode = "raise"
    elif state == "abandoned":
        deleter.mode = "gate"  # never opened: cut at its bound
    rig = rig_with(deleter)
    rt = rig.runtime
    await _reach(rig, state, event)
    assert rt.deletion.state == state
    mark = len(rig.sink.records)

    release = await _cause(rig, deleter, state, event)

    recs = [
        r
        for r in rig.sink.records[mark:]
        if r.machine == "room_deletion" and r.event == event and r.kind in ("transition", "ignore")
    ]
    assert recs, f"the deletion never saw {event}"
    assert (recs[0].kind, recs[0].source, recs[0].dest) == (outcome, state, dest)
    # the server is called once the deletion is both asked for and allowed, and only once
    started = state in ("deleting", "deleted", "failed", "abandoned") or dest == "deleting"
    assert len(deleter.calls) == (1 if started else 0)
    deleter.gate.set()
    await rig.clock.advance(20)
    await release
    await rt.aclose()
    assert rt.deletion.actor.closed and rt.deletion.actor.live_tasks == 0
    assert rig.clock.pending == 0


async def test_a_runtime_s_owner_hears_first_and_one_that_raises_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A part's owner (the job that built it, given as it is built) hears each
    of its state changes before the listeners; one that raises is logged once and dropped,
    and the listeners and the machine go on (the deletion still runs). A callable is
    required."""
    from agent_runtime.runtimes.room_deletion import RoomDeletion
    from agent_runtime.testing.clock import VirtualClock

    deleted: list[str] = []

    async def delete_room() -> None:
        deleted.append("room")

    heard: list[str] = []

    def owner(change: Any) -> None:
        heard.append(f"owner {change.dest}")
        raise RuntimeError("owner broke")

    with pytest.raises(TypeError, match="owner must be callable"):
        RoomDeletion(delete_room, clock=VirtualClock(), owner="job")  # type: ignore[arg-type]
    deletion = RoomDeletion(delete_room, clock=VirtualClock(), owner=owner)
    # a part: its owner hears the machine itself, and so do the machine's own listeners
    deletion.actor.on("state_changed", lambda change: heard.append(f"listener {change.dest}"))
    deletion.request()
    await deletion.allow()
    dests = [h.split()[1] for h in heard if h.startswith("listener")]
    assert heard[:2] == [f"owner {dests[0]}", f"listener {dests[0]}"]
    assert sum(h.startswith("owner") for h in heard) == 1 and len(dests) >= 2
    assert deleted == ["room"]
    failed = [r for r in caplog.records if "owner broke" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelname == "ERROR"
    await deletion.aclose()


async def test_a_deletion_built_alone_tells_its_own_listeners() -> None:
    """With no owner (no job built it), the runtime's own ``state_changed`` listeners hear
    each change of its machine (built by a job, its owner hears the machine instead)."""
    from agent_runtime.runtimes.room_deletion import RoomDeletion
    from agent_runtime.testing.clock import VirtualClock

    async def delete_room() -> None:
        pass

    deletion = RoomDeletion(delete_room, clock=VirtualClock())
    heard: list[str] = []
    deletion.on("state_changed", lambda change: heard.append(change.dest))
    deletion.request()
    await deletion.allow()
    assert heard and heard[-1] == "deleted"


@pytest.mark.parametrize("asked", [True, False], ids=["asked", "not-asked"])
async def test_a_deletion_released_before_it_was_allowed_leaves_the_room(
    asked: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The deletion is released before the job's close work allowed it (a job whose close
    was cut before its room step, or a runtime released early): ``aclose()`` returns, no
    server call is made, the room is left as it is, and a deletion that was asked for says
    so in the log (one that nobody asked for says nothing)."""
    from agent_runtime.runtimes.room_deletion import RoomDeletion
    from agent_runtime.testing.clock import VirtualClock

    calls: list[str] = []

    async def delete_room() -> None:
        calls.append("delete")

    deletion = RoomDeletion(delete_room, clock=VirtualClock())
    heard: list[tuple[str, str]] = []
    deletion.on("state_changed", lambda change: heard.append((change.source, change.dest)))
    if asked:
        deletion.request()
    caplog.set_level(logging.WARNING, logger="agent_runtime.room_deletion")
    await asyncio.wait_for(deletion.aclose(), 5)
    assert calls == [] and deletion.deleted_at is None
    ending = ("requested", "abandoned") if asked else ("kept", "closed")
    assert heard[-1] == ending
    warned = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.room_deletion"]
    never_allowed = "room_deletion: room deletion was asked for, but the job closed before"
    assert [w.startswith(never_allowed) for w in warned] == ([True] if asked else [])
