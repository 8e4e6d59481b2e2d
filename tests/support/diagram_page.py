"""Render a diagram the way a reviewer sees it, in headless Chromium, in a 1,000 px column.

An SVG is shown as a code host shows an image: its natural size, scaled down to the
column when wider. A Mermaid file is rendered by Mermaid itself (the npm package under
``tests/js/mermaid``, installed by ``.ci/mermaid``), in the same column, as code hosts do.

Every line of every label is measured from the page (``Range.getClientRects`` of each text
node), so the figures are what the browser drew, not what the renderer asked for.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MERMAID_DIR = ROOT / "tests" / "js" / "mermaid"
MERMAID_JS = MERMAID_DIR / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
SCREENSHOTS = ROOT / "build" / "diagram-screenshots"
COLUMN = 1000  # px: a review column

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<style>body {{ margin: 0; background: #fff; }} #col {{ width: {col}px; }}</style>
{head}</head>
<body><div id="col">{body}</div></body></html>
"""

# Each text node's line boxes; a label is one text node (one SVG <text>, or one HTML label).
_MEASURE = """
const col = document.getElementById('col');
const svg = col.querySelector('svg');
const walker = document.createTreeWalker(svg, NodeFilter.SHOW_TEXT);
const labels = [];
for (let n = walker.nextNode(); n; n = walker.nextNode()) {
  if (!n.textContent.trim()) continue;
  const el = n.parentElement;
  const style = getComputedStyle(el);
  if (style.display === 'none' || style.visibility === 'hidden') continue;
  const range = document.createRange();
  range.selectNodeContents(n);
  const rects = [...range.getClientRects()]
    .filter(r => r.width > 0 && r.height > 0)
    .map(r => [r.left, r.top, r.width, r.height]);
  if (rects.length) labels.push({text: n.textContent.trim(), rects});
}
const box = svg.getBoundingClientRect();
return JSON.stringify({width: box.width, height: box.height, labels});
"""


@dataclass(frozen=True)
class Label:
    text: str
    rects: list[tuple[float, float, float, float]]  # left, top, width, height: one per line


@dataclass(frozen=True)
class Rendering:
    width: float
    height: float
    labels: list[Label]

    @property
    def smallest_line(self) -> tuple[float, str]:
        """The height of the smallest line of any label, and that label's text."""
        return min(((r[3], lb.text) for lb in self.labels for r in lb.rects), default=(0.0, ""))

    def overlaps(self, share: float = 0.25) -> list[tuple[str, str]]:
        """Pairs of labels whose lines cross: by more than a pixel across and more than
        ``share`` of the smaller line's height. (A line box is the font's ascent plus
        descent, taller than the ink: consecutive lines of one node touch by a few pixels.)"""
        found: list[tuple[str, str]] = []
        flat = [(i, r) for i, lb in enumerate(self.labels) for r in lb.rects]
        for a in range(len(flat)):
            i, (ax, ay, aw, ah) = flat[a]
            for b in range(a + 1, len(flat)):
                j, (bx, by, bw, bh) = flat[b]
                if i == j:
                    continue
                dx = min(ax + aw, bx + bw) - max(ax, bx)
                dy = min(ay + ah, by + bh) - max(ay, by)
                if dx > 1 and dy > share * min(ah, bh):
                    found.append((self.labels[i].text, self.labels[j].text))
        return found


def svg_page(svg: str) -> str:
    # an image at its natural size, scaled down to the column (max-width: 100%)
    script = """<script>
    window.addEventListener('load', () => {
      const svg = document.querySelector('#col svg');
      const w = svg.width.baseVal.value, h = svg.height.baseVal.value;
      const shown = Math.min(w, COLUMN);
      svg.setAttribute('width', shown + 'px');
      svg.setAttribute('height', (h * shown / w) + 'px');
      document.body.dataset.ready = '1';
    });
    </script>""".replace("COLUMN", str(COLUMN))
    body = svg[svg.index("<svg") :]
    return _PAGE.format(col=COLUMN, head=script, body=body)


def mermaid_page(source: str) -> str:
    script = f"""<script src="{MERMAID_JS.as_uri()}"></script>
    <script>
    window.addEventListener('load', async () => {{
      mermaid.initialize({{startOnLoad: false}});
      const text = {json.dumps(source)};
      try {{
        const {{svg}} = await mermaid.render('diagram', text);
        document.getElementById('col').innerHTML = svg;
      }} catch (e) {{
        document.body.dataset.error = String(e);
      }}
      document.body.dataset.ready = '1';
    }});
    </script>"""
    return _PAGE.format(col=COLUMN, head=script, body="")


@contextmanager
def browser() -> Iterator[Any]:
    """Headless Chromium through selenium (the caller checks CHROMIUM/CHROMEDRIVER)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--allow-file-access-from-files",
        "--force-device-scale-factor=1",
        f"--window-size={COLUMN + 40},900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER or ""))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def render(driver: Any, page: str, workdir: Path, screenshot: Path | None) -> Rendering:
    """Load ``page``, wait for it to draw, measure every label, optionally screenshot."""
    from selenium.webdriver.support.ui import WebDriverWait

    html = workdir / "page.html"
    html.write_text(page, encoding="utf-8")
    driver.set_window_size(COLUMN + 40, 900)
    driver.get(html.as_uri())
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1'")
    )
    error = driver.execute_script("return document.body.dataset.error || ''")
    if error:
        raise AssertionError(f"Mermaid refused the diagram: {error}")
    data = json.loads(driver.execute_script(_MEASURE))
    if screenshot is not None:
        # the whole page, however tall: Chromium's own capture beyond the viewport
        size = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
        )
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
            },
        )
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return Rendering(
        width=data["width"],
        height=data["height"],
        labels=[Label(lb["text"], [tuple(r) for r in lb["rects"]]) for lb in data["labels"]],
    )
