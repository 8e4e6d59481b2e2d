"""``agent-runtime diagrams`` and ``agent-runtime table``: files written, ``--check`` naming
each stale, missing or stray file, no ``livekit.agents`` import."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

import agent_runtime.tools.commands.diagrams as diagrams_cmd
from agent_runtime.tools.cli import main
from agent_runtime.tools.drawing import cell_regions
from agent_runtime.tools.render import mermaid, terminal_table
from statemachines.machines import MACHINES

# the committed diagrams of the specs as written
pytestmark = pytest.mark.snapshot

ROOT = Path(__file__).resolve().parents[1]


def test_committed_diagrams_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagrams", "--check", "--out", str(ROOT / "diagrams")])
    assert code == 0, capsys.readouterr().err + "\nrun `agent-runtime diagrams` and commit"


def test_writes_every_file_then_check_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    for m in MACHINES:
        assert {f"{m}.mmd", f"{m}.dot", f"{m}.md", f"{m}.svg"} <= names  # no Graphviz needed
        assert (out / f"{m}.svg").read_text().startswith("<svg")
    assert "README.md" in names
    assert all(n.split(".")[0] in (*MACHINES, "README", "whole-job") for n in names)
    assert {"whole-job.mmd", "whole-job.dot"} <= names
    if shutil.which("dot"):
        assert (out / "whole-job.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert (out / "job.mmd").read_text() == mermaid(MACHINES["job"])
    capsys.readouterr()
    assert main(["diagrams", "--check", "--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out
    # writing again changes nothing
    assert main(["diagrams", "--out", str(out)]) == 0
    assert "wrote" not in capsys.readouterr().out


def test_every_file_written_is_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The SVGs were written but never listed in the `wrote ...` lines."""
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    wrote = [line.removeprefix("wrote ") for line in capsys.readouterr().out.splitlines()]
    assert sorted(wrote) == sorted(str(p) for p in out.iterdir())
    assert str(out / "avatar.svg") in wrote
    # an SVG drawn again is listed when it changed, and only then
    (out / "avatar.svg").unlink()
    (out / "job.svg").write_text("<svg/>")
    assert main(["diagrams", "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"wrote {out / 'avatar.svg'}",
        f"wrote {out / 'job.svg'}",
    ]
    if shutil.which("dot"):
        assert str(out / "whole-job.svg") in wrote


def test_check_names_each_stale_missing_and_stray_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    (out / "job.md").write_text("edited by hand\n")
    (out / "avatar.dot").unlink()
    (out / "robot.mmd").write_text("stateDiagram-v2\n")
    (out / "robot.svg").write_text("<svg/>")
    (out / "notes.txt").write_text("not generated")  # not ours: left alone
    (out / "participant.svg").write_text("<svg>edited</svg>")  # a machine's SVG is compared
    if (out / "whole-job.svg").exists():
        (out / "whole-job.svg").write_text("<svg>other graphviz</svg>")  # Graphviz's: never
    capsys.readouterr()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"stale: {out / 'job.md'}" in err
    assert f"stale: {out / 'participant.svg'}" in err
    assert f"missing: {out / 'avatar.dot'}" in err
    assert f"stray: {out / 'robot.mmd'} (no machine named 'robot')" in err
    assert f"stray: {out / 'robot.svg'} (no machine named 'robot')" in err
    assert len(err) == 6 and err[-1].startswith("5 diagram file(s) out of date")
    # regenerating fixes it and removes the strays of the machine that is gone
    assert main(["diagrams", "--out", str(out)]) == 0
    assert not (out / "robot.mmd").exists() and (out / "notes.txt").exists()
    assert main(["diagrams", "--check", "--out", str(out)]) == 0


def test_check_says_what_stands_where_a_file_should_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a directory was said "missing", and a file not UTF-8 was a traceback
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    (out / "avatar.md").unlink()
    (out / "avatar.md").mkdir()
    (out / "job.md").write_bytes(b"\xff\xfe")
    (out / "finalize.md").unlink()
    (out / "finalize.md").symlink_to("finalize.md")
    capsys.readouterr()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    assert sorted(capsys.readouterr().err.splitlines()[:-1]) == [
        f"not a file: {out / 'avatar.md'} (a directory)",
        f"unreadable: {out / 'finalize.md'} (Too many levels of symbolic links)",
        f"unreadable: {out / 'job.md'} (not UTF-8 text)",
    ]


def test_check_fails_after_a_spec_change_until_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    job = MACHINES["job"]
    cell = ("awaiting_finalize", "hold_timeout")
    rows = tuple(
        r.model_copy(update={"dest": "closed"}) if (r.source, r.event) == cell else r
        for r in job.rows
    )
    changed = type(job)(**{**job.model_dump(), "rows": rows})  # validated like a real edit
    monkeypatch.setattr(diagrams_cmd, "MACHINES", {**MACHINES, "job": changed})
    capsys.readouterr()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"stale: {out / 'job.mmd'}" in err and f"stale: {out / 'README.md'}" in err
    assert "avatar" not in err
    assert main(["diagrams", "--out", str(out)]) == 0
    assert main(["diagrams", "--check", "--out", str(out)]) == 0


def test_check_on_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It listed every file as "missing:" and said they were out of date."""
    none = tmp_path / "none"
    assert main(["diagrams", "--check", "--out", str(none)]) == 2
    assert capsys.readouterr().err == f"agent-runtime diagrams: {none}: no such directory\n"
    assert not none.exists()


def run_from(monkeypatch: pytest.MonkeyPatch, root: Path, *, clone: bool) -> Path:
    """The diagrams command as if its package were under ``root`` (a clone with its
    pyproject.toml and diagrams/, or a site-packages), run from ``root/docs``."""
    if clone:
        (root / "pyproject.toml").parent.mkdir(parents=True)
        (root / "pyproject.toml").write_text("[project]\n")
        assert main(["diagrams", "--out", str(root / "diagrams")]) == 0
    module = root / "agent_runtime" / "tools" / "commands" / "diagrams.py"
    monkeypatch.setattr(diagrams_cmd, "__file__", str(module))
    (root / "docs").mkdir(parents=True)
    monkeypatch.chdir(root / "docs")
    return root / "docs"


def test_from_elsewhere_in_a_clone_the_clones_diagrams_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from a clone's docs/, --check said each file was missing (exit 1), and the
    `agent-runtime diagrams` it advised wrote a new docs/diagrams/."""
    clone = tmp_path / "clone"
    here = run_from(monkeypatch, clone, clone=True)
    (clone / "diagrams" / "job.md").write_text("edited by hand\n")
    capsys.readouterr()
    assert main(["diagrams", "--check"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"stale: {clone / 'diagrams' / 'job.md'}" and len(err) == 2
    assert err[1].endswith("run `agent-runtime diagrams` and commit the result")
    assert main(["diagrams"]) == 0
    assert capsys.readouterr().out == f"wrote {clone / 'diagrams' / 'job.md'}\n"
    assert main(["diagrams", "--check"]) == 0
    assert capsys.readouterr().out.startswith(f"{clone / 'diagrams'}: diagrams of ")
    assert list(here.iterdir()) == []


def test_with_no_diagrams_directory_check_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed (no clone) and run where there is no diagrams/, --check said every file
    was missing and out of date."""
    here = run_from(monkeypatch, tmp_path / "site-packages", clone=False)
    assert main(["diagrams", "--check"]) == 2
    assert capsys.readouterr().err == (
        "agent-runtime diagrams: no diagrams/ directory here (nor in a clone of the project "
        "this package runs from) to check: give --out DIR\n"
    )
    assert list(here.iterdir()) == []
    # writing them is asked for: they are written here
    assert main(["diagrams"]) == 0
    assert (here / "diagrams" / "job.mmd").is_file()


@pytest.mark.parametrize("check", [False, True], ids=["write", "check"])
@pytest.mark.parametrize("under", [False, True], ids=["the-file", "under-the-file"])
def test_an_out_that_is_a_file_is_one_line_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: bool, under: bool
) -> None:
    """``--out`` naming an existing file (or a path under one) was a FileExistsError
    traceback; it is exit 2 with one line, and the file is left as it was."""
    existing = tmp_path / "notes"
    existing.write_text("mine\n")
    out = existing / "d" if under else existing
    code = main(["diagrams", "--out", str(out), *(["--check"] if check else [])])
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert err == [
        f"agent-runtime diagrams: {out}: not a directory"
        + (f" ({existing} is a file)" if under else "")
    ]
    assert existing.read_text() == "mine\n" and list(tmp_path.iterdir()) == [existing]


def test_a_directory_of_someone_elses_files_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--out docs` replaced the README there and removed every .md beside it as a "stray"
    out = tmp_path / "docs"
    out.mkdir()
    (out / "README.md").write_text("# my project\n")
    (out / "notes.md").write_text("mine\n")
    code = main(["diagrams", "--out", str(out)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert "holds files agent-runtime diagrams did not write" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "notes.md"]
    assert (out / "README.md").read_text() == "# my project\n"
    # a check only reads: it lists what differs there
    assert main(["diagrams", "--out", str(out), "--check"]) == 1
    assert f"stray: {out / 'notes.md'}" in capsys.readouterr().err
    # a directory holding only a .gitkeep is an empty one
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / ".gitkeep").write_text("")
    assert main(["diagrams", "--out", str(kept)]) == 0 and (kept / "README.md").is_file()


def test_diagrams_and_table_do_not_import_livekit_agents(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from agent_runtime.tools.cli import main\n"
        f"assert main(['diagrams', '--out', {str(tmp_path)!r}]) == 0\n"
        f"assert main(['diagrams', '--check', '--out', {str(tmp_path)!r}]) == 0\n"
        "assert main(['table', 'job']) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('livekit.agents'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_table_prints_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "session_host"]) == 0
    out = capsys.readouterr().out
    assert out == terminal_table(MACHINES["session_host"])
    assert re.search(r"\n  attach +REJECT  \(the host is closed\)", out)
    assert not re.search(r"\n  attach +\[is_current\] -> ", out)  # internal reads internal
    assert re.search(r"\n  attach +\[is_current\] internal\n +else internal / unsubscribe", out)


def test_table_of_an_unknown_machine_lists_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "robot"]) == 2
    err = capsys.readouterr().err
    assert (
        "unknown machine 'robot'; machines: avatar, job, session_host, participant, "
        "room_deletion, finalize" in err
    )


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("diagrams", "table", "diff", "replay"):
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        assert f"agent-runtime {cmd}" in capsys.readouterr().out


def test_svgs_name_each_region_diff_links_to(tmp_path: Path) -> None:
    """`agent-runtime diff` links to diagrams/NAME.svg#REGION: every region it can name, for
    every cell of every machine, is an element of that SVG, and the SVG's own style outlines
    whichever region the link targets."""
    assert main(["diagrams", "--out", str(tmp_path)]) == 0
    for name, spec in MACHINES.items():
        svg = (tmp_path / f"{name}.svg").read_text()
        assert svg.count("<style>") == 1 and ":target rect" in svg and "#d1242f" in svg
        ids = [el.get("id") for el in ElementTree.fromstring(svg.encode()).iter()]
        regions = {
            ident for cells in cell_regions(spec).values() for r in cells.values() for ident, _ in r
        }
        assert regions and regions <= set(ids), f"{name}.svg lacks {regions - set(ids)}"
        assert len([i for i in ids if i]) == len({i for i in ids if i})  # each id once
    ids = {
        el.get("id") for el in ElementTree.fromstring((tmp_path / "avatar.svg").read_bytes()).iter()
    }
    for region in ("state--routing", "edge--starting--failed", "into--closed", "into--failed"):
        assert region in ids


def test_check_fails_when_a_channel_changes_until_regenerated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole job is drawn from the declarations: dropping a link makes it stale."""
    from statemachines import links

    out = tmp_path / "d"
    assert main(["diagrams", "--out", str(out)]) == 0
    fewer = links.without(links.LINKS, "finalize", "report_answered", "job")
    assert len(fewer) == len(links.LINKS) - 1
    monkeypatch.setattr(links, "LINKS", fewer)
    capsys.readouterr()
    assert main(["diagrams", "--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"stale: {out / 'whole-job.mmd'}" in err and f"stale: {out / 'whole-job.dot'}" in err
    assert "avatar.mmd" not in err
    assert main(["diagrams", "--out", str(out)]) == 0
    assert "report_answered" not in (out / "whole-job.dot").read_text()
