"""The trace is observation: a sink that fails never changes what a machine does, and a
record never keeps more of a payload than a bound.

The full disk is real: ``/dev/full`` opens for writing and fails every flush with ENOSPC.
The job runs in the in-memory room on virtual time (only the network is stood in for).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from livekit.agents import Agent, AgentSession

from agent_runtime import Actor, AgentJob, Event, JsonlSink, MemorySink, Tracer, TraceRecord
from agent_runtime.observe.trace import MAX_PAYLOAD
from agent_runtime.runtimes.job import JobRuntime
from agent_runtime.testing.clock import VirtualClock
from agent_runtime.testing.inmemory import InMemoryRoom
from tests.test_actor import LAMP, Harness

FULL_DISK = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL_DISK.exists(), reason="no /dev/full here")


class Broken:
    """A sink that fails every write, as a disk does when it is full."""

    def __init__(self) -> None:
        self.calls = 0

    def write(self, record: TraceRecord) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")


async def _job_path(tracer: Tracer | None, trace_path: Path | None) -> list[Any]:
    """Shut a job down; what a user sees of it: its states over time, its close work."""
    clock = VirtualClock()
    room = InMemoryRoom(name="r", clock=clock)
    room.connect_locally()
    seen: list[Any] = []
    runtime = JobRuntime(
        room=room,
        clock=clock,
        tracer=tracer,
        trace_path=trace_path,
        close_timeout=0.5,
        delete_room=_no_deletion,
    )

    async def callback() -> None:
        seen.append(("shutdown callback", clock.now()))

    runtime.add_shutdown_callback(callback)
    runtime.on("state_changed", lambda c: seen.append((c.machine, c.dest, clock.now())))
    await runtime.start()
    runtime.shutdown("done")
    await clock.advance(0)
    # bounded: a job stuck in closing would fail here, not hang the suite
    await asyncio.wait_for(runtime.wait_closed(), 5)
    await asyncio.wait_for(runtime.aclose(), 5)
    seen.append(("final", runtime.state, runtime.host_state, runtime.closed_at))
    return seen


async def _no_deletion() -> None:
    return None


@needs_dev_full
async def test_a_full_disk_does_not_stop_the_job(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 13 item 1: with ``trace_path="/dev/full"`` the job stayed in ``closing``
    forever and ``aclose()`` never returned; now it closes exactly as without a trace, and
    the failure is logged once."""
    without = await _job_path(None, None)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        full = await _job_path(None, FULL_DISK)
    assert full == without
    assert full[-1] == ("final", "closed", "closed", 0.0)
    warnings = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"trace sink JsonlSink({str(FULL_DISK)!r}) failed")
    # from the next record's write, or from the close if the job wrote none after it
    assert "No space left on device" in warnings[0]


@pytest.mark.parametrize("where", ["fifo-without-reader", "sysfs"])
async def test_a_trace_file_the_disk_will_not_open_does_not_stop_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """A trace file the system refuses to open (a FIFO nobody reads, ENXIO; a filesystem
    that takes no new file, EACCES even as root) refused the job: its user was never
    served. A disk fault at the open is what a full disk mid-job is: one WARNING, the job
    as without a trace file (a path no file can be at is still refused: test_faults)."""
    if where == "fifo-without-reader":
        path = tmp_path / "trace.fifo"
        os.mkfifo(path)
    else:
        path = Path("/sys/agent-runtime-trace.jsonl")
        if not Path("/sys").is_dir():
            pytest.skip("no /sys here")
    without = await _job_path(None, None)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        faulty = await _job_path(None, path)
    assert faulty == without
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert warning.startswith(f"trace_path: cannot write the trace to {str(path)!r} (")
    assert warning.endswith("): this job writes no trace file")


