"""Horizontal bar charts drawn as SVG on the server.

A charting library in the browser would need a script (which the pages' content security
policy forbids) or a build; a bar chart is a few rectangles, so its geometry is computed
here and the template writes it as SVG with presentation attributes (no inline styles),
every label escaped like any other text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ROW = 22  # pixels per bar
LABEL = 200  # pixels for the labels on the left
BAR = 420  # pixels for the longest bar
VALUE = 120  # pixels for the value on the right
MAX_BARS = 40  # a chart shows the first 40 rows; the table beside it has them all


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    shown: str  # the value as text
    y: int
    width: int


@dataclass(frozen=True)
class Chart:
    title: str
    bars: tuple[Bar, ...]
    height: int
    width: int = LABEL + BAR + VALUE
    label_width: int = LABEL
    row: int = ROW


def bar_chart(title: str, rows: Sequence[tuple[str, float]], fmt: str = "{:,.0f}") -> Chart:
    """A chart of ``rows`` (label, value), one bar each, scaled to the largest value."""
    rows = list(rows)[:MAX_BARS]
    top = max((value for _, value in rows), default=0) or 1
    bars = tuple(
        Bar(label[:40], value, fmt.format(value), i * ROW, max(round(BAR * value / top), 1 if value else 0))
        for i, (label, value) in enumerate(rows)
    )
    return Chart(title, bars, max(len(bars), 1) * ROW)
