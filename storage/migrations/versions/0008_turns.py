"""Records of one long-lived stream: which connection they came over and which turn they are.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

A bidirectional stream (Cursor's chat over Connect, and later WebSocket chats) carries
many answers before it ends, if it ever does; each answer is a record of its own, written
when its turn ends. These columns tie them together:

- ``exchanges.connection_id``: the id the proxy gave the stream (or connection) the record
  came over; the same for every turn of it; NULL for an ordinary one-exchange request;
- ``exchanges.turn``: the turn's position in that stream, 0, 1, 2, ...; NULL likewise.

``exchange_view`` is made again with both added (after ``client_status``), and the
connection's records are found by an index on ``(connection_id, turn)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

CONNECTION_COMMENT = "The stream or connection the record came over (shared by its turns); NULL for a single exchange."
TURN_COMMENT = "Position of this answer in its stream or connection: 0, 1, ...; NULL for a single exchange."


def _view_sql(with_turns: bool) -> str:
    previous = importlib.import_module("storage.migrations.versions.0007_client_status")
    sql = previous._view_sql(with_client_status=True)
    if not with_turns:
        return sql
    # client_status is followed by request_body in the view: put the new columns between.
    marker = " AS client_status,\n  "
    assert marker in sql
    return sql.replace(marker, f"{marker}connection_id,\n  turn,\n  ", 1)


def upgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("connection_id", sa.String(64), comment=CONNECTION_COMMENT))
        batch.add_column(sa.Column("turn", sa.Integer(), comment=TURN_COMMENT))
    op.create_index("ix_exchanges_connection_id_turn", "exchanges", ["connection_id", "turn"])
    VIEW.create_view(_view_sql(with_turns=True), grants)


def downgrade() -> None:
    grants = VIEW.drop_view()
    op.drop_index("ix_exchanges_connection_id_turn", table_name="exchanges")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("turn")
        batch.drop_column("connection_id")
    VIEW.create_view(_view_sql(with_turns=False), grants)
