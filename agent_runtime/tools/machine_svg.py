"""A machine's diagram as SVG, laid out here from its ``drawing`` (``drawing.py``): the one
picture ``agent-runtime diagrams`` writes as ``NAME.svg`` and the timeline page embeds. No
Graphviz: the same spec gives the same bytes, so ``diagrams --check`` compares them.

The layout reads top to bottom in bands: each state sits one band below the furthest state
leading to it (edges that close a cycle set aside), so the flow goes down and final states
come last. Under each band, a row of edge labels (one line per row of the cell); left of a
state, the hub of an event entering it from many. A row wider than the page wraps, so the
picture fits a 1,000 px column unscaled. Also the colour of each state, which the page's
lanes share with the diagrams."""

from __future__ import annotations

import html
import zlib
from dataclasses import dataclass

from agent_runtime.tools.drawing import BOX_WRAP, BULLET, WRAP, Drawing, drawing, region_id, wrap
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


def text_width(text: str, px: float = 7.4) -> float:
    """A generous estimate of ``text``'s drawn width at ``px`` per character."""
    return len(text) * px


# -- layout ------------------------------------------------------------------------------------

PAGE = 1000  # px: the review column the diagrams must fit unscaled
_FONT = "Helvetica, Arial, sans-serif"
_NAME_PX, _TEXT_PX = 14, 12  # a state's name; every other line
_NAME_CHAR, _TEXT_CHAR = 9.2, 7.4  # per character, wide enough for DejaVu Sans as well
_LINE = 15  # px between lines of 12 px text
_PAD = 7  # inside a box
_GAP_X, _GAP_Y = 22, 30
_MARGIN = 14
_DOT_ROOM = 30  # above everything: the initial state's dot and arrow
_LANE = 12  # between the arcs of edges going back up, on the right


@dataclass
class _Box:
    key: str  # unique: "s NAME", "e SOURCE DEST", "h DEST"
    title: str  # bold, centred; empty for an edge label
    lines: list[str]
    w: float
    h: float
    x: float = 0.0  # top-left corner
    y: float = 0.0

    @property
    def cx(self) -> float:
        return self.x + self.w / 2


def _box(key: str, title: str, lines: list[str]) -> _Box:
    w = max([text_width(title, _NAME_CHAR)] + [text_width(t, _TEXT_CHAR) for t in lines])
    h = (_NAME_PX + 6 if title else 0) + _LINE * len(lines)
    return _Box(key, title, lines, max(w + 2 * _PAD, 70 if title else 0), h + 2 * _PAD)


def _ranks(spec: MachineSpec) -> dict[str, int]:
    """The band of each state. Edges that close a cycle (found depth-first from the initial
    state, rows in spec order) are set aside; each state then sits one band below the
    furthest state leading to it."""
    succ: dict[str, list[str]] = {s: [] for s in spec.state_names}
    for r in spec.rows:
        if r.dest is not None and r.dest != r.source and r.dest not in succ[r.source]:
            succ[r.source].append(r.dest)
    preds: dict[str, list[str]] = {s: [] for s in spec.state_names}
    seen: set[str] = set()
    on_path: set[str] = set()

    def visit(s: str) -> None:
        seen.add(s)
        on_path.add(s)
        for d in succ[s]:
            if d in on_path:
                continue  # closes a cycle: drawn as an edge going back up
            preds[d].append(s)
            if d not in seen:
                visit(d)
        on_path.discard(s)

    for s in [spec.initial, *spec.state_names]:  # validation makes all reachable; be safe
        if s not in seen:
            visit(s)
    rank: dict[str, int] = {}

    def depth(s: str) -> int:
        if s not in rank:
            rank[s] = 0
            rank[s] = max((depth(p) + 1 for p in preds[s]), default=0)
        return rank[s]

    for s in spec.state_names:
        depth(s)
    return rank


@dataclass
class _Layout:
    boxes: dict[str, _Box]
    links: list[tuple[str, str]]  # (from key, to key): the lines between boxes
    width: float
    height: float


