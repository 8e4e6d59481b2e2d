"""A trace as one self-contained HTML page: each machine's diagram, a timeline of the job
(a lane per machine instance, its states as bars, effects and rejects as marks, the
scenario's inputs above: for a production trace, which has none written, the steps
``agent-runtime record`` rebuilds from it, or no strip when none can be), and a scrubber
that lights each machine's state at that time in the diagrams.

Everything is inline (CSS, the SVG drawings, a little JavaScript): the page fetches nothing
and needs no Graphviz; the diagrams are ``machine_svg.py``'s, the pictures ``agent-runtime
diagrams`` writes as ``diagrams/NAME.svg`` (without their link ids). Open it at
``page.html#t=12`` to start the scrubber at t = 12.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_runtime.observe.trace import TraceRecord
from agent_runtime.testing.result import seconds_text as secs
from agent_runtime.tools.lanes import Lane, Lanes, summarise
from agent_runtime.tools.machine_svg import diagram_svg, esc, state_colour, text_width
from agent_runtime.tools.output import write_file
from agent_runtime.tools.record import RecordError, record
from statemachines import MachineSpec
from statemachines.machines import MACHINES

# -- the timeline ------------------------------------------------------------------------------

_LABEL_W = 170
_PLOT_W = 960
_LANE_H = 30
_LANE_GAP = 14
_TOP = 56  # the axis and the inputs strip


def _ticks(t0: float, t1: float) -> list[float]:
    span = t1 - t0
    raw = span / 8
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) / step + 1e-9) + 1)]


def _lanes_payload(lanes: Lanes, t1: float) -> list[dict[str, Any]]:
    return [
        {
            "label": lanes.label(lane),
            "machine": lane.machine,
            "instance": lane.instance,
            "segments": [
                [seg.state, seg.start, seg.end if seg.end is not None else t1, seg.entered_by]
                for seg in lane.segments
            ],
        }
        for lane in lanes.lanes()
    ]


def timeline_svg(
    lanes: Lanes,
    machines: Mapping[str, MachineSpec],
    t0: float,
    t1: float,
    inputs: Sequence[TraceRecord],
) -> str:
    """The timeline, ``inputs`` drawn above the lanes (none: no strip)."""
    ordered = lanes.lanes()
    span = (t1 - t0) or 1.0
    height = _TOP + len(ordered) * (_LANE_H + _LANE_GAP) + 10
    width = _LABEL_W + _PLOT_W + 20

    def x(t: float) -> float:
        return _LABEL_W + (t - t0) / span * _PLOT_W

    out = [
        f'<svg id="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'data-t0="{t0}" data-t1="{t1}" data-left="{_LABEL_W}" data-plot="{_PLOT_W}">',
        f'<rect x="{_LABEL_W}" y="0" width="{_PLOT_W}" height="{height}" fill="#fafafa"/>',
    ]
    for tick in _ticks(t0, t1):
        out.append(
            f'<line x1="{x(tick):.1f}" y1="14" x2="{x(tick):.1f}" y2="{height}" '
            'stroke="#e6e6e6"/>'
            f'<text x="{x(tick):.1f}" y="11" class="tick">{secs(tick)}s</text>'
        )
    if inputs:
        out.append('<text x="8" y="36" class="strip-label">inputs</text>')
    for rec in inputs:
        cx = x(rec.t)
        rpc = rec.event in ("rpc", "session_request")
        tip = f"t={secs(rec.t)} {rec.event} {summarise(rec.data)}"
        out.append(
            f'<path class="input{" rpc" if rpc else ""}" d="M{cx - 5:.1f},24 L{cx + 5:.1f},24 '
            f'L{cx:.1f},34 z"><title>{esc(tip)}</title></path>'
        )
    for i, lane in enumerate(ordered):
        y = _TOP + i * (_LANE_H + _LANE_GAP)
        spec = machines.get(lane.machine)
        label = lanes.label(lane)
        out.append(
            f'<g class="lane" data-label="{esc(label)}" data-machine="{esc(lane.machine)}" '
            f'data-instance="{esc(lane.instance)}">'
            f'<text x="8" y="{y + _LANE_H / 2 + 4:.1f}" class="lane-label">{esc(label)}'
            f"<title>{esc(lane.machine)} instance {esc(lane.instance or '(none)')}</title></text>"
        )
        out += _segments(lane, spec, y, x, t1)
        out += _marks(lane, y, x)
        out.append("</g>")
    out.append(
        f'<line id="cursor" x1="{_LABEL_W}" y1="14" x2="{_LABEL_W}" y2="{height}" '
        'stroke="#d00" stroke-width="1.5"/>'
    )
    out.append("</svg>")
    return "".join(out)


def _segments(lane: Lane, spec: MachineSpec | None, y: float, x: Any, t1: float) -> list[str]:
    out = []
    for seg in lane.segments:
        end = seg.end if seg.end is not None else t1
        x0, x1 = x(seg.start), x(end)
        w = max(x1 - x0, 2.0)
        entered = f", entered on {seg.entered_by}" if seg.entered_by else ""
        tip = f"{seg.state}: {secs(seg.start)}s to {secs(end)}s{entered}"
        out.append(
            f'<rect class="seg" data-state="{esc(seg.state)}" x="{x0:.1f}" y="{y:.1f}" '
            f'width="{w:.1f}" height="{_LANE_H}" rx="4" fill="{state_colour(spec, seg.state)}" '
            f'stroke="#777" stroke-width="0.6"><title>{esc(tip)}</title></rect>'
        )
        if w > text_width(seg.state, 6.6) + 8:
            out.append(
                f'<text x="{x0 + 5:.1f}" y="{y + 19:.1f}" class="seg-label">{esc(seg.state)}</text>'
            )
    return out


_MARK_W = 8.0  # an effect's mark is a diamond this wide


def _marks(lane: Lane, y: float, x: Any) -> list[str]:
    out = []
    base = y + _LANE_H + 1
    # effects whose marks would overlap are one mark, red if any failed, its title naming
    # each: a failure followed at once by a restore was drawn under the restore's green mark
    groups: list[tuple[float, list[str], list[bool]]] = []  # (x, titles, failed)
    for m in lane.marks:
        if m.kind == "effect":
            cx = x(m.t)
            tip = f"t={secs(m.t)} effect {m.name}: {m.outcome}" + (
                f" ({m.detail})" if m.detail else ""
            )
            if not groups or cx - groups[-1][0] >= _MARK_W:
                groups.append((cx, [], []))
            groups[-1][1].append(tip)
            groups[-1][2].append(m.outcome not in ("ok", "cancelled", ""))
    for cx, tips, failed in groups:
        out.append(
            f'<path class="mark effect{" failed" if any(failed) else ""}" '
            f'd="M{cx:.1f},{base - 4:.1f} L{cx + 4:.1f},{base:.1f} L{cx:.1f},{base + 4:.1f} '
            f'L{cx - 4:.1f},{base:.1f} z"><title>{esc(chr(10).join(tips))}</title></path>'
        )
    for m in lane.marks:
        cx = x(m.t)
        if m.kind == "reject":
            out.append(
                f'<path class="mark reject" d="M{cx - 4:.1f},{y - 4:.1f} L{cx + 4:.1f},{y + 4:.1f} '
                f'M{cx + 4:.1f},{y - 4:.1f} L{cx - 4:.1f},{y + 4:.1f}">'
                f"<title>t={secs(m.t)} rejected {esc(m.name)}</title></path>"
            )
    return out


# -- the page ------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fff; }
header { padding: 12px 20px 4px; }
h1 { font-size: 19px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
.sub { color: #666; font-size: 13px; }
#controls { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ddd;
  padding: 8px 20px; display: flex; gap: 12px; align-items: center; z-index: 2; }
#scrubber { flex: 1; }
#now { font-variant-numeric: tabular-nums; min-width: 110px; font-weight: 600; }
main { padding: 0 20px 30px; }
#states { border-collapse: collapse; margin: 6px 0; }
#states td, #states th { padding: 2px 12px 2px 0; text-align: left; }
#states td.state { font-weight: 600; }
.scroll { overflow-x: auto; }
.diagrams { display: flex; flex-wrap: wrap; gap: 14px; }
.diagram-box { border: 1px solid #ddd; border-radius: 8px; padding: 6px 10px; }
.diagram-box h3 { margin: 2px 0; font-size: 15px; }
.state.lit rect:first-of-type { fill: #ffca28; stroke: #d84315; stroke-width: 3; }
.lane-label { font: 600 13px system-ui, sans-serif; }
.strip-label { font: italic 12px system-ui, sans-serif; fill: #666; }
.tick { font: 10px system-ui, sans-serif; fill: #777; text-anchor: middle; }
.seg-label { font: 11px system-ui, sans-serif; pointer-events: none; }
.mark.effect { fill: #2e7d32; } .mark.effect.failed { fill: #c62828; }
.mark.reject { stroke: #c62828; stroke-width: 2; fill: none; }
.input { fill: #546e7a; } .input.rpc { fill: #6a1b9a; }
.legend span { margin-right: 14px; }
#timeline { cursor: crosshair; }
"""

