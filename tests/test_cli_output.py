"""What every command does when its output cannot go where it was sent: stdout's reader
gone (``| head``), a full stdout, Ctrl-C, an ``--out`` that cannot be a directory, an output
file that is one of the inputs. Each is one line on stderr (or nothing, for a pipe whose
reader left) and an exit code, never a traceback, and no input file is changed."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent_runtime.tools.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"
CLI = [sys.executable, "-m", "agent_runtime.tools.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
FULL = Path("/dev/full")
WAIT = 120


def _closed_pipe() -> int:
    """The write end of a pipe whose reader has already gone."""
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.parametrize(
    "argv",
    [["table", "avatar"], ["export", "xstate", "avatar"], ["simulate", str(SCENARIO)]],
    ids=["table", "export", "simulate"],
)
def test_a_reader_that_left_stops_the_command_quietly(argv: list[str]) -> None:
    write = _closed_pipe()
    try:
        done = subprocess.run(
            [*CLI, *argv], stdout=write, stderr=subprocess.PIPE, env=ENV, cwd=ROOT, timeout=WAIT
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (141, "")


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")
@pytest.mark.parametrize(
    "argv",
    [
        ["table", "avatar"],
        ["export", "xstate", "avatar"],
        ["diagrams", "--out", "{tmp}"],
        ["--help"],
    ],
    ids=["table", "export", "diagrams", "help"],
)
def test_a_full_stdout_is_one_line_naming_stdout(argv: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path / "dg")) for a in argv]
    with FULL.open("w") as full:
        done = subprocess.run(
            [*CLI, *argv], stdout=full, stderr=subprocess.PIPE, env=ENV, cwd=ROOT, timeout=WAIT
        )
    prog = "agent-runtime" if argv == ["--help"] else f"agent-runtime {argv[0]}"
    assert (done.returncode, done.stderr.decode()) == (
        2,
        f"{prog}: cannot write to stdout (No space left on device)\n",
    )


def test_ctrl_c_during_simulate_is_one_line_and_exit_130() -> None:
    proc = subprocess.Popen(
        [*CLI, "simulate", str(ROOT / "examples" / "scenarios")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        cwd=ROOT,
        text=True,
        # a child of a non-interactive shell may inherit SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it is running scenarios
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err  # what it said, if the interrupt went astray
    assert err.splitlines()[-1] == "agent-runtime simulate: interrupted"
    assert "Traceback" not in err


def test_ctrl_c_while_the_command_loads_is_one_line_too() -> None:
    """Ctrl-C in a command's first half second landed before ``main``'s handler, in the
    package's import of the machines and livekit's protobufs: a traceback. Importing the
    CLI now loads neither; each command loads them inside ``main``."""
    script = (
        "import sys\n"
        "import agent_runtime.tools.cli\n"
        "heavy = ('livekit', 'statemachines', 'pydantic', 'agent_runtime.actor')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=ENV, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# every command, with the arguments it needs to be parsed
COMMANDS = {
    "simulate": ["simulate"],
    "replay": ["replay", "t.jsonl"],
    "record": ["record", "t.jsonl"],
    "watch": ["watch", "t.jsonl"],
    "timeline": ["timeline", "t.jsonl", "-o", "p.html"],
    "diagrams": ["diagrams"],
    "table": ["table", "job"],
    "export": ["export", "xstate"],
    "fuzz": ["fuzz", "agent:server"],
    "diff": ["diff", "HEAD"],
}


def test_the_list_has_every_command() -> None:
    listed = re.findall(r"^    (\w+)  ", _parser().format_help(), flags=re.M)
    assert sorted(listed) == sorted(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(_parser().parse_args(COMMANDS[command]).module)

    def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    assert main(COMMANDS[command]) == 130
    assert capsys.readouterr().err == f"agent-runtime {command}: interrupted\n"


def test_a_task_the_cut_run_left_pending_is_no_news_when_it_is_collected(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CI drew asyncio's "Task was destroyed but it is pending!" after "interrupted": when
    the cut run's pending task is collected is the collector's choice (at exit, or in an
    exit hook), and its report came last on stderr."""
    import asyncio
    import gc

    module = importlib.import_module(_parser().parse_args(COMMANDS["simulate"]).module)

    def interrupted(*_: object) -> int:
        loop = asyncio.new_event_loop()
        cut = loop.create_task(asyncio.sleep(3600))  # the scenario the interrupt cut
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        del cut  # left pending: collected whenever the collector runs
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "run", interrupted)
    assert main(COMMANDS["simulate"]) == 130
    gc.collect()
    assert capsys.readouterr().err == "agent-runtime simulate: interrupted\n"
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


