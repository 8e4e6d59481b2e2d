"""The renderers: every row and cell shows up, output is deterministic, labels stay valid."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent_runtime.tools.drawing import BULLET, Hub, _edges, cell_table, drawing, dump_cell_table
from agent_runtime.tools.render import (
    diagram_files,
    dot,
    markdown_table,
    mermaid,
    terminal_table,
)
from agent_runtime.tools.system_diagram import (
    AGENT_STATES,
    system_dot,
    system_files,
    system_markdown,
    system_view,
)
from statemachines import Effect, MachineSpec, State, StateTimeout, cells, row
from statemachines.machines import MACHINES

# renderings of the specs as written
pytestmark = pytest.mark.snapshot

# names with every character Mermaid, DOT or Markdown treat specially
ODD = MachineSpec(
    name="odd:machine;1",
    initial="start-1",
    states=(
        State(name="start-1", timeout=StateTimeout(event="t;o", setting="a:b", default=1.5)),
        State(name="x y|z", invoke=("ta<sk>",)),
        State(name="end", final=True),
    ),
    events=("go:now", "t;o", 'a"b#c'),
    guards=("g|1", "g{2}"),
    effects=(Effect(name="e|1", error_event="t;o"), Effect(name="ta<sk>")),
    rows=(
        *row("start-1", "go:now", "x y|z", guards=["g|1", "g{2}"], effects=["e|1"]),
        *row("start-1", "go:now", None),
        *row("x y|z", 'a"b#c', "end"),
        *row("x y|z", "t;o", None, effects=["e|1"]),
        *row("x y|z", "go:now", "start-1"),
    ),
    ignore=(
        *cells("start-1", ["t;o", 'a"b#c']),
        *cells("end", ["go:now", "t;o", 'a"b#c'], note="a | note"),
    ),
)

ALL = [*MACHINES.values(), ODD]
IDS = [m.name for m in ALL]


def _hub_sources(hub: Hub, spec: MachineSpec) -> dict[str, set[str]]:
    """Row label -> the states a hub says it comes from."""
    if hub.title == "from every other state":
        union = {s.name for s in spec.states if s.name != hub.dest and not s.final}
    else:
        union = set(hub.title.removeprefix("from any of ").split(", "))
    out: dict[str, set[str]] = {}
    for line in hub.lines:
        head, sep, label = line.partition(": ")
        if sep and set(head.split(", ")) <= union and "[" not in head:
            out[label] = set(head.split(", "))
        else:
            out[line] = union
    return out


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_the_drawing_shows_every_row_once(spec: MachineSpec) -> None:
    """Each row is on its (source, dest) edge, in a hub into dest that names its source, or
    listed inside its state (internal): nothing dropped, nothing drawn twice."""
    d = drawing(spec)
    shown: list[tuple[str, str | None, str]] = []
    for edge in d.edges:
        shown += [(edge.source, edge.dest, line) for line in edge.lines]
    for hub in d.hubs:
        for label, sources in _hub_sources(hub, spec).items():
            shown += [(s, hub.dest, label) for s in sorted(sources)]
    for box in d.states:
        listed = [t.removeprefix(BULLET) for t in box.details if t.startswith(BULLET)]
        shown += [(box.name, None, label) for label in listed]
    expected = [(s, dst, label) for s, dst, _, label in _edges(spec)]
    assert sorted(shown, key=str) == sorted(expected, key=str)
    # one edge per (source, dest) pair, at most one hub per state
    assert len({(e.source, e.dest) for e in d.edges}) == len(d.edges)
    assert len({h.dest for h in d.hubs}) == len(d.hubs)


def test_an_event_from_three_states_or_more_is_drawn_once() -> None:
    d = drawing(MACHINES["avatar"])
    (into_closed,) = [h for h in d.hubs if h.dest == "closed"]
    assert into_closed.title == "from every other state"
    assert "idle: close / unhook" in into_closed.lines
    (into_failed,) = [h for h in d.hubs if h.dest == "failed"]
    assert into_failed.title == "from any of starting, routing, joined, clearing"
    assert into_failed.lines == (
        "start_error / restore_route",
        "routing, joined, clearing: avatar_left / restore_route",
    )
    assert not any(e.dest == "closed" for e in d.edges)
    # two states entering one: still edges, one per pair with a line per row
    (to_failed,) = [e for e in d.edges if (e.source, e.dest) == ("starting", "failed")]
    assert to_failed.lines == (
        "no_route / restore_route",
        "start_timeout / record_route, restore_route",
    )


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_mermaid_has_the_initial_marker_finals_and_an_edge_per_pair_and_hub(
    spec: MachineSpec,
) -> None:
    text = mermaid(spec)
    lines = text.splitlines()
    assert lines[3] == "stateDiagram-v2"
    d = drawing(spec)
    edges = [ln for ln in lines if " --> " in ln and "[*]" not in ln]
    assert len(edges) == len(d.edges) + len(d.hubs)
    assert sum(1 for ln in lines if ln.strip().startswith("[*] -->")) == 1
    finals = [s for s in spec.states if s.final]
    assert sum(1 for ln in lines if ln.endswith("--> [*]")) == len(finals)
    for ln in lines[4:]:
        # after the state id and its ` : `, a label may not hold a bare ':' or ';' (they
        # end it): both are Mermaid entity codes
        head, _, label = ln.partition(" : ")
        assert ":" not in label, ln
        assert ";" not in re.sub(r"#\d+;", "", label), ln
        assert re.fullmatch(
            r"\s+(\[\*\]|\w+)( --> (\[\*\]|\w+))?|\s+state \"[^\"]+\" as \w+"
            r"|\s+classDef hub .*|\s+class \w+ hub",
            head,
        ), ln


def test_mermaid_lists_internal_rows_timeouts_and_tasks_in_the_state() -> None:
    text = mermaid(MACHINES["avatar"])
    assert "    routing : routing" in text  # the title line, so details do not replace it
    assert "routing : after join_timeout (30s)#58;\n    routing : join_timeout\n" in text
    assert (
        "routing : internal#58;\n    routing : \u2022 room_connected\n"
        "    routing : / check_presence\n" in text
    )
    assert "joined --> clearing : interrupt [clear_pending]" in text
    assert "clearing : task follow_plugin_clear" in text
    assert "routing --> joined : \u2022 avatar_connected [has_video]<br>\u2022 video_pub" in text
    assert 'state "from every other state" as into_closed' in text
    assert "into_closed : idle#58; close / unhook" in text
    assert "into_closed --> closed\n    class into_closed hub" in text
    job = mermaid(MACHINES["job"])
    assert "closing : task run_close" in job
    assert "[else]" in job.split("serving --> closing : ")[1].split("\n")[0]
    part = mermaid(MACHINES["participant"])
    assert "[else if is_linked and grace_enabled]" in part


def test_odd_names_are_declared_with_safe_ids() -> None:
    text = mermaid(ODD)
    assert 'state "start-1" as start_1' in text
    assert 'state "end" as s_end' in text  # a Mermaid keyword
    assert "[*] --> start_1" in text and "s_end --> [*]" in text
    assert "title: odd_machine_1" in text


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_dot_is_accepted_by_graphviz(spec: MachineSpec, tmp_path: Path) -> None:
    text = dot(spec)
    d = drawing(spec)
    assert text.count(" -> ") == len(d.edges) + len(d.hubs) + 1
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed")
    done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "<svg" in done.stdout


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_markdown_table_has_every_cell(spec: MachineSpec) -> None:
    text = markdown_table(spec)
    grid = [ln for ln in text.splitlines() if ln.startswith("| `")]
    table = cell_table(spec)
    events = grid[: len(spec.events)]
    for line, event in zip(events, spec.events, strict=True):
        cols = re.split(r"(?<!\\)\|", line)[1:-1]
        assert len(cols) == len(spec.states) + 1, line
        for col, state in zip(cols[1:], table["states"], strict=True):
            kind = table["cells"][state][event]["kind"]
            expect = {"ignore": "ignore", "reject": "**reject**", "transition": ""}[kind]
            assert col.strip().startswith(expect) or kind == "transition"
            if kind == "transition":
                assert "→" in col or "internal" in col


def test_markdown_shows_guards_in_order_timeouts_tasks_and_error_events() -> None:
    text = markdown_table(MACHINES["participant"])
    assert (
        "1. [is_linked and closing_reason] → closing / close_session<br>"
        "2. [is_linked and grace_enabled] → grace<br>"
        "3. [is_linked] → closing / close_session<br>4. else internal"
    ) in text
    assert "| `grace` |  | `grace_timeout` after `grace_period` (default 15s) |" in text
    assert "| `close_session` | `close_failed` |" in text
    assert "ignore (nobody is linked)" in text
    job = markdown_table(MACHINES["job"])
    assert (
        "| `closing` |  | `close_timeout` after `close_timeout` (default 10s) | `run_close` |"
        in (job)
    )
    assert "**reject** (already started)" in markdown_table(MACHINES["avatar"])
    odd = markdown_table(ODD)
    assert "ignore (a \\| note)" in odd  # a pipe would split the column


def test_terminal_table_lists_every_cell_per_state() -> None:
    text = terminal_table(MACHINES["participant"])
    assert "grace   (timeout: after grace_period (default 15s) fires grace_timeout)" in text
    lines = text.splitlines()
    i = lines.index("linked")
    assert lines[i + 2].split() == [
        "participant_disconnected",
        "[is_linked",
        "and",
        "closing_reason]",
        "->",
        "closing",
        "/",
        "close_session",
    ]
    assert lines[i + 5].strip() == "else internal"
    assert "REJECT  (already started)" in terminal_table(MACHINES["avatar"])


def test_output_is_deterministic() -> None:
    first = diagram_files(MACHINES)
    again = diagram_files(dict(MACHINES))
    assert first == again
    assert list(first) == [
        *(f"{n}.{ext}" for n in MACHINES for ext in ("mmd", "dot", "md", "svg")),
        "whole-job.mmd",
        "whole-job.dot",
        "README.md",
    ]


def test_readme_embeds_every_mermaid_diagram_and_links_the_tables() -> None:
    readme = diagram_files(MACHINES)["README.md"]
    for name, spec in MACHINES.items():
        assert "```mermaid\n" + mermaid(spec) + "```" in readme
        assert f"[{name}.md]({name}.md)" in readme


def test_golden_dump_is_one_cell_a_line_and_valid_json() -> None:
    import json

    table = cell_table(MACHINES["job"])
    text = dump_cell_table(table)
    assert json.loads(text) == table
    assert '      "hold_timeout": {"kind": "transition", "rows": [{"dest": "closing"' in text


def test_golden_command_writes_one_table_per_machine_and_drops_stale_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verification.golden import main

    (tmp_path / "robot.json").write_text("{}")
    assert main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{m}.json" for m in MACHINES)
    for name, spec in MACHINES.items():
        assert (tmp_path / f"{name}.json").read_text() == dump_cell_table(cell_table(spec))
    assert capsys.readouterr().out.count("wrote ") == len(MACHINES)


def test_the_golden_tables_are_what_the_command_writes() -> None:
    """``tests/tables`` is the command's default, and the checked-in tables are current."""
    from verification.golden import TABLES

    assert Path(__file__).parent / "tables" == TABLES
    for name, spec in MACHINES.items():
        assert (TABLES / f"{name}.json").read_text() == dump_cell_table(cell_table(spec))


