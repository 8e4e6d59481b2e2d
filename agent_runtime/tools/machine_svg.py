"""A machine's diagram as an inline SVG, laid out here from its spec (the timeline page
draws it and needs no Graphviz): states in columns by their distance from the initial
state, an edge per (source, dest) pair labelled with its events; and the colour of each
state, which the page's lanes share with the diagrams."""

from __future__ import annotations

import html
import zlib

from statemachines import MachineSpec

_PALETTE = (  # neighbours differ: a machine's states are coloured in spec order
    "#8ecae6",
    "#ffd6a5",
    "#b5e48c",
    "#cdb4db",
    "#ffe5a0",
    "#f4acb7",
    "#a8dadc",
    "#caffbf",
    "#90e0ef",
    "#e9c46a",
)


def esc(text: object) -> str:
    """``text`` escaped for HTML and SVG text and attribute values."""
    return html.escape(str(text), quote=True)


def state_colour(spec: MachineSpec | None, state: str) -> str:
    """Grey for a final state; otherwise by the state's place in its spec, so the states of
    one machine differ (by name when the spec does not know it)."""
    if spec is None or state not in spec.state_names:
        return _PALETTE[zlib.crc32(state.encode()) % len(_PALETTE)]
    if spec.state(state).final:
        return "#d9d9d9"
    return _PALETTE[spec.state_names.index(state) % len(_PALETTE)]


# -- diagrams ---------------------------------------------------------------------------------

_NODE_H = 36
_COL_GAP = 125
_ROW_GAP = 30
_MARGIN = 24
_ARC_STEP = 17  # between stacked arcs (edges that skip columns or go back)


def text_width(text: str, px: float = 7.4) -> float:
    return len(text) * px


def _layout(spec: MachineSpec) -> tuple[dict[str, int], list[list[str]]]:
    """The column of each state and the states of each column. Edges that close a cycle
    (found depth-first from the initial state, rows in spec order) are set aside; each state
    then sits one column after the furthest state leading to it, so the flow reads left to
    right and final states come last."""
    succ: dict[str, list[str]] = {s: [] for s in spec.state_names}
    for r in spec.rows:
        if r.dest is not None and r.dest != r.source and r.dest not in succ[r.source]:
            succ[r.source].append(r.dest)
    forward: dict[str, list[str]] = {s: [] for s in spec.state_names}
    seen: set[str] = set()
    on_path: set[str] = set()

    def visit(s: str) -> None:
        seen.add(s)
        on_path.add(s)
        for d in succ[s]:
            if d in on_path:
                continue  # closes a cycle: drawn as an edge going back
            forward[s].append(d)
            if d not in seen:
                visit(d)
        on_path.discard(s)

    visit(spec.initial)
    for s in spec.state_names:  # validation makes every state reachable; be safe anyway
        if s not in seen:
            visit(s)
    rank: dict[str, int] = {}

    def depth(s: str) -> int:
        # longest path from a source of the acyclic part: the state's column
        if s not in rank:
            rank[s] = 0
            preds = [p for p, ds in forward.items() if s in ds]
            rank[s] = max((depth(p) + 1 for p in preds), default=0)
        return rank[s]

    for s in spec.state_names:
        depth(s)
    columns: list[list[str]] = [[] for _ in range(max(rank.values()) + 1)]
    for s in spec.state_names:
        columns[rank[s]].append(s)
    return rank, columns


def _detail(spec: MachineSpec, state: str) -> str:
    st = spec.state(state)
    parts = []
    if st.timeout is not None:
        parts.append(f"timeout: {st.timeout.event}")
    parts += [f"task: {name}" for name in st.invoke]
    return ", ".join(parts)


