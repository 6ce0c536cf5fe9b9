"""Budgets: the rule kind (bad rules refused in one line naming file, line and fix), UTC
calendar periods at their boundaries, the book's arithmetic (database snapshot plus this
proxy's own records, never counted twice), the failure policy when the totals cannot be
read, and the totals query on real SQLite and PostgreSQL databases."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Engine, create_engine, insert

from addon.filters import budgets as budgets_module
from addon.filters.budgets import (
    Budget,
    BudgetBook,
    Totals,
    build_snapshot,
    period_end,
    period_key,
    period_start,
)
from addon.filters.rules import Rule, RulesError, load_rules, parse_rules
from addon.mitm.budgets import BudgetKeeper, SpendRefresher
from addon.record import ExchangeRecord
from storage.database import open_engine
from storage.schema import exchanges
from storage.spend import Spend, read_spend

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
EPOCH = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)


def budget(text: str) -> Budget:
    (b,) = parse_rules(f'[[rule]]\nid = "b"\nkind = "budget"\naction = "block"\n{text}')
    assert isinstance(b, Budget)
    return b


def error(text: str, tmp_path) -> str:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError) as e:
        load_rules(path)
    message = str(e.value)
    assert "\n" not in message
    return message


# -- the rule kind -------------------------------------------------------------------------


def test_a_budget_rule_is_parsed_beside_content_rules():
    rules = parse_rules("""
[[rule]]
id = "names"
kind = "keywords"
keywords = ["Nightjar"]
action = "block"

