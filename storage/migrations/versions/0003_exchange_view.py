"""The view ``exchange_view`` (one flat row per exchange) and indexes for ``llm-audit list``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

The indexes on ``user_id``, ``request_model`` and ``status`` become indexes on each of
them *and* ``started_at``: ``llm-audit list --user alice`` shows alice's newest
exchanges, and with the start time in the index the database reads just those instead
of sorting all of hers (the README gives figures for a million exchanges). They serve
lookups by the first column alone as well as the old ones did.

The view has the same name, columns and meaning on SQLite and PostgreSQL, so a query
or a BI dashboard written against one works on the other; only the SQL that computes
the derived columns differs (``strftime`` against ``EXTRACT(EPOCH ...)``, ``json_each``
against ``jsonb``). Its columns are listed in ``storage.schema.exchange_view``.

A later migration that changes ``exchanges`` beyond adding columns drops this view first
and creates it again at its end: on SQLite, Alembic's batch mode drops a column by copying
the table and renaming the copy, which SQLite refuses while a view refers to the table
("error in view exchange_view: no such table"); PostgreSQL refuses to drop or retype a
column a view uses. ``view_sql(SQLITE)`` and ``view_sql(POSTGRESQL)`` below give this
revision's statement (0004's downgrade uses them). Such a migration drops the view with
:func:`drop_view` and makes it again with :func:`create_view`, which give PostgreSQL's
grants on it back: a view made again is a new object with none, and an analyst's
``GRANT SELECT ON exchange_view`` would otherwise be gone after an upgrade.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The view's columns in order. Names not in a backend's expressions below are taken
# from ``exchanges`` unchanged.
COLUMNS = (
    "id", "started_at", "first_chunk_at", "ended_at", "day", "status", "blocked",
    "dialect", "provider", "request_model", "response_model",
    "user_id", "session_id", "request_id", "response_id", "task_id",
    "client_address", "user_agent", "api_key_fingerprint", "proxy_instance",
    "server_address", "server_port", "http_method", "url_path", "http_status", "streamed",
    "duration_ms", "time_to_first_chunk_ms",
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_write_input_tokens",
    "reasoning_output_tokens", "total_tokens", "usage_source",
    "error_code", "error_message", "finding_codes", "verdict_rules", "tool_call_count",
    "output_text", "delivered_text", "client_text", "request_body",
    "event_count", "bytes_to_client", "bytes_from_upstream",
)  # fmt: skip

# Expressions the two backends share.
COMMON = {
    "total_tokens": "CASE WHEN input_tokens IS NULL AND output_tokens IS NULL THEN NULL "
                    "ELSE coalesce(input_tokens, 0) + coalesce(output_tokens, 0) END",
    "client_text": "coalesce(delivered_text, output_text)",
}  # fmt: skip


def _sqlite_ms(later: str) -> str:
    """Whole milliseconds from ``started_at`` to ``later``, rounded half away from zero as
    PostgreSQL's numeric ``round`` does.

    Exact to the microsecond, like PostgreSQL: SQLite's date functions keep times to the
    millisecond only (``julianday`` differences would be up to 1 ms off, ``59.999999``
    would round to the next minute), so the whole seconds come from ``strftime('%s')``
    of the stored text's first 19 characters (``YYYY-MM-DD HH:MM:SS``) and the
    microseconds from the rest (``.ffffff``).
    """
    micros = f"(CAST(substr({later}, 21, 6) AS INTEGER) - CAST(substr(started_at, 21, 6) AS INTEGER))"
    seconds = f"(strftime('%s', substr({later}, 1, 19)) - strftime('%s', substr(started_at, 1, 19)))"
    return f"CAST(round(({seconds} * 1000000 + {micros}) / 1000.0) AS INTEGER)"


def _sqlite_array(column: str) -> str:
    """The JSON array in ``column``, or NULL when it holds something else (e.g. JSON null)."""
    return f"CASE WHEN json_type({column}) = 'array' THEN {column} END"


def _sqlite_distinct(column: str, key: str) -> str:
    """The distinct ``key`` values of the objects in a JSON array, sorted, comma-separated."""
    return (
        f"(SELECT group_concat(v) FROM (SELECT DISTINCT json_extract(value, '$.{key}') AS v "
        f"FROM json_each({_sqlite_array(column)}) WHERE type = 'object' ORDER BY v))"
    )


SQLITE = COMMON | {
    "day": "date(started_at)",
    "blocked": (
        "CASE WHEN status = 'blocked' OR EXISTS (SELECT 1 FROM json_each(" + _sqlite_array("verdicts") + ") "
        "WHERE type = 'object' AND json_extract(value, '$.action') = 'block') THEN 1 ELSE 0 END"
    ),
    "user_agent": """json_extract(request_headers, '$."user-agent"')""",
    "duration_ms": _sqlite_ms("ended_at"),
    "time_to_first_chunk_ms": _sqlite_ms("first_chunk_at"),
    "finding_codes": _sqlite_distinct("findings", "code"),
    "verdict_rules": _sqlite_distinct("verdicts", "rule_id"),
    "tool_call_count": f"json_array_length({_sqlite_array('tool_calls')})",
}


def _pg_ms(later: str) -> str:
    # numeric: exact, and rounded half away from zero (EXTRACT gives a double before PostgreSQL 14)
    return f"CAST(round(CAST(EXTRACT(EPOCH FROM ({later} - started_at)) AS numeric) * 1000) AS bigint)"


def _pg_distinct(column: str, key: str) -> str:
    """As :func:`_sqlite_distinct`; sorted byte-wise (``C``) as SQLite sorts."""
    value = f"""(e ->> '{key}') COLLATE "C\""""
    return (
        f"(SELECT string_agg(DISTINCT {value}, ',' ORDER BY {value}) FROM jsonb_array_elements("
        f"CASE WHEN jsonb_typeof({column}) = 'array' THEN {column} END) AS e WHERE jsonb_typeof(e) = 'object')"
    )