_JS = """
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("timeline-data").textContent);
  const scrub = document.getElementById("scrubber");
  const now = document.getElementById("now");
  const svg = document.getElementById("timeline");
  const cursor = document.getElementById("cursor");
  const left = Number(svg.dataset.left), plot = Number(svg.dataset.plot);
  const span = (data.t1 - data.t0) || 1;
  const boxes = new Map();
  document.querySelectorAll("g.state").forEach(function (g) {
    boxes.set(g.dataset.machine + "\\u0000" + g.dataset.state, g);
  });
  const cells = Array.from(document.querySelectorAll("#states td.state"));
  const times = Array.from(new Set([].concat.apply([data.t0, data.t1], data.lanes.map(
    function (lane) { return lane.segments.map(function (s) { return s[1]; }); }))))
    .sort(function (a, b) { return a - b; });

  function segmentAt(lane, t) {
    const segs = lane.segments;
    for (let i = 0; i < segs.length; i++) {
      if (t < segs[i][2] || i === segs.length - 1) {
        return t >= segs[i][1] || i === 0 ? segs[i] : segs[i - 1];
      }
    }
    return null;
  }

  function show(t) {
    document.querySelectorAll("g.state.lit").forEach(function (g) { g.classList.remove("lit"); });
    data.lanes.forEach(function (lane, i) {
      const seg = segmentAt(lane, t);
      if (!seg) { return; }
      const box = boxes.get(lane.machine + "\\u0000" + seg[0]);
      if (box) { box.classList.add("lit"); }
      cells[i].textContent = seg[0];
      cells[i].nextElementSibling.textContent = "since " + seg[1].toFixed(3) + " s" +
        (seg[3] ? " (on " + seg[3] + ")" : "");
    });
    const x = left + (t - data.t0) / span * plot;
    cursor.setAttribute("x1", x);
    cursor.setAttribute("x2", x);
    now.textContent = "t = " + t.toFixed(3) + " s";
    document.body.dataset.t = String(t);
  }

  function go(t) {
    t = Math.min(data.t1, Math.max(data.t0, t));
    scrub.value = String(t);
    show(t);
  }

  scrub.addEventListener("input", function () { show(Number(scrub.value)); });
  svg.addEventListener("click", function (ev) {
    const box = svg.getBoundingClientRect();
    const x = (ev.clientX - box.left) * (svg.viewBox.baseVal.width / box.width);
    go(data.t0 + (x - left) / plot * span);
  });
  document.getElementById("prev").addEventListener("click", function () {
    const t = Number(scrub.value);
    go(times.filter(function (v) { return v < t - 1e-9; }).pop() ?? data.t0);
  });
  document.getElementById("next").addEventListener("click", function () {
    const t = Number(scrub.value);
    go(times.find(function (v) { return v > t + 1e-9; }) ?? data.t1);
  });
  const start = /[#&]t=([0-9.eE+-]+)/.exec(location.hash);
  go(start ? Number(start[1]) : data.t0);
})();
"""