[[rule]]
id = "team-month"
kind = "budget"
period = "month"
per = "user"
limit_usd = 50
models = ["gpt-4o*"]
users = ["team-a-*"]
action = "block"
reason = "team A's monthly budget"
""")
    assert isinstance(rules[0], Rule)
    b = rules[1]
    assert isinstance(b, Budget)
    assert (b.id, b.period, b.per, b.meter, b.limit, b.reason) == (
        "team-month",
        "month",
        "user",
        "usd",
        50.0,
        "team A's monthly budget",
    )
    assert b.applies("openai", "gpt-4o-mini", "team-a-alice")
    assert not b.applies("openai", "gpt-5", "team-a-alice")
    assert not b.applies("openai", "gpt-4o", None)  # a pattern never matches a missing value


def test_token_budgets_count_total_input_or_output_and_default_to_all():
    b = budget('period = "day"\nlimit_tokens = 1000')
    assert (b.meter, b.per, b.limit) == ("total", "all", 1000.0)
    assert budget('period = "day"\nlimit_tokens = 10\ntokens = "output"').meter == "output"


@pytest.mark.parametrize(
    ("body", "line", "fragment"),
    [
        ('period = "day"', 2, "missing a limit: give limit_usd = 50.0 (US dollars) or limit_tokens"),
        ('period = "day"\nlimit_usd = 5\nlimit_tokens = 10', 8, "give limit_usd or limit_tokens, not both"),
        ('period = "week"\nlimit_usd = 5', 6, "'period' must be one of day, month, not 'week'"),
        ('period = "day"\nlimit_usd = -1', 7, "'limit_usd' must be a number of US dollars above 0"),
        ('period = "day"\nlimit_usd = "5"', 7, "'limit_usd' must be a number of US dollars above 0"),
        ('period = "day"\nlimit_tokens = 1.5', 7, "'limit_tokens' must be a whole number of tokens above 0"),
        ('period = "day"\nlimit_usd = 5\ntokens = "input"', 8, "'tokens' says which tokens limit_tokens counts"),
        ('period = "day"\nlimit_usd = 5\nper = "team"', 8, "'per' must be one of user, key, model, all"),
        ('period = "day"\nlimit_usd = 5\nwindow = 10', 8, "unknown key 'window' (a budget rule takes:"),
        ('period = "day"\nlimit_usd = 5\nmodels = []', 8, "'models' must be a non-empty list"),
        ("limit_usd = 5", 2, "missing 'period'"),
    ],
)
def test_a_bad_budget_rule_is_one_line_naming_file_line_and_fix(tmp_path, body, line, fragment):
    text = f'# budgets\n[[rule]]\nid = "b"\nkind = "budget"\naction = "block"\n{body}\n'
    message = error(text, tmp_path)
    assert message.startswith(f"{tmp_path / 'rules.toml'}:{line}: rule 'b': "), message
    assert fragment in message, message


def test_a_rules_file_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")  # tomllib's RecursionError
    with pytest.raises(RulesError, match="nested too deeply to be a rules file"):
        load_rules(path)


def test_a_budget_and_a_content_rule_cannot_share_an_id(tmp_path):
    text = (
        '[[rule]]\nid = "x"\nkind = "pii"\naction = "flag"\n\n'
        '[[rule]]\nid = "x"\nkind = "budget"\naction = "block"\nperiod = "day"\nlimit_usd = 1\n'
    )
    assert "duplicate id 'x'" in error(text, tmp_path)


# -- periods -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "day", "month"),
    [
        (datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "2026-12-31", "2026-12"),
        (datetime(2027, 1, 1, 0, 0, tzinfo=UTC), "2027-01-01", "2027-01"),
        # a time given in another zone is read in UTC: 00:30 in Vienna is the day before
        (datetime(2027, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))), "2026-12-31", "2026-12"),
        (datetime(2028, 2, 29, 12, 0, tzinfo=UTC), "2028-02-29", "2028-02"),
    ],
)
def test_periods_are_utc_calendar_days_and_months(t, day, month):
    assert (period_key("day", t), period_key("month", t)) == (day, month)


def test_period_bounds_at_the_ends_of_days_months_and_years():
    t = datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert period_start("day", t) == datetime(2026, 12, 31, tzinfo=UTC)
    assert period_end("day", t) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_start("month", t) == datetime(2026, 12, 1, tzinfo=UTC)
    assert period_end("month", t) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end("month", datetime(2028, 2, 1, tzinfo=UTC)) == datetime(2028, 3, 1, tzinfo=UTC)
    assert period_end("month", datetime(2026, 1, 31, tzinfo=UTC)) == datetime(2026, 2, 1, tzinfo=UTC)


# -- the book's arithmetic -----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spend(user=None, key=None, model="gpt-4o", provider="openai", inp=0, out=0, usd=0.0, n=1, unpriced=0):
    return Spend(user, key, model, provider, inp, out, usd, n, unpriced, 0)


def row(user="alice", started=NOW, inp=10, out=5, cost=None, status="completed", model="gpt-4o", key="sha256:k"):
    return {
        "status": status,
        "started_at": started,
        "user_id": user,
        "api_key_fingerprint": key,
        "request_model": model,
        "provider": "openai",
        "input_tokens": inp,
        "output_tokens": out,
        "cost_usd": cost,
    }


def book(*budgets: Budget, failure="closed", clock=None) -> BudgetBook:
    return BudgetBook(budgets, instance="p1", failure=failure, refresh_seconds=5, epoch=EPOCH, clock=clock or Clock())


def fresh(b: BudgetBook, today=(), earlier=(), now=NOW) -> None:
    b.refreshed(build_snapshot(b.budgets, today, earlier, now, b._clock()))


def test_the_database_part_and_the_local_part_add_up_to_the_limit():
    daily = budget('period = "day"\nper = "user"\nlimit_tokens = 100')
    b = book(daily)
    fresh(b, [spend("alice", inp=40, out=20), spend("bob", inp=500)])
    assert b.total(daily, "alice", NOW).value("total") == 60
    assert b.check("openai", "gpt-4o", "alice", None, NOW) == []
    b.add(row(inp=30, out=9))  # 99: still under
    assert b.check("openai", "gpt-4o", "alice", None, NOW) == []
    b.add(row(inp=1, out=0))  # 100: reached
    (verdict,) = b.check("openai", "gpt-4o", "alice", None, NOW)
    assert (verdict.action, verdict.rule_id, verdict.filter, verdict.location) == ("block", "b", "budget", "request")
    assert verdict.reason == "budget 'b' reached: user 'alice' used 100 of 100 total tokens today (2026-12-02 UTC)"
    (bob,) = b.check("openai", "gpt-4o", "bob", None, NOW)  # from the database alone
    assert "user 'bob' used 500 of 100" in bob.reason


def test_open_rows_rows_before_the_epoch_and_users_without_an_id_are_not_counted_locally():
    daily = budget('period = "day"\nper = "user"\nlimit_tokens = 10')
    b = book(daily)
    fresh(b)
    b.add(row(status="in_progress", inp=100))  # the write-ahead row: nothing used yet
    b.add(row(started=EPOCH - timedelta(microseconds=1), inp=100))  # the database's to count
    b.add(row(user=None, inp=100))  # a per-user budget does not count a request without a user
    assert b.local == {}
    assert b.check("openai", "gpt-4o", None, None, NOW) == []
    b.add(row(started=EPOCH, inp=100))
    assert b.total(daily, "alice", NOW).input_tokens == 100


def test_a_new_period_starts_at_zero_and_each_record_counts_in_the_period_it_started():
    daily = budget('period = "day"\nlimit_tokens = 100')
    monthly = Budget("m", "block", "month", "all", "total", 1000.0)
    b = book(daily, monthly)
    fresh(b, [spend(inp=90)], [spend(inp=800)])
    assert b.total(daily, "", NOW).input_tokens == 90
    assert b.total(monthly, "", NOW).input_tokens == 890
    tomorrow = NOW + timedelta(days=1)
    assert b.total(daily, "", tomorrow).input_tokens == 0  # yesterday's snapshot is not today's
    assert b.total(monthly, "", tomorrow).input_tokens == 890  # the same month
    b.add(row(started=tomorrow, inp=7))
    assert b.total(daily, "", tomorrow).input_tokens == 7
    assert b.total(daily, "", NOW).input_tokens == 90
    next_month = datetime(2027, 1, 1, tzinfo=UTC)
    assert b.total(monthly, "", next_month).input_tokens == 0


def test_usd_budgets_count_unknown_costs_as_zero_and_say_so():
    usd = budget('period = "day"\nper = "key"\nlimit_usd = 1.5')
    b = book(usd)
    fresh(b, [spend(key="sha256:k", usd=1.0, n=3, unpriced=1)])
    b.add(row(cost=None, model="my-llama"))  # no pricer: the row's own cost, unknown
    b.add(row(cost=0.25))
    assert b.check("openai", "gpt-4o", None, "sha256:k", NOW) == []
    b.add(row(cost=0.25))
    (verdict,) = b.check("openai", "gpt-4o", None, "sha256:k", NOW)
    assert verdict.reason == (
        "budget 'b' reached: key sha256:k used $1.50 of $1.50 today (2026-12-02 UTC); "
        "2 exchanges without a known cost counted as $0"
    )


def test_rows_the_writer_has_not_priced_yet_are_priced_off_the_event_loop():
    usd = budget('period = "day"\nlimit_usd = 1')
    tokens = Budget("t", "block", "day", "all", "total", 1000.0)
    b = book(usd, tokens)
    fresh(b)
    woken, priced = [], []
    b.on_pending = lambda: woken.append(1)
    b.pricer = lambda r: priced.append(r["request_model"]) or (None if r["request_model"] == "my-llama" else 0.6)
    b.add(row(cost=None, inp=100))
    b.add(row(cost=None, model="my-llama", inp=100))
    assert (woken, priced) == ([1, 1], [])  # nothing priced on the event loop
    assert b.total(tokens, "", NOW).input_tokens == 200  # tokens count at once
    assert b.total(usd, "", NOW).cost_usd == 0
    assert b.price_pending() == [
        "budget 'b': the cost of 'my-llama' is unknown; its exchanges count as $0 "
        "(give its price in a price file: llm_audit_prices)"
    ]
    assert priced == ["gpt-4o", "my-llama"]
    used = b.total(usd, "", NOW)
    assert (used.cost_usd, used.unpriced, used.exchanges) == (0.6, 1, 2)
    assert b.total(tokens, "", NOW).unpriced == 0  # only USD budgets wait for a price
    assert b.check("openai", "gpt-4o", None, None, NOW) == []
    b.add(row(cost=None))
    b.price_pending()
    assert [v.rule_id for v in b.check("openai", "gpt-4o", None, None, NOW)] == ["b"]


def test_scope_patterns_limit_which_exchanges_count_and_which_requests_are_checked():
    b4o = budget('period = "day"\nlimit_tokens = 10\nmodels = ["gpt-4o*"]\nproviders = ["openai"]')
    b = book(b4o)
    fresh(b, [spend(model="gpt-4o-mini", inp=10), spend(model="gpt-5", inp=1000)])
    assert b.total(b4o, "", NOW).input_tokens == 10
    assert len(b.check("openai", "gpt-4o", None, None, NOW)) == 1
    assert b.check("openai", "gpt-5", None, None, NOW) == []
    assert b.check("anthropic", "gpt-4o", None, None, NOW) == []


def test_variants_of_a_model_name_stay_in_scope_and_in_one_subject():
    """The model name is the client's: a case, blank or full-width variant an upstream
    takes as the same model neither leaves a budget's scope nor starts a total of its own."""
    scoped = budget('period = "day"\nlimit_tokens = 10\nmodels = ["gpt-4o*"]\nproviders = ["openai"]')
    per_model = Budget("pm", "block", "day", "model", "total", 10)
    b = book(scoped, per_model)
    fresh(b, [spend(model="GPT-4o", inp=6)])
    b.add(row(model=" ｇｐｔ-4O ", inp=4, out=0))
    for variant in ("gpt-4o", "GPT-4O", "gpt-4o ", "ｇｐｔ-４ｏ"):
        assert sorted(v.rule_id for v in b.check("OpenAI", variant, None, None, NOW)) == ["b", "pm"], variant
    assert b.check("openai", "gpt-5", None, None, NOW) == []


