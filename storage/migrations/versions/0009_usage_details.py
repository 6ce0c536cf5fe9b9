"""Token counts by kind beyond the five usage columns: audio, text and image tokens.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

OpenAI Realtime reports its usage by modality (``input_token_details.audio_tokens``,
``output_token_details.text_tokens``, ...), and Gemini Live by modality too; audio tokens
are priced apart from text ones. ``exchanges.usage_details`` keeps those counts, as a JSON
object of the names in :class:`addon.events.Usage` beyond the five usage columns
(``input_audio_tokens``, ``output_text_tokens``, ...); NULL when the upstream sent none.
``exchange_view`` is made again with it (after ``turn``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
COMMENT = "Token counts by kind beyond the usage columns ({input_audio_tokens: ..., ...}); NULL when none were sent."


def _view_sql(with_details: bool) -> str:
    previous = importlib.import_module("storage.migrations.versions.0008_turns")
    sql = previous._view_sql(with_turns=True)
    if not with_details:
        return sql
    marker = "connection_id,\n  turn,\n  "
    assert marker in sql
    return sql.replace(marker, f"{marker}usage_details,\n  ", 1)


def upgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("usage_details", JSON, comment=COMMENT))
    VIEW.create_view(_view_sql(with_details=True), grants)


def downgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("usage_details")
    VIEW.create_view(_view_sql(with_details=False), grants)