# -- --out and output files ----------------------------------------------------------------------


def test_export_out_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "somefile"
    blocker.write_text("mine")
    (tmp_path / "d" / "avatar.js").mkdir(parents=True)
    cases = {
        str(blocker / "sub"): f"not a directory ({blocker} is a file)",
        str(tmp_path / "d"): f"{tmp_path / 'd' / 'avatar.js'} is a directory, not a file",
    }
    for out, why in cases.items():
        assert main(["export", "xstate", "avatar", "--out", out]) == 2
        assert capsys.readouterr().err == f"agent-runtime export: {out}: {why}\n"
    assert blocker.read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["avatar.js"]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc here")
def test_export_out_under_proc_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "xstate", "avatar", "--out", "/proc/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-runtime export: /proc/x: cannot write (") and err.count("\n") == 1


def test_export_out_writes_every_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "xstate", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(
        f"{n}.js" for n in importlib.import_module("statemachines.machines").MACHINES
    )  # and no temporary file left beside them
    assert capsys.readouterr().out.count("wrote ") == len(written)


def test_diagrams_with_a_directory_where_a_file_goes_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dg"
    (out / "avatar.svg").mkdir(parents=True)
    assert main(["diagrams", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"agent-runtime diagrams: {out}: {out / 'avatar.svg'} is a directory, not a file\n"
    )
    assert [p.name for p in out.iterdir()] == ["avatar.svg"]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_simulate_html_of_a_directory_names_html(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    scenarios = tmp_path / "s"
    scenarios.mkdir()
    for name in ("a.yaml", "b.yaml"):
        (scenarios / name).write_bytes(SCENARIO.read_bytes())
    page = tmp_path / "p.html"
    argv = ["simulate", str(scenarios), "--html", str(page), *(["--json"] if as_json else [])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = "--html draws exactly one FILE (2 scenario files found)"
    assert captured.err == f"agent-runtime simulate: {line}\n"
    assert captured.out == (
        '{"ok": false, "file": null, "error": "' + line + '"}\n' if as_json else ""
    )
    assert not page.exists()


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="no /proc here")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_simulate_html_under_proc_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    argv = ["simulate", str(SCENARIO), "--html", "/proc/x.html", *(["--json"] if as_json else [])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    line = "/proc/x.html: cannot write the page (No such file or directory)"
    assert captured.err == f"agent-runtime simulate: {line}\n"
    assert "final" not in captured.out and "transitions" not in captured.out  # nothing ran


def _copy(src: Path, dest: Path) -> Path:
    dest.write_bytes(src.read_bytes())
    return dest


@pytest.fixture(scope="module")
def run_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("run") / "run.jsonl"
    assert main(["simulate", str(SCENARIO), "--trace", str(trace)]) == 0
    return trace


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["simulate", "{s}", "--trace", "{s}"],
            "agent-runtime simulate: --trace {s} is the scenario file {s}; it would be overwritten",
        ),
        (
            ["simulate", "{s}", "--html", "./{s}"],
            "agent-runtime simulate: --html ./{s} is the scenario file {s}; it would be "
            "overwritten",
        ),
        (
            ["simulate", "{s}", "--trace", "{t}", "--html", "{t}"],
            "agent-runtime simulate: --trace and --html name the same file {t}; one would "
            "overwrite the other",
        ),
        (
            ["timeline", "{t}", "-o", "{t}"],
            "agent-runtime timeline: -o {t} is the trace; it would be overwritten",
        ),
        (
            ["record", "{t}", "-o", "./{t}"],
            "agent-runtime record: -o ./{t} is the trace; it would be overwritten",
        ),
    ],
    ids=["simulate-trace", "simulate-html", "trace-is-html", "timeline", "record"],
)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    tmp_path: Path,
    run_jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    s, t = _copy(SCENARIO, tmp_path / "s.yaml"), _copy(run_jsonl, tmp_path / "t.jsonl")
    before = (s.read_bytes(), t.read_bytes())
    names = {"{s}": s.name, "{t}": t.name}

    def fill(text: str) -> str:
        for k, v in names.items():
            text = text.replace(k, v)
        return text

    assert main([fill(a) for a in argv]) == 2
    captured = capsys.readouterr()
    assert (captured.err, captured.out) == (fill(line) + "\n", "")
    assert (s.read_bytes(), t.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml", "t.jsonl"]


def _with_file_size_limit(limit: int) -> None:
    """In the child: a file written past ``limit`` bytes fails (EFBIG), as on a full disk."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails rather than the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize(
    ("argv", "what", "limit"),
    [
        (["timeline", "{t}", "-o", "{o}"], "page", 8192),
        (["record", "{t}", "-o", "{o}"], "scenario", 512),
        (["simulate", str(SCENARIO), "--html", "{o}"], "page", 32768),
    ],
    ids=["timeline", "record", "simulate-html"],
)
def test_an_output_cut_by_a_full_disk_leaves_the_file_there_as_it_was(
    tmp_path: Path, run_jsonl: Path, argv: list[str], what: str, limit: int
) -> None:
    # the page was written up to the disk's end over the user's file: a half page, the
    # file that was there lost
    out = tmp_path / "out" / "kept.txt"
    out.parent.mkdir()
    out.write_text("the user's own file\n", encoding="utf-8")
    argv = [a.replace("{t}", str(run_jsonl)).replace("{o}", str(out)) for a in argv]
    done = subprocess.run(
        [*CLI, *argv],
        capture_output=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
        preexec_fn=lambda: _with_file_size_limit(limit),
    )
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2, err
    assert f"agent-runtime {argv[0]}: {out}: cannot write the {what} (File too large)" in err
    assert not any("Traceback" in line for line in err)
    assert out.read_text(encoding="utf-8") == "the user's own file\n"
    assert [p.name for p in out.parent.iterdir()] == ["kept.txt"]  # no half-written file left


def test_an_output_through_a_link_replaces_the_linked_file_and_keeps_the_link(
    tmp_path: Path, run_jsonl: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "pages" / "page.html"
    real.parent.mkdir()
    real.write_text("old page\n", encoding="utf-8")
    link = tmp_path / "latest.html"
    link.symlink_to(real)
    assert main(["timeline", str(run_jsonl), "-o", str(link)]) == 0
    assert link.is_symlink() and real.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in real.parent.iterdir()) == ["page.html"]


@pytest.mark.parametrize("command", ["export", "diagrams"])
@pytest.mark.parametrize("link_to", ["a-file", "no-file-yet"])
def test_an_out_directory_s_file_through_a_link_writes_the_linked_file_and_keeps_the_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, link_to: str
) -> None:
    """``export --out``/``diagrams --out`` replaced a link standing for one of their files
    (a dangling one too) with a file of their own: the link's file is written and the
    link kept, as ``record -o``, ``timeline -o`` and ``simulate --trace`` do."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    kept.mkdir()
    argv = ["export", "xstate", "avatar"] if command == "export" else ["diagrams"]
    assert main([*argv, "--out", str(out)]) == 0  # diagrams writes only where it wrote
    capsys.readouterr()
    name = "avatar.js" if command == "export" else "avatar.md"
    real = kept / name
    if link_to == "a-file":
        real.write_text("the user's own copy\n", encoding="utf-8")
    (out / name).unlink()
    (out / name).symlink_to(real)
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    assert f"wrote {out / name}\n" in capsys.readouterr().out
    assert (out / name).is_symlink() and os.readlink(out / name) == str(real)
    assert real.read_text(encoding="utf-8") != "the user's own copy\n"
    assert [p.name for p in kept.iterdir()] == [name]  # no temporary file left


@pytest.mark.parametrize("command", ["export", "diagrams"])
@pytest.mark.parametrize("where", ["the-directory", "a-file", "a-loop", "under-a-loop"])
def test_an_out_link_to_nothing_is_one_line_naming_the_link_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, where: str
) -> None:
    """A link that leads into no directory was ``cannot write (File exists)`` for ``--out``
    itself, and named a temporary file of the command's for one of its files. A link to
    itself was said to be a link to a link that is not there."""
    argv = ["export", "xstate", "avatar"] if command == "export" else ["diagrams"]
    out = tmp_path / "out"
    given = out / "sub" if where == "under-a-loop" else out
    if where == "the-directory":
        out.symlink_to(tmp_path / "gone")
        why = f"a link to {tmp_path / 'gone'}, which is not there"
    elif where in ("a-loop", "under-a-loop"):
        out.symlink_to(out)
        why = "Too many levels of symbolic links" + (f" ({out})" if given != out else "")
    else:
        out.mkdir()
        link = out / ("avatar.js" if command == "export" else "avatar.md")
        link.symlink_to("../gone/x")
        why = f"{link} is a link into a directory that is not there (../gone/x)"
    assert main([*argv, "--out", str(given)]) == 2
    assert capsys.readouterr().err == f"agent-runtime {command}: {given}: {why}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert out.is_symlink() or [p.name for p in out.iterdir()] == [link.name]


