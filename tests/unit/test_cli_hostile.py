"""The CLI against what a hostile client, upstream or database writer put in its way
(an adversarial review of the CLI, 2026-12-07): stored text that would drive the
auditor's terminal, files that never end, a key given where no checkpoints are."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import orjson
import pytest
from sqlalchemy import insert
from test_cli_query import at, exchange, llm_audit, run

from cli.terminal import visible
from storage.database import open_engine, shown_url
from storage.schema import exchanges
from storage.status import process_start

TITLE = "\x1b]0;PWNED\x07\x1b[2J\x1b[31m"  # sets the window title, clears the screen, turns text red


@pytest.fixture
def hostile_db(tmp_path) -> str:
    """One exchange whose client-set role and upstream-set finish reason carry escapes,
    and one final record in no chain whose id a database writer filled with a verdict."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    body = {"model": "gpt-4o", "messages": [{"role": f"user{TITLE}", "content": "hello"}]}
    output = {"choices": [{"index": 0, "text": "hi", "finish_reason": f"stop{TITLE}"}], "tool_calls": []}
    fake = "9f54\r\x1b[2K\x1b[1A\r\x1b[2Kchain review: OK, records 1..11\x1b[8m"
    engine = open_engine(url)
    with engine.begin() as conn:
        conn.execute(
            insert(exchanges), [exchange("65c2" + "0" * 28, at(1), ttfc_ms=5, request_body=body, output=output)]
        )
        conn.execute(insert(exchanges), [exchange(fake, at(2), ttfc_ms=5)])
    engine.dispose()
    return url


def test_show_makes_a_role_and_a_finish_reason_visible(hostile_db):
    status, out, err = run("--db", hostile_db, "show", "65c2")
    assert status == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert f"user{visible(TITLE)}" in out and f"finish reason stop{visible(TITLE)}" in out


def test_verify_prints_stored_ids_visible(hostile_db):
    status, out, _ = run("--db", hostile_db, "verify")
    assert status == 1 and "\x1b" not in out and "\r" not in out
    assert "records in no chain: 2" in out and "\\x1b[2K" in out


def test_a_one_line_error_quoting_stored_or_given_text_is_visible(tmp_path):
    status, _, err = run("--db", f"sqlite:///{tmp_path}/no\x1b[2Jdir/sub/a.db", "list")
    assert status == 2 and "\x1b" not in err and "\\x1b[2J" in err


def test_invisible_separators_and_marks_are_made_visible():
    assert visible("a\u2028b\u2029c\u200ed\u200fe\u061cf") == "a\\u2028b\\u2029c\\u200ed\\u200fe\\u061cf"


def test_a_public_key_without_checkpoints_is_a_mistake_named(hostile_db, tmp_path):
    status, _, err = run("--db", hostile_db, "verify", "--public-key", str(tmp_path / "k.pub"))
    assert status == 2 and "--checkpoints DIR" in err and err.count("\n") == 1