def test_a_long_user_id_is_the_same_subject_in_the_database_and_in_memory():
    """The database keeps a user id's first 255 characters: the totals read back (another
    proxy's, or this one's after a restart) are those of the id the next request names."""
    daily = budget('period = "day"\nper = "user"\nlimit_tokens = 10')
    long_id = "u" * 300
    b = book(daily)
    fresh(b, [spend(user=long_id[:255], inp=10)])
    (verdict,) = b.check("openai", "gpt-4o", long_id, None, NOW)
    assert verdict.action == "block"


def test_a_flag_budget_records_and_lets_the_request_pass():
    flag = Budget("soft", "flag", "day", "all", "total", 1.0, reason="soft limit")
    b = book(flag)
    fresh(b, [spend(inp=5)])
    (verdict,) = b.check("openai", "gpt-4o", None, None, NOW)
    assert (verdict.action, verdict.reason.split(":")[0]) == ("flag", "soft limit")


@pytest.mark.parametrize(("failure", "action"), [("closed", "block"), ("open", "flag")])
def test_totals_that_cannot_be_read_follow_the_failure_policy(failure, action):
    clock = Clock()
    daily = budget('period = "day"\nlimit_tokens = 100')
    b = book(daily, failure=failure, clock=clock)
    (verdict,) = b.check("openai", "gpt-4o", None, None, NOW)  # never read yet
    assert (verdict.action, verdict.rule_id) == (action, "filter_error")
    assert verdict.reason == "budget 'b' cannot be checked: the totals were not read yet"
    fresh(b)
    assert b.check("openai", "gpt-4o", None, None, NOW) == []
    b.refresh_failed("cannot read the totals: connection refused")
    clock.now += 14  # one failed refresh is not enough: the totals are still recent
    assert b.check("openai", "gpt-4o", None, None, NOW) == []
    clock.now += 2
    (verdict,) = b.check("openai", "gpt-4o", None, None, NOW)
    assert (verdict.action, verdict.rule_id) == (action, "filter_error")
    assert verdict.reason == (
        "budget 'b' cannot be checked: the totals are 16 s old (cannot read the totals: connection refused)"
    )
    # what is known still counts (under open): this proxy's own use is never stale
    b.add(row(inp=100))
    assert [v.rule_id for v in b.check("openai", "gpt-4o", None, None, NOW)] == ["filter_error", "b"]