def _place(row: list[_Box], want: dict[str, float], right: float) -> None:
    """Each box as near its wanted centre as its neighbours allow, the row kept within
    [0, right] (a row is never wider: longer ones are wrapped first)."""
    x = -1e9
    for b in row:
        b.x = max(want.get(b.key, 0.0) - b.w / 2, x)
        x = b.x + b.w + _GAP_X
    if row[-1].x + row[-1].w - row[0].x > right:  # pushed apart too far: side by side
        x = 0.0
        for b in row:
            b.x, x = x, x + b.w + _GAP_X
    shift = sum(want.get(b.key, 0.0) - b.cx for b in row) / len(row)
    shift = min(shift, right - (row[-1].x + row[-1].w))
    shift = max(shift, -row[0].x)
    for b in row:
        b.x += shift


def _layout(d: Drawing, spec: MachineSpec) -> _Layout:
    """Where every box of the drawing goes, and the lines between them."""
    rank = _ranks(spec)
    boxes: dict[str, _Box] = {}
    # a band per rank: its states (each hub just left of the state it enters), then the
    # labels of the edges leaving them
    bands: list[tuple[list[str], list[str]]] = [([], []) for _ in range(max(rank.values()) + 1)]
    links: list[tuple[str, str]] = []
    hubs = {hub.dest: hub for hub in d.hubs}
    for sb in d.states:
        hub = hubs.get(sb.name)
        if hub is not None:
            key = f"h {hub.dest}"
            lines = [p for t in (hub.title, *hub.lines) for p in wrap(t, BOX_WRAP)]
            boxes[key] = _box(key, "", lines)
            bands[rank[sb.name]][0].append(key)
            links.append((key, f"s {hub.dest}"))
        lines = [p for line in sb.details for p in wrap(line, BOX_WRAP)]
        boxes[f"s {sb.name}"] = _box(f"s {sb.name}", sb.name, lines)
        bands[rank[sb.name]][0].append(f"s {sb.name}")
    for e in d.edges:
        items = [f"{BULLET}{t}" for t in e.lines] if len(e.lines) > 1 else list(e.lines)
        key = f"e {e.source} {e.dest}"
        boxes[key] = _box(key, "", [p for t in items for p in wrap(t, WRAP)])
        bands[rank[e.source]][1].append(key)
        links += [(f"s {e.source}", key), (key, f"s {e.dest}")]
    up = {f"e {e.source} {e.dest}" for e in d.edges if rank[e.dest] <= rank[e.source]}
    back = len(up)
    right = PAGE - 2 * _MARGIN - _LANE * (back + 1)
    rows: list[list[str]] = []
    for band in bands:
        for keys in band:  # wrapped where the boxes would not fit side by side
            if not keys:
                continue
            rows.append([])
            used = 0.0
            for i, k in enumerate(keys):
                w = boxes[k].w + (boxes[keys[i + 1]].w if k.startswith("h ") else 0)
                if rows[-1] and not rows[-1][-1].startswith("h ") and used + w > right:
                    rows.append([])
                    used = 0.0
                rows[-1].append(k)
                used += boxes[k].w + _GAP_X
    near: dict[str, list[str]] = {k: [] for k in boxes}
    for a, b in links:
        near[a].append(b)
        near[b].append(a)
    placed: set[str] = set()
    # twice: the first pass sees only the rows above a box, the second both sides
    for _ in range(2):
        for keys in rows:
            want: dict[str, float] = {}
            for k in keys:
                xs = [boxes[n].cx for n in near[k] if n in placed and n not in keys]
                want[k] = sum(xs) / len(xs) if xs else right / 2
            for k in keys:
                if k.startswith("h "):  # beside its state, on the left
                    dest = boxes["s " + k[2:]]
                    want[k] = want[dest.key] - (dest.w + boxes[k].w) / 2 - _GAP_X + 0.01
            # a label whose edge goes back up last in its row: its line leaves to the right
            keys.sort(key=lambda k: (k in up, want[k]))
            _place([boxes[k] for k in keys], want, right)
            placed.update(keys)
    left = min(b.x for b in boxes.values())  # rows centred on one axis: no empty strip
    y = float(_MARGIN + _DOT_ROOM)
    for keys in rows:
        tallest = max(boxes[k].h for k in keys)
        for k in keys:
            boxes[k].x += _MARGIN - left
            boxes[k].y = y + (tallest - boxes[k].h) / 2
        y += tallest + _GAP_Y
    width = max(b.x + b.w for b in boxes.values()) + _LANE * (back + 1) + _MARGIN
    return _Layout(boxes, links, width, y - _GAP_Y + _MARGIN)


