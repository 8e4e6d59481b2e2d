"""The one result table: rows every section returns, rendered as Markdown and as JSON."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Comparison = Literal[">=", "<=", ">", "<"]


@dataclass(frozen=True, slots=True)
class Target:
    """A figure the row must reach: ``value OP limit``. An ``int`` limit is a count and
    prints as one."""

    op: Comparison
    limit: float

    def met(self, value: float) -> bool:
        if self.op == ">=":
            return value >= self.limit
        if self.op == "<=":
            return value <= self.limit
        if self.op == ">":
            return value > self.limit
        return value < self.limit

    def __str__(self) -> str:
        limit = f"{self.limit:,}" if isinstance(self.limit, int) else _num(self.limit)
        return f"{self.op} {limit}"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table.

    ``value`` is the figure in ``unit``; ``text`` replaces the formatted value when a figure
    is not a number (an upstream behaviour such as "never restored"). ``how`` says how the
    figure was obtained and goes to the notes under the table and to the JSON. ``samples``
    are the individual runs behind a median (JSON only).
    """

    section: str
    case: str
    value: float | None
    unit: str
    target: Target | None = None
    text: str = ""
    how: str = ""
    samples: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.section or not self.case:
            raise ValueError("a row needs a section and a case")
        if self.value is None and not self.text:
            raise ValueError(f"row {self.case!r}: give a value or a text")
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"row {self.case!r}: value {self.value!r} is not finite")
        if self.target is not None and self.value is None:
            raise ValueError(f"row {self.case!r}: a target needs a numeric value")

    @property
    def met(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.target.met(self.value)

    @property
    def figure(self) -> str:
        if self.text:
            return self.text
        assert self.value is not None
        if self.unit == "x":  # ratios sit near their targets: two decimals, always
            return f"{self.value:,.2f} x"
        return f"{_num(self.value)} {self.unit}".rstrip()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = str(self.target) if self.target is not None else None
        d["met"] = self.met
        d["figure"] = self.figure
        d["samples"] = list(self.samples)
        return d


def _num(x: float) -> str:
    """Three significant figures, thousands separated; no scientific notation."""
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def render_markdown(rows: Sequence[Row]) -> str:
    """The table (section, case, figure, target, met) and numbered notes on how."""
    notes: list[str] = []
    lines = [
        "| section | case | figure | target | met |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        case = r.case
        if r.how:
            if r.how not in notes:
                notes.append(r.how)
            case += f" [{notes.index(r.how) + 1}]"
        met = {True: "yes", False: "**MISSED**", None: ""}[r.met]
        target = str(r.target) + (f" {r.unit}" if r.unit else "") if r.target else ""
        lines.append(f"| {r.section} | {case} | {r.figure} | {target} | {met} |")
    if notes:
        lines.append("")
        lines.extend(f"[{i}] {n}" for i, n in enumerate(notes, 1))
    return "\n".join(lines)


def missed(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.met is False]