def diagram_svg(spec: MachineSpec) -> str:
    """The machine as an SVG drawing: a box per state (``data-machine``/``data-state``, the
    scrubber lights it), an edge per (source, dest) labelled with its events. Edges to the
    next column are drawn straight across; edges that skip columns arc below, edges that go
    back arc above, edges within a column loop on its right."""
    rank, columns = _layout(spec)
    size: dict[str, tuple[float, float]] = {}
    for s in spec.state_names:
        detail = _detail(spec, s)
        w = max(90.0, text_width(s) + 24, text_width(detail, 6.0) + 16)
        size[s] = (w, _NODE_H + (14 if detail else 0))
    labels: dict[tuple[str, str], list[str]] = {}
    for r in spec.rows:
        if r.dest is not None and r.dest != r.source:
            events = labels.setdefault((r.source, r.dest), [])
            if r.event not in events:
                events.append(r.event)
    below = [k for k in labels if rank[k[1]] > rank[k[0]] + 1]
    above = [k for k in labels if rank[k[1]] < rank[k[0]]]
    col_w = [max(size[s][0] for s in col) for col in columns]
    col_h = [sum(size[s][1] for s in col) + _ROW_GAP * (len(col) - 1) for col in columns]
    band = max(col_h)
    top = _MARGIN + (_ARC_STEP * len(above) + 14 if above else 0)
    pos: dict[str, tuple[float, float]] = {}  # top-left corner
    x = _MARGIN + 24.0  # the initial dot's room
    for c, col in enumerate(columns):
        y = top + (band - col_h[c]) / 2
        for s in col:
            w, h = size[s]
            pos[s] = (x + (col_w[c] - w) / 2, y)
            y += h + _ROW_GAP
        x += col_w[c] + _COL_GAP
    width = x - _COL_GAP + _MARGIN + 70  # room for the loops within a column
    height = top + band + (_ARC_STEP * len(below) + 14 if below else 0) + _MARGIN

    def anchor(s: str, side: str) -> tuple[float, float]:
        (sx, sy), (sw, sh) = pos[s], size[s]
        return {
            "right": (sx + sw, sy + sh / 2),
            "left": (sx, sy + sh / 2),
            "top": (sx + sw / 2, sy),
            "bottom": (sx + sw / 2, sy + sh),
        }[side]

    mid = f"arrow-{spec.name}"
    edge_svg: list[str] = []
    for (s, d), events in labels.items():
        if (s, d) in below:
            k = below.index((s, d)) + 1
            p0, p3 = anchor(s, "bottom"), anchor(d, "bottom")
            level = top + band + _ARC_STEP * k
            c1, c2 = (
                (p0[0] + 20, level + (level - p0[1]) / 3),
                (p3[0] - 20, level + (level - p3[1]) / 3),
            )
        elif (s, d) in above:
            k = above.index((s, d)) + 1
            p0, p3 = anchor(s, "top"), anchor(d, "top")
            level = top - _ARC_STEP * k
            c1, c2 = (
                (p0[0] - 20, level - (p0[1] - level) / 3),
                (p3[0] + 20, level - (p3[1] - level) / 3),
            )
        elif rank[s] == rank[d]:
            p0, p3 = anchor(s, "right"), anchor(d, "right")
            c1, c2 = (p0[0] + 55, p0[1]), (p3[0] + 55, p3[1])
        else:
            p0, p3 = anchor(s, "right"), anchor(d, "left")
            bend = (p3[0] - p0[0]) / 2
            c1, c2 = (p0[0] + bend, p0[1]), (p3[0] - bend, p3[1])
        path = (
            f"M{p0[0]:.1f},{p0[1]:.1f} C{c1[0]:.1f},{c1[1]:.1f} "
            f"{c2[0]:.1f},{c2[1]:.1f} {p3[0]:.1f},{p3[1]:.1f}"
        )
        lx = (p0[0] + 3 * c1[0] + 3 * c2[0] + p3[0]) / 8
        ly = (p0[1] + 3 * c1[1] + 3 * c2[1] + p3[1]) / 8
        if (s, d) in below or (s, d) in above:
            lines = [", ".join(events)]  # an arc's apex has room for one long line
        else:
            lines = events  # one event a line, stacked above the edge
            ly -= 11 * (len(lines) - 1) + 4
        text = "".join(
            f'<tspan x="{lx:.1f}" y="{ly + 3 + 11 * i:.1f}">{esc(line)}</tspan>'
            for i, line in enumerate(lines)
        )
        edge_svg.append(
            f'<g class="edge" data-source="{esc(s)}" data-dest="{esc(d)}">'
            f"<title>{esc(s)} \u2192 {esc(d)} on {esc(', '.join(events))}</title>"
            f'<path d="{path}" fill="none" stroke="#666" stroke-width="1.1" '
            f'marker-end="url(#{esc(mid)})"/>'
            f'<text class="edge-label" text-anchor="middle" font-size="10">{text}</text></g>'
        )
    out = [
        f'<svg class="diagram" data-machine="{esc(spec.name)}" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="{esc(spec.name)} state diagram">',
        f'<defs><marker id="{esc(mid)}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#555"/></marker></defs>',
    ]
    ix, iy = anchor(spec.initial, "left")
    out.append(
        f'<circle cx="{ix - 20:.1f}" cy="{iy:.1f}" r="5" fill="#333"/>'
        f'<path d="M{ix - 15:.1f},{iy:.1f} L{ix - 1:.1f},{iy:.1f}" '
        f'stroke="#333" marker-end="url(#{esc(mid)})"/>'
    )
    out += edge_svg  # under the boxes, labels haloed
    for s in spec.state_names:
        x, y = pos[s]
        w, h = size[s]
        st = spec.state(s)
        detail = _detail(spec, s)
        out.append(
            f'<g class="state" data-machine="{esc(spec.name)}" data-state="{esc(s)}">'
            f"<title>{esc(s)}: {esc(st.description or s)}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="9" '
            f'fill="{state_colour(spec, s)}" stroke="#444" stroke-width="1.2"/>'
        )
        if st.final:
            out.append(
                f'<rect x="{x + 3:.1f}" y="{y + 3:.1f}" width="{w - 6:.1f}" '
                f'height="{h - 6:.1f}" rx="7" fill="none" stroke="#444"/>'
            )
        out.append(
            f'<text x="{x + w / 2:.1f}" y="{y + 22:.1f}" class="state-name" '
            f'text-anchor="middle" font-size="13" font-weight="600">{esc(s)}</text>'
        )
        if detail:
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{y + 38:.1f}" class="state-detail" '
                f'text-anchor="middle" font-size="10.5">'
                f"{esc(detail)}</text>"
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
