"""The audit database schema, in SQLAlchemy Core.

One row per exchange in ``exchanges``; one row per purge in ``purge_log``; one row per
quarantined record in ``quarantine``; one flat row per
exchange in the view ``exchange_view`` (for ``llm-audit`` and analysts). Column
names follow the project's issues and, where one exists, the OpenTelemetry GenAI
attribute they mirror (``request_model`` ~ ``gen_ai.request.model``, ``input_tokens`` ~
``gen_ai.usage.input_tokens``, ...).
JSON columns are ``jsonb`` on PostgreSQL and JSON text on SQLite; times are UTC.

This module describes the schema the code expects (the head of the migrations); the
database gets there through ``storage/migrations``. A change here needs a new
migration: ``tests/unit/test_migrations.py`` fails until the two agree.

``exchange_view`` is described here as a table of its own :data:`views` metadata (so
Alembic's comparison of tables does not take it for a missing table): its SQL differs per
backend and lives in the migration that creates it (``0003``), its columns and their
meaning are the same on both, and the tests check that the database's view has exactly
the columns below. Columns without a comment are those of ``exchanges``, unchanged.
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
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()

IN_PROGRESS = "in_progress"  # the status of an exchange's write-ahead row, until it ends
ANSWER_BYTES = "output_text_utf8"  # a huge answer's column on SQLite, in place of output_text

Json = JSON().with_variant(JSONB(), "postgresql")
# The JSON columns' values as the writer stores them (readers iterate them, and on SQLite,
# where a column holds whatever was put there, storage.stored holds a value to them): a
# list or an object, or a string (a value the writer reduced to its JSON text, or erased
# content). A JSON column not named here may hold any JSON value; a bare number only in
# JSON_BARE_NUMBER (a client's body, which SQLite's NUMERIC affinity stored as a number
# until the writer stored such a body as its JSON text).
JSON_LISTS = frozenset({"findings", "verdicts", "tool_calls", "finish_reasons"})
JSON_OBJECTS = frozenset({"output", "request_headers", "response_headers", "usage_details", "content_hashes"})
JSON_BARE_NUMBER = "request_body"
Time = DateTime(timezone=True)
# Money, in US dollars: numeric(20, 12) is exact on PostgreSQL (sums in SQL, as stats and
# budgets take them, are exact too), 12 decimal places hold a single token of the cheapest
# price (a hundredth of a dollar per million tokens is 1e-8). SQLite has no decimal type:
# the column has NUMERIC affinity and keeps a double (15 significant digits: far below a
# nano-dollar for any exchange under a million dollars). Read back as float on both
# (asdecimal=False): SQLAlchemy would otherwise convert SQLite's doubles to Decimal with a
# warning about rounding, and the writer's spool serializes rows with orjson, which takes
# floats, not Decimals. Costs are computed in Decimal (storage/cost.py) and rounded to
# the 12 places once, when stored.
Money = Numeric(20, 12, asdecimal=False)

exchanges = Table(
    "exchanges",
    metadata,
    Column("id", String(64), primary_key=True, comment="Exchange id (hex UUID)."),
    Column("started_at", Time, comment="When the request started (UTC)."),
    Column("first_chunk_at", Time, comment="When the first response body byte arrived (UTC)."),
    Column("ended_at", Time, comment="When the exchange ended (UTC)."),
    Column(
        "status",
        String(32),
        nullable=False,
        comment="in_progress, completed, failed, blocked, client_aborted, upstream_aborted, interrupted.",
    ),
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
    Column("output_text", Text, comment="Answer text of choice / content block 0 (NULL when in output_text_utf8)."),
    Column(
        "output",
        Json,
        comment="Every choice's reasoning, refusal, stop reason and text (choice 0's is output_text); tool calls (their arguments are in tool_calls).",
    ),
    Column("tool_calls", Json, comment="List of {id, name, arguments}."),
    Column("finish_reasons", Json, comment="List of stop reasons, one per choice / block."),
    Column("input_tokens", BigInteger, comment="NULL when the upstream reported none."),
    Column("output_tokens", BigInteger, comment="NULL when the upstream reported none."),
    Column("cache_read_input_tokens", BigInteger),
    Column("cache_write_input_tokens", BigInteger),
    Column("reasoning_output_tokens", BigInteger),
    Column("usage_source", String(16), comment="provider or none."),
    Column(
        "usage_details",
        Json,
        comment="Token counts by kind beyond the usage columns ({input_audio_tokens: ..., ...}); NULL when none were sent.",
    ),
    Column(
        "cost_usd",
        Money,
        comment="Price of the exchange in US dollars (storage/cost.py); NULL when the price is unknown, never a guess.",
    ),
    Column(
        "cost_prices",
        String(64),
        comment="Which price data computed cost_usd: genai-prices and its version, or override: and the file's sha256 prefix.",
    ),
    Column("error_code", String(255)),
    Column("error_message", Text),
    Column("findings", Json, comment="List of {code, detail}."),
    Column(
        "verdicts",
        Json,
        comment="Content-filter verdicts: {action, rule_id, reason, filter, position, match_hash, ...}.",
    ),
    Column("event_count", Integer, comment="SSE events dispatched (not counting replayed ones)."),
    Column("replayed_events", Integer, comment="Events of a resumed stream that an earlier exchange already audited."),
    Column("bytes_to_client", BigInteger, comment="Body bytes forwarded to the client."),
    Column("bytes_from_upstream", BigInteger, comment="Body bytes received from the upstream."),
    Column(
        "delivered_text",
        Text,
        comment="Answer text the client received, when a content filter made it differ from output_text; else NULL.",
    ),
    Column(
        "client_status",
        Integer,
        comment="HTTP status the client received when the proxy replaced the upstream's answer "
        "(a blocked held answer); NULL when the client got http_status.",
    ),
    Column(
        "connection_id",
        String(64),
        comment="The stream or connection the record came over (shared by its turns); NULL for a single exchange.",
    ),
    Column(
        "turn",
        Integer,
        comment="Position of this answer in its stream or connection: 0, 1, ...; NULL for a single exchange.",
    ),
    # tamper evidence (storage/chain.py): set when the record is final
    Column("chain_id", String(255), comment="Hash chain of the writer that sealed the final record (its instance)."),
    Column("chain_seq", BigInteger, comment="Position in its chain: 1, 2, 3, ..."),
    Column(
        "prev_hash", String(64), comment="record_hash of the record before it in the chain (64 zeros for the first)."
    ),
    Column(
        "record_hash", String(64), comment="SHA-256 of the canonical serialization of the record (storage/chain.py)."
    ),
    Column("content_hashes", Json, comment="SHA-256 of each content column; they stand for erased content."),
    Column("erased_at", Time, comment="When llm-audit erase replaced the content with an erasure marker."),
    Column(
        "open_mac", String(64), comment="HMAC of the write-ahead row by the proxy that opened it (storage/adoption.py)."
    ),
    # The last column of the table, and it must stay last (migration 0012, storage/writer.py):
    # SQLite writes a zero-filled BLOB there without making it in memory.
    Column(
        ANSWER_BYTES,
        LargeBinary,
        comment="SQLite: the answer as UTF-8 bytes when it was too long to write as text (2^20 characters and more); "
        "output_text is then NULL and exchange_view.output_text reads this. NULL on PostgreSQL.",
    ),
    Index("ix_exchanges_started_at", "started_at"),
    Index("ix_exchanges_ended_at", "ended_at"),
    Index("ix_exchanges_chain_id_chain_seq", "chain_id", "chain_seq"),
    # the filters of llm-audit list, whose pages are sorted by started_at
    Index("ix_exchanges_user_id_started_at", "user_id", "started_at"),
    Index("ix_exchanges_request_model_started_at", "request_model", "started_at"),
    Index("ix_exchanges_status_started_at", "status", "started_at"),
    Index("ix_exchanges_connection_id_turn", "connection_id", "turn"),
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
    Column("chain_starts", Json, comment="Where each hash chain begins after the purge: {chain: {seq, prev_hash}}."),
    comment="Every purge of exchanges: who, when, the cut-off and how many rows went.",
)

chains = Table(
    "chains",
    metadata,
    Column("chain_id", String(255), primary_key=True, comment="A writer's chain: its proxy instance name."),
    Column("head_seq", BigInteger, nullable=False, comment="chain_seq of the last record written."),
    Column("head_hash", String(64), nullable=False, comment="record_hash of the last record written."),
    Column("start_seq", BigInteger, nullable=False, comment="chain_seq of the first record kept (after purges)."),
    Column("start_prev_hash", String(64), nullable=False, comment="record_hash of the last record purged."),
    Column("lease_holder", String(255), comment="The proxy process writing this chain (host, pid, start)."),
    Column("lease_until", Time, comment="Until when its lease runs; renewed by its heartbeat."),
    comment="Each hash chain's head, and where it begins after purges.",
)

erasure_log = Table(
    "erasure_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("erased_at", Time, nullable=False, comment="When the erasure ran (UTC)."),
    Column("actor", String(255), nullable=False, comment="Who erased: the OS user."),
    Column("user_id", String(255), nullable=False, comment="The data subject whose content was erased."),
    Column("erased_count", BigInteger, nullable=False, comment="Exchanges whose content was erased."),
    comment="Every erasure of a user's content (data-subject requests).",
)

quarantine = Table(
    "quarantine",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("quarantined_at", Time, nullable=False, comment="When the record was quarantined (UTC)."),
    Column("reason", Text, nullable=False, comment="Why it could be written nowhere as it was."),
    Column("file", Text, nullable=False, comment="The quarantine file that keeps the raw line."),
    Column("size", BigInteger, nullable=False, comment="Bytes of the raw line."),
    Column("sha256", String(64), nullable=False, comment="SHA-256 of the raw line."),
    Column("chain_id", String(255), comment="The record's hash chain, when it could be read from the line."),
    Column("chain_seq", BigInteger, comment="Its position in the chain, when known."),
    Column("prev_hash", String(64), comment="Its prev_hash, when known."),
    Column("record_hash", String(64), comment="Its record_hash, when known."),
    Column("record_id", String(64), comment="The exchange id, when known."),
    Index("ux_quarantine_file_sha256", "file", "sha256", unique=True),
    Index("ix_quarantine_chain_id_chain_seq", "chain_id", "chain_seq"),
    comment="Records kept in a quarantine file instead of exchanges: unreadable spool lines, rows refused even reduced.",
)

views = MetaData()

exchange_view = Table(
    "exchange_view",
    views,
    Column("id", String(64), comment="Exchange id."),
    Column("started_at", Time, comment="When the request started (UTC)."),
    Column("first_chunk_at", Time, comment="When the first response body byte arrived (UTC)."),
    Column("ended_at", Time, comment="When the exchange ended (UTC)."),
    Column("day", String(10), comment="UTC date of started_at, YYYY-MM-DD."),
    Column("status", String(32), comment="As in exchanges."),
    Column("blocked", Boolean, comment="Status blocked, or a content-filter verdict with action block."),
    Column("dialect", String(32)),
    Column("provider", String(64)),
    Column("request_model", String(255)),
    Column("response_model", String(255)),
    Column("user_id", String(255)),
    Column("session_id", String(255)),
    Column("request_id", String(255)),
    Column("response_id", String(255)),
    Column("task_id", String(255)),
    Column("client_address", String(64)),
    Column("user_agent", Text, comment="The request's User-Agent header."),
    Column("api_key_fingerprint", String(32)),
    Column("proxy_instance", String(255)),
    Column("server_address", String(255)),
    Column("server_port", Integer),
    Column("http_method", String(16)),
    Column("url_path", Text),
    Column("http_status", Integer),
    Column("streamed", Boolean),
    Column("duration_ms", BigInteger, comment="ended_at - started_at in whole milliseconds."),
    Column("time_to_first_chunk_ms", BigInteger, comment="first_chunk_at - started_at in whole milliseconds."),
    Column("input_tokens", BigInteger),
    Column("output_tokens", BigInteger),
    Column("cache_read_input_tokens", BigInteger),
    Column("cache_write_input_tokens", BigInteger),
    Column("reasoning_output_tokens", BigInteger),
    Column("total_tokens", BigInteger, comment="input_tokens + output_tokens; NULL when neither was reported."),
    Column("usage_source", String(16)),
    Column("error_code", String(255)),
    Column("error_message", Text),
    Column("finding_codes", Text, comment="Distinct finding codes, sorted, comma-separated; NULL when none."),
    Column(
        "verdict_rules",
        Text,
        comment="Distinct rule ids of content-filter verdicts, sorted, comma-separated; NULL when none.",
    ),
    Column("tool_call_count", Integer, comment="Number of tool calls in the output."),
    Column("output_text", Text, comment="Answer text of choice / content block 0, from either column of exchanges."),
    Column("delivered_text", Text),
    Column("client_text", Text, comment="What the client received: delivered_text, else output_text."),
    Column("client_status", Integer, comment="HTTP status the client received: client_status, else http_status."),
    Column("connection_id", String(64), comment="As in exchanges."),
    Column("turn", Integer, comment="As in exchanges."),
    Column("usage_details", Json, comment="As in exchanges."),
    Column("cost_usd", Money, comment="As in exchanges: US dollars, NULL when the price is unknown."),
    Column("cost_prices", String(64), comment="As in exchanges."),
    Column("request_body", Json, comment="The request body (JSON)."),
    Column("event_count", Integer),
    Column("bytes_to_client", BigInteger),
    Column("bytes_from_upstream", BigInteger),
    comment="One flat row per exchange, the same columns on SQLite and PostgreSQL.",
)
