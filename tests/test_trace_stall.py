"""A trace file that takes no more records never freezes the job.

The reader is real: a FIFO whose reader opened it and never reads (a ``tail`` paused, a
log shipper stuck). Once the pipe's buffer (64 KiB on Linux) was full, the next record's
``write()`` blocked the event loop, so every machine of the job, its voice session and
every other job on that loop stopped for as long as the reader did (for ever, here).

Each run is on virtual time in a thread of its own, joined with a bound: a run that
freezes fails the test (its reader then reads, which lets the run finish), it does not
hang the suite. A run that does not freeze returns at once.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import JsonlSink, Tracer, TraceRecord
from agent_runtime.testing.clock import run as on_virtual_time
from agent_runtime.testing.runner import run_scenario
from agent_runtime.testing.scenario import load_scenario

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no FIFOs there")

FROZEN = 10.0  # real seconds a run may take before it counts as frozen (it takes < 1)


@pytest.fixture
def stalled_fifo(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A FIFO and its reader's end: opened, never read from."""
    path = tmp_path / "trace.fifo"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        yield path, reader
    finally:
        os.close(reader)


def finishes(run: Callable[[], Any], reader: int) -> Any:
    """``run()``'s result, run in a thread; a run still blocked after ``FROZEN`` seconds
    fails the test, once the reader, reading at last, let it finish."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
    thread.start()
    thread.join(FROZEN)
    if thread.is_alive():
        while thread.is_alive():
            _drain(reader)  # the blocked write goes on, the run ends; the test fails
            thread.join(0.1)
        pytest.fail(f"the job froze on its trace file: still running after {FROZEN:g} s")
    return out[0]


def _drain(reader: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(reader, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def rejoins(tmp_path: Path, n: int) -> Path:
    """A scenario whose user drops and rejoins ``n`` times: some 1.1 KB of trace each."""
    steps = ["  - {at: 0, event: session.start}"]
    for i in range(n):
        steps.append(
            f"  - {{at: {2 * i + 1}, event: participant_disconnected, identity: user, "
            "reason: SIGNAL_CLOSE}"
        )
        steps.append(f"  - {{at: {2 * i + 2}, event: participant_connected, identity: user}}")
    steps.append(f"  - {{at: {2 * n + 10}, event: end}}")
    path = tmp_path / "rejoins.yaml"
    path.write_text(
        "name: the user drops and rejoins, again and again\n"
        "participants: [{identity: user}]\nconfig: {grace_period: 15}\nsteps:\n"
        + "\n".join(steps)
        + "\n",
        encoding="utf-8",
    )
    return path


def test_a_trace_reader_that_stops_reading_does_not_freeze_the_job(
    tmp_path: Path,
    stalled_fifo: tuple[Path, int],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some 340 KB of records, five times what the pipe holds: the job used to freeze at
    the first 64 KiB. Now it runs to its end exactly as with a regular trace file; the
    trace stops where its reader did, says so once, and the job goes on without it."""
    # the records waiting for the reader: 64 KiB here (a few MB by default)
    monkeypatch.setattr("agent_runtime.observe.trace.MAX_QUEUED", 1 << 16, raising=False)
    fifo, reader = stalled_fifo
    scenario = load_scenario(rejoins(tmp_path, 300))
    regular = tmp_path / "regular.jsonl"
    expected = on_virtual_time(run_scenario(scenario, trace_path=regular))
    assert "trace_error" not in expected

    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        result = finishes(lambda: on_virtual_time(run_scenario(scenario, trace_path=fifo)), reader)

    why = result.pop("trace_error")
    assert result == expected  # the job did all it does with a trace file that takes all
    assert "the trace file takes no more records: its reader stopped reading" in why
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert f"trace sink JsonlSink({str(fifo)!r}) failed in write (" in warning
    assert why in warning and warning.endswith("it is disabled, the machines go on without it")
    # what the reader finds when it reads again: the job's first records, in order (a
    # reader that never read again may find the last one cut)
    lines = _drain(reader).decode().split("\n")
    whole = regular.read_text(encoding="utf-8").splitlines()
    assert 0 < sum(len(line) + 1 for line in lines) < len(regular.read_bytes()) // 2
    assert lines[:-1] == whole[: len(lines) - 1]
    assert whole[len(lines) - 1].startswith(lines[-1])


