"""``agent-runtime timeline`` and ``simulate --html``: the page, in a real headless browser.

Real: a bundled scenario run through the scenario runner into a JSONL trace, the page
drawn from it, Debian's Chromium driven by selenium through Debian's chromedriver (clicks and
key presses as a person makes them). Skipped, with the reason, only where no Chromium or
chromedriver is installed (`.ci/run` installs them).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from agent_runtime import read_trace
from agent_runtime.testing.entrypoint import EntrypointRunner
from agent_runtime.testing.inmemory import InMemoryRoom
from agent_runtime.tools.cli import main as cli
from agent_runtime.tools.drawing import drawing
from agent_runtime.tools.timeline import diagram_svg, timeline_html
from statemachines.machines import MACHINES

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "scenarios" / "sim_hangup_then_finalize.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The page and the trace of the seed scenario, made by ``simulate --trace --html``."""
    out = tmp_path_factory.mktemp("timeline")
    trace, html = out / "run.jsonl", out / "page.html"
    assert cli(["simulate", str(SCENARIO), "--trace", str(trace), "--html", str(html)]) == 0
    return trace, html


def lanes_in(trace: Path) -> list[str]:
    """The machine instances that wrote records, in MACHINES order: what the lanes must be."""
    seen: list[tuple[str, str]] = []
    for line in trace.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        key = (rec["machine"], rec["instance"])
        if rec["kind"] != "input" and key not in seen:
            seen.append(key)
    order = list(MACHINES)
    return [m for m, _ in sorted(seen, key=lambda k: order.index(k[0]))]


def test_the_page_is_self_contained(page: tuple[Path, Path]) -> None:
    text = page[1].read_text(encoding="utf-8")
    assert "://" not in text  # no address of any kind: nothing to fetch
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\bsrc=|@import", text)
    assert re.findall(r"url\(([^)]*)\)", text) and all(
        u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", text)
    )


def test_every_machine_draws_without_graphviz() -> None:
    for name, spec in MACHINES.items():
        svg = diagram_svg(spec, standalone=False)
        states = re.findall(r'<g class="state" data-machine="([^"]+)" data-state="([^"]+)"', svg)
        assert states == [(name, s) for s in spec.state_names]
        edges = set(re.findall(r'<g class="edge" data-source="([^"]+)" data-dest="([^"]+)"', svg))
        hubs = set(re.findall(r'<g class="hub" data-dest="([^"]+)"', svg))
        # every transition to another state is drawn: as its own edge, or in the box of
        # rows entering its dest from many states
        want = {(r.source, r.dest) for r in spec.rows if r.dest not in (None, r.source)}
        assert (
            {(s, d) for s, d in want if d not in hubs}
            <= edges
            <= want | {(r.source, r.source) for r in spec.rows if r.dest == r.source}
        )
        assert hubs == {h.dest for h in drawing(spec).hubs}


def _boxes(svg: str) -> dict[str, list[tuple[str, ...]]]:
    """Each state's, edge's and hub's shapes (their geometry), by what they draw."""
    root = ElementTree.fromstring(re.sub(r' xmlns="[^"]+"', "", svg))
    out: dict[str, list[tuple[str, ...]]] = {}
    for g in root.iter("g"):
        key = " ".join(
            g.get(a, "") for a in ("class", "data-state", "data-source", "data-dest")
        ).strip()
        out[key] = [
            tuple(el.get(a, "") for a in ("x", "y", "width", "height", "d"))
            for el in g
            if el.tag in ("rect", "path")
        ]
    return out