async def test_a_trace_file_without_a_thread_to_write_it_does_not_stop_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trace file's writer is a thread: a process at its limit of threads (a
    container's pids limit) refuses it, and the job failed to build (``RuntimeError: can't
    start new thread``). Like a disk that will not open the file: one WARNING, the job as
    without a trace file."""
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        if thread.name.startswith("trace writer"):
            raise RuntimeError("can't start new thread")
        start(thread)

    without = await _job_path(None, None)
    monkeypatch.setattr(threading.Thread, "start", refused)
    path = tmp_path / "trace.jsonl"
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        faulty = await _job_path(None, path)
    assert faulty == without
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert warning == (
        f"trace_path: cannot write the trace to {str(path)!r} (no thread to write it: "
        "can't start new thread): this job writes no trace file"
    )


async def test_a_failing_sink_changes_nothing_the_actor_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Entering the state (its timer, its task) and the effects happen as without a tracer;
    the other sinks keep every record; the broken one is asked once and then left alone."""
    plain, broken = Harness(), Harness()
    bad, kept = Broken(), MemorySink()
    broken.actor.tracer = Tracer(bad, kept)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        for h in (plain, broken):
            h.actor.post(Event("press"))
            await h.actor.join()
            await asyncio.sleep(0)  # the state's task starts
    assert broken.log == plain.log == ["glow in on", "fuse in on", "log note {'from': 'glow'}"]
    assert broken.actor.state == "on" and broken.actor.timer_armed
    assert broken.hum_started.is_set() and broken.actor.live_tasks == 1
    await broken.clock.advance(10)  # the state timeout was armed despite the failure
    await broken.actor.join()
    assert broken.actor.state == "off"
    assert [(r.kind, r.event) for r in kept.records] == [
        (r.kind, r.event) for r in plain.sink.records
    ] + [("transition", "tick")]
    assert bad.calls == 1
    assert len([r for r in caplog.records if r.name == "agent_runtime.trace"]) == 1
    for h in (plain, broken):
        await h.actor.aclose()


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_ctrl_c_while_a_sink_writes_is_not_the_sink_s_failure(error: type[BaseException]) -> None:
    """A Ctrl-C landing in a write ends the program; it no longer disables the sink (and
    goes unheard) as a disk error does."""

    class Interrupted(MemorySink):
        def write(self, record: TraceRecord) -> None:
            raise error

    sink = Interrupted()
    tracer = Tracer(sink)
    record = TraceRecord(t=0.0, kind="transition", machine="job", instance="j", event="x")
    with pytest.raises(error):
        tracer.write(record)
    assert tracer.sinks == [sink]


async def test_a_tracer_that_raises_does_not_skip_the_step() -> None:
    """The actor's own guard: even a tracer of someone else's making that raises cannot
    cut a transition short."""

    class Raises(Tracer):
        def write(self, record: TraceRecord) -> None:
            raise RuntimeError("tracer bug")

    h = Harness()
    h.actor.tracer = Raises()
    h.actor.post(Event("press"))
    await h.actor.join()
    assert h.actor.state == "on" and h.actor.timer_armed
    assert h.log == ["glow in on", "fuse in on", "log note {'from': 'glow'}"]
    await h.actor.aclose()


@needs_dev_full
def test_jsonl_sink_on_a_full_disk_disables_itself() -> None:
    sink = JsonlSink(FULL_DISK)
    tracer = Tracer(sink)
    tracer.write(TraceRecord(0.0, "transition", "job", "j", event="shutdown"))
    assert not sink.flush()  # the sink's thread has tried to write it, and failed
    tracer.write(TraceRecord(1.0, "transition", "job", "j", event="close_done"))
    assert sink.failed is not None and "No space left on device" in sink.failed
    assert tracer.failures == [f"JsonlSink({str(FULL_DISK)!r}): {sink.failed}"]
    sink.close()  # closing a sink whose last write failed does not raise either


@needs_dev_full
def test_flush_says_the_records_did_not_reach_a_full_disk() -> None:
    """``flush()`` is how a program makes sure its records are in the file: it said they
    were (True) when the disk refused them, open or closed, while ``failed`` said nothing
    until the next record."""
    sink = JsonlSink(FULL_DISK)
    sink.write(TraceRecord(0.0, "transition", "job", "j", event="shutdown"))
    assert not sink.flush()
    sink.close()
    assert not sink.flush() and sink.failed is not None


def test_flush_says_the_records_reached_the_file(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "trace.jsonl")
    sink.write(TraceRecord(0.0, "transition", "job", "j", event="shutdown"))
    assert sink.flush()
    assert (tmp_path / "trace.jsonl").read_text().count("\n") == 1
    sink.close()
    assert sink.flush() and sink.failed is None