def test_status_refuses_a_pipe_and_a_pid_of_zero(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    done = llm_audit("status", str(pipe))
    assert done.returncode == 2 and "not a regular file" in done.stderr
    doc = {"pid": 0, "instance": "proxy\x1b[31m", "writer_alive": True, "stopped": False, "written": 1, "spooled": 0}
    doc |= {"quarantined": 0, "held": 0, "updated": "2026-12-07T10:00:00Z", "last_error": None}
    (tmp_path / "status.json").write_bytes(orjson.dumps(doc))
    status, out, _ = run("status", str(tmp_path / "status.json"))
    assert status != 0 and "records flow" not in out and "\x1b" not in out


def test_status_tells_a_proxy_gone_from_a_later_process_given_its_pid(tmp_path):
    """A proxy killed outright leaves a status file saying it runs; its pid given to a
    later process made status say "records flow", exit 0, for a proxy long gone."""
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        doc = {"pid": later.pid, "instance": "gone", "writer_alive": True, "stopped": False, "written": 1}
        doc |= {"spooled": 0, "quarantined": 0, "held": 0, "updated": "2026-12-07T10:00:00Z", "last_error": None}
        path = tmp_path / "status.json"
        path.write_bytes(orjson.dumps(doc | {"pid_started": process_start(later.pid)}))
        assert run("status", str(path))[0] == 0  # (that very process: records flow)
        path.write_bytes(orjson.dumps(doc | {"pid_started": process_start(os.getpid())}))
        status, out, _ = run("status", str(path))
        assert status == 3 and "not running (the process is gone" in out, out
    finally:
        later.kill()
        later.wait()


def test_hosts_reads_no_device(tmp_path):
    assert stat.S_ISCHR(os.stat("/dev/zero").st_mode)
    done = llm_audit("hosts", "--extra", "/dev/zero")
    assert done.returncode == 2 and "not a regular file" in done.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:Sup3r@db.example/audit", "postgresql+psycopg://u:***@db.example/audit"),
        (
            "postgresql+psycopg://u@127.0.0.1:1/x?password=hunter2&sslmode=require",
            "postgresql+psycopg://u@127.0.0.1:1/x?password=***&sslmode=require",
        ),
        (
            "postgresql+psycopg://u:hunter2@h:port/x?sslpassword=zz",
            "postgresql+psycopg://u:***@h:port/x?sslpassword=***",
        ),
        ("sqlite:////var/lib/llm-audit/audit.db", "sqlite:////var/lib/llm-audit/audit.db"),
        ("u:Sup3r@db.example/audit", "u:***@db.example/audit"),  # (no scheme: no URL to parse)
        ("postgres//u:hunter2@db/x", "postgres//u:***@db/x"),
        ("postgresql+psycopg://u:hunter2@zz@h:port/x", "postgresql+psycopg://u:***@h:port/x"),
        ("postgresql://u:hunter2@zz@db.example/x", "postgresql://u:***@db.example/x"),  # (parses: host "zz@db...")
        ("postgresql://u:hunter2 zz@h:abc/db", "postgresql://u:***@h:abc/db"),
        ("app:hunter2/zz@dbhost/audit", "app:***@dbhost/audit"),
        (
            "postgresql://app:hunter2?zz@db.example:5432,db2.example:5432/audit",
            "postgresql://app:***@db.example:5432,db2.example:5432/audit",
        ),
        ("postgresql://app:hunter2@zz?9@db.example/audit", "postgresql://app:***@db.example/audit"),
        ("postgresql://u:hunter2@h/db?sslcert=/a@b", "postgresql://u:***@h/db?sslcert=/a@b"),
    ],
)
def test_a_database_url_is_shown_without_its_passwords(url, shown):
    """``?password=`` (libpq takes it there too) was printed by every error, --help
    (the value of $LLM_AUDIT_DB), db upgrade, purge, serve and the status file."""
    assert shown_url(url) == shown
    _, _, err = run("--db", url, "list")
    assert "hunter2" not in err and "Sup3r" not in err and "zz" not in err
    assert shown in llm_audit("--help", env={"LLM_AUDIT_DB": url}).stdout


def test_a_port_that_is_no_number_is_a_url_mistake_not_tampering():
    status, _, err = run("--db", "postgresql+psycopg://u@host:notaport/x", "list")
    assert status == 2 and "is not a database URL" in err and "verify" not in err


def test_no_command_but_a_checkpoint_into_a_new_folder_makes_a_signing_key(hostile_db, tmp_path):
    """A purge or an erasure with its key mistyped (or left out) made a new key and signed
    its statement with it: verify distrusted it from then on (exit 2), after a purge that
    cannot be undone. Nothing is changed now, and the error names --key."""
    for command in (["purge", "--older-than", "1d", "--force"], ["erase", "--user", "ana"]):
        status, out, err = run(
            "--db", hostile_db, *command, "--key", str(tmp_path / "typo.pem"), "--dir", str(tmp_path)
        )
        assert status == 2 and "there is no signing key at" in err and "--key FILE" in err and out == ""
        assert "llm_audit_signing_key" in err  # (the proxy's option that names its key)
    assert not (tmp_path / "typo.pem").exists()
    status, out, _ = run("--db", hostile_db, "list", "--format", "jsonl")
    assert len(out.splitlines()) == 2  # (nothing purged)


