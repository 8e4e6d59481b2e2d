"""Where a command's output file goes: every option that writes one (``record -o``,
``timeline -o``, ``simulate --trace``/``--html``, ``export --out``, ``diagrams --out``)
makes the directories missing for it, refuses a place no directory can be made before
anything runs (one line, exit 2, nothing made), keeps the permissions of a file it
rewrites, and names the file the user gave, never a temporary file of its own."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_runtime.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"
PROC = Path("/proc/self")

# what each option writes, as its error line names it
WHAT = {
    "record": "scenario",
    "timeline": "page",
    "simulate-html": "page",
    "simulate-trace": "trace",
}


@pytest.fixture(scope="module")
def run_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("run") / "run.jsonl"
    assert main(["simulate", str(SCENARIO), "--trace", str(trace)]) == 0
    return trace


def _argv(command: str, trace: Path, out: Path) -> list[str]:
    return {
        "record": ["record", str(trace), "-o", str(out)],
        "timeline": ["timeline", str(trace), "-o", str(out)],
        "simulate-html": ["simulate", str(SCENARIO), "--html", str(out)],
        "simulate-trace": ["simulate", str(SCENARIO), "--trace", str(out)],
    }[command]


@pytest.mark.parametrize("command", ["record", "timeline", "simulate-html"])
def test_an_output_file_into_missing_directories_makes_them(
    tmp_path: Path, run_jsonl: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``record -o``, ``timeline -o`` and ``simulate --html`` refused a missing directory
    (No such file or directory) while ``simulate --trace`` makes its own."""
    out = tmp_path / "new" / "deeper" / "out.txt"
    assert main(_argv(command, run_jsonl, out)) == 0, capsys.readouterr().err
    assert f"wrote {out}" in capsys.readouterr().err
    start = "# Recorded by `agent-runtime record`" if command == "record" else "<!DOCTYPE html>"
    assert out.read_text(encoding="utf-8").startswith(start)