def test_totals_add_every_field():
    t = Totals(1, 2, 0.5, 1, 0, 0)
    t.add(Totals(3, 4, 0.25, 2, 1, 1))
    assert t == Totals(4, 6, 0.75, 3, 1, 1)
    assert (t.value("input"), t.value("output"), t.value("total"), t.value("usd")) == (4, 6, 10, 0.75)
    assert Totals.of_row({"input_tokens": None, "output_tokens": None, "cost_usd": None}) == Totals(0, 0, 0.0, 1, 1, 1)


# -- the totals query, on both backends -----------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database()
    engine = open_engine(url)
    yield engine
    engine.dispose()


def put(engine: Engine, **fields) -> None:
    values = {"id": uuid.uuid4().hex, "status": "completed", "dialect": "openai-chat", "streamed": False} | fields
    with engine.begin() as conn:
        conn.execute(insert(exchanges).values(values))


def test_read_spend_sums_final_rows_of_the_range_leaving_out_the_proxys_own_since_its_epoch(engine):
    common = {"user_id": "alice", "request_model": "gpt-4o", "provider": "openai", "api_key_fingerprint": "sha256:k"}
    put(engine, started_at=NOW, input_tokens=10, output_tokens=5, cost_usd=0.25, proxy_instance="p2", **common)
    put(engine, started_at=NOW, input_tokens=1, output_tokens=1, cost_usd=None, proxy_instance=None, **common)
    put(engine, started_at=EPOCH - timedelta(seconds=1), input_tokens=100, proxy_instance="p1", **common)
    put(engine, started_at=EPOCH, input_tokens=1000, proxy_instance="p1", **common)  # the book counts it
    put(engine, started_at=NOW, status="in_progress", input_tokens=10000, **common)
    put(engine, started_at=NOW - timedelta(days=1), input_tokens=100000, **common)  # yesterday
    put(engine, started_at=NOW, input_tokens=7, proxy_instance="p2", user_id="bob", request_model="gpt-5")
    day = period_start("day", NOW)
    rows = sorted(read_spend(engine, day, day + timedelta(days=1), "p1", EPOCH), key=lambda s: str(s.user_id))
    assert rows == [
        Spend("alice", "sha256:k", "gpt-4o", "openai", 111, 6, 0.25, 3, 2, 0),
        Spend("bob", None, "gpt-5", None, 7, 0, 0.0, 1, 1, 0),
    ]


