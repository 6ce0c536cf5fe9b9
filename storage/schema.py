"""The audit database schema, in SQLAlchemy Core.

One row per exchange in ``exchanges``; one row per purge in ``purge_log``. Column
names follow the project's issues and, where one exists, the OpenTelemetry GenAI
attribute they mirror (``request_model`` ~ ``gen_ai.request.model``, ``input_tokens`` ~
``gen_ai.usage.input_tokens``, ...).
JSON columns are ``jsonb`` on PostgreSQL and JSON text on SQLite; times are UTC.

This module describes the schema the code expects (the head of the migrations); the
database gets there through ``storage/migrations``. A change here needs a new
migration: ``tests/unit/test_migrations.py`` fails until the two agree.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

Json = JSON().with_variant(JSONB(), "postgresql")
Time = DateTime(timezone=True)

exchanges = Table(
    "exchanges",
    metadata,
    Column("id", String(64), primary_key=True, comment="Exchange id (hex UUID)."),
    Column("started_at", Time, comment="When the request started (UTC)."),
    Column("first_chunk_at", Time, comment="When the first response body byte arrived (UTC)."),
    Column("ended_at", Time, comment="When the exchange ended (UTC)."),
    Column("status", String(32), nullable=False, comment="in_progress, completed, failed, blocked, client_aborted, upstream_aborted, interrupted."),
    Column("dialect", String(32), nullable=False, comment="Protocol: llm-stream, openai-chat, ..."),
    Column("provider", String(64), comment="gen_ai.provider.name when known."),
    Column("server_address", String(255), comment="Upstream host."),
    Column("server_port", Integer, comment="Upstream port."),
    Column("http_method", String(16)),
    Column("url_path", Text, comment="Request path, without the query."),
    Column("url_query", Text, comment="Query string, credentials fingerprinted."),
    Column("http_version", String(16), comment="HTTP version between client and proxy."),
    Column("http_status", Integer, comment="Upstream response status."),
    Column("client_address", String(64), comment="Client IP address."),
    Column("proxy_instance", String(255), comment="Which proxy recorded the exchange."),
    Column("api_key_fingerprint", String(32), comment="sha256: prefix of the credential, never the credential."),
    Column("request_headers", Json, comment="Request headers, credentials fingerprinted."),
    Column("response_headers", Json, comment="Response headers, cookies fingerprinted."),
    Column("request_model", String(255), comment="Model the client asked for."),
    Column("response_model", String(255), comment="Model the upstream says served it."),
    Column("response_id", String(255), comment="Upstream response id."),
    Column("request_id", String(255), comment="Request id (metadata.request_id or echoed)."),
    Column("user_id", String(255), comment="End user (metadata.user_id)."),
    Column("session_id", String(255), comment="Session or conversation (metadata.session_id)."),
    Column("task_id", String(255), comment="LMSP task id; links a resumed event stream to its task."),
    Column("streamed", Boolean, nullable=False, comment="True when the response was an event stream."),
    Column("request_body", Json, comment="The request body as JSON (a JSON string if it was not JSON)."),
    Column("output_text", Text, comment="Answer text of choice / content block 0."),
    Column("output", Json, comment="Every choice's text, reasoning, refusal and stop reason; tool calls."),
    Column("tool_calls", Json, comment="List of {id, name, arguments}."),
    Column("finish_reasons", Json, comment="List of stop reasons, one per choice / block."),
    Column("input_tokens", BigInteger, comment="NULL when the upstream reported none."),
    Column("output_tokens", BigInteger, comment="NULL when the upstream reported none."),
    Column("cache_read_input_tokens", BigInteger),
    Column("cache_write_input_tokens", BigInteger),
    Column("reasoning_output_tokens", BigInteger),
    Column("usage_source", String(16), comment="provider or none."),
    Column("error_code", String(255)),
    Column("error_message", Text),
    Column("findings", Json, comment="List of {code, detail}."),
    Column("verdicts", Json, comment="Content-filter verdicts: {action, rule_id, reason, filter, position, match_hash, ...}."),
    Column("event_count", Integer, comment="SSE events dispatched (not counting replayed ones)."),
    Column("replayed_events", Integer, comment="Events of a resumed stream that an earlier exchange already audited."),
    Column("bytes_to_client", BigInteger, comment="Body bytes forwarded to the client."),
    Column("bytes_from_upstream", BigInteger, comment="Body bytes received from the upstream."),
    Column(
        "delivered_text", Text,
        comment="Answer text the client received, when a content filter made it differ from output_text; else NULL.",
    ),
    Index("ix_exchanges_started_at", "started_at"),
    Index("ix_exchanges_ended_at", "ended_at"),
    Index("ix_exchanges_user_id", "user_id"),
    Index("ix_exchanges_request_model", "request_model"),
    Index("ix_exchanges_status", "status"),
)

purge_log = Table(
    "purge_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("purged_at", Time, nullable=False, comment="When the purge started (UTC)."),
    Column("finished_at", Time, comment="When it finished; NULL while running or if it was interrupted."),
    Column("actor", String(255), nullable=False, comment="Who purged: the OS user, or the proxy's retention."),
    Column("cutoff", Time, nullable=False, comment="Exchanges that ended before this time were deleted."),
    Column("older_than", Text, nullable=False, comment="The age or date as given (183d, 2025-01-01, ...)."),
    Column("deleted_count", BigInteger, nullable=False, comment="Exchanges deleted, updated with every batch."),
    comment="Every purge of exchanges: who, when, the cut-off and how many rows went.",
)