def test_a_checkpoint_refuses_a_foreign_folder_a_shared_key_and_known_tampering(hostile_db, tmp_path):
    from storage.checkpoint import load_or_create_key, write_signed

    proxy_key, other = tmp_path / "proxy.pem", tmp_path / "other.pem"
    folder = tmp_path / "checkpoints"
    write_signed(folder, load_or_create_key(proxy_key), "checkpoint", {"format": 1, "chains": {}}, at(1))
    status, _, err = run("--db", hostile_db, "checkpoint", "--key", str(other), "--dir", str(folder))
    assert status == 2 and "there is no signing key at" in err  # (a folder already signed: no new key)
    load_or_create_key(other)
    status, _, err = run("--db", hostile_db, "checkpoint", "--key", str(other), "--dir", str(folder))
    assert status == 2 and "is signed by key" in err and f"not by {other}" in err
    os.chmod(other, 0o644)
    status, _, err = run("--db", hostile_db, "checkpoint", "--key", str(other), "--dir", str(tmp_path / "new"))
    assert status == 2 and f"chmod 600 {other}" in err
    os.chmod(other, 0o600)  # (a new folder, but a database a plain verify calls tampered: never signed over)
    status, _, err = run("--db", hostile_db, "checkpoint", "--key", str(other), "--dir", str(tmp_path / "new"))
    assert status == 2 and "refusing to sign: a record in no chain" in err
    assert not (tmp_path / "new").exists() or not list((tmp_path / "new").iterdir())