POSTGRESQL = COMMON | {
    "day": "to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
    "blocked": """(status = 'blocked' OR coalesce(verdicts @> '[{"action": "block"}]', false))""",
    "user_agent": "request_headers ->> 'user-agent'",
    "duration_ms": _pg_ms("ended_at"),
    "time_to_first_chunk_ms": _pg_ms("first_chunk_at"),
    "finding_codes": _pg_distinct("findings", "code"),
    "verdict_rules": _pg_distinct("verdicts", "rule_id"),
    "tool_call_count": "CASE WHEN jsonb_typeof(tool_calls) = 'array' THEN jsonb_array_length(tool_calls) END",
}


def view_sql(expressions: dict[str, str]) -> str:
    """``CREATE VIEW exchange_view`` with one backend's expressions for the derived columns."""
    columns = ",\n  ".join(f"{expressions[name]} AS {name}" if name in expressions else name for name in COLUMNS)
    return f"CREATE VIEW exchange_view AS SELECT\n  {columns}\nFROM exchanges"


# Every grant on the view (and on its columns) but its owner's own, as (column or NULL,
# the column quoted, grantee, privilege, grantable); the grantee quoted, PUBLIC for everyone.
_GRANTS = sa.text("""
SELECT NULL, NULL, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END, a.privilege_type,
       a.is_grantable
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.oid = to_regclass('exchange_view') AND a.grantee <> c.relowner
UNION ALL
SELECT t.attname, quote_ident(t.attname), CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END,
       a.privilege_type, a.is_grantable
FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid CROSS JOIN LATERAL aclexplode(t.attacl) a
LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.oid = to_regclass('exchange_view') AND NOT t.attisdropped AND a.grantee <> c.relowner
ORDER BY 1 NULLS FIRST, 3, 4
""")
# The view's owner, quoted, when it is not the role running the migration.
_OTHER_OWNER = sa.text("""
SELECT quote_ident(pg_get_userbyid(relowner)) FROM pg_class
WHERE oid = to_regclass('exchange_view') AND pg_get_userbyid(relowner) <> current_user
""")


class Grants:
    """What :func:`drop_view` found on the view it dropped (PostgreSQL): its owner when
    another role owns it, and each grant, with its column for a column's grant.

    (A plain class: Alembic loads this module under no name in ``sys.modules``, where a
    dataclass cannot read its annotations.)
    """

    def __init__(self) -> None:
        self.owner: str | None = None
        self.grants: list[tuple[str | None, str]] = []


def drop_view() -> Grants:
    """Drop ``exchange_view``; what :func:`create_view` needs to give its owner and grants
    back (nothing on SQLite, which has neither)."""
    saved = Grants()
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        saved.owner = bind.execute(_OTHER_OWNER).scalar()
        for column, quoted, grantee, privilege, grantable in bind.execute(_GRANTS):
            on = f"{privilege} ({quoted})" if column is not None else privilege
            option = " WITH GRANT OPTION" if grantable else ""
            saved.grants.append((column, f"GRANT {on} ON exchange_view TO {grantee}{option}"))
    op.execute("DROP VIEW exchange_view")
    return saved


def create_view(sql: str, saved: Grants) -> None:
    """Make ``exchange_view`` again with ``sql``, then give back the owner and the grants
    :func:`drop_view` found: the grants are given by the role running the migration, and
    a column's grant only while the new view still has that column."""
    op.execute(sql)
    if saved.owner is not None:
        op.execute(f"ALTER VIEW exchange_view OWNER TO {saved.owner}")
    columns = None
    for column, grant in saved.grants:
        if column is not None:
            if columns is None:
                columns = set(op.get_bind().execute(_COLUMNS).scalars())
            if column not in columns:
                continue
        op.execute(grant)


_COLUMNS = sa.text("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass('exchange_view') AND attnum > 0")


# Columns that had an index of their own, now indexed together with started_at.
LISTED_BY = ("user_id", "request_model", "status")


def upgrade() -> None:
    for column in LISTED_BY:
        op.drop_index(f"ix_exchanges_{column}", table_name="exchanges")
        op.create_index(f"ix_exchanges_{column}_started_at", "exchanges", [column, "started_at"])
    op.execute(view_sql(POSTGRESQL if op.get_bind().dialect.name == "postgresql" else SQLITE))


def downgrade() -> None:
    op.execute("DROP VIEW exchange_view")
    for column in LISTED_BY:
        op.drop_index(f"ix_exchanges_{column}_started_at", table_name="exchanges")
        op.create_index(f"ix_exchanges_{column}", "exchanges", [column])
