"""Alembic's environment: migrate the connection that :mod:`storage.migrations` hands over.

Only online migrations on that connection are supported; there is no ``alembic.ini``
and no URL here (use ``llm-audit db upgrade``). The caller owns the transaction:
Alembic runs inside it, so the caller's lock covers the whole upgrade.
"""

from alembic import context

from storage.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with 'llm-audit db upgrade' (storage.migrations.upgrade), not alembic's command")

context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things: autogenerate writes batch operations (copy and
    # move the table), which are plain ALTERs on PostgreSQL.
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