# -- the whole job ----------------------------------------------------------------------------


def test_the_whole_job_draws_every_declared_channel() -> None:
    from statemachines.links import LINKS
    from statemachines.routing import ROUTES
    from statemachines.system import FOLLOW_ORDER, RELEASE, REPORTS, TEARDOWN, WATCHES

    view = system_view(MACHINES)
    assert view.machines == tuple(MACHINES)
    by_pair = {(c.source, c.target, c.kind): c for c in view.channels}
    for r in ROUTES:
        ch = by_pair[("room", r.machine, "route")]
        assert f"{r.fact} → {r.event}" in ch.short
        assert any(line.startswith(r.fact) and line.endswith(f"→ {r.event}") for line in ch.lines)
    for k in LINKS:
        ch = by_pair[(k.source, k.target, "link")]
        # a step's number in the order of the task that fires it (TEARDOWN or RELEASE)
        steps = [t.name for t in (RELEASE if k.on == "run_teardown" else TEARDOWN)]
        at = f" step {steps.index(k.step) + 1}" if k.step else ""
        assert f"{k.on}{at} → {k.event}" in ch.short
    for w in WATCHES:
        assert any(
            line.endswith(f"→ {w.event}") for line in by_pair[(w.source, w.target, "watch")].short
        )
    for rep in REPORTS:  # what a runtime reports of its livekit part, to another machine
        assert f"{rep.report} → {rep.event}" in by_pair[(rep.source, rep.target, "report")].short
    assert by_pair[("avatar", "playout", "report")].short == (
        "segment_flushed → handed_off",
        "playback_finished → playback_finished",
    )
    # what the declarations say, in words
    assert by_pair[("avatar", "playout", "watch")].short == (
        "leaves joined or clearing → avatar_left",
        "enters joined or clearing → avatar_joined",
    )
    assert by_pair[("job", "agent_job", "watch")].short == (
        "enters closed → job_closed",
        "enters awaiting_finalize → job_holding",
    )
    assert "agent thinking → agent_thinking" in by_pair[("agent_session", "playout", "watch")].lines
    # the follow order on the room's arrows, the teardown's step numbers on run_close's
    for i, machine in enumerate(FOLLOW_ORDER):
        assert by_pair[("room", machine, "route")].heading.startswith(("1st", "2nd", "3rd")[i])
    assert by_pair[("job", "session_host", "link")].short == ("run_close step 1 → close",)
    assert [name for name, _ in view.orders] == ["TEARDOWN", "RELEASE"]
    assert view.orders[0][1][0][0] == "host (30%)"
    files = system_files(MACHINES)
    dot_text, mmd = files["whole-job.dot"], files["whole-job.mmd"]
    assert dot_text.count(" -> ") == len(view.channels)
    assert sum(1 for ln in mmd.splitlines() if "-->|" in ln or "-.->|" in ln) == len(view.channels)
    for name in MACHINES:
        assert f'  "{name}";' in dot_text
    assert "TEARDOWN, in order" in dot_text and "RELEASE, in order" in mmd


