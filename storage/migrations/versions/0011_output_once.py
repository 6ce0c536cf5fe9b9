"""The answer is stored once: choice 0's text and the tool calls' arguments leave ``output``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

From this revision on the proxy writes ``output.choices[0]`` without its ``text`` (it is
``output_text``) and ``output.tool_calls`` without their ``arguments`` (they are in the
``tool_calls`` column, the same calls in the same order): a long stream's answer, or a tool
call carrying a file, was written, hashed and held twice. ``exchange.transcript``'s
``output_choices`` and ``output_tool_calls`` read a row in either form. Only the
column's comment changes (PostgreSQL keeps comments; SQLite has none, so this is a no-op
there). Rows written before keep their repeated text: they are sealed in the hash chain
as they are, and every reader takes either form.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_COMMENT = "Every choice's text, reasoning, refusal and stop reason; tool calls."
NEW_COMMENT = "Every choice's reasoning, refusal, stop reason and text (choice 0's is output_text); tool calls (their arguments are in tool_calls)."


def _comment(comment: str, existing: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.alter_column(
        "exchanges",
        "output",
        comment=comment,
        existing_comment=existing,
        existing_type=JSONB(),  # (PostgreSQL only: the column is jsonb there)
    )


def upgrade() -> None:
    _comment(NEW_COMMENT, OLD_COMMENT)


def downgrade() -> None:
    _comment(OLD_COMMENT, NEW_COMMENT)