def test_the_page_shows_the_picture_diagrams_writes(
    page: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One layout: each diagram on the page has the boxes, edges and hubs of
    ``diagrams/NAME.svg`` where that file has them, and the same size."""
    assert cli(["diagrams", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    text = page[1].read_text(encoding="utf-8")
    shown = re.findall(r'<svg class="diagram" data-machine="([^"]+)".*?</svg>', text, re.S)
    assert shown == lanes_in(page[0])
    for name in shown:
        embedded = re.search(rf'<svg class="diagram" data-machine="{name}".*?</svg>', text, re.S)
        assert embedded is not None
        written = (tmp_path / f"{name}.svg").read_text(encoding="utf-8")
        page_boxes, file_boxes = _boxes(embedded.group()), _boxes(written)
        assert page_boxes == file_boxes and len(file_boxes) >= len(MACHINES[name].states)
        size = r'width="(\d+)" height="(\d+)"'
        assert re.findall(size, embedded.group())[0] == re.findall(size, written)[0]


def test_a_trace_of_a_machine_this_build_lacks_still_draws() -> None:
    from agent_runtime.observe.trace import TraceRecord

    records = [
        TraceRecord(0.0, "transition", "lift", "l1", event="call", source="idle", dest="moving"),
        TraceRecord(2.0, "transition", "lift", "l1", event="arrive", source="moving", dest="idle"),
    ]
    html = timeline_html(records, title="lift")
    assert 'data-label="lift"' in html and "no spec for machine lift in this build" in html


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the trace"),
        ("{oops\n", ":1: not JSON"),
        ('{"t": 0, "kind": "transition", "machine": "job", "instance": "", "x": 1}\n', ":1: "),
        # an empty trace drew an empty page, exit 0 (replay and record refuse it)
        ("", "t.jsonl: nothing to draw: the trace is empty"),
        ("\n  \n", "t.jsonl: nothing to draw: the trace is empty"),
    ],
    ids=["missing", "not-json", "unknown-field", "empty", "blank-lines"],
)
def test_a_trace_that_cannot_be_drawn_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    trace = tmp_path / "t.jsonl"
    if content is not None:
        trace.write_text(content, encoding="utf-8")
    out = tmp_path / "page.html"
    assert cli(["timeline", str(trace), "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("agent-runtime timeline: ")
    assert message in err[0] and not out.exists()


def test_dash_writes_the_page_to_stdout_and_no_file_named_dash(
    page: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ``-o -`` wrote a file named "-" in the working directory (a trial's)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli(["timeline", str(page[0]), "-o", "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("<!DOCTYPE html>") and out.rstrip().endswith("</html>")
    assert "<svg" in out and "run.jsonl" in out  # the trace's page, titled by its name
    assert err == "" and list(tmp_path.iterdir()) == []


def test_a_page_that_cannot_be_written_is_one_line(
    page: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("mine")
    target = tmp_path / "a-file" / "page.html"
    assert cli(["timeline", str(page[0]), "-o", str(target)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"agent-runtime timeline: {target}: cannot write the page (Not a directory)"


# -- in the browser ----------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "no Chromium here: apt-get install chromium chromium-driver (.ci/run installs them)"
        )
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (the dev extra has it)"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def lit(driver: Any, machine: str) -> list[str]:
    return [
        el.get_attribute("data-state")
        for el in driver.find_elements("css selector", f'g.state.lit[data-machine="{machine}"]')
    ]


def test_in_a_browser_the_lanes_match_the_trace_and_the_scrubber_lights_the_state(
    page: tuple[Path, Path], browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    trace, html = page
    browser.get(html.as_uri())
    assert browser.title == "sim_hangup_then_finalize.yaml: timeline"
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

    labels = [
        el.get_attribute("data-label") for el in browser.find_elements("css selector", "g.lane")
    ]
    assert labels == lanes_in(trace)
    assert labels == [
        "job",
        "session_host",
        "participant",
        "room_deletion",
        "finalize",
        "session",
        "agent_job",
    ]
    shown = [el.text for el in browser.find_elements("css selector", "text.lane-label")]
    assert shown == labels
    diagrams = browser.find_elements("css selector", "svg.diagram")
    assert [d.get_attribute("data-machine") for d in diagrams] == labels

    # at the start: the job serving, the user linked
    assert lit(browser, "job") == ["serving"] and lit(browser, "participant") == ["linked"]
    scrubber = browser.find_element("id", "scrubber")
    scrubber.send_keys(Keys.END)  # to the end, by keyboard
    assert lit(browser, "job") == ["closed"] and lit(browser, "session_host") == ["closed"]
    assert browser.find_element("id", "now").text == "t = 30.000 s"

    # a click on the timeline at t=12 (the hold: the session closed at 10, verdict at 14)
    svg = browser.find_element("id", "timeline")
    left, plot = float(svg.get_attribute("data-left")), float(svg.get_attribute("data-plot"))
    t0, t1 = float(svg.get_attribute("data-t0")), float(svg.get_attribute("data-t1"))
    x = left + (12 - t0) / (t1 - t0) * plot
    ActionChains(browser).move_to_element_with_offset(
        svg, round(x - svg.size["width"] / 2), 0
    ).click().perform()
    assert abs(float(scrubber.get_attribute("value")) - 12) < 0.1
    assert lit(browser, "job") == ["awaiting_finalize"]
    assert lit(browser, "participant") == ["closed"]
    rows = browser.find_elements("css selector", "#states tr")
    assert [r.text.split()[:2] for r in rows] == [
        ["job", "awaiting_finalize"],
        ["session_host", "detached"],
        ["participant", "closed"],
        ["room_deletion", "requested"],
        ["finalize", "idle"],
        ["session", "ended"],  # the user hung up at 10: the job's own session ended
        ["agent_job", "running"],
    ]
    browser.find_element("id", "next").click()  # the next transition: the verdict, t=14
    assert lit(browser, "job") == ["closed"]  # closing lasted no virtual time
    assert browser.find_element("id", "now").text == "t = 14.000 s"
    scrubber.send_keys(Keys.HOME)
    assert lit(browser, "job") == ["serving"]
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    scrubber.send_keys(Keys.END)
    ActionChains(browser).move_to_element_with_offset(
        svg, round(x - svg.size["width"] / 2), 0
    ).click().perform()
    shot = tmp_path / "timeline.png"
    assert browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")


def test_simulate_html_draws_one_file_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "page.html"
    assert cli(["simulate", str(SCENARIO), str(SCENARIO), "--html", str(out)]) == 2
    assert (
        capsys.readouterr().err.strip() == "agent-runtime simulate: --html draws exactly one FILE"
    )
    assert not out.exists()
    # under --json, the error object as every other refusal gives it
    assert cli(["simulate", str(SCENARIO), str(SCENARIO), "--html", str(out), "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {
        "ok": False,
        "file": None,
        "error": "--html draws exactly one FILE",
    }


def test_simulate_html_dash_is_refused_not_mixed_into_the_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the timeline's ``-o -`` (stdout) reached ``simulate --html -`` through the page
    # drawing they share: the page went to stdout ahead of the report (and of --json's
    # object, which no longer parsed)
    monkeypatch.chdir(tmp_path)
    why = "--html -: the run's report goes to stdout; name a file for the page"
    assert cli(["simulate", str(SCENARIO), "--html", "-"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"agent-runtime simulate: {why}"
    assert cli(["simulate", str(SCENARIO), "--html", "-", "--json"]) == 2
    assert json.loads(capsys.readouterr().out) == {"ok": False, "file": None, "error": why}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("later", [0.0, 0.05], ids=["same-instant", "a-few-pixels-later"])
def test_a_failed_effect_is_not_hidden_under_one_drawn_at_the_same_instant(
    tmp_path: Path, later: float
) -> None:
    # the avatar's failed start and the restore it causes are at one instant (or a little
    # later, on a real clock): the restore's green mark was drawn over the red one, so the
    # page showed no failure
    scenario = tmp_path / "fails_once.yaml"
    scenario.write_text(
        "name: avatar start fails once, retry joins\n"
        "config: {avatar_identity: av, retry_avatar: {attempts: 1, backoff: {initial: 0.5}}}\n"
        "participants: [{identity: alice}]\n"
        "steps:\n"
        "  - {at: 0, event: session.start}\n"
        "  - {at: 0, event: avatar.start_error, times: 1}\n"
        "  - {at: 3, event: participant_connected, identity: av, kind: agent}\n"
        "  - {at: 3.2, event: track_published, identity: av, kind: video}\n"
        "  - {at: 20, event: end}\n",
        encoding="utf-8",
    )
    trace, html = tmp_path / "t.jsonl", tmp_path / "page.html"
    assert cli(["simulate", str(scenario), "--trace", str(trace)]) == 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    first = next(i for i, r in enumerate(records) if r.get("effect") == "restore_route")
    for rec in records[first:]:  # the restore and all after it: the times still go on
        rec["t"] += later
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli(["timeline", str(trace), "-o", str(html)]) == 0
    marks = re.findall(
        r'<path class="mark effect( failed)?" d="([^"]+)"><title>([^<]*)</title>', html.read_text()
    )
    failure = [(d, tip) for bad, d, tip in marks if "start_plugin: error" in tip]
    assert len(failure) == 1, marks
    at, tip = failure[0]
    drawn_there = [bad for bad, d, _ in marks if d == at]
    assert drawn_there == [" failed"]  # one mark at that spot, red
    assert "restore_route: ok" in tip  # naming each effect drawn there


def test_tiny_times_read_as_plain_seconds() -> None:
    # the header read "0 s to 1.4001e-05 s" for a production trace's first records
    from agent_runtime.observe.trace import TraceRecord

    records = [
        TraceRecord(0.0, "transition", "job", "r", event="start", source="serving", dest="serving"),
        TraceRecord(1.4001e-05, "transition", "job", "r", event="shutdown", source="serving",
                    dest="closing"),
    ]  # fmt: skip
    html = timeline_html(records, title="tiny")
    assert "0 s to 0.000014001 s on the job" in html and "1.4001e-05 s" not in html


async def test_a_production_traces_page_draws_its_inputs_as_record_rebuilds_them(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    agent_room: InMemoryRoom,
    run_entrypoint: EntrypointRunner,
    browser: Any,
) -> None:
    """A deployed job's trace holds no input records, only the machines' events: its page
    drew an inputs strip with nothing in it. It now draws the steps ``record`` rebuilds
    (here: the example agent traced as deployed, ``AGENT_TRACE``, on the kit's room)."""
    from livekit import rtc

    from examples import agent

    monkeypatch.setenv("AGENT_TRACE", str(tmp_path / "{job_id}.jsonl"))
    monkeypatch.delenv("AGENT_AVATAR", raising=False)
    agent_room.add_participant("user")
    await run_entrypoint(agent.server)
    await run_entrypoint.clock.advance(3)
    agent_room.remove_participant("user", rtc.DisconnectReason.CLIENT_INITIATED)
    await run_entrypoint.wait_ended()
    trace, html = tmp_path / "test-job.jsonl", tmp_path / "page.html"
    assert "input" not in {r.kind for r in read_trace(trace)}  # a production trace
    assert cli(["timeline", str(trace), "-o", str(html)]) == 0

    browser.get(html.as_uri())
    marks = browser.find_elements("css selector", "svg#timeline path.input")
    tips = [m.find_element("css selector", "title").get_attribute("textContent") for m in marks]
    assert [t.split(" {")[0] for t in tips] == [
        "t=0 session.start",
        "t=3 participant_disconnected",
        "t=3 end",
    ]
    assert '"identity": "user"' in tips[1] and '"reason": "CLIENT_INITIATED"' in tips[1]
    # each where its time is on the axis
    svg = browser.find_element("id", "timeline")
    left, plot = float(svg.get_attribute("data-left")), float(svg.get_attribute("data-plot"))
    t0, t1 = float(svg.get_attribute("data-t0")), float(svg.get_attribute("data-t1"))
    tips_x = [m.location["x"] + m.size["width"] / 2 - svg.location["x"] for m in marks]
    assert [round(x) for x in tips_x] == [
        round(left + (t - t0) / (t1 - t0) * plot) for t in (0, 3, 3)
    ]
    assert (
        "as agent-runtime record rebuilds it"
        in browser.find_element("css selector", ".legend").text
    )
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_a_trace_no_inputs_can_be_rebuilt_from_draws_no_inputs_strip() -> None:
    """Nothing to draw there (``record`` finds no machine event to rebuild from): the strip
    and its legend are left out, not drawn empty."""
    from agent_runtime.observe.trace import TraceRecord

    records = [TraceRecord(0.0, "effect", "job", "r", effect="run_close", outcome="ok")]
    html = timeline_html(records, title="no inputs")
    assert 'class="strip-label">inputs<' not in html and "input (purple" not in html
    assert '<g class="lane" data-label="job"' in html  # the lane itself is drawn


def test_a_trace_record_cannot_read_still_gets_its_page() -> None:
    """A production trace whose facts ``record`` cannot read (here a participant's
    attributes that are not a mapping: a hand-edited or damaged trace) is still drawn, as
    it was before the inputs strip was rebuilt from it."""
    from agent_runtime.observe.trace import TraceRecord

    joined = {"identity": "user", "kind": "standard", "attributes": "not a mapping"}
    records = [
        TraceRecord(
            0.0, "transition", "participant", "r", event="participant_connected",
            source="waiting", dest="linked", data=joined,
        ),
    ]  # fmt: skip
    html = timeline_html(records, title="damaged")
    assert '<g class="lane" data-label="participant"' in html
    # record itself refuses it with a clear line (a traceback before)
    from agent_runtime.tools.record import RecordError, record

    with pytest.raises(RecordError, match=r"t=0: 'user''s attributes are str, not a mapping"):
        record(records, name="damaged")
    # so are the attributes a fact says changed (the simulator's, routed to the job)
    left = {"identity": "user", "changed": "not a mapping"}
    good = {**joined, "attributes": {}}
    changed = [
        dataclasses.replace(records[0], data=good),
        TraceRecord(
            1.0, "transition", "job", "r", event="simulator_left",
            source="serving", dest="closing", data=left,
        ),
    ]  # fmt: skip
    assert '<g class="lane" data-label="job"' in timeline_html(changed, title="damaged")
    with pytest.raises(RecordError, match=r"t=1: 'user''s changed attributes are str"):
        record(changed, name="damaged")