def timeline_html(
    records: Sequence[TraceRecord],
    *,
    title: str,
    source: str = "",
    machines: Mapping[str, MachineSpec] = MACHINES,
) -> str:
    """The whole page for ``records``."""
    lanes = Lanes(machines).extend(records)
    rebuilt = not lanes.inputs
    inputs = rebuilt_inputs(records) if rebuilt else lanes.inputs
    t0 = lanes.t0 if lanes.t0 is not None else 0.0
    t1 = lanes.t1 if lanes.t1 is not None else 0.0
    if t1 <= t0:
        t1 = t0 + 1.0
    ordered = lanes.lanes()
    payload = {"t0": t0, "t1": t1, "lanes": _lanes_payload(lanes, t1)}
    data = json.dumps(payload, sort_keys=True).replace("</", "<\\/")
    step = (t1 - t0) / 1000
    shown: list[str] = []
    for lane in ordered:
        if lane.machine not in shown:
            shown.append(lane.machine)
    diagrams = []
    for name in shown:
        spec = machines.get(name)
        body = (
            diagram_svg(spec, standalone=False)
            if spec is not None
            else f'<p class="sub">no spec for machine {esc(name)} in this build</p>'
        )
        diagrams.append(
            f'<div class="diagram-box"><h3>{esc(name)}</h3><div class="scroll">{body}</div></div>'
        )
    rows = "".join(
        f'<tr><th>{esc(lanes.label(lane))}</th><td class="state"></td><td class="sub"></td></tr>'
        for lane in ordered
    )
    summary = (
        f"{lanes.records} records, {len(ordered)} machine instances, "
        f"{secs(t0)} s to {secs(t1)} s on the job's clock"
    )
    if source:
        summary = f"{source}: {summary}"
    what = "input, as agent-runtime record rebuilds it" if rebuilt else "scenario input"
    legend = f"<span>\u25bc {what} (purple: RPC or session request)</span>" if inputs else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<header>
