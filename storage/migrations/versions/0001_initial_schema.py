"""The first released schema: ``exchanges`` and ``purge_log``.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Databases created by ``metadata.create_all`` before migrations existed already hold an
``exchanges`` table and no ``alembic_version``: this revision adopts that table when its
columns are the ones below (it is then stamped 0001 like any other database) and
refuses a development database whose ``exchanges`` differs, rather than stamping a
schema it does not have.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from storage.migrations import SchemaError

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of storage.schema's types: a migration must not change when schema.py does.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)


def _exchanges_columns() -> list[sa.Column]:
    return [
        sa.Column("id", sa.String(64), nullable=False, comment="Exchange id (hex UUID)."),
        sa.Column("started_at", TIME, comment="When the request started (UTC)."),
        sa.Column("first_chunk_at", TIME, comment="When the first response body byte arrived (UTC)."),
        sa.Column("ended_at", TIME, comment="When the exchange ended (UTC)."),
        sa.Column(
            "status",
            sa.String(32),
            nullable=False,
            comment="in_progress, completed, failed, blocked, client_aborted, upstream_aborted, interrupted.",
        ),
        sa.Column("dialect", sa.String(32), nullable=False, comment="Protocol: llm-stream, openai-chat, ..."),
        sa.Column("provider", sa.String(64), comment="gen_ai.provider.name when known."),
        sa.Column("server_address", sa.String(255), comment="Upstream host."),
        sa.Column("server_port", sa.Integer(), comment="Upstream port."),
        sa.Column("http_method", sa.String(16)),
        sa.Column("url_path", sa.Text(), comment="Request path, without the query."),
        sa.Column("url_query", sa.Text(), comment="Query string, credentials fingerprinted."),
        sa.Column("http_version", sa.String(16), comment="HTTP version between client and proxy."),
        sa.Column("http_status", sa.Integer(), comment="Upstream response status."),
        sa.Column("client_address", sa.String(64), comment="Client IP address."),
        sa.Column("proxy_instance", sa.String(255), comment="Which proxy recorded the exchange."),
        sa.Column(
            "api_key_fingerprint", sa.String(32), comment="sha256: prefix of the credential, never the credential."
        ),
        sa.Column("request_headers", JSON, comment="Request headers, credentials fingerprinted."),
        sa.Column("response_headers", JSON, comment="Response headers, cookies fingerprinted."),
        sa.Column("request_model", sa.String(255), comment="Model the client asked for."),
        sa.Column("response_model", sa.String(255), comment="Model the upstream says served it."),
        sa.Column("response_id", sa.String(255), comment="Upstream response id."),
        sa.Column("request_id", sa.String(255), comment="Request id (metadata.request_id or echoed)."),
        sa.Column("user_id", sa.String(255), comment="End user (metadata.user_id)."),
        sa.Column("session_id", sa.String(255), comment="Session or conversation (metadata.session_id)."),
        sa.Column("task_id", sa.String(255), comment="LMSP task id; links a resumed event stream to its task."),
        sa.Column("streamed", sa.Boolean(), nullable=False, comment="True when the response was an event stream."),
        sa.Column("request_body", JSON, comment="The request body as JSON (a JSON string if it was not JSON)."),
        sa.Column("output_text", sa.Text(), comment="Answer text of choice / content block 0."),
        sa.Column("output", JSON, comment="Every choice's text, reasoning, refusal and stop reason; tool calls."),
        sa.Column("tool_calls", JSON, comment="List of {id, name, arguments}."),
        sa.Column("finish_reasons", JSON, comment="List of stop reasons, one per choice / block."),
        sa.Column("input_tokens", sa.BigInteger(), comment="NULL when the upstream reported none."),
        sa.Column("output_tokens", sa.BigInteger(), comment="NULL when the upstream reported none."),
        sa.Column("cache_read_input_tokens", sa.BigInteger()),
        sa.Column("cache_write_input_tokens", sa.BigInteger()),
        sa.Column("reasoning_output_tokens", sa.BigInteger()),
        sa.Column("usage_source", sa.String(16), comment="provider or none."),
        sa.Column("error_code", sa.String(255)),
        sa.Column("error_message", sa.Text()),
        sa.Column("findings", JSON, comment="List of {code, detail}."),
        sa.Column(
            "verdicts",
            JSON,
            comment="Content-filter verdicts: {action, rule_id, reason, filter, position, match_hash, ...}.",
        ),
        sa.Column("event_count", sa.Integer(), comment="SSE events dispatched (not counting replayed ones)."),
        sa.Column(
            "replayed_events",
            sa.Integer(),
            comment="Events of a resumed stream that an earlier exchange already audited.",
        ),
        sa.Column("bytes_to_client", sa.BigInteger(), comment="Body bytes forwarded to the client."),
    ]


def upgrade() -> None:
    existing = sa.inspect(op.get_bind())
    if existing.has_table("exchanges"):
        _adopt_exchanges(existing)
    else:
        op.create_table("exchanges", *_exchanges_columns(), sa.PrimaryKeyConstraint("id"))
        for column in ("started_at", "ended_at", "user_id", "request_model", "status"):
            op.create_index(f"ix_exchanges_{column}", "exchanges", [column])
    op.create_table(
        "purge_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("purged_at", TIME, nullable=False, comment="When the purge started (UTC)."),
        sa.Column("finished_at", TIME, comment="When it finished; NULL while running or if it was interrupted."),
        sa.Column(
            "actor", sa.String(255), nullable=False, comment="Who purged: the OS user, or the proxy's retention."
        ),
        sa.Column("cutoff", TIME, nullable=False, comment="Exchanges that ended before this time were deleted."),
        sa.Column("older_than", sa.Text(), nullable=False, comment="The age or date as given (183d, 2025-01-01, ...)."),
        sa.Column(
            "deleted_count", sa.BigInteger(), nullable=False, comment="Exchanges deleted, updated with every batch."
        ),
        sa.PrimaryKeyConstraint("id"),
        comment="Every purge of exchanges: who, when, the cut-off and how many rows went.",
    )


def _adopt_exchanges(existing: sa.Inspector) -> None:
    """Keep a pre-migration ``exchanges`` table, or refuse one with other columns."""
    have = {column["name"] for column in existing.get_columns("exchanges")}
    want = {column.name for column in _exchanges_columns()}
    if have != want:
        differences = [f"missing {name}" for name in sorted(want - have)]
        differences += [f"unexpected {name}" for name in sorted(have - want)]
        raise SchemaError(
            "it holds an 'exchanges' table from a development version of llm-audit without schema "
            f"migrations ({', '.join(differences)}); move the database aside (a new one is created) or fix the table"
        )


def downgrade() -> None:
    raise NotImplementedError("0001 is the first schema: there is nothing to go back to")
