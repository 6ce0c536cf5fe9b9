"""Cost in the database, on real SQLite files and a real PostgreSQL server: the writer
prices records, ``exchange_view`` and ``stats`` show it, ``llm-audit cost recompute``
prices past records again, and the hash chains verify before and after (cost is derived
data, outside the chain). On PostgreSQL with the roles, the proxy role cannot reprice
final records and the purge role can.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from addon.record import OUTCOME_COMPLETE, ExchangeRecord
from storage.cost import GENAI_PRICES, cost_of, load_prices
from storage.database import DatabaseError, open_engine
from storage.query import Filters, stats
from storage.recompute import recompute
from storage.schema import exchange_view, exchanges
from storage.spool import Spool
from storage.verify import verify
from storage.writer import AuditWriter

BIN = Path(sys.executable).parent
DAY1 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
DAY2 = DAY1 + timedelta(days=1)
PRICES = """\
[[price]]
provider = "openai"
model = "gpt-4o-mini*"
input = 0.1
output = 0.4
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def engine(url):
    engine = open_engine(url)
    yield engine
    engine.dispose()


def finished(
    user: str, model: str, provider: str | None, when: datetime, tokens: tuple[int, int, int] | None, final: bool = True
) -> dict:
    r = ExchangeRecord(
        dialect="openai-chat",
        proxy_instance="px",
        started_at=when.timestamp(),
        user_id=user,
        provider=provider,
        request_model=model,
        response_model=model,
    )
    if tokens is not None:
        r.usage = {"input_tokens": tokens[0], "output_tokens": tokens[1], "cache_read_input_tokens": tokens[2]}
    if final:
        r.terminal_seen = True
        r.finish(OUTCOME_COMPLETE, ended_at=when.timestamp() + 1)
    return r.to_row()


ROWS = [
    finished("alice", "gpt-4o-mini", "openai", DAY1, (1000, 200, 0)),
    finished("alice", "gpt-4o-mini", "openai", DAY2, (3000, 100, 1024)),
    finished("bob", "claude-sonnet-4-5", "anthropic", DAY1, (5000, 700, 4000)),
    finished("bob", "llama3.1:8b", "ollama", DAY2, (50, 20, 0)),  # self-hosted: no price
    finished("carol", "gpt-4o-mini", "openai", DAY2, None),  # no usage: no price
]


def write(engine, rows: list[dict], tmp_path: Path, prices=None) -> None:
    writer = AuditWriter(engine, Spool(tmp_path / f"spool-{uuid.uuid4().hex}.jsonl"), "px", prices=prices)
    for row in rows:
        writer.submit(row)
    writer.close()


def stored(engine) -> dict[str, dict]:
    with engine.connect() as conn:
        return {r["id"]: dict(r) for r in conn.execute(select(exchanges)).mappings()}


def expected(row: dict, prices=None):
    return cost_of(row | {"started_at": row["started_at"]}, prices)


def test_the_writer_prices_final_records_and_the_view_shows_the_cost(engine, tmp_path):
    opened = finished("dave", "gpt-4o-mini", "openai", DAY1, (10, 10, 0), final=False)
    write(engine, [*ROWS, opened], tmp_path)
    rows = stored(engine)
    for row in ROWS:
        usd, source = expected(row)
        assert rows[row["id"]]["cost_usd"] == (None if usd is None else pytest.approx(usd, abs=1e-12))
        assert rows[row["id"]]["cost_prices"] == source
    assert [rows[r["id"]]["cost_prices"] for r in ROWS] == [GENAI_PRICES] * 3 + [None, None]
    assert rows[opened["id"]]["cost_usd"] is None  # an exchange in progress is priced when it ends
    assert all(isinstance(rows[r["id"]]["cost_usd"], float) for r in ROWS[:3])
    with engine.connect() as conn:
        view = {r.id: (r.cost_usd, r.cost_prices) for r in conn.execute(select(exchange_view))}
    assert view[ROWS[2]["id"]] == (rows[ROWS[2]["id"]]["cost_usd"], GENAI_PRICES)
    assert verify(engine).ok


