"""SQLite's ``exchange_view`` reads a JSON column only when it holds JSON.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07

SQLite keeps any text in any column, and its JSON functions raise on text that is no
JSON ("malformed JSON"): one such value in ``findings``, ``verdicts``, ``tool_calls`` or
``request_headers``, planted by whoever can write the database, made every query of the
view fail, so ``llm-audit list``, ``export`` and ``stats`` and the review pages answered
nothing for any record. The view now reads those columns through ``json_valid``
(``CASE``, which SQLite evaluates lazily: an ``AND`` may evaluate both sides), so such a
record's derived columns are NULL and the other records are read; ``llm-audit verify``
names the record. PostgreSQL's ``jsonb`` holds only JSON: its view is left as it is
(and so are its grants).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

JSON_READ = ("verdicts", "findings", "tool_calls")  # read with json_type, then json_each or json_array_length


def _view_sql(guarded: bool) -> str:
    """SQLite's view, reading JSON only where it is JSON when ``guarded``."""
    sql = importlib.import_module("storage.migrations.versions.0012_answer_bytes")._view_sql(either_form=True)
    if not guarded:
        return sql
    replacements = [
        (f"json_type({column}) = 'array'", f"CASE WHEN json_valid({column}) THEN json_type({column}) END = 'array'")
        for column in JSON_READ
    ]
    headers = """json_extract(request_headers, '$."user-agent"')"""
    replacements.append((headers, f"CASE WHEN json_valid(request_headers) THEN {headers} END"))
    for old, new in replacements:
        assert old in sql, old
        sql = sql.replace(old, new)
    return sql


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        VIEW.create_view(_view_sql(guarded=True), VIEW.drop_view())


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        VIEW.create_view(_view_sql(guarded=False), VIEW.drop_view())
