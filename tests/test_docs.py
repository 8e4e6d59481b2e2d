"""The docs cannot drift from the code: every fenced block in the guide (``docs/``) and in
the README is either run or checked by a test, or marked as not runnable, by the HTML
comment on the line before it:

- ``<!-- not run: why -->``: not runnable, and why (usually which test covers it);
- ``<!-- run -->``: a Python block this file runs;
- ``<!-- file: PATH -->``: the block is that file of the project, as it is;
- ``<!-- quickstart: ... -->``: the README's quick start, which this file runs from the
  source tree (``.ci/wheel`` runs it again from the built wheel);
- any other marker is one a test looks the block up by (the marker's text is in a test).

The site itself is built strict by ``.ci/docs`` (``mkdocs build --strict``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(\s*)(`{3,})([\w+-]*)")
MARKER = re.compile(r"^<!-- (.+?) -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based, of the opening fence
    lang: str
    marker: str | None
    body: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = MARKER.match(lines[j].strip()) if j >= 0 else None
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(m.group(2)):
            end += 1
        body = "\n".join(ln[len(m.group(1)) :] for ln in lines[i + 1 : end])
        out.append(Block(page, i + 1, m.group(3), mark.group(1) if mark else None, body))
        i = end + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]
# where another test looks a block up by its marker (this file's own text does not count)
TESTS_TEXT = "\n".join(
    p.read_text(encoding="utf-8")
    for p in (ROOT / "tests").glob("*.py")
    if p.name != Path(__file__).name
)


def test_the_docs_have_code_blocks() -> None:
    assert len(ALL) > 20 and any(b.marker == "run" for b in ALL)


@pytest.mark.parametrize("block", ALL, ids=str)
def test_every_block_is_run_checked_or_marked_not_runnable(block: Block) -> None:
    marker = block.marker
    assert marker is not None, (
        f"{block}: a code block with no marker; run it in a test, or put "
        "<!-- not run: why --> on the line before it"
    )
    if marker.startswith("not run:"):
        assert marker.removeprefix("not run:").strip(), f"{block}: say why it is not run"
    elif marker.startswith("file: "):
        path = ROOT / marker.removeprefix("file: ")
        assert path.is_file(), f"{block}: {path} does not exist"
        assert block.body == path.read_text(encoding="utf-8").rstrip("\n"), (
            f"{block}: the copy of {path.relative_to(ROOT)} is stale"
        )
    elif marker.startswith("quickstart:"):
        assert block.page.name == "README.md", f"{block}: quick start blocks live in the README"
    elif marker != "run":
        assert marker in TESTS_TEXT, f"{block}: no test reads the block marked {marker!r}"


@pytest.mark.parametrize("block", [b for b in ALL if b.marker == "run"], ids=str)
def test_runnable_blocks_run(block: Block, tmp_path: Path) -> None:
    assert block.lang == "python", f"{block}: only Python blocks are run"
    done = subprocess.run(
        [sys.executable, "-c", block.body],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stderr}"


def test_the_readme_quick_start_runs(tmp_path: Path) -> None:
    """What ``.ci/wheel`` runs from the wheel, run here from the installed source tree."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / ".ci" / "quickstart.py"),
            str(ROOT / "README.md"),
            "tools,testing",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "quick start: 4 blocks ran" in done.stdout


def test_the_options_table_gives_each_literal_default_agent_job_has() -> None:
    """The embedding guide's options table names real ``AgentJob`` options, and a default
    written as a value (`True`, `15 s`) is the one ``AgentJob`` takes when the option is
    left out (it said playout's was `False`: a job with an avatar composes it)."""
    import inspect

    from agent_runtime import AgentJob

    params = inspect.signature(AgentJob.__init__).parameters
    text = (ROOT / "docs" / "guide" / "embedding.md").read_text(encoding="utf-8")
    table = text.split("| option | default | what it decides |\n|---|---|---|\n")[1]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", table.split("\n\n")[0], re.M)
    assert len(rows) > 10
    literals = {"`True`": True, "`False`": False, "`None`": None}
    for name, default in rows:
        assert name in params, f"the options table names {name!r}, which AgentJob does not take"
        value = default.split(" (")[0].strip()
        seconds = re.fullmatch(r"(\d+(?:\.\d+)?) s", value)
        if value in literals:
            assert params[name].default is literals[value], f"{name}: the table says {value}"
        elif seconds:
            assert params[name].default == float(seconds[1]), f"{name}: the table says {value}"


def test_the_quick_start_installs_from_a_clone_while_the_package_is_unpublished() -> None:
    """The README said `pip install livekit-agent-fsm`, which finds nothing while the
    CHANGELOG's newest release is not yet published: it says so and installs from a clone,
    naming only extras pyproject.toml declares."""
    import tomllib

    release = re.search(r"^## \[\d[^\]]*\] - (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert release is not None
    if "not yet published" not in release[1]:
        pytest.skip(f"the newest release is {release[1]!r}: the quick start may install it by name")
    readme = ROOT / "README.md"
    (install,) = [b for b in blocks(readme) if b.marker == "quickstart: install"]
    assert "The package is not published yet" in readme.read_text(encoding="utf-8")
    commands = re.findall(r"^pip install (\S+)", install.body, re.M)
    assert commands and all(re.fullmatch(r"'?\.(\[[\w,]+\])?'?", c) for c in commands), commands
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = set(pyproject["project"]["optional-dependencies"])
    named = {
        e for c in commands for group in re.findall(r"\[([\w,]+)\]", c) for e in group.split(",")
    }
    assert named and named <= declared, named - declared


def test_the_readme_machines_table_names_every_state_of_each_machine() -> None:
    """The `states` column of each machine's row names exactly its states (session_host's
    left `closing` out)."""
    from statemachines.machines import MACHINES

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text.split("<!-- docs: start machines -->")[1].split("<!-- docs: end machines -->")[0]
    rows = dict(re.findall(r"^\| \[`(\w+)`\]\([^)]*\)[^|]*\| ([^|]+) \|", table, re.M))
    assert set(rows) == set(MACHINES)
    for name, states in rows.items():
        named = set(re.findall(r"\w+", states))
        assert named == set(MACHINES[name].state_names), (name, states)


def test_the_observability_page_names_every_state_that_gets_a_span() -> None:
    """The page's list of states that take time is exactly the ones the OTel sink spans
    (it named four of sixteen)."""
    from agent_runtime.observe.otel import held_states

    text = (ROOT / "docs" / "guide" / "observability.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if "each state that takes time" in line]
    listed = row.split("state task (", 1)[1].split(")", 1)[0]
    named = {tuple(s.split(".")) for s in re.findall(r"`(\w+\.\w+)`", listed)}
    assert named == set(held_states())


def test_the_scenarios_page_names_every_participant_kind_a_scenario_takes() -> None:
    """The page's list of kinds is exactly the scenario format's (it named none, and the
    format took five of livekit's seven)."""
    from agent_runtime.testing.scenario import PARTICIPANT_KINDS

    text = (ROOT / "docs" / "guide" / "scenarios.md").read_text(encoding="utf-8")
    listed = text.split("`kind` is one of the", 1)[1].split(";", 1)[0]
    named = re.findall(r"`(\w+)`", listed.split(":", 1)[1])
    assert sorted(named) == sorted(PARTICIPANT_KINDS)