def test_agent_states_are_livekits() -> None:
    from typing import get_args

    from livekit.agents.voice.events import AgentState

    assert set(AGENT_STATES) == set(get_args(AgentState))


def test_the_whole_job_reads_statemachines_system_when_it_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24's module, in shapes it may take: watches as models naming two machines and a
    function of a state change, the follow order, teardown steps (some run at once)."""
    import sys
    import types

    from pydantic import BaseModel

    from statemachines.glue import agent_state_event, avatar_change_event

    class Watch(BaseModel):
        source: str
        target: str
        event_of: object
        note: str = ""

    fake = types.ModuleType("statemachines.system")
    fake.WATCHES = (  # type: ignore[attr-defined]
        Watch(source="avatar", target="playout", event_of=avatar_change_event),
        {"watched": "participant", "by": "playout", "note": "the link"},
        ("job", "nobody"),  # names one machine only: listed, not drawn
        {"source": "agent_session", "target": "playout", "event_of": agent_state_event},
    )
    fake.FOLLOW_ORDER = ("job", "avatar", "participant")  # type: ignore[attr-defined]
    fake.TEARDOWN = (  # type: ignore[attr-defined]
        "session_host",
        ("avatar", "participant"),
        {"name": "room", "bound": 0.25, "what": "the room goes"},
    )
    monkeypatch.setitem(sys.modules, "statemachines.system", fake)
    view = system_view(MACHINES)
    watches = [c for c in view.channels if c.kind == "watch"]
    assert [(c.source, c.target) for c in watches] == [
        ("avatar", "playout"),
        ("participant", "playout"),
        ("agent_session", "playout"),  # not a machine: its function is named, not evaluated
    ]
    assert watches[0].lines == (
        "leaves routing for joined → avatar_joined",
        "leaves joined, clearing for failed, closed → avatar_left",
    )
    assert watches[1].lines == ("state changes - the link",)
    assert watches[2].lines[0] == "event_of agent_state_event"
    assert view.follow_order == ("job", "avatar", "participant")
    ((name, steps),) = view.orders
    assert name == "TEARDOWN"
    assert steps == (
        ("session_host", "session_host"),
        ("avatar and participant (at once)", "avatar and participant (at once)"),
        ("room (25%)", "room (25%): the room goes"),
    )
    dot_text = system_dot(view)
    assert "(1st to hear a fact)" in dot_text
    assert "2. avatar and participant" in dot_text
    section = "\n".join(system_markdown(view))
    assert "Room facts are followed in this order: job, avatar, participant." in section
    assert "3. room (25%): the room goes" in section


def test_the_whole_job_without_statemachines_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """A revision before issue 24: the playout machine's follows come from glue's functions."""
    import sys

    import statemachines.glue  # today's glue reads the module itself: loaded before it goes

    assert statemachines.links.LINKS
    monkeypatch.setitem(sys.modules, "statemachines.system", None)  # import fails as if absent
    view = system_view(MACHINES)
    assert view.orders == () and view.follow_order == ()
    by_pair = {(c.source, c.target, c.kind): c for c in view.channels}
    assert by_pair[("avatar", "playout", "watch")].lines == (
        "leaves routing for joined → avatar_joined",
        "leaves joined, clearing for failed, closed → avatar_left",
    )
    assert ("job", "agent_job", "watch") not in by_pair
    assert "(`WATCHES`)" not in "\n".join(system_markdown(view))
