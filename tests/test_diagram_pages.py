"""Every diagram, as a reviewer sees it: drawn by headless Chromium in a 1,000 px column.

Each SVG (a machine's as ``agent-runtime diagrams`` draws it, the whole job's rendered now by
Graphviz from its DOT file) is shown as a code host shows an image (natural size, scaled down
to the column); each Mermaid file is drawn by Mermaid 11 from the npm registry
(``tests/js/mermaid``, installed by ``.ci/mermaid``). The page is then measured: the smallest
line of any label must be at least MIN_LINE px high, no label may cross another, and a diagram
scaled to the column keeps an aspect near a page's (not a thin strip). A screenshot of each
page is written to ``build/diagram-screenshots/`` for the reviewer.

Real: Chromium, chromedriver, Graphviz's ``dot``, Mermaid. Nothing is faked. A link to a
region of a machine's SVG (as ``agent-runtime diff`` prints) is opened there too.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.tools.drawing import cell_regions
from agent_runtime.tools.render import diagram_files
from agent_runtime.tools.system_diagram import NAME as WHOLE_JOB
from statemachines.machines import MACHINES
from tests.support.diagram_page import (
    CHROMEDRIVER,
    CHROMIUM,
    COLUMN,
    MERMAID_JS,
    ROOT,
    SCREENSHOTS,
    browser,
    mermaid_page,
    render,
    svg_page,
)

# a diagram, rendered from the specs as written
pytestmark = pytest.mark.snapshot

MIN_LINE = 10.0  # px: the smallest label line a reviewer reads at the column's width
MIN_ASPECT = 0.45  # height / width of a diagram scaled down to the column

NAMES = [*MACHINES, WHOLE_JOB]


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "no Chromium here: apt-get install chromium chromium-driver (.ci/run installs them)"
        )
    pytest.importorskip("selenium", reason="selenium is not installed (the dev extra has it)")
    with browser() as d:
        yield d


@pytest.fixture(scope="module")
def mermaid_installed() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("no Node.js here: Mermaid cannot be installed to draw the .mmd files")
    if not MERMAID_JS.is_file():
        done = subprocess.run(
            ["bash", str(ROOT / ".ci" / "mermaid")], capture_output=True, text=True, check=False
        )
        assert MERMAID_JS.is_file(), (
            "Mermaid is not installed and `bash .ci/mermaid` could not install it:\n" + done.stderr
        )


@pytest.fixture(scope="module")
def svgs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every machine's SVG as ``diagrams`` writes it; the whole job's, Graphviz's, only
    where Graphviz is installed."""
    out = tmp_path_factory.mktemp("svg")
    for name, text in diagram_files(MACHINES).items():
        if name.endswith((".svg", ".dot")):
            (out / name).write_text(text, encoding="utf-8")
    dot = shutil.which("dot")
    if dot is not None:
        src = out / f"{WHOLE_JOB}.dot"
        subprocess.run([dot, "-Tsvg", str(src), "-o", str(src.with_suffix(".svg"))], check=True)
    return out


def _check(name: str, rendering: Any) -> None:
    line, text = rendering.smallest_line
    assert line >= MIN_LINE, (
        f"{name}: at {COLUMN} px its smallest label line is {line:.1f} px ({text!r}); "
        f"see {SCREENSHOTS / name}.png"
    )
    assert rendering.overlaps() == [], f"{name}: labels cross: {rendering.overlaps()[:5]}"
    if rendering.width >= COLUMN - 1:  # scaled down: not a strip across the page
        aspect = rendering.height / rendering.width
        assert aspect >= MIN_ASPECT, f"{name}: {rendering.width:.0f} x {rendering.height:.0f}"


@pytest.mark.parametrize("name", NAMES)
def test_svg_reads_at_a_review_column(name: str, svgs: Path, driver: Any, tmp_path: Path) -> None:
    if not (svgs / f"{name}.svg").is_file():
        pytest.skip("Graphviz is not installed (.ci/run installs it): no whole-job.svg")
    page = svg_page((svgs / f"{name}.svg").read_text(encoding="utf-8"))
    rendering = render(driver, page, tmp_path, SCREENSHOTS / f"{name}.svg.png")
    assert rendering.labels, f"{name}.svg drew no text"
    _check(f"{name}.svg", rendering)


@pytest.mark.parametrize("name", NAMES)
def test_mermaid_reads_at_a_review_column(
    name: str, mermaid_installed: None, driver: Any, tmp_path: Path
) -> None:
    source = diagram_files(MACHINES)[f"{name}.mmd"]
    rendering = render(driver, mermaid_page(source), tmp_path, SCREENSHOTS / f"{name}.mmd.png")
    assert rendering.labels, f"{name}.mmd drew no text"
    texts = " ".join(label.text for label in rendering.labels)
    assert "Unsupported markdown" not in texts and "Syntax error" not in texts
    _check(f"{name}.mmd", rendering)


@pytest.mark.parametrize("name", list(MACHINES))
def test_a_link_to_a_region_outlines_it(name: str, svgs: Path, driver: Any) -> None:
    """Each region ``agent-runtime diff`` can link to, opened in the browser as
    ``NAME.svg#REGION``, is drawn in red; the regions not linked keep their colours."""
    regions = sorted(
        {
            ident
            for cells in cell_regions(MACHINES[name]).values()
            for r in cells.values()
            for ident, _ in r
        }
    )
    for ident in regions:
        driver.get(f"{(svgs / f'{name}.svg').as_uri()}#{ident}")
        strokes = driver.execute_script(
            "return [...document.querySelectorAll('rect, path')].map(e => "
            "[e.closest('[id]') ? e.closest('[id]').id : '', getComputedStyle(e).stroke])"
        )
        red = {owner for owner, stroke in strokes if stroke == "rgb(209, 36, 47)"}
        assert red == {ident}, f"{name}.svg#{ident}: drawn red: {sorted(red)}"
