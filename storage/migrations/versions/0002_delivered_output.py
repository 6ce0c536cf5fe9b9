"""What the client received when a content filter held back or cut the output.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

- ``bytes_from_upstream``: body bytes received from the upstream. Equal to
  ``bytes_to_client`` unless the proxy answered itself (a blocked request) or a content
  filter withheld or replaced part of the stream.
- ``delivered_text``: the answer text (choice / content block 0) the client received,
  when it differs from ``output_text`` (the upstream's text as received); NULL when the
  client received all of ``output_text``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(
            sa.Column("bytes_from_upstream", sa.BigInteger(), comment="Body bytes received from the upstream.")
        )
        batch.add_column(
            sa.Column(
                "delivered_text",
                sa.Text(),
                comment="Answer text the client received, when a content filter made it differ from output_text; else NULL.",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("delivered_text")
        batch.drop_column("bytes_from_upstream")
