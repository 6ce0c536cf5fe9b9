"""The quarantine table: records kept in a quarantine file instead of ``exchanges``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

The writer quarantines a spool line that cannot be read back (torn, corrupted) and a row
the database refuses even reduced to a minimal row (storage/quarantine.py). The raw line
stays in the quarantine file beside the spool; this table names it, with the record's
chain columns as far as they could be recovered, so that ``llm-audit verify`` reports a
quarantined record where its chain has a gap instead of tampering. A new table only: the
view ``exchange_view`` is untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "quarantine",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("quarantined_at", TIME, nullable=False, comment="When the record was quarantined (UTC)."),
        sa.Column("reason", sa.Text(), nullable=False, comment="Why it could be written nowhere as it was."),
        sa.Column("file", sa.Text(), nullable=False, comment="The quarantine file that keeps the raw line."),
        sa.Column("size", sa.BigInteger(), nullable=False, comment="Bytes of the raw line."),
        sa.Column("sha256", sa.String(64), nullable=False, comment="SHA-256 of the raw line."),
        sa.Column("chain_id", sa.String(255), comment="The record's hash chain, when it could be read from the line."),
        sa.Column("chain_seq", sa.BigInteger(), comment="Its position in the chain, when known."),
        sa.Column("prev_hash", sa.String(64), comment="Its prev_hash, when known."),
        sa.Column("record_hash", sa.String(64), comment="Its record_hash, when known."),
        sa.Column("record_id", sa.String(64), comment="The exchange id, when known."),
        sa.PrimaryKeyConstraint("id"),
        comment="Records kept in a quarantine file instead of exchanges: unreadable spool lines, rows refused even reduced.",
    )
    op.create_index("ux_quarantine_file_sha256", "quarantine", ["file", "sha256"], unique=True)
    op.create_index("ix_quarantine_chain_id_chain_seq", "quarantine", ["chain_id", "chain_seq"])


def downgrade() -> None:
    op.drop_index("ix_quarantine_chain_id_chain_seq", "quarantine")
    op.drop_index("ux_quarantine_file_sha256", "quarantine")
    op.drop_table("quarantine")