def test_hostile_token_counts_neither_break_the_totals_nor_reopen_a_budget(engine):
    """The counts are the upstream's bytes: two rows of 2**62 overflowed SQLite's integer
    sum ('integer overflow': no totals, every request in scope refused once they went
    stale) and PostgreSQL's cast back to bigint (stats, the review page); a negative
    count took from the total. The same rows in stats and the review page's overview."""
    from review.overview import overview
    from storage.query import Filters, stats

    common = {"user_id": "mallory", "request_model": "gpt-4o", "provider": "openai", "proxy_instance": "p2"}
    for inp, out in ((2**62, 1), (2**62, 1), (-(2**62), -(2**62)), (5, 1)):
        put(engine, started_at=NOW, input_tokens=inp, output_tokens=out, **common)
    day = period_start("day", NOW)
    (spent,) = read_spend(engine, day, day + timedelta(days=1), "p1", EPOCH)
    huge = int(float(2**63 + 5))  # a double's sum: exact to 2**53
    assert (spent.input_tokens, spent.output_tokens, spent.exchanges) == (huge, 3, 4)
    daily = budget('period = "day"\nper = "user"\nlimit_tokens = 1000')
    b = book(daily)
    fresh(b, [spent])
    b.add(row(user="mallory", inp=-(2**62), out=-(2**62)))  # this proxy's own: adds nothing either
    (verdict,) = b.check("openai", "gpt-4o", "mallory", None, NOW)
    assert verdict.action == "block"
    with engine.connect() as conn:
        (total,) = stats(conn, Filters(), [])
        assert (total["input_tokens"], total["output_tokens"]) == (huge, 3)
        assert overview(conn, Filters()).totals["input_tokens"] == huge


