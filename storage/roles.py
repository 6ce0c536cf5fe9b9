"""Least privilege on PostgreSQL: a role for the proxies and one for purging and erasing.

``llm-audit db roles`` prints (or, with ``--apply``, runs as the tables' owner) the SQL
below. Log-in roles are then made members of one of the two group roles:

- the proxy role may insert exchanges and complete its own write-ahead rows, and keep
  its chain's head in ``chains``, and list what it quarantines in ``quarantine``; it cannot delete anything, and a trigger stops it from
  changing a final record (its upsert already only updates rows in progress);
- the purge role may delete exchanges (``llm-audit purge``), erase content
  (``llm-audit erase``) and write ``purge_log`` / ``erasure_log``.

The owner (who runs ``llm-audit db upgrade``) keeps all rights; keep its password away
from both.
"""

from __future__ import annotations

import re

DEFAULT_PROXY_ROLE = "llm_audit_proxy"
DEFAULT_PURGE_ROLE = "llm_audit_purge"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class RoleError(ValueError):
    """A role name that cannot be used; the message is one line."""


def roles_sql(proxy: str = DEFAULT_PROXY_ROLE, purge: str = DEFAULT_PURGE_ROLE) -> str:
    """The SQL that creates the two roles, their grants and the trigger (idempotent)."""
    for name in (proxy, purge):
        if not _NAME.fullmatch(name):
            raise RoleError(f"role name {name!r}: use lower-case letters, digits and _ (at most 63)")
    if proxy == purge:
        raise RoleError("the proxy role and the purge role must differ")
    return f"""\
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{proxy}') THEN CREATE ROLE {proxy} NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{purge}') THEN CREATE ROLE {purge} NOLOGIN; END IF;
END $$;
GRANT USAGE ON SCHEMA public TO {proxy}, {purge};
GRANT SELECT ON alembic_version, exchange_view TO {proxy}, {purge};
GRANT SELECT, INSERT, UPDATE ON exchanges, chains TO {proxy};
GRANT SELECT, INSERT ON quarantine TO {proxy};
GRANT SELECT ON quarantine TO {purge};
GRANT USAGE ON SEQUENCE quarantine_id_seq TO {proxy};
GRANT SELECT, UPDATE, DELETE ON exchanges TO {purge};
GRANT SELECT, INSERT, UPDATE ON chains, purge_log, erasure_log TO {purge};
GRANT USAGE ON SEQUENCE purge_log_id_seq, erasure_log_id_seq TO {purge};
CREATE OR REPLACE FUNCTION llm_audit_final_records_are_immutable() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  IF OLD.status <> 'in_progress'
     AND pg_has_role(current_user, '{proxy}', 'MEMBER')
     AND NOT pg_has_role(current_user, '{purge}', 'MEMBER') THEN
    RAISE EXCEPTION 'llm-audit: final audit records cannot be changed by the proxy role'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $fn$;
DROP TRIGGER IF EXISTS llm_audit_final_records_are_immutable ON exchanges;
CREATE TRIGGER llm_audit_final_records_are_immutable BEFORE UPDATE ON exchanges
  FOR EACH ROW EXECUTE FUNCTION llm_audit_final_records_are_immutable();
"""