def test_closing_a_trace_whose_reader_stopped_gives_up_and_says_what_was_lost(
    stalled_fifo: tuple[Path, int],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reader stops before the records waiting for it are too many to keep (the sink
    has not failed yet); the job closes: ``close()`` waits for them a bounded time (0.2 s
    here; the pipe stays full), gives up, and says how many records the file did not get."""
    monkeypatch.setattr("agent_runtime.observe.trace.CLOSE_WAIT", 0.2, raising=False)
    fifo, reader = stalled_fifo
    sink = JsonlSink(fifo)
    tracer = Tracer(sink)
    payload = {"text": "x" * 900}

    def job() -> None:
        for n in range(200):  # some 200 KB: three times what the pipe holds
            tracer.write(TraceRecord(float(n), "input", "job", "r", event="e", data=payload))
        sink.close()

    with caplog.at_level(logging.WARNING, logger="agent_runtime.trace"):
        finishes(job, reader)
    assert tracer.sinks == [sink]  # no write failed: the records were kept for the reader
    assert sink.failed is not None
    # on a loaded machine the thread may not have written even what the pipe holds
    lost = 200 - sink.written
    assert 0 < lost <= 200 and f"{lost:,} records not written" in sink.failed
    assert "its reader stopped reading" in sink.failed
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "agent_runtime.trace"]
    assert warning == f"trace sink JsonlSink({str(fifo)!r}) failed at its close ({sink.failed})"
    got = _drain(reader).decode().split("\n")
    assert [json.loads(line)["t"] for line in got[:-1]] == [float(n) for n in range(len(got) - 1)]


def test_a_trace_file_gets_every_record_in_order_by_its_close(tmp_path: Path) -> None:
    """A regular file, as a job writes it: complete and in order once the sink is
    closed, whoever reads it next (replay, record, the scenario runner)."""
    path = tmp_path / "trace.jsonl"
    sink = JsonlSink(path)
    tracer = Tracer(sink)
    for n in range(5000):
        tracer.write(TraceRecord(float(n), "transition", "job", "r", event=f"e{n}"))
    sink.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["event"] for line in lines] == [f"e{n}" for n in range(5000)]
    assert sink.written == 5000 and sink.failed is None and tracer.sinks == [sink]


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """The next file opened gets a descriptor number of 1024 or more, as in a busy worker
    (select() takes only those below 1024)."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"at most {hard} open files here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    taken: list[int] = []
    try:
        while not taken or taken[-1] < 1024:
            taken.append(os.open(os.devnull, os.O_RDONLY))
        os.close(taken.pop())  # the one at 1024 or above: the trace file's
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_trace_reader_that_reads_late_gets_every_record_in_a_busy_process(
    stalled_fifo: tuple[Path, int], high_descriptors: None
) -> None:
    """The pipe fills before its reader reads (a log shipper starting, a ``tail`` resumed):
    once it reads, it gets every record. With the file's descriptor at 1024 or above the
    writer's thread died at the first full pipe (``select()``: filedescriptor out of range,
    a traceback on stderr), and the rest of the trace was lost for a reader that did read."""
    fifo, reader = stalled_fifo
    sink = JsonlSink(fifo)
    tracer = Tracer(sink)
    for n in range(200):  # some 200 KB: three times what the pipe holds
        tracer.write(TraceRecord(float(n), "input", "job", "r", event="e", data={"x": "y" * 900}))
    assert not sink.flush(0.2)  # the pipe is full: its reader has read nothing yet
    got: list[bytes] = []

    def read_all() -> None:
        while True:
            try:
                chunk = os.read(reader, 1 << 16)
            except BlockingIOError:
                threading.Event().wait(0.001)
                continue
            if not chunk:  # the writer closed the file
                return
            got.append(chunk)

    drain = threading.Thread(target=read_all, daemon=True)
    drain.start()
    sink.close()
    drain.join(FROZEN)
    assert not drain.is_alive()
    assert sink.failed is None and sink.written == 200 and tracer.sinks == [sink]
    lines = b"".join(got).decode().splitlines()
    assert [json.loads(line)["t"] for line in lines] == [float(n) for n in range(200)]