def test_the_refresher_reads_the_totals_into_the_book_off_the_event_loop(engine):
    today = datetime.now(UTC)
    put(engine, started_at=today, input_tokens=60, proxy_instance="p2", user_id="alice")
    daily = Budget("d", "block", "day", "user", "input", 50.0)
    monthly = Budget("m", "block", "month", "user", "input", 1000.0)
    b = BudgetBook([daily, monthly], instance="p1", failure="closed", refresh_seconds=1)
    refresher = SpendRefresher(lambda: (b, engine))
    try:
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while b.snapshot is None and datetime.now(UTC) < deadline:
            refresher.wake()
            time.sleep(0.02)
        assert b.total(daily, "alice", today).input_tokens == 60
        (verdict,) = b.check(None, None, "alice", None, today)
        assert verdict.rule_id == "d"
    finally:
        refresher.close()


def test_a_database_that_cannot_be_read_is_kept_in_the_book_and_the_policy_decides():
    unreachable = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/audit", connect_args={"connect_timeout": 2})
    clock = Clock()
    b = BudgetBook(
        [Budget("d", "block", "day", "all", "total", 10.0)],
        instance="p1",
        failure="closed",
        refresh_seconds=1,
        clock=clock,
    )
    refresher = SpendRefresher(lambda: (b, unreachable))
    try:
        deadline = time.monotonic() + 10
        while b.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        refresher.close()
        unreachable.dispose()
    assert b.error is not None and b.error.startswith("cannot read the totals: "), b.error
    (verdict,) = b.check(None, None, None, None)
    assert (verdict.action, verdict.rule_id) == ("block", "filter_error")
    assert verdict.reason.startswith(
        "budget 'd' cannot be checked: the totals were not read yet (cannot read the totals:"
    )


class Writer:
    """What the keeper reads of the audit writer: its engine and instance name."""

    def __init__(self, engine: Engine, instance: str) -> None:
        self.engine, self.instance = engine, instance


class Store:
    def __init__(self, writer: Writer | None) -> None:
        self.writer, self.prices = writer, None