@needs_dev_full
def test_a_full_disk_found_at_the_close_is_logged_by_the_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sink's thread finds the disk full with the job's last record: no record comes
    after it to carry the error to the tracer; ``close()`` logs it, once."""
    sink = JsonlSink(FULL_DISK)
    tracer = Tracer(sink)
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        tracer.write(TraceRecord(0.0, "transition", "job", "j", event="close_done"))
        sink.close()
        sink.close()
    assert sink.failed == "OSError: [Errno 28] No space left on device: 1 record not written"
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert (
        warning == f"trace sink JsonlSink({str(FULL_DISK)!r}) failed at its close ({sink.failed})"
    )
    assert tracer.sinks == [sink] and sink.written == 0


# -- what a record keeps of a payload ---------------------------------------------------------


def test_a_record_keeps_a_bounded_part_of_a_huge_payload() -> None:
    """Issue 13 item 9: a 50 MB ``provisional_reason`` was copied whole into one record."""
    huge = "x" * 50_000_000
    sink = MemorySink()
    Tracer(sink).write(
        TraceRecord(
            0.0,
            "transition",
            "session_host",
            "j",
            event="finalize",
            data={"provisional_reason": huge, "nested": {"list": [huge] * 3}},
            detail=huge,
        )
    )
    (rec,) = sink.records
    size = len(json.dumps(rec.to_dict()))
    assert size < MAX_PAYLOAD + 1000, size
    reason = rec.data["provisional_reason"]
    assert reason.startswith("x" * 100) and reason.endswith("[49,999,000 more characters]")
    assert rec.detail.startswith("x" * 100) and rec.detail.endswith("more characters]")
    kept = rec.data["nested"]["list"]
    assert kept[0].endswith("more characters]") and kept[-1] == "...[1 more items]"


def test_a_record_keeps_a_bounded_part_of_a_deep_or_wide_payload() -> None:
    deep: Any = "bottom"
    for _ in range(10_000):
        deep = [deep]
    wide = {f"k{i}": i for i in range(100_000)}
    sink = MemorySink()
    Tracer(sink).write(TraceRecord(0.0, "input", "scenario", "s", data={"d": deep, "w": wide}))
    (rec,) = sink.records
    assert len(json.dumps(rec.to_dict())) < MAX_PAYLOAD + 1000
    assert len(rec.data["w"]) <= 101


async def test_the_finalize_reason_in_the_trace_is_bounded() -> None:
    """End to end: a finalize whose reason is 5 MB leaves a record of a few KiB."""
    from tests.support.job_rig import JobRig

    rig = JobRig()
    await rig.runtime.start()
    remote = await rig.remote()
    reason = "r" * 5_000_000
    await asyncio.wait_for(
        remote.finalize_simulation(provisional_success=True, provisional_reason=reason), 5
    )
    await rig.settle()
    biggest = max(len(json.dumps(r.to_dict())) for r in rig.sink.records)
    assert biggest < MAX_PAYLOAD + 1000
    await remote.aclose()
    await rig.runtime.aclose()


def test_actor_records_are_bounded_where_they_are_written() -> None:
    """The bound is in the tracer, not at call sites: an actor's record of an event whose
    data is huge is bounded too."""
    sink = MemorySink()
    actor = Actor(
        LAMP,
        effects={n: (lambda ev: None) for n in ("glow", "fuse", "hum", "log")},
        guards={"armed": lambda ev: True},
        tracer=Tracer(sink),
        clock=VirtualClock(),
    )

    async def run() -> None:
        await actor.send(Event("note", {"blob": "b" * 1_000_000}))
        await actor.aclose()

    asyncio.run(run())
    assert all(len(json.dumps(r.to_dict())) < MAX_PAYLOAD + 1000 for r in sink.records)


# -- reading a trace back ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "nested", "huge-int", "not-a-record"])
def test_read_trace_refuses_what_is_no_trace_at_once(tmp_path: Path, kind: str) -> None:
    """Issue 13 item 5: a FIFO hung ``read_trace``, ``/dev/zero`` grew until memory ran
    out, deep nesting and long integers raised out of it. Each is a ``ValueError`` naming
    the file (and the line)."""
    import os

    from agent_runtime import read_trace

    path = tmp_path / "t.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
        why = f"{path}: cannot read the trace: a FIFO, not a regular file"
    elif kind == "dev-zero":
        path = Path("/dev/zero")
        why = f"{path}: cannot read the trace: a character device, not a regular file"
    elif kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
        why = f"{path}:1: not a trace record (nested too deep)"
    elif kind == "huge-int":
        path.write_text('{"t": 1' + "0" * 5000 + "}\n")
        why = f"{path}:1: not a trace record (a number of more than 4300 digits)"
    else:
        path.write_text('{"t": 0, "kind": "transition"}\n')
        why = f"{path}:1: not a trace record"
    with pytest.raises(ValueError) as err:
        read_trace(path)
    assert str(err.value).startswith(why)


def test_a_small_payload_is_kept_as_it_is() -> None:
    """The bound changes nothing a record of ordinary size holds (enums stay enums)."""
    from livekit.agents import CloseReason

    data = {
        "reason": CloseReason.PARTICIPANT_DISCONNECTED,
        "identity": "u",
        "attributes": {"lk.simulator": "1"},
        "n": 3,
        "ok": True,
        "at": 1.5,
        "none": None,
        "kinds": ("sip", "standard"),
    }
    sink = MemorySink()
    Tracer(sink).write(TraceRecord(0.0, "input", "scenario", "s", data=dict(data)))
    (rec,) = sink.records
    assert rec.data == data
    assert rec.data["reason"] is CloseReason.PARTICIPANT_DISCONNECTED


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Tracer("trace.jsonl"), "Tracer takes sinks .* not 'trace.jsonl'"),  # type: ignore[arg-type]
        (lambda: JsonlSink(5), r"JsonlSink takes a file path \(str or Path\), not 5"),  # type: ignore[arg-type]
    ],
    ids=["a path given as a sink", "a number given as a path"],
)
def test_a_tracer_or_sink_built_from_the_wrong_thing_says_so(
    build: Callable[[], object], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Tracer("trace.jsonl")`` was accepted and every record then disabled it with an
    AttributeError; ``JsonlSink(5)`` failed with Python's own "expected str, bytes or
    os.PathLike object, not int". Each names what it takes, and writes nothing."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=message):
        build()
    assert list(tmp_path.iterdir()) == []


async def test_a_trace_file_another_job_writes_is_left_to_it_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # one trace_path for every job (no {job_id} in it): the second job's open truncated the
    # file the first was still writing, both wrote on at their own offsets, and the first
    # job's trace was gone, without a word
    from livekit.agents import AgentSession

    from agent_runtime import AgentJob

    path = tmp_path / "agent.jsonl"
    clock = VirtualClock()
    rooms = [InMemoryRoom(name=n, clock=clock) for n in ("a", "b")]
    first = AgentJob(room=rooms[0], session=AgentSession(), trace_path=path, clock=clock)
    await first.start_runtime()
    with caplog.at_level(logging.WARNING, logger="agent_runtime"):
        second = AgentJob(room=rooms[1], session=AgentSession(), trace_path=path, clock=clock)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning == (
        f"trace_path: {str(path)!r} is being written by another job's trace: this job "
        "writes no trace file (put {job_id} in trace_path for one file a job)"
    )
    await second.start_runtime()
    await second.aclose(graceful=False)
    await first.aclose(graceful=False)
    # the first job's trace, whole from its first record (a truncation left NULs before
    # the records written after it), and nothing of the second's
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["t"] == 0.0 and records[-1]["dest"] == "closed"
    assert {r["instance"] for r in records} == {"a"}


@pytest.mark.skipif(sys.platform == "win32", reason="no advisory locks there")
def test_a_trace_file_on_a_filesystem_without_locks_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that refuses locks (some NFS mounts: ENOLCK) cannot say whether another
    trace writes the file: it is written as it was before locks were taken, not dropped.
    No such mount here: the lock's refusal is injected (fcntl.flock), the file is real."""
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    path = tmp_path / "trace.jsonl"
    path.write_text("an older job's line\n")
    sink = JsonlSink(path)
    sink.write(TraceRecord(t=0.0, kind="transition", machine="job", instance="r", event="start"))
    sink.close()
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["event"] == "start" and sink.failed is None