<h1>{esc(title)}</h1>
<div class="sub">{esc(summary)}</div>
</header>
<div id="controls">
<button id="prev" type="button" title="previous transition">\u25c0</button>
<input id="scrubber" type="range" min="{t0}" max="{t1}" step="{step}" value="{t0}"
 aria-label="time">
<button id="next" type="button" title="next transition">\u25b6</button>
<span id="now"></span>
</div>
<main>
<h2>Timeline</h2>
<div class="sub legend"><span>bars: states</span><span>\u25c6 effect (red: failed)</span>
<span>\u2715 rejected event</span>{legend}<span>click the timeline or move the slider</span>
</div>
<div class="scroll">{timeline_svg(lanes, machines, t0, t1, inputs)}</div>
<table id="states"><tbody>{rows}</tbody></table>
<h2>Diagrams</h2>
<div class="diagrams">{"".join(diagrams)}</div>
</main>
<script type="application/json" id="timeline-data">{data}</script>
<script>{_JS}</script>
</body>
</html>
"""


def rebuilt_inputs(records: Sequence[TraceRecord]) -> list[TraceRecord]:
    """The inputs of a trace that has none written (a production trace's): the steps
    ``agent-runtime record`` rebuilds from the machines' events (room facts, RPCs and
    session requests, the agent's own calls), at their times; none when ``record``
    refuses the trace (edited or damaged; a trace of two jobs passed from Python)."""
    try:
        steps = record(records, name="trace").scenario["steps"]
    except RecordError:
        return []
    return [
        TraceRecord(
            step["at"],
            "input",
            "trace",
            "",
            event=step["event"],
            data={k: v for k, v in step.items() if k not in ("at", "event")},
        )
        for step in steps
    ]


def write_timeline(
    records: Sequence[TraceRecord], out: str | Path, *, title: str, source: str = ""
) -> None:
    """The page written to ``out`` whole or not at all (a full disk leaves what was there)."""
    write_file(out, timeline_html(records, title=title, source=source))
