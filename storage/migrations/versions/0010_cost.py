"""What each exchange cost, and which price data said so.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

- ``exchanges.cost_usd``: the price of the exchange in US dollars, computed from its
  provider, model and recorded usage (:mod:`storage.cost`); NULL when the price is not
  known (an unknown model or provider, no usage reported), never a guess;
- ``exchanges.cost_prices``: which price data computed it (``genai-prices 0.2.3``, or
  ``override:`` and the first 12 hex digits of the file's SHA-256); NULL when ``cost_usd`` is.

Both are derived data, not evidence: they stay out of the hash chain (:mod:`storage.chain`),
so that ``llm-audit cost recompute`` can set them again after a price update.
``exchange_view`` is made again with both (after ``usage_details``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's own revision: drop_view and create_view keep PostgreSQL's grants on it.
VIEW = importlib.import_module("storage.migrations.versions.0003_exchange_view")

# As storage.schema.Money: numeric(20, 12), read back as float (see there why).
MONEY = sa.Numeric(20, 12, asdecimal=False)
COST_COMMENT = "Price of the exchange in US dollars (storage/cost.py); NULL when the price is unknown, never a guess."
PRICES_COMMENT = (
    "Which price data computed cost_usd: genai-prices and its version, or override: and the file's sha256 prefix."
)


def _view_sql(with_cost: bool) -> str:
    previous = importlib.import_module("storage.migrations.versions.0009_usage_details")
    sql = previous._view_sql(with_details=True)
    if not with_cost:
        return sql
    marker = "usage_details,\n  "
    assert sql.count(marker) == 1
    return sql.replace(marker, f"{marker}cost_usd,\n  cost_prices,\n  ", 1)


def upgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(sa.Column("cost_usd", MONEY, comment=COST_COMMENT))
        batch.add_column(sa.Column("cost_prices", sa.String(64), comment=PRICES_COMMENT))
    VIEW.create_view(_view_sql(with_cost=True), grants)


def downgrade() -> None:
    grants = VIEW.drop_view()
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("cost_prices")
        batch.drop_column("cost_usd")
    VIEW.create_view(_view_sql(with_cost=False), grants)
