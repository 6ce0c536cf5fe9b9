"""The tables of ``list`` and ``stats``: columns that narrow, then thin out, to fit the width."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cli.terminal import STATUS_COLORS, Style, clip, display_width, one_line, pad, timestamp

GAP = "  "  # between table columns


@dataclass
class Column:
    """A table column: its header, its cells (one line each), and how it gives way.

    A ``flex`` column gives way first (down to ``min_width``), then the other columns
    with a ``min_width``, widest first; ``min_width`` None: never narrowed. When even
    that does not fit, the columns with the lowest ``keep`` are left out. ``colors``
    maps a cell to its colour.
    """

    header: str
    cells: list[str]
    min_width: int | None = None
    right: bool = False
    keep: int = 0
    flex: bool = False
    colors: Callable[[str], str | None] | None = None

    @property
    def natural(self) -> int:
        return max([display_width(self.header), *map(display_width, self.cells)])


def table(columns: Sequence[Column], width: int, style: Style) -> str:
    """The columns as a table of at most ``width`` columns: narrowed, then thinned out."""
    columns = list(columns)
    while True:
        widths = _narrowed(columns, width)
        if widths is not None or len(columns) == 1:
            break
        columns.remove(min(columns, key=lambda c: c.keep))
    widths = widths or [width]
    header = GAP.join(pad(clip(c.header, w), w, c.right) for c, w in zip(columns, widths, strict=True))
    lines = [style.bold(header.rstrip())]
    for i in range(len(columns[0].cells)):
        cells = []
        for c, w in zip(columns, widths, strict=True):
            cell = pad(clip(c.cells[i], w), w, c.right)
            cells.append(style(cell, c.colors(c.cells[i])) if c.colors else cell)
        lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines)


def _narrowed(columns: Sequence[Column], width: int) -> list[int] | None:
    """Widths that fit ``width``, taken from the widest narrowable columns first; None if impossible."""
    widths = [c.natural for c in columns]
    floors = [min(c.min_width, w) if c.min_width is not None else w for c, w in zip(columns, widths, strict=True)]
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - width
    for i, c in enumerate(columns):
        if c.flex and excess > 0:
            step = min(excess, widths[i] - floors[i])
            widths[i] -= step
            excess -= step
    while excess > 0:
        slack = [w - floor for w, floor in zip(widths, floors, strict=True)]
        i = max(range(len(columns)), key=slack.__getitem__)
        if slack[i] <= 0:
            return None
        widths[i] -= 1
        excess -= 1
    return widths


def exchanges_table(rows: Sequence[dict[str, Any]], width: int, style: Style) -> str:
    """``list`` for a person: time, id, who, which model, how it ended, tokens, the output's first words."""

    def cells(fn: Callable[[dict[str, Any]], Any]) -> list[str]:
        return [one_line(str(v)) if (v := fn(r)) is not None else "-" for r in rows]

    return table([
        Column("time (UTC)", cells(lambda r: timestamp(r["started_at"], seconds=False)), keep=9),
        Column("id", cells(lambda r: (r["id"] or "-")[:12]), keep=7),  # (None: an id llm-audit did not write)
        Column("client", cells(lambda r: r["client_address"]), min_width=15, keep=2),
        Column("user", cells(lambda r: r["user_id"]), min_width=8, keep=5),
        Column("provider", cells(lambda r: r["provider"]), min_width=9, keep=1),
        Column("model", cells(lambda r: r["request_model"]), min_width=12, keep=6),
        Column("status", cells(lambda r: r["status"]), keep=8, colors=lambda s: STATUS_COLORS.get(s)),
        Column("tokens", cells(_tokens), right=True, keep=3),
        Column("output", cells(_snippet), min_width=20, keep=4, flex=True),
    ], width, style)  # fmt: skip


def _tokens(row: dict[str, Any]) -> str | None:
    if row["input_tokens"] is None and row["output_tokens"] is None:
        return None
    return f"{_or_dash(row['input_tokens'])}/{_or_dash(row['output_tokens'])}"


def _snippet(row: dict[str, Any]) -> str:
    """The first words of what the client received, else the error."""
    text = one_line(row["client_text"])[:200]
    if not text and (row["error_code"] or row["error_message"]):
        text = f"[{row['error_code'] or 'error'}] {one_line(row['error_message'])[:200]}"
    return text


def stats_table(rows: Sequence[dict[str, Any]], by: Sequence[str], width: int, style: Style) -> str:
    """``stats`` for a person: the group keys, then the counts and sums right-aligned."""

    def cells(name: str) -> list[str]:
        if name == "cost_usd":  # US dollars to the millionth: one short exchange costs some ten-thousandths
            return ["-" if r[name] is None else f"{r[name]:.6f}" for r in rows]
        return [_or_dash(r[name]) for r in rows]

    keys = [
        Column(key, [one_line(str(r[key])) if r[key] is not None else "-" for r in rows], min_width=8, keep=9)
        for key in by
    ]
    # (field, header, keep): on a narrow terminal the lowest keep goes first
    numbers = [
        ("exchanges", "exchanges", 8), ("with_usage", "with usage", 3), ("input_tokens", "input", 7),
        ("output_tokens", "output", 7), ("cache_read_input_tokens", "cached", 4),
        ("reasoning_output_tokens", "reasoning", 2), ("cost_usd", "cost $", 7), ("priced", "priced", 1),
        ("errors", "errors", 6), ("blocks", "blocks", 6), ("time_to_first_chunk_p50_ms", "ttfc p50 ms", 5),
        ("time_to_first_chunk_p95_ms", "ttfc p95 ms", 4),
    ]  # fmt: skip
    return table(
        [*keys, *(Column(header, cells(name), right=True, keep=keep) for name, header, keep in numbers)], width, style
    )


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)