# -- drawing -----------------------------------------------------------------------------------


def _text(b: _Box) -> str:
    """A box's lines: the title centred and bold, the others left-aligned (a state's or hub's
    list) or centred (an edge label)."""
    out: list[str] = []
    y = b.y + _PAD
    if b.title:
        y += _NAME_PX
        out.append(
            f'<text x="{b.cx:.1f}" y="{y:.1f}" text-anchor="middle" font-size="{_NAME_PX}" '
            f'font-weight="bold">{esc(b.title)}</text>'
        )
        y += 6
    centred = b.key.startswith("e ")
    for line in b.lines:
        y += _LINE
        x, anchor = (b.cx, "middle") if centred else (b.x + _PAD, "start")
        out.append(
            f'<text x="{x:.1f}" y="{y - 3:.1f}" text-anchor="{anchor}" '
            f'font-size="{_TEXT_PX}">{esc(line)}</text>'
        )
    return "".join(out)


_Ends = dict[tuple[str, str], tuple[float, float]]  # (box, line) -> where the line meets it


def _ends(lay: _Layout) -> _Ends:
    """Where each line leaves its box and enters the next, spread along the box's side in
    the order of the other ends, so lines sharing a box do not start at one point."""
    sides: dict[tuple[str, str], list[tuple[float, tuple[str, str]]]] = {}
    for link in lay.links:
        a, b = lay.boxes[link[0]], lay.boxes[link[1]]
        if b.y > a.y and not link[0].startswith("h "):  # others: see _path
            sides.setdefault((link[0], "bottom"), []).append((b.cx, link))
            sides.setdefault((link[1], "top"), []).append((a.cx, link))
    out: _Ends = {}
    for (key, side), ends in sides.items():
        box = lay.boxes[key]
        ends.sort(key=lambda e: e[0])
        for i, (_, link) in enumerate(ends):
            x = box.x + box.w * (i + 1) / (len(ends) + 1)
            y = box.y + (box.h if side == "bottom" else 0)
            out[(key, link[0] + "|" + link[1])] = (x, y)
    return out


def _path(lay: _Layout, ends: _Ends, link: tuple[str, str], lane: int) -> str:
    a, b = lay.boxes[link[0]], lay.boxes[link[1]]
    tag = link[0] + "|" + link[1]
    if b.y > a.y and not link[0].startswith("h "):  # down: an S-curve
        x0, y0 = ends[(link[0], tag)]
        x1, y1 = ends[(link[1], tag)]
        m = (y0 + y1) / 2
        return f"M{x0:.1f},{y0:.1f} C{x0:.1f},{m:.1f} {x1:.1f},{m:.1f} {x1:.1f},{y1:.1f}"
    if link[0].startswith("h "):  # a hub, on its state's left
        x0, y0, x1, y1 = a.x + a.w, a.y + a.h / 2, b.x, b.y + min(b.h / 2, 18.0)
        m = (x0 + x1) / 2
        return f"M{x0:.1f},{y0:.1f} C{m:.1f},{y0:.1f} {m:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"
    # back up (a cycle, or a state's edge to itself): out to the right, round and in,
    # each in its own lane
    x0, y0 = a.x + a.w, a.y + a.h / 2
    x1, y1 = b.x + b.w, b.y + min(b.h - 8, 12.0 + 6 * (lane % 4))
    far = lay.width - _MARGIN - _LANE * lane
    return f"M{x0:.1f},{y0:.1f} C{far:.1f},{y0:.1f} {far:.1f},{y1:.1f} {x1:.1f},{y1:.1f}"


