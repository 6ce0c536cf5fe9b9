"""What HTTP status the client received when the proxy answered in the upstream's place.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

- ``exchanges.client_status``: the HTTP status of the proxy's own answer when it
  replaced one the upstream sent (a content filter blocked a held, non-streamed answer:
  the client got, for example, HTTP 400 where the upstream said 200); NULL when the
  client received the status in ``http_status``.
- ``exchange_view.client_status``: the status the client received in every case,
  ``coalesce(client_status, http_status)``. The view is made again with the column
  added (after ``client_text``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

COMMENT = (
    "HTTP status the client received when the proxy replaced the upstream's answer "
    "(a blocked held answer); NULL when the client got http_status."
)


def _view_sql(with_client_status: bool) -> str:
    expressions = VIEW.POSTGRESQL if op.get_bind().dialect.name == "postgresql" else VIEW.SQLITE
    if not with_client_status:
        return VIEW.view_sql(expressions)
    at = VIEW.COLUMNS.index("client_text") + 1
    columns = (*VIEW.COLUMNS[:at], "client_status", *VIEW.COLUMNS[at:])
    expressions = expressions | {"client_status": "coalesce(client_status, http_status)"}
    body = ",\n  ".join(f"{expressions[name]} AS {name}" if name in expressions else name for name in columns)
    return f"CREATE VIEW exchange_view AS SELECT\n  {body}\nFROM exchanges"


def upgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("client_status", sa.Integer(), comment=COMMENT))
    VIEW.create_view(_view_sql(with_client_status=True), grants)


def downgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("client_status")
    VIEW.create_view(_view_sql(with_client_status=False), grants)
