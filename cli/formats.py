"""What scripts read: JSON, JSON Lines and CSV, streamed; and the progress bar of ``export``.

The field names are the query's (the ``exchange_view`` column names), times are ISO 8601
in UTC, JSON columns stay JSON (in CSV: JSON text), booleans are ``true``/``false``; the
same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import IO, Any

import orjson

from cli.terminal import visible

MACHINE_FORMATS = ("json", "jsonl", "csv")


def write_records(rows: Iterable[dict[str, Any]], fmt: str, fields: Sequence[str], out: IO[str]) -> None:
    """Write ``rows`` as ``json`` (one array), ``jsonl`` or ``csv`` (header: ``fields``), one
    row at a time: ``rows`` may be a stream larger than memory."""
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(fields)
        for row in rows:
            writer.writerow([_csv_cell(row[name]) for name in fields])
        return
    separator = "[\n" if fmt == "json" else ""
    for row in rows:
        out.write(separator + orjson.dumps(row).decode())
        separator = ",\n" if fmt == "json" else "\n"
    if fmt == "json":
        out.write("\n]\n" if separator == ",\n" else "[]\n")
    elif separator:
        out.write("\n")


def json_document(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n"


# A cell a spreadsheet would run as a formula (CWE-1236): its text starts with one of these.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> str:
    """One CSV cell: recorded text is hostile, so a cell that would start a formula is
    prefixed with ``'`` (the OWASP rule; spreadsheets then show it as text), and control
    characters, bidirectional marks and overrides (a file name shown reversed) and line
    separators are escaped as the terminal shows them (:func:`~cli.terminal.visible`:
    ``\x1b``, ``\u202e``); numbers are left as they are. JSON keeps the text exact."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    text = orjson.dumps(value).decode() if isinstance(value, dict | list) else str(value)
    text = visible(text)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class Progress:
    """A one-line progress bar on a terminal (``stream``, normally stderr), redrawn at most
    ten times a second; :meth:`track` passes the items through unchanged."""

    BAR = 30

    def __init__(self, total: int, stream: IO[str], what: str = "exchanges") -> None:
        self.total, self.stream, self.what = total, stream, what
        self._drawn = 0.0

    def track(self, items: Iterable[Any]) -> Iterator[Any]:
        n = 0
        for n, item in enumerate(items, 1):
            yield item
            if time.monotonic() - self._drawn >= 0.1:
                self._draw(n)
        self._draw(n, done=True)

    def _draw(self, n: int, done: bool = False) -> None:
        self._drawn = time.monotonic()
        share = n / self.total if self.total else 1.0
        filled = min(round(share * self.BAR), self.BAR)
        line = f"\r[{'#' * filled}{'.' * (self.BAR - filled)}] {min(share, 1.0):4.0%} {n}/{self.total} {self.what}"
        self.stream.write(line + ("\n" if done else ""))
        self.stream.flush()