def diagram_svg(spec: MachineSpec, *, standalone: bool = True) -> str:
    """The machine's diagram. A box per state (``g.state`` with ``data-machine`` and
    ``data-state``: the timeline's scrubber lights it), an edge label per (source, dest)
    pair (``g.edge``), a dashed box per hub (``g.hub``). ``standalone`` (the file
    ``diagrams`` writes) adds the SVG namespace, the ids ``agent-runtime diff`` links to
    (``drawing.region_id``) and the style that outlines a linked one; the page embeds
    several machines inline, where those ids would clash, and leaves them out."""
    d = drawing(spec)
    lay = _layout(d, spec)
    ends = _ends(lay)
    name = esc(spec.name)
    mid = f"arrow-{name}"

    def ident(kind: str, *states: str) -> str:
        return f' id="{region_id(kind, *states)}"' if standalone else ""

    def line(link: tuple[str, str], lane: int, arrow: bool) -> str:
        head = f' marker-end="url(#{mid})"' if arrow else ""
        return (
            f'<path d="{_path(lay, ends, link, lane)}" fill="none" stroke="#555" '
            f'stroke-width="1.2"{head}/>'
        )

    def label_box(b: _Box, dashed: bool) -> str:
        border = 'stroke="#555" stroke-dasharray="4 3"' if dashed else 'stroke="none"'
        return (
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="5" '
            f'fill="#fff" {border}/>{_text(b)}'
        )

    xmlns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [
        f'<svg{xmlns} class="diagram" '
        f'data-machine="{name}" width="{lay.width:.0f}" height="{lay.height:.0f}" '
        f'viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" font-family="{_FONT}" fill="#222" '
        f'role="img" aria-label="{name} state diagram">',
        f"<title>{name}</title>",
    ]
    if standalone:
        # a link to NAME.svg#REGION (as `agent-runtime diff` prints) outlines that region
        out.append(
            "<style>:target rect, :target path { stroke: #d1242f; stroke-width: 3; } "
            ":target text { fill: #d1242f; }</style>"
        )
    out.append(
        f'<defs><marker id="{mid}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#555"/></marker></defs>'
    )
    first = lay.boxes[f"s {spec.initial}"]
    ix, iy = first.cx, first.y - _DOT_ROOM + 4
    out.append(
        f'<circle cx="{ix:.1f}" cy="{iy:.1f}" r="5" fill="#333"/>'
        f'<path d="M{ix:.1f},{iy + 5:.1f} L{ix:.1f},{first.y - 1:.1f}" stroke="#333" '
        f'marker-end="url(#{mid})"/>'
    )
    lane = 0
    for e in d.edges:  # under the boxes; the label sits on its edge, on white
        key = f"e {e.source} {e.dest}"
        into = (key, f"s {e.dest}")
        up = lay.boxes[into[1]].y <= lay.boxes[key].y
        lane += up
        title = f"{e.source} \u2192 {e.dest}: " + "; ".join(e.lines)
        out.append(
            f'<g class="edge"{ident("edge", e.source, e.dest)} data-source="{esc(e.source)}" '
            f'data-dest="{esc(e.dest)}"><title>{esc(title)}</title>'
            f"{line((f's {e.source}', key), 0, False)}{line(into, lane, True)}"
            f"{label_box(lay.boxes[key], False)}</g>"
        )
    for hub in d.hubs:
        key = f"h {hub.dest}"
        out.append(
            f'<g class="hub"{ident("into", hub.dest)} data-dest="{esc(hub.dest)}">'
            f"{line((key, f's {hub.dest}'), 0, True)}{label_box(lay.boxes[key], True)}</g>"
        )
    for sb in d.states:
        b = lay.boxes[f"s {sb.name}"]
        rect = f'x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}"'
        out.append(
            f'<g class="state"{ident("state", sb.name)} data-machine="{name}" '
            f'data-state="{esc(sb.name)}"><title>{esc(sb.name)}: '
            f"{esc(spec.state(sb.name).description or sb.name)}</title>"
            f'<rect {rect} rx="9" fill="{state_colour(spec, sb.name)}" stroke="#444" '
            f'stroke-width="1.2"/>'
        )
        if sb.final:  # a double border, as state charts draw a final state
            out.append(
                f'<rect x="{b.x + 3:.1f}" y="{b.y + 3:.1f}" width="{b.w - 6:.1f}" '
                f'height="{b.h - 6:.1f}" rx="7" fill="none" stroke="#444"/>'
            )
        out.append(f"{_text(b)}</g>")
    out.append("</svg>")
    # one state, edge or hub a line: a change to the picture reads as a diff in review
    return "\n".join(out) + ("\n" if standalone else "")