def test_a_trace_and_its_page_into_one_missing_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trace's directory was made and the page refused, for the same directory."""
    out = tmp_path / "out"
    argv = ["simulate", str(SCENARIO), "--trace", str(out / "x.jsonl")]
    assert main([*argv, "--html", str(out / "x.html")]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["x.html", "x.jsonl"]
    assert main(["replay", str(out / "x.jsonl")]) == 0


@pytest.mark.parametrize("command", list(WHAT))
@pytest.mark.parametrize(
    "kind", ["under-a-file", "under-a-link-to-nothing", "a-link-into-proc", "a-link-loop"]
)
def test_an_output_no_directory_can_be_made_for_is_one_line_before_anything_runs(
    tmp_path: Path,
    run_jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    kind: str,
) -> None:
    """Under a link that leads nowhere it was ``File exists`` (the trace's) or a run then
    ``No such file or directory`` (the page's); a page through a link into /proc was
    refused only after the run; a link to itself was a traceback (``Symlink loop``)."""
    if kind == "under-a-file":
        (tmp_path / "f").write_text("mine")
        out, why = tmp_path / "f" / "sub" / "out.txt", "Not a directory"
    elif kind == "under-a-link-to-nothing":
        (tmp_path / "f").symlink_to(tmp_path / "gone")
        out, why = tmp_path / "f" / "sub" / "out.txt", f"{tmp_path / 'f'} is a link to "
        why += f"{tmp_path / 'gone'}, which is not there"
    elif kind == "a-link-loop":
        (tmp_path / "f").symlink_to(tmp_path / "f")
        out, why = tmp_path / "f", "Too many levels of symbolic links"
    else:
        if not PROC.exists():
            pytest.skip("no /proc here")
        (tmp_path / "f").symlink_to("/proc/agent-runtime-out.txt")
        out, why = tmp_path / "f", "No such file or directory"
    code = main(_argv(command, run_jsonl, out))
    captured = capsys.readouterr()
    prog = command.split("-")[0]
    what = WHAT[command]
    line = f"{out}: cannot write the {what}" + (f": {why}" if what == "trace" else f" ({why})")
    assert (code, captured.err) == (2, f"agent-runtime {prog}: {line}\n")
    assert captured.out == ""  # nothing ran
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.parametrize("command", ["record", "timeline"])
def test_a_trace_that_is_a_link_to_itself_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """It was a traceback (``RuntimeError: Symlink loop``), where replay said one line."""
    trace = tmp_path / "run.jsonl"
    trace.symlink_to(trace)
    code = main(_argv(command, trace, tmp_path / "out.txt"))
    captured = capsys.readouterr()
    line = f"{trace}: cannot read the trace: Too many levels of symbolic links"
    assert (code, captured.err) == (2, f"agent-runtime {command}: {line}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]


ARGV = {"export": ["export", "xstate", "avatar"], "diagrams": ["diagrams"]}
NAME = {"export": "avatar.js", "diagrams": "avatar.md"}


@pytest.mark.parametrize("command", ["export", "diagrams"])
def test_an_out_directory_s_file_keeps_its_permissions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A file ``export --out`` or ``diagrams --out`` rewrote got a new file's permissions
    (0644 under the usual umask), where ``record -o`` keeps the file's own."""
    out = tmp_path / "out"
    assert main([*ARGV[command], "--out", str(out)]) == 0
    mine = out / NAME[command]
    mine.write_text("stale\n", encoding="utf-8")
    mine.chmod(0o600)
    capsys.readouterr()
    assert main([*ARGV[command], "--out", str(out)]) == 0, capsys.readouterr().err
    assert f"wrote {mine}\n" in capsys.readouterr().out
    assert mine.read_text(encoding="utf-8") != "stale\n"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600


@pytest.mark.skipif(not PROC.exists(), reason="no /proc here")
@pytest.mark.parametrize("command", ["export", "diagrams"])
def test_a_link_where_no_file_can_be_made_is_named_not_a_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A link into a directory that is there but takes no file (/proc here; one the user
    may not write in elsewhere) named a temporary file (``/proc/.avatar.js.x1y2.tmp``)."""
    out = tmp_path / "out"
    assert main([*ARGV[command], "--out", str(out)]) == 0
    link = out / NAME[command]
    link.unlink()
    link.symlink_to(f"/proc/{NAME[command]}")
    capsys.readouterr()
    assert main([*ARGV[command], "--out", str(out)]) == 2
    what = "cannot write" if command == "export" else "cannot write the diagrams"
    err = capsys.readouterr().err
    assert err == f"agent-runtime {command}: {link}: {what} (No such file or directory)\n"
    assert link.is_symlink()


@pytest.mark.skipif(shutil.which("dot") is None, reason="no Graphviz `dot` here")
def test_the_whole_job_svg_cut_by_a_full_disk_leaves_the_file_there_as_it_was(
    tmp_path: Path,
) -> None:
    """``diagrams --out`` wrote the whole job's SVG (Graphviz's) in place, not through the
    writer every other file goes through: a full disk left half of it."""
    out = tmp_path / "out"
    assert main(["diagrams", "--out", str(out)]) == 0
    svg = out / "whole-job.svg"
    size = svg.stat().st_size
    svg.write_text("the old drawing\n", encoding="utf-8")  # the only file to rewrite
    done = subprocess.run(
        [sys.executable, "-m", "agent_runtime.tools.cli", "diagrams", "--out", str(out)],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=120,
        preexec_fn=lambda: _with_file_size_limit(size // 2),
    )
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "(File too large)" in err[0], err
    assert svg.read_text(encoding="utf-8") == "the old drawing\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def _with_file_size_limit(limit: int) -> None:
    """In the child: a file written past ``limit`` bytes fails (EFBIG), as on a full disk."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails rather than the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