def test_an_output_named_by_dev_stdout_in_a_pipe_is_written_there(run_jsonl: Path) -> None:
    done = subprocess.run(
        [*CLI, "record", str(run_jsonl), "-o", "/dev/stdout"],
        capture_output=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("# Recorded by `agent-runtime record`")


@pytest.mark.parametrize("command", ["export", "diagrams"])
def test_an_out_directory_cut_by_a_full_disk_is_not_left_behind(
    tmp_path: Path, command: str
) -> None:
    # every file was left out, as promised, but the directories made for them stayed
    out = tmp_path / "new" / "out"
    argv = (
        ["export", "xstate", "--out", str(out)]
        if command == "export"
        else [
            "diagrams",
            "--out",
            str(out),
        ]
    )
    done = subprocess.run(
        [*CLI, *argv],
        capture_output=True,
        env=ENV,
        cwd=ROOT,
        timeout=WAIT,
        preexec_fn=lambda: _with_file_size_limit(1024),
    )
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "(File too large)" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_file_the_user_may_write_in_a_directory_they_may_not_is_still_written(
    run_jsonl: Path,
) -> None:
    # no temporary file can be made beside it: the page is written in place, as before
    base = Path(tempfile.mkdtemp(prefix="agent-runtime-ro-"))  # for nobody too, as root
    try:
        os.chmod(base, 0o755)
        trace = _copy(run_jsonl, base / "run.jsonl")
        os.chmod(trace, 0o644)
        shared = base / "shared"
        shared.mkdir()
        page = shared / "page.html"
        page.write_text("old page\n", encoding="utf-8")
        os.chmod(page, 0o666)
        os.chmod(shared, 0o555)

        def as_someone_else() -> None:
            if os.geteuid() == 0:  # root writes anywhere: be nobody
                os.setgid(65534)
                os.setuid(65534)

        try:  # a Python under root's home (pyenv's) is not nobody's to run: nothing to try
            subprocess.run(
                [CLI[0], "-c", "import agent_runtime"],
                capture_output=True,
                env=ENV,
                cwd=base,
                timeout=WAIT,
                preexec_fn=as_someone_else,
                check=True,
            )
        except (PermissionError, subprocess.CalledProcessError) as e:
            pytest.skip(f"another user cannot run this Python here: {e}")
        done = subprocess.run(
            [*CLI, "timeline", str(trace), "-o", str(page)],
            capture_output=True,
            env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"},
            cwd=base,
            timeout=WAIT,
            preexec_fn=as_someone_else,
        )
        assert done.returncode == 0, done.stderr.decode()
        assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
        assert [p.name for p in shared.iterdir()] == ["page.html"]
    finally:
        os.chmod(base / "shared", 0o755)
        shutil.rmtree(base)