def test_new_rules_keep_the_book_in_force_until_the_new_one_is_read(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    put(engine, started_at=datetime.now(UTC), input_tokens=60, proxy_instance="p2", user_id="alice")
    store = Store(Writer(engine, "p1"))
    keeper = BudgetKeeper(store)  # type: ignore[arg-type]
    try:
        keeper.configure([Budget("d", "block", "day", "all", "input", 50.0)], "closed", 3600)
        keeper.start()  # the first read, before traffic
        first = keeper.book
        assert first is not None and first.snapshot is not None
        record = ExchangeRecord(started_at=time.time(), user_id="alice")
        assert [v.rule_id for v in keeper.check(record)] == ["d"]

        keeper.configure([Budget("e", "block", "day", "all", "input", 100.0)], "closed", 3600)
        keeper.recorded(row(started=datetime.now(UTC), inp=45))  # fed to both books
        deadline = time.monotonic() + 10
        while keeper.next is not None and keeper.next.snapshot is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert keeper.check(record) and keeper.book is not first  # the new book, read: in force
        (verdict,) = keeper.check(record)
        assert verdict.rule_id == "e" and "used 105 of 100 input tokens" in verdict.reason
        keeper.configure([], "closed", 3600)  # no budgets: nothing checked
        assert keeper.check(record) == [] and keeper.book is None
    finally:
        keeper.close()
        engine.dispose()


def test_start_puts_the_book_in_force_when_the_thread_read_its_totals_first(tmp_path):
    """The refresh thread may read a new book's totals before ``start`` does (it is woken
    when the book is made): ``start`` still puts that book in force."""
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    store = Store(Writer(engine, "p1"))
    keeper = BudgetKeeper(store)  # type: ignore[arg-type]
    try:
        keeper.configure([Budget("d", "block", "day", "all", "input", 50.0)], "closed", 3600)
        deadline = time.monotonic() + 10
        while keeper.next is not None and keeper.next.snapshot is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert keeper.next is not None and keeper.next.snapshot is not None  # the thread's read
        keeper.start()
        assert keeper.book is not None and keeper.next is None
    finally:
        keeper.close()
        engine.dispose()


def test_a_row_waiting_for_its_price_holds_only_what_pricing_reads(tmp_path, monkeypatch):
    """A row waits on the budgets' thread for its cost: not with the exchange's content."""
    seen: list[dict] = []
    monkeypatch.setattr(BudgetKeeper, "_price", lambda self, r: seen.append(dict(r)) or 0.5)
    engine = open_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    keeper = BudgetKeeper(Store(Writer(engine, "p1")))  # type: ignore[arg-type]
    try:
        keeper.configure([Budget("u", "block", "day", "all", "usd", 1.0)], "closed", 3600)
        keeper.start()
        big = {"request_body": {"messages": [{"role": "user", "content": "x" * 10**6}]}, "output_text": "y" * 10**6}
        keeper.recorded(row(started=datetime.now(UTC)) | big)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        (priced,) = seen
        assert priced["request_model"] == "gpt-4o" and priced["input_tokens"] == 10
        assert "request_body" not in priced and "output_text" not in priced
    finally:
        keeper.close()
        engine.dispose()


def test_rows_waiting_for_a_price_are_bounded_and_the_rest_count_as_unknown(monkeypatch):
    """The budgets' thread stuck (a database read that hangs): the rows waiting for their
    cost stop at PENDING_MAX; the others count as exchanges of unknown cost, and say so."""
    monkeypatch.setattr(budgets_module, "PENDING_MAX", 3)
    usd = budget('period = "day"\nlimit_usd = 1')
    b = book(usd)
    fresh(b)
    b.pricer = lambda r: 0.1
    for _ in range(5):
        b.add(row(cost=None))
    assert len(b.pending) == 3
    assert b.total(usd, "", NOW).unpriced == 2
    b.price_pending()
    used = b.total(usd, "", NOW)
    assert (round(used.cost_usd, 6), used.unpriced, used.exchanges) == (0.3, 2, 5)


def test_the_local_totals_of_past_periods_are_forgotten():
    """Kept, they grew with every day, and with every user id a client made up."""
    daily = budget('period = "day"\nper = "user"\nlimit_tokens = 100')
    b = book(daily)
    for i in range(50):
        b.add(row(user=f"made-up-{i}", started=NOW))
    assert len(b.local) == 50
    tomorrow = NOW + timedelta(days=1)
    b.add(row(user="alice", started=tomorrow, inp=7))
    b.add(row(user="alice", started=NOW, inp=1))  # a late record of yesterday: kept until the next day
    assert sorted(k[1] for k in b.local) == ["2026-12-02", "2026-12-03"]
    assert b.total(daily, "alice", tomorrow).input_tokens == 7
    b.add(row(user="alice", started=tomorrow + timedelta(days=1)))
    assert [k[1] for k in b.local] == ["2026-12-04"]


def test_models_of_unknown_cost_are_named_in_a_bounded_number_of_lines(monkeypatch):
    monkeypatch.setattr(budgets_module, "UNPRICED_NOTES_MAX", 3)
    usd = budget('period = "day"\nlimit_usd = 1')
    b = book(usd)
    b.pricer = lambda r: None
    for i in range(10):
        b.add(row(cost=None, model=f"made-up-{i}-" + "m" * 10_000))
    notes = b.price_pending()
    assert len(notes) == 4 and "more models of unknown cost" in notes[-1]
    assert all(len(n) < 400 for n in notes)
    assert b.total(usd, "", NOW).unpriced == 10


def test_the_event_loop_never_writes_the_cost_the_budgets_thread_adds():
    """add() on the event loop and price_pending() on the budgets' thread share a row's
    totals: an ``x += 0`` of the cost from the event loop could write back a value the
    thread had just replaced, and lose that cost."""
    writes: list[str] = []

    class Watched(Totals):
        def __setattr__(self, name, value):
            writes.append(name)
            super().__setattr__(name, value)

    usd = budget('period = "day"\nlimit_usd = 1')
    b = book(usd)
    b.pricer = lambda r: 0.5
    b.local[("b", "2026-12-02", "")] = watched = Watched()
    writes.clear()
    b.add(row(cost=None, inp=10, out=5))
    assert sorted(writes) == ["exchanges", "input_tokens", "output_tokens"]
    b.price_pending()
    assert (watched.cost_usd, watched.input_tokens, watched.unpriced) == (0.5, 10, 0)