def test_a_stored_value_that_is_not_utf8_is_shown_and_named_not_a_failure(hostile_db):
    """SQLite keeps any bytes in a TEXT column: one value that was not UTF-8 made every
    query fail and verify stop (exit 2, "could not run") without naming the record."""
    import sqlite3

    with sqlite3.connect(hostile_db.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE exchanges SET output_text = CAST(X'41FFFE42' AS TEXT), user_id = CAST(X'C0AF' AS TEXT)")
    status, out, err = run("--db", hostile_db, "list", "--format", "jsonl")
    assert status == 0 and len(out.splitlines()) == 2, err
    status, out, err = run("--db", hostile_db, "show", "65c2")
    assert status == 0 and "\ufffd" in out, err  # (the user id, read with U+FFFD)
    status, out, _ = run("--db", hostile_db, "verify")
    assert status == 1 and "65c20000000000000000000000000000" in out


def test_verify_says_what_is_open_and_names_an_open_record_posing_as_a_quarantined_one(hostile_db):
    """Open records are exchanges under way: verify does not check them, and said nothing
    of them, while list and show read them. A sealed record reopened to show other
    content, its place filled by a quarantine row, is named."""
    from storage.schema import quarantine

    engine = open_engine(hostile_db)
    victim = "65c2" + "0" * 28
    with engine.begin() as conn:
        conn.execute(exchanges.update().where(exchanges.c.id == victim).values(status="in_progress"))
        conn.execute(
            quarantine.insert().values(
                quarantined_at=at(3), reason="x", file="/nowhere", size=1, sha256="0" * 64,
                chain_id="review", chain_seq=1, record_id=victim,
            )
        )  # fmt: skip
    engine.dispose()
    status, out, _ = run("--db", hostile_db, "verify")
    assert status == 1 and "records still open: 1 (under way, not sealed: not checked" in out
    assert (
        f"inserted: an open record bears the id of quarantined record {victim}" not in out
    )  # (no chain holds the gap)


def test_mistakes_that_would_match_nothing_are_named(hostile_db):
    status, _, err = run("--db", hostile_db, "list", "--status", "complete")
    assert status == 2 and "no exchange has the status 'complete'; the statuses are in_progress, completed" in err
    status, _, err = run("--db", hostile_db, "list", "--since", "2026-03-07", "--until", "2026-03-01")
    assert status == 2 and "is not before --until" in err and "swap them" in err
    status, out, _ = run("--db", hostile_db, "show", "65C2")  # (ids are lower-case hex)
    assert status == 0 and out.startswith("exchange 65c2")
    status, _, err = run("--db", "", "list")  # (an unset shell variable: not the default database)
    assert status == 2 and "--db is empty" in err
    status, _, err = run("--db", hostile_db, "erase", "--user", " ")
    assert status == 2 and "--user is empty" in err


def test_looking_at_a_database_makes_none_and_upgrading_adds_to_none_foreign(tmp_path):
    import sqlite3

    status, out, _ = run("--db", f"sqlite:///{tmp_path}/new/x.db", "db", "current")
    assert status == 0 and out.startswith("none (no schema yet") and not (tmp_path / "new").exists()
    status, _, err = run("--db", f"sqlite:///{tmp_path}/r.db", "db", "roles", "--apply")
    assert status == 2 and "PostgreSQL" in err and not (tmp_path / "r.db").exists()
    with sqlite3.connect(tmp_path / "other.db") as other:
        other.execute("CREATE TABLE foo (a)")
    os.chmod(tmp_path / "other.db", 0o600)
    status, _, err = run("--db", f"sqlite:///{tmp_path}/other.db", "db", "upgrade")
    assert status == 2 and "holds tables that are not llm-audit's (foo)" in err and "--force" in err


def test_a_damaged_file_and_a_busy_address_name_their_fix(tmp_path):
    import socket

    (tmp_path / "damaged.db").write_bytes(os.urandom(60000))
    status, _, err = run("--db", f"sqlite:///{tmp_path}/damaged.db", "list")
    assert status == 2 and "is damaged or is no SQLite database" in err and ".recover" in err
    password = tmp_path / "password"
    password.write_text("a password long enough\n")
    password.chmod(0o600)
    engine = open_engine(f"sqlite:///{tmp_path}/a.db")
    engine.dispose()
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = llm_audit("--db", f"sqlite:///{tmp_path}/a.db", "serve", "--password-file", str(password),
                         "--listen", f"127.0.0.1:{port}")  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "cannot listen on 127.0.0.1" in done.stderr


def test_signed_evidence_is_private_whatever_the_umask(tmp_path):
    from storage.checkpoint import load_or_create_key, public_key_path, write_signed

    old = os.umask(0)
    try:
        key = load_or_create_key(tmp_path / "keys" / "k.pem")
        path = write_signed(tmp_path / "evidence" / "cp", key, "erasure", {"format": 1, "user_id": "ana"}, at(1))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == stat.S_IMODE(os.stat(path.parent.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(public_key_path(tmp_path / "keys" / "k.pem")).st_mode) == 0o644


@pytest.mark.parametrize("seq", [None, 0, -5])
def test_a_final_record_at_no_place_in_its_chain_is_named(hostile_db, seq):
    """A chain's walk reads its records from number 1 (or its start) on: a final record
    with a chain but no number, or one below 1, was read by no walk and passed verify,
    while list and show showed it."""
    engine = open_engine(hostile_db)
    with engine.begin() as conn:
        conn.execute(exchanges.update().values(chain_id="review", chain_seq=seq))
    engine.dispose()
    status, out, _ = run("--db", hostile_db, "verify")
    assert status == 1 and "inserted: final record 65c20000000000000000000000000000 is in no chain" in out


@pytest.mark.parametrize(("command", "value"), [(["list", "--since"], "-1d"), (["purge", "--older-than"], "-30d")])
def test_a_value_starting_with_a_minus_gets_the_options_own_error(tmp_path, command, value):
    """argparse read "-1d" as an option and answered "expected one argument"."""
    status, _, err = run("--db", f"sqlite:///{tmp_path / 'none.db'}", *command, value)
    assert status == 2 and len(err.splitlines()) == 1 and "expected one argument" not in err, err
    assert f"'{value}': use an age (Nh, Nd, Nw, e.g. 183d)" in err, err


def test_the_records_read_with_values_llm_audit_did_not_write_are_counted_not_all_kept():
    """An export of a database planted with millions of such rows keeps no list of them all."""
    from storage.stored import Unreadable

    unreadable = Unreadable()
    for i in range(25):
        unreadable.add(f"id-{i}: input_tokens: a BLOB, no integer")
    assert unreadable.count == 25 and unreadable.named == [
        f"id-{i}: input_tokens: a BLOB, no integer" for i in range(10)
    ]
    assert not Unreadable()
