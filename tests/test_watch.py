"""``agent-runtime watch``: a trace followed as it grows, on a real terminal (a pseudo-
terminal the command runs in, as in a shell), in a pipe, and on bad input.

The trace is a real one (a bundled scenario run through the scenario runner), written to
the watched file in two parts as a job would write it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_runtime.testing.runner import run_scenario
from agent_runtime.testing.scenario import load_scenario
from agent_runtime.tools.commands.watch import Watch

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"
CLI = [sys.executable, "-m", "agent_runtime.tools.cli", "watch"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
WAIT = 30.0  # real seconds: a bound on a child process's output, never a pause


@pytest.fixture(scope="module")
def trace_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    import asyncio

    path = tmp_path_factory.mktemp("watch") / "full.jsonl"
    asyncio.run(run_scenario(load_scenario(SCENARIO), trace_path=path))
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def split_at_hold(lines: list[str]) -> tuple[list[str], list[str]]:
    """Up to the job entering awaiting_finalize, and the rest."""
    n = next(i for i, ln in enumerate(lines) if '"dest": "awaiting_finalize"' in ln)
    return lines[: n + 1], lines[n + 1 :]


def state_row(frame: str, machine: str) -> str:
    rows = [ln.split() for ln in frame.splitlines() if ln.startswith(machine + " ")]
    return rows[0][1] if rows else ""


def interruptible() -> None:
    """In the child, before it runs: Ctrl-C interrupts it, as in a user's terminal. A suite
    started in the background by a shell without job control (``cmd &`` in a script) runs
    with SIGINT ignored, and a child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A child process on a pseudo-terminal of 120 x 40, its controlling terminal."""

    def __init__(self, args: list[str], cwd: Path = ROOT) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))

        def become_its_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            interruptible()

        self.proc = subprocess.Popen(
            args,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=ENV,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=become_its_terminal,
        )
        os.close(slave)
        self.output = ""

    def read_until(self, done: Callable[[str], bool]) -> str:
        deadline = time.monotonic() + WAIT
        while not done(self.output):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; the terminal shows:\n{self.output[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child has gone: the terminal is closed
                    chunk = b""
                if not chunk:
                    if not done(self.output):
                        raise AssertionError(f"the terminal closed:\n{self.output[-3000:]}")
                    break
                self.output += chunk.decode("utf-8", "replace")
        return self.output

    def frame(self) -> str:
        """The last complete screen drawn (from cursor-home to clear-below), plain text."""
        drawn = self.output.split("\x1b[H")
        complete = [f for f in drawn[1:] if "\x1b[J" in f]
        return ANSI.sub("", complete[-1]) if complete else ""

    def wait_frame(self, done: Callable[[str], bool]) -> str:
        self.read_until(lambda _: done(self.frame()))
        return self.frame()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)
        os.close(self.master)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_(args: list[str], cwd: Path = ROOT) -> Terminal:
        opened.append(Terminal(args, cwd))
        return opened[-1]

    yield open_
    for t in opened:
        t.close()


def test_on_a_terminal_the_view_is_redrawn_as_the_trace_grows_and_ctrl_c_ends_it(
    tmp_path: Path, trace_lines: list[str], terminal: Callable[..., Terminal]
) -> None:
    first, rest = split_at_hold(trace_lines)
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(first), encoding="utf-8")
    term = terminal([*CLI, str(trace), "--interval", "0.05"])

    frame = term.wait_frame(lambda f: state_row(f, "job") == "awaiting_finalize")
    assert state_row(frame, "session_host") == "detached"
    assert state_row(frame, "participant") == "closed"
    assert "serving -> awaiting_finalize  on session_closed" in frame
    assert "timeout armed" in frame and "hold_timeout" in frame

    with trace.open("a", encoding="utf-8") as fh:  # the job goes on writing
        fh.write("".join(rest))
    frame = term.wait_frame(lambda f: state_row(f, "job") == "closed")
    assert "awaiting_finalize -> closing  on finalize_answered" in frame
    assert state_row(frame, "session_host") == "closed"
    assert term.output.count("\x1b[2J") == 1  # redrawn in place, not scrolled

    os.write(term.master, b"\x03")  # Ctrl-C, through the terminal
    assert term.proc.wait(WAIT) == 0
    term.read_until(lambda out: out.endswith("\x1b[?25h\n") or out.endswith("\x1b[?25h\r\n"))
    assert "Traceback" not in term.output and "KeyboardInterrupt" not in term.output


def test_a_line_that_is_not_a_record_is_named_on_the_view_and_skipped(
    tmp_path: Path, trace_lines: list[str], terminal: Callable[..., Terminal]
) -> None:
    first, _ = split_at_hold(trace_lines)
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(first[:2]) + "{not json\n" + "".join(first[2:]), encoding="utf-8")
    term = terminal([*CLI, trace.name, "--interval", "0.05"], cwd=tmp_path)
    frame = term.wait_frame(lambda f: state_row(f, "job") == "awaiting_finalize")
    assert (  # the problem is wrapped to the terminal's width, not cut
        "job.jsonl:3: not JSON (Expecting property name enclosed in double quotes at column 2)"
        in " ".join(frame.split())
    )
    assert "line skipped" in frame
    os.write(term.master, b"\x03")
    assert term.proc.wait(WAIT) == 0
    assert "Traceback" not in term.output


def test_in_a_pipe_each_transition_is_an_appended_line(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    first, rest = split_at_hold(trace_lines)
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(first), encoding="utf-8")
    proc = subprocess.Popen(
        [*CLI, str(trace), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not any("serving -> awaiting_finalize" in ln for ln in lines):
            lines.append(proc.stdout.readline())
        with trace.open("a", encoding="utf-8") as fh:
            fh.write("".join(rest))
        while not any("closing -> closed" in ln and " job " in f" {ln} " for ln in lines):
            lines.append(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == ""
    text = "".join(lines) + out
    assert "\x1b" not in text  # plain lines, no terminal control
    job = [ln.split() for ln in text.splitlines() if " job " in f" {ln} "]
    assert [(row[2], row[4]) for row in job] == [
        ("serving", "awaiting_finalize"),
        ("awaiting_finalize", "closing"),
        ("closing", "closed"),
    ]


def test_in_a_pipe_whose_reader_left_with_nothing_new_to_write_the_follower_ends(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    """``watch trace | head -2`` on a finished trace: the pipe took every line at once,
    head left, and the follower, with nothing more to write, never heard of it: it ran on
    until the trace grew (a trial's runs, 2 of 6). It asks the pipe, as ``tail -f`` does."""
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines), encoding="utf-8")
    proc = subprocess.Popen(
        [*CLI, str(trace), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    entries, _, _ = Watch(str(trace)).poll(final=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for _ in entries:  # every line it will print: nothing more is written after them
            assert proc.stdout.readline()
        proc.stdout.close()  # the reader leaves
        assert proc.wait(timeout=WAIT) == 0
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()


def test_once_prints_the_view_and_exits(tmp_path: Path, trace_lines: list[str]) -> None:
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines), encoding="utf-8")
    done = subprocess.run(
        [*CLI, str(trace), "--once"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    assert state_row(done.stdout, "job") == "closed"
    assert state_row(done.stdout, "participant") == "closed"


def test_once_in_a_pipe_prints_whole_lines_and_the_last_record_without_its_newline(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    # lines were cut at the terminal's width (100 in a pipe), and a finished trace whose
    # last line had no newline lost that record
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines).rstrip("\n"), encoding="utf-8")
    done = subprocess.run(
        [*CLI, str(trace), "--once", "--last", "1000"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "40"},
        cwd=ROOT,
        timeout=WAIT,
    )
    assert (done.returncode, done.stderr) == (0, "")
    last = json.loads(trace_lines[-1])
    assert f"{len(trace_lines)} records, t = {last['t']:.3f}" in done.stdout
    assert "agent_job      closing -> closed  on released" in done.stdout  # past column 40


def test_once_says_a_last_line_still_being_written_is_not_shown(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    # a job writing its trace as --once reads it: the cut last line was dropped in silence,
    # the view one record short with nothing saying so
    trace = tmp_path / "job.jsonl"
    cut = trace_lines[-1][: len(trace_lines[-1]) // 2]
    trace.write_text("".join(trace_lines[:-1]) + cut, encoding="utf-8")
    done = subprocess.run(
        [*CLI, str(trace), "--once", "--last", "1000"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr
    n = len(trace_lines)
    assert done.stderr == (
        f"agent-runtime watch: {trace}:{n}: not whole yet (still being written?); not shown\n"
    )
    assert f"{n - 1} records" in done.stdout


def test_a_transition_back_into_its_own_state_is_listed(tmp_path: Path) -> None:
    # a session attached in place of another (attached -> attached, its effects
    # unsubscribe, subscribe) was not in the list: invisible in a production trace
    import asyncio

    trace = tmp_path / "attach.jsonl"
    scenario = load_scenario(ROOT / "examples" / "scenarios" / "host_attach_a_then_b.yaml")
    asyncio.run(run_scenario(scenario, trace_path=trace))
    watch = Watch(str(trace))
    watch.poll(final=True)
    lines = watch.view(last=1000, width=None)
    assert any("session_host" in ln and "attached -> attached  on attach" in ln for ln in lines)


def test_the_sample_view_in_the_docs_is_what_watch_prints(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    """The observability guide's sample listed three machines and a session host going
    from detached straight to closed: it is the view of the scenario's trace as printed."""
    page = (ROOT / "docs" / "guide" / "observability.md").read_text(encoding="utf-8")
    (sample,) = re.findall(
        r"<!-- sample: agent-runtime watch --once -->\n```\n(.*?)```", page, re.S
    )
    (tmp_path / "run.jsonl").write_text("".join(trace_lines), encoding="utf-8")
    done = subprocess.run(
        [*CLI, "run.jsonl", "--once"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "100"},  # a pipe's lines are whole whatever the width
        cwd=tmp_path,
        timeout=WAIT,
    )
    assert (done.returncode, done.stdout) == (0, sample), done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "{path}: no such file"),
        ("fifo", "{path}: not a regular file"),
        (
            '{"t": 1, "kind": "transition", "machine": "job", "instance": ""}\n',
            "{path}:1: a transition record needs 'source' and 'dest'",
        ),
        ('{"kind": "input"}\n', "{path}:1: not a trace record: no 't', 'machine', 'instance'"),
        ("[1, 2]\n", "{path}:1: a record is a JSON object, not list"),
        ('{"t": 1, "kind": "teleport", "machine": "job", "instance": ""}\n', "unknown record kind"),
        ('{"t": "soon", "kind": "input", "machine": "x", "instance": ""}\n', "field 't' must"),
        (
            '{"t": 1, "kind": "input", "machine": "x", "instance": "", "colour": 1}\n',
            "unknown field 'colour'",
        ),
        (b"\xff\xfe\n", "{path}:1: not UTF-8 text; line skipped"),
    ],
)
def test_bad_input_gets_one_line_and_no_traceback(
    tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    trace = tmp_path / "bad.jsonl"
    if isinstance(content, bytes):
        trace.write_bytes(content)
    elif content == "fifo":
        os.mkfifo(trace)  # nobody writes: reading it would block forever
    elif content is not None:
        trace.write_text(content, encoding="utf-8")
    done = subprocess.run(
        [*CLI, str(trace), "--once"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agent-runtime watch: "), done.stderr
    assert message.format(path=trace) in lines[0]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # the reported one, followed (a ValueError traceback from time.sleep)
        (["--interval", "-1"], "--interval must be above 0 and at most 3600 seconds, not -1"),
        # the others with --once, which read no interval before: each printed a view
        (["--interval", "0", "--once"], "--interval must be above 0"),
        (["--interval", "nan", "--once"], "--interval must be above 0"),
        (["--interval", "inf", "--once"], "--interval must be above 0"),
        (["--interval", "3601", "--once"], "--interval must be above 0"),
        (["--last", "-1", "--once"], "--last must be 1 or more, not -1"),
        (["--last", "0", "--once"], "--last must be 1 or more, not 0"),
    ],
    ids=[
        *("interval-negative", "interval-0", "interval-nan", "interval-inf", "interval-3601"),
        *("last-negative", "last-0"),
    ],
)
def test_an_interval_or_a_count_out_of_range_is_refused(
    tmp_path: Path,
    trace_lines: list[str],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """``--interval -1`` was a ValueError traceback; ``--last -1`` (or 0) showed "(none
    yet)" under a trace full of transitions. Each is exit 2 with one line, nothing shown."""
    from agent_runtime.tools.cli import main

    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines), encoding="utf-8")
    code = main(["watch", str(trace), *args])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    (line,) = captured.err.splitlines()
    assert line.startswith(f"agent-runtime watch: {message}")


def test_a_trace_truncated_and_written_past_its_old_end_between_polls_starts_over(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    # the next job's trace on the same path, longer than the last by the next poll: the
    # file never looked smaller, so its new start was read from the old position on
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines), encoding="utf-8")
    watch = Watch(str(trace))
    watch.poll()
    size = trace.stat().st_size
    records: list[str] = []
    t = 0.0
    while sum(len(r) for r in records) <= size:
        rec = {"t": t, "kind": "transition", "machine": "job", "instance": "next"}
        rec |= {"event": "shutdown", "source": "serving", "dest": "serving"}
        records.append(json.dumps(rec) + "\n")
        t += 1.0
    trace.write_text("".join(records), encoding="utf-8")
    entries, problems, restarted = watch.poll()
    assert restarted and problems == []
    assert len(entries) == len(records)  # every record of the new trace, from its start
    assert [(ln.machine, ln.instance) for ln in watch.lanes.lanes()] == [("job", "next")]


def test_a_truncated_trace_starts_the_view_over(tmp_path: Path, trace_lines: list[str]) -> None:
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(trace_lines), encoding="utf-8")
    watch = Watch(str(trace))
    watch.poll()
    assert {lane.machine: lane.state for lane in watch.lanes.lanes()}["job"] == "closed"
    # a new job writes the same path: the file is truncated and starts again
    record = {"t": 0.0, "kind": "transition", "machine": "job", "instance": "next"}
    record |= {"event": "shutdown", "source": "serving", "dest": "closing"}
    trace.write_text(json.dumps(record) + "\n", encoding="utf-8")
    _, _, restarted = watch.poll()
    assert restarted
    assert [(ln.machine, ln.instance, ln.state) for ln in watch.lanes.lanes()] == [
        ("job", "next", "closing")
    ]
    # a partly written line waits for its end
    with trace.open("a", encoding="utf-8") as fh:
        fh.write('{"t": 1.0, "kind": "transition", "machine": "job", ')
    entries, problems, _ = watch.poll()
    assert entries == [] and problems == []
    with trace.open("a", encoding="utf-8") as fh:
        fh.write(
            '"instance": "next", "event": "close_done", "source": "closing", "dest": "closed"}\n'
        )
    entries, problems, _ = watch.poll()
    assert [e.text for e in entries] == ["closing -> closed  on close_done"] and problems == []


def test_another_jobs_records_appended_start_the_view_over_where_the_time_goes_back(
    tmp_path: Path, trace_lines: list[str]
) -> None:
    # each of the second job's lines was skipped ("line skipped"): the view stayed on the
    # first job for as long as the second one wrote
    first, rest = split_at_hold(trace_lines)
    trace = tmp_path / "job.jsonl"
    trace.write_text("".join(first), encoding="utf-8")
    watch = Watch(str(trace))
    watch.poll()
    with trace.open("a", encoding="utf-8") as fh:  # the job goes on, then another appends
        fh.write("".join(rest) + "".join(first))
    entries, problems, restarted = watch.poll()
    n = len(trace_lines) + 1
    last = json.loads(trace_lines[-1])["t"]
    assert problems == [
        f"{trace}:{n}: time goes backwards (0.0 after {last!r} on line {n - 1}): not one "
        "clock's trace (two joined, an edited one, or runtimes with clocks of their own "
        "writing to one tracer?); the view starts over from this line"
    ]
    assert not restarted  # the file was not replaced: read on from where it was
    # the first job's end, then the second job's start
    texts = [e.text for e in entries]
    end = texts.index("closing -> closed  on close_done")
    assert texts.index("serving -> awaiting_finalize  on session_closed") > end
    states = {lane.machine: lane.state for lane in watch.lanes.lanes()}
    assert states["job"] == "awaiting_finalize" and watch.lanes.records == len(first)