def test_the_writer_uses_a_price_file_first(engine, tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    prices = load_prices(path)
    write(engine, ROWS[:3], tmp_path, prices)
    rows = stored(engine)
    assert rows[ROWS[0]["id"]]["cost_usd"] == pytest.approx((1000 * 0.1 + 200 * 0.4) / 1e6, abs=1e-15)
    assert rows[ROWS[0]["id"]]["cost_prices"] == prices.label
    assert rows[ROWS[2]["id"]]["cost_prices"] == GENAI_PRICES  # not in the file


def test_stats_sum_cost_by_user_model_provider_and_day(engine, tmp_path):
    write(engine, ROWS, tmp_path)
    cost = {r["id"]: expected(r).usd or 0.0 for r in ROWS}
    a1, a2, b1, _, _ = (r["id"] for r in ROWS)
    with engine.connect() as conn:
        by_user = {r["user"]: r for r in stats(conn, Filters(), ["user"])}
        by_day = {r["day"]: r for r in stats(conn, Filters(), ["day"])}
        by_model = {r["model"]: r for r in stats(conn, Filters(), ["model", "provider"])}
        total = stats(conn, Filters(), [])[0]
    assert by_user["alice"]["cost_usd"] == pytest.approx(cost[a1] + cost[a2], abs=1e-12)
    assert (by_user["alice"]["priced"], by_user["bob"]["priced"], by_user["carol"]["priced"]) == (2, 1, 0)
    assert by_user["bob"]["cost_usd"] == pytest.approx(cost[b1], abs=1e-12)
    assert by_user["carol"]["cost_usd"] is None  # nothing priced: unknown, not zero
    assert by_day["2026-05-01"]["cost_usd"] == pytest.approx(cost[a1] + cost[b1], abs=1e-12)
    assert by_model["llama3.1:8b"]["cost_usd"] is None and by_model["llama3.1:8b"]["provider"] == "ollama"
    assert total["cost_usd"] == pytest.approx(sum(cost.values()), abs=1e-12) and total["priced"] == 3


def test_recompute_after_a_price_change_updates_only_the_cost_and_verify_still_passes(engine, url, tmp_path):
    write(engine, ROWS, tmp_path)
    before = stored(engine)
    with engine.begin() as conn:  # prices as an older price list had them
        conn.execute(update(exchanges).values(cost_usd=99.5, cost_prices="genai-prices 0.0.1"))
    assert verify(engine).ok  # cost is not evidence: the chain does not cover it

    done = recompute(engine, batch_size=2)  # batches smaller than the table
    assert (done.examined, done.changed, done.priced) == (5, 5, 3)
    after = stored(engine)
    for id, row in before.items():
        assert after[id] == row  # every column as the writer stored it, the cost included
    assert recompute(engine).changed == 0
    assert verify(engine).ok

    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    prices = load_prices(path)
    assert recompute(engine, prices, since=DAY2, dry_run=True).changed == 1
    assert stored(engine) == after  # a dry run changes nothing
    done = recompute(engine, prices, since=DAY2)
    assert (done.examined, done.changed) == (3, 1)  # the day-2 openai record with usage
    assert stored(engine)[ROWS[1]["id"]]["cost_prices"] == prices.label
    assert stored(engine)[ROWS[0]["id"]]["cost_prices"] == GENAI_PRICES  # before --since
    assert verify(engine).ok

    out = subprocess.run(
        [str(BIN / "llm-audit"), "--db", url, "cost", "recompute"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"changed the cost of 1 of 5 exchanges (3 priced, 2 unknown) with {GENAI_PRICES}"
    checked = subprocess.run(
        [str(BIN / "llm-audit"), "--db", url, "verify"], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_recompute_with_a_bad_price_file_is_one_line_and_changes_nothing(engine, url, tmp_path):
    write(engine, ROWS[:1], tmp_path)
    path = tmp_path / "prices.toml"
    path.write_text('[[price]]\nmodel = "x"\ninput = 1\n')
    out = subprocess.run(
        [str(BIN / "llm-audit"), "--db", url, "cost", "recompute", "--prices", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out
    assert f"{path}:1: price entry 1: output is missing" in out.stderr


def test_stats_table_shows_the_cost(url, engine, tmp_path):
    write(engine, ROWS, tmp_path)
    out = subprocess.run(
        [str(BIN / "llm-audit"), "--db", url, "stats", "--by", "user", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    header, *lines = out.stdout.splitlines()
    assert "cost_usd" in header.split(",") and "priced" in header.split(",")
    table = subprocess.run(
        [str(BIN / "llm-audit"), "--db", url, "stats", "--by", "day"], capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0 and "cost $" in table.stdout, table


def test_on_postgresql_the_proxy_role_cannot_reprice_final_records_and_the_purge_role_can(postgres, tmp_path):
    database = postgres.create_database()
    open_engine(database).dispose()
    applied = subprocess.run(
        [str(BIN / "llm-audit"), "--db", database, "db", "roles", "--apply"], capture_output=True, text=True, timeout=60
    )
    assert applied.returncode == 0, applied.stderr
    users = {}
    for group in ("llm_audit_proxy", "llm_audit_purge"):
        name = f"u_{uuid.uuid4().hex[:10]}"
        with postgres.connect(database.rsplit("/", 1)[1]) as conn:
            conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {group}")
            conn.commit()
        users[group] = database.replace("://postgres@", f"://{name}@")
    engine = open_engine(users["llm_audit_proxy"])
    write(
        engine,
        [finished("alice", "gpt-4o-mini", "openai", datetime.now(UTC) - timedelta(hours=1), (10, 5, 0))],
        tmp_path,
    )
    with pytest.raises(DatabaseError, match="run it as the database owner or a member of the purge role"):
        recompute(engine, load_prices(_file(tmp_path)))
    engine.dispose()
    engine = open_engine(users["llm_audit_purge"])
    assert recompute(engine, load_prices(_file(tmp_path))).changed == 1
    assert verify(engine).ok
    engine.dispose()


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.toml"
    path.write_text(PRICES)
    return path


def test_show_prints_the_cost_or_says_it_is_unknown(url, engine, tmp_path):
    write(engine, ROWS, tmp_path)
    shown = {}
    for row in (ROWS[0], ROWS[3]):
        out = subprocess.run(
            [str(BIN / "llm-audit"), "--db", url, "show", row["id"]], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        shown[row["id"]] = out.stdout
    assert f"  cost ${expected(ROWS[0]).usd:.6f} ({GENAI_PRICES})\n" in shown[ROWS[0]["id"]]
    assert "  cost unknown (no price for this provider and model)\n" in shown[ROWS[3]["id"]]
