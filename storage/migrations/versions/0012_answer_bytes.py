"""A huge answer is stored as UTF-8 bytes in the last column of ``exchanges``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

- ``exchanges.output_text_utf8``: on SQLite, a final record's answer of 2^20 characters or more is
  written here, as its UTF-8 bytes, and ``output_text`` is NULL (``storage/writer.py``).
  Bound as a text parameter, SQLite holds a copy of the value and then builds the whole
  row in memory: about twice the text on top of the text the proxy holds. A zero-filled
  BLOB in a row's *last* column is the one value SQLite writes without making it, and
  its bytes are then written a slice at a time (incremental blob I/O): so the column must
  stay the last of the table (``tests/unit/test_answer_bytes.py`` checks it).
  PostgreSQL has the column too (the same columns on both) and leaves it NULL.
- On SQLite ``exchange_view.output_text`` (and ``client_text``) read either form, so
  queries, ``llm-audit`` and ``verify`` see the answer as before; the hash chain covers the
  answer text whichever column holds it. PostgreSQL's view is left as it is (and so are
  its grants): the writer never puts bytes there, and ``verify`` reports any it finds.

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

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

COMMENT = (
    "SQLite: the answer as UTF-8 bytes when it was too long to write as text (2^20 characters and more); "
    "output_text is then NULL and exchange_view.output_text reads this. NULL on PostgreSQL."
)
# The answer in either form, as text: what SQLite's exchange_view shows as output_text.
# Only a BLOB is read (SQLite lets any type into any column; verify reports anything else).
TEXT_COMMENT = (
    "Answer text of choice / content block 0.",
    "Answer text of choice / content block 0 (NULL when in output_text_utf8).",
)
ANSWER = "coalesce(output_text, CASE WHEN typeof(output_text_utf8) = 'blob' THEN CAST(output_text_utf8 AS TEXT) END)"


def _view_sql(either_form: bool) -> str:
    """SQLite's view (PostgreSQL's is left as it is, and so are its grants)."""
    previous = importlib.import_module("storage.migrations.versions.0010_cost")
    sql = previous._view_sql(with_cost=True)
    if not either_form:
        return sql
    for old, new in (
        ("\n  output_text,\n", f"\n  {ANSWER} AS output_text,\n"),
        ("coalesce(delivered_text, output_text) AS client_text", f"coalesce(delivered_text, {ANSWER}) AS client_text"),
    ):
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new, 1)
    return sql


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name != "postgresql"
    if sqlite:
        grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("output_text_utf8", sa.LargeBinary(), comment=COMMENT))
    if sqlite:
        VIEW.create_view(_view_sql(either_form=True), grants)
    else:  # (comments: PostgreSQL only)
        op.alter_column("exchanges", "output_text", comment=TEXT_COMMENT[1], existing_comment=TEXT_COMMENT[0])


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name != "postgresql"
    if sqlite:
        grants = VIEW.drop_view()
        # the answers stored as bytes, kept as text
        op.execute(f"UPDATE exchanges SET output_text = {ANSWER} WHERE output_text_utf8 IS NOT NULL")
    else:
        op.alter_column("exchanges", "output_text", comment=TEXT_COMMENT[0], existing_comment=TEXT_COMMENT[1])
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("output_text_utf8")
    if sqlite:
        VIEW.create_view(_view_sql(either_form=False), grants)
