"""A huge answer is stored as UTF-8 bytes in the last column of ``exchanges``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

- ``exchanges.output_text_utf8``: on SQLite, an answer of a million characters or more is
  written here, as its UTF-8 bytes, and ``output_text`` is NULL (``storage/writer.py``).
  Bound as a text parameter, SQLite holds a copy of the value and then builds the whole
  row in memory: about twice the text on top of the text the proxy holds. A zero-filled
  BLOB in a row's *last* column is the one value SQLite writes without making it, and
  its bytes are then written a slice at a time (incremental blob I/O): so the column must
  stay the last of the table (``tests/unit/test_answer_bytes.py`` checks it).
  PostgreSQL has the column too (the same columns on both) and leaves it NULL.
- ``exchange_view.output_text`` (and ``client_text``) read either form, so queries,
  ``llm-audit`` and ``verify`` see the answer as before; the hash chain covers the answer
  text whichever column holds it.

Added with ``ADD COLUMN``, which puts it last on both backends without copying the table.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = (
    "The answer as UTF-8 bytes when it was too long to write as text (SQLite, a million characters and more); "
    "output_text is then NULL. exchange_view.output_text reads either."
)
# The answer in either form, as text: what exchange_view shows as output_text.
ANSWER = {
    "sqlite": "coalesce(output_text, CAST(output_text_utf8 AS TEXT))",
    "postgresql": "coalesce(output_text, convert_from(output_text_utf8, 'UTF8'))",
}


def _view_sql(either_form: bool) -> str:
    previous = importlib.import_module("storage.migrations.versions.0010_cost")
    sql = previous._view_sql(with_cost=True)
    if not either_form:
        return sql
    answer = ANSWER["postgresql" if op.get_bind().dialect.name == "postgresql" else "sqlite"]
    for old, new in (
        ("\n  output_text,\n", f"\n  {answer} AS output_text,\n"),
        ("coalesce(delivered_text, output_text) AS client_text", f"coalesce(delivered_text, {answer}) AS client_text"),
    ):
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new, 1)
    return sql


def upgrade() -> None:
    op.execute("DROP VIEW exchange_view")
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("output_text_utf8", sa.LargeBinary(), comment=COMMENT))
    op.execute(_view_sql(either_form=True))


def downgrade() -> None:
    op.execute("DROP VIEW exchange_view")
    answer = ANSWER["postgresql" if op.get_bind().dialect.name == "postgresql" else "sqlite"]
    op.execute(f"UPDATE exchanges SET output_text = {answer} WHERE output_text_utf8 IS NOT NULL")  # kept as text
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("output_text_utf8")
    op.execute(_view_sql(either_form=False))
