"""Tamper evidence against an insider: the proof that a write-ahead row is the proxy's
own, and the lease that keeps one proxy per chain.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``exchanges.open_mac``: an HMAC the proxy puts on each write-ahead row it opens, keyed by
a secret that never enters the database (storage/adoption.py); at its next start it seals
into its chain (as ``interrupted``) only the open rows whose HMAC checks out, so a row an
insider inserted is reported, not signed. ``chains.lease_holder`` / ``lease_until``: the
proxy writing the chain and until when its lease runs (renewed by a heartbeat): a second
proxy with the same instance name is refused at start instead of forking the chain.
New nullable columns only: earlier records' hashes do not change (NULL is not hashed) and
the view ``exchange_view`` is untouched.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(
            sa.Column(
                "open_mac",
                sa.String(64),
                comment="HMAC of the write-ahead row by the proxy that opened it (storage/adoption.py).",
            )
        )
    with op.batch_alter_table("chains") as batch:
        batch.add_column(
            sa.Column(
                "lease_holder", sa.String(255), comment="The proxy process writing this chain (host, pid, start)."
            )
        )
        batch.add_column(sa.Column("lease_until", TIME, comment="Until when its lease runs; renewed by its heartbeat."))


def downgrade() -> None:
    # Dropping columns copies the table on SQLite, which a view on it forbids: see 0003.
    view = importlib.import_module("storage.migrations.versions.0003_exchange_view")
    grants = view.drop_view()
    with op.batch_alter_table("chains") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("lease_holder")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("open_mac")
    view.create_view(
        view.view_sql(view.POSTGRESQL if op.get_bind().dialect.name == "postgresql" else view.SQLITE), grants
    )
