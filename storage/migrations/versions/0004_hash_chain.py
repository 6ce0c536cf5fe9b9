"""Tamper evidence: hash-chain columns, the chains table, the erasure log.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

Final records written before this revision are sealed here, into the chain of the proxy
instance that wrote them, in the order they started: from now on they are as
tamper-evident as new ones (``llm-audit verify`` treats a final record in no chain as
inserted by hand). Columns are only added, so the view ``exchange_view`` can stay
(see 0003).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(
            sa.Column(
                "chain_id",
                sa.String(255),
                comment="Hash chain of the writer that sealed the final record (its instance).",
            )
        )
        batch.add_column(sa.Column("chain_seq", sa.BigInteger(), comment="Position in its chain: 1, 2, 3, ..."))
        batch.add_column(
            sa.Column(
                "prev_hash",
                sa.String(64),
                comment="record_hash of the record before it in the chain (64 zeros for the first).",
            )
        )
        batch.add_column(
            sa.Column(
                "record_hash",
                sa.String(64),
                comment="SHA-256 of the canonical serialization of the record (storage/chain.py).",
            )
        )
        batch.add_column(
            sa.Column("content_hashes", JSON, comment="SHA-256 of each content column; they stand for erased content.")
        )
        batch.add_column(
            sa.Column("erased_at", TIME, comment="When llm-audit erase replaced the content with an erasure marker.")
        )
    op.create_index("ix_exchanges_chain_id_chain_seq", "exchanges", ["chain_id", "chain_seq"])
    with op.batch_alter_table("purge_log") as batch:
        batch.add_column(
            sa.Column(
                "chain_starts", JSON, comment="Where each hash chain begins after the purge: {chain: {seq, prev_hash}}."
            )
        )
    op.create_table(
        "chains",
        sa.Column("chain_id", sa.String(255), nullable=False, comment="A writer's chain: its proxy instance name."),
        sa.Column("head_seq", sa.BigInteger(), nullable=False, comment="chain_seq of the last record written."),
        sa.Column("head_hash", sa.String(64), nullable=False, comment="record_hash of the last record written."),
        sa.Column(
            "start_seq", sa.BigInteger(), nullable=False, comment="chain_seq of the first record kept (after purges)."
        ),
        sa.Column("start_prev_hash", sa.String(64), nullable=False, comment="record_hash of the last record purged."),
        sa.PrimaryKeyConstraint("chain_id"),
        comment="Each hash chain's head, and where it begins after purges.",
    )
    op.create_table(
        "erasure_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("erased_at", TIME, nullable=False, comment="When the erasure ran (UTC)."),
        sa.Column("actor", sa.String(255), nullable=False, comment="Who erased: the OS user."),
        sa.Column("user_id", sa.String(255), nullable=False, comment="The data subject whose content was erased."),
        sa.Column("erased_count", sa.BigInteger(), nullable=False, comment="Exchanges whose content was erased."),
        sa.PrimaryKeyConstraint("id"),
        comment="Every erasure of a user's content (data-subject requests).",
    )
    _seal_existing_records()


def _seal_existing_records(batch: int = 500) -> None:
    """Seal the final records already in the database (storage/chain.py's canonical form,
    which never changes: verify depends on it)."""
    from storage.chain import Chain, Head

    bind = op.get_bind()
    table = sa.Table("exchanges", sa.MetaData(), autoload_with=bind)  # this revision's columns, typed
    chains_table = sa.Table("chains", sa.MetaData(), autoload_with=bind)
    ids = bind.execute(
        sa.select(table.c.id, table.c.proxy_instance)
        .where(table.c.status != "in_progress")
        .order_by(table.c.started_at, table.c.id)
    ).all()
    writers: dict[str, Chain] = {}
    for i in range(0, len(ids), batch):
        part = ids[i : i + batch]
        rows = {
            r["id"]: dict(r)
            for r in bind.execute(sa.select(table).where(table.c.id.in_([r.id for r in part]))).mappings()
        }
        for rid, instance in part:
            chain = writers.setdefault(instance or "unknown", Chain(instance or "unknown", Head()))
            sealed = chain.seal(rows[rid])
            bind.execute(
                table.update()
                .where(table.c.id == rid)
                .values(
                    {
                        name: sealed[name]
                        for name in ("chain_id", "chain_seq", "prev_hash", "record_hash", "content_hashes")
                    }
                )
            )
    for chain in writers.values():
        bind.execute(
            chains_table.insert().values(
                chain_id=chain.chain_id,
                head_seq=chain.head.seq,
                head_hash=chain.head.hash,
                start_seq=1,
                start_prev_hash="0" * 64,
            )
        )


def downgrade() -> None:
    # Dropping columns copies the table on SQLite, which a view on it forbids: see 0003.
    view = importlib.import_module("storage.migrations.versions.0003_exchange_view")
    grants = view.drop_view()
    op.drop_table("erasure_log")
    op.drop_table("chains")
    with op.batch_alter_table("purge_log") as batch:
        batch.drop_column("chain_starts")
    op.drop_index("ix_exchanges_chain_id_chain_seq", "exchanges")
    with op.batch_alter_table("exchanges") as batch:
        for name in ("erased_at", "content_hashes", "record_hash", "prev_hash", "chain_seq", "chain_id"):
            batch.drop_column(name)
    view.create_view(
        view.view_sql(view.POSTGRESQL if op.get_bind().dialect.name == "postgresql" else view.SQLITE), grants
    )