class _FailsWhenTold:
    """A sink that works until told to fail, as a disk fills up mid-job."""

    def __init__(self) -> None:
        self.fail = False

    def write(self, record: TraceRecord) -> None:
        if self.fail:
            raise OSError(5, "Input/output error")


@pytest.mark.parametrize("jobs", [1, 2])
async def test_a_tracer_shared_by_jobs_does_not_blame_the_last_one_built(
    caplog: pytest.LogCaptureFixture, jobs: int
) -> None:
    """A worker handing one ``Tracer`` to each of its jobs: the sink's failure was logged
    as the last job built's (its room named), whichever job's record failed and though
    the sink is gone for all of them. Alone, the job is named; shared, none is, and the
    line says every job sharing it lost the sink."""
    clock = VirtualClock()
    sink = _FailsWhenTold()
    tracer = Tracer(sink)
    built = []
    for name in ["first", "second"][:jobs]:
        room = InMemoryRoom(name=name, clock=clock)
        room.connect_locally()
        built.append(
            AgentJob(room=room, session=AgentSession(), clock=clock, tracer=tracer, otel=False)
        )
    sink.fail = True
    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        await built[0].start(Agent(instructions="agent"))  # the first job's record fails
    for job in built:
        await asyncio.wait_for(job.aclose(), 5)
    warnings = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert len(warnings) == 1, warnings
    if jobs == 1:
        assert warnings[0].startswith("room first: trace sink")
        assert "sharing" not in warnings[0]
    else:
        assert "room second" not in warnings[0]
        assert warnings[0].startswith("trace sink")
        assert "disabled for every job sharing its tracer" in warnings[0]
