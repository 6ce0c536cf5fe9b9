"""The exchange hooks driven by hand, without a running proxy: each flow passes through
the states of ``addon/mitm/flow_state.py`` and its record reaches the store once it ends.

The real proxy is tested end to end in ``tests/e2e/``; these pin the state each hook
leaves a flow in, which the e2e tests see only through the rows.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import tracemalloc
import zlib

import brotli
import orjson
import pytest
from backports import zstd
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.flow import Error
from mitmproxy.test import tflow
from protoenc import end_stream, env, f, m

from addon import auditor
from addon.auditor import READ_RUN_CHUNKS
from addon.filters.api import BaseFilter, OutputPiece, Verdict
from addon.filters.engine import FilterSet
from addon.filters.rules import parse_rules
from addon.mitm.content_filters import ContentFilters
from addon.mitm.flow_record import request_content
from addon.mitm.flow_state import AnsweredByProxy, HeldWhole, Recording, Sniffing, Streaming
from addon.mitm.hooks import ExchangeHooks
from addon.record import OUTCOME_CLIENT_ABORTED, OUTCOME_UPSTREAM_ABORTED, ExchangeRecord, Status

BLOCK_WORD = parse_rules("""
[[rule]]
id = "code-names"
kind = "keywords"
keywords = ["Nightjar"]
action = "block"
""")
SSE = {"content-type": "text/event-stream"}


class Store:
    """Stands in for AuditStore: keeps what it is given."""

    instance = "test"

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def submit(self, record: ExchangeRecord) -> None:
        self.rows.append(record.to_row())


def hooks(rules=None) -> tuple[ExchangeHooks, Store]:
    store, filters = Store(), ContentFilters()
    filters.filterset = FilterSet(rules, failure="closed") if rules else None
    return ExchangeHooks(store, filters), store


def chat_flow(text: str = "hi", stream: bool = True) -> http.HTTPFlow:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    request = http.Request.make(
        "POST", "https://api.openai.com/v1/chat/completions", orjson.dumps(body), {"content-type": "application/json"}
    )
    return tflow.tflow(req=request)


def response_headers(headers: dict[str, str]) -> http.Response:
    """A response as mitmproxy has it in ``responseheaders``: no body read yet."""
    response = http.Response.make(200, b"", headers)
    response.raw_content = None
    return response


def chunk(text: str) -> bytes:
    data = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return b"data: " + orjson.dumps(data) + b"\n\n"


def stream_through(h: ExchangeHooks, flow: http.HTTPFlow, *chunks: bytes) -> bytes:
    """What the tap passes to the client of the chunks, the body's end included."""
    out = b""
    for piece in (*chunks, b""):
        sent = flow.response.stream(piece)
        out += sent if isinstance(sent, bytes) else b"".join(sent)
    return out


def test_a_streamed_exchange_goes_recording_then_streaming_and_is_written_when_it_ends():
    h, store = hooks()
    flow = chat_flow()
    h.request(flow)
    assert isinstance(h.flows[flow.id], Recording)
    assert [row["status"] for row in store.rows] == ["in_progress"]  # the write-ahead row

    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    assert isinstance(h.flows[flow.id], Streaming)
    body = chunk("Hello") + b"data: [DONE]\n\n"
    assert stream_through(h, flow, body) == body

    h.response(flow)
    assert flow.id not in h.flows
    row = store.rows[-1]
    assert (row["status"], row["output_text"]) == ("completed", "Hello")
    assert flow.response.raw_content == body  # the copy mitmproxy's views show
    assert flow.comment.endswith("completed")


def test_a_request_a_filter_blocks_is_answered_by_the_proxy_and_written_once():
    h, store = hooks(BLOCK_WORD)
    flow = chat_flow("about Nightjar")
    h.request(flow)
    assert isinstance(h.flows[flow.id], AnsweredByProxy)
    assert flow.response is not None and store.rows == []  # no write-ahead row for it

    h.responseheaders(flow)
    assert flow.response.stream is False  # the proxy's own answer is not tapped
    h.response(flow)
    [row] = store.rows
    assert (row["status"], row["error_code"]) == (Status.BLOCKED, "content_filtered")
    assert row["http_status"] == flow.response.status_code


def test_a_json_answer_filters_may_block_is_held_whole_and_replaced_when_blocked():
    h, store = hooks(BLOCK_WORD)
    flow = chat_flow(stream=False)
    h.request(flow)
    assert isinstance(h.flows[flow.id], Recording) and h.flows[flow.id].output is not None
    answer = {
        "id": "r1",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Nightjar"}, "finish_reason": "stop"}],
    }
    flow.response = http.Response.make(200, orjson.dumps(answer), {"content-type": "application/json"})
    h.responseheaders(flow)
    assert isinstance(h.flows[flow.id], HeldWhole)
    assert flow.response.stream is False  # mitmproxy holds it whole

    h.response(flow)
    row = store.rows[-1]
    assert row["status"] == "blocked" and row["delivered_text"] == ""
    assert b"Nightjar" not in flow.response.content


def test_an_event_stream_no_request_revealed_is_sniffed_and_claimed_by_its_first_event():
    h, store = hooks()
    flow = tflow.tflow(req=http.Request.make("GET", "https://example.com/events"))
    h.request(flow)
    assert flow.id not in h.flows

    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    assert isinstance(h.flows[flow.id], Sniffing)
    flow.response.stream(chunk("Hi"))
    assert isinstance(h.flows[flow.id], Streaming)
    stream_through(h, flow, b"data: [DONE]\n\n")
    h.response(flow)
    assert store.rows[-1]["output_text"] == "Hi"


def test_an_upstream_that_cannot_be_reached_fails_the_record_with_mitmproxy_s_message():
    h, store = hooks()
    flow = chat_flow()
    h.request(flow)
    flow.error = Error("Connection refused")
    h.error(flow)
    row = store.rows[-1]
    assert (row["status"], row["error_code"], row["error_message"]) == (
        "failed",
        "upstream_error",
        "Connection refused",
    )


def test_done_writes_the_exchanges_still_open_as_cut_off():
    h, store = hooks()
    flow = chat_flow()
    h.request(flow)
    h.done()
    row = store.rows[-1]
    assert row["status"] == "client_aborted" and "proxy_shutdown" in [f["code"] for f in row["findings"]]
    assert h.flows == {}


# -- a stream read in runs (addon.auditor.READ_RUN) ----------------------------------------------


FLAG_TOKENS = parse_rules("""
[[rule]]
id = "tok42-seen"
kind = "keywords"
keywords = ["tok42"]
action = "flag"

[[rule]]
id = "teens"
kind = "regex"
pattern = "tok1[0-9] tok"
action = "flag"
""")


def _end(h: ExchangeHooks, flow: http.HTTPFlow, kind: str) -> None:
    """End the exchange as ``kind`` says: its body ends (``complete``), the proxy stops
    (``shutdown``), or a side cuts it (``upstream``; else the client)."""
    if kind == "complete":
        flow.response.stream(b"")
        h.response(flow)
    elif kind == "shutdown":
        h.done()
    else:
        flow.error = Error("connection closed")
        outcome = OUTCOME_UPSTREAM_ABORTED if kind == "upstream" else OUTCOME_CLIENT_ABORTED
        h._record_aborted(flow, h.flows.pop(flow.id), outcome)


def _row_of(kind: str, sniffed: bool, rules=None) -> dict:
    """The row of a 50-delta stream cut (or ended) by ``kind``, its chunks 37 bytes each."""
    h, store = hooks(rules)
    flow = tflow.tflow(req=http.Request.make("GET", "https://example.com/events")) if sniffed else chat_flow()
    h.request(flow)
    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    body = b"".join(chunk(f"tok{i} ") for i in range(50)) + (
        b"data: [DONE]\n\n" if kind in ("complete", "had_all") else b""
    )
    for i in range(0, len(body), 37):
        flow.response.stream(body[i : i + 37])
    _end(h, flow, "client" if kind == "had_all" else kind)
    row = store.rows[-1]  # (the first is the write-ahead open record)
    # (a run's text is checked as one piece: its verdicts come rule by rule, not in text order)
    row["verdicts"] = sorted(row["verdicts"], key=lambda v: (v["position"], v["rule_id"]))
    return {k: v for k, v in row.items() if k not in ("id", "started_at", "first_chunk_at", "ended_at")}


def test_a_stream_read_in_runs_is_recorded_as_one_read_chunk_by_chunk_however_it_ends(monkeypatch) -> None:
    """Ended, cut by either side (a client that had it all too), or cut off by the proxy
    stopping: whether its chunks were read in runs or one by one, the row is the same,
    with every delta that came (the catch-up before the record is judged or written),
    and, under rules that only flag, every verdict."""
    whole = "".join(f"tok{i} " for i in range(50))
    for kind in ("complete", "client", "had_all", "upstream", "shutdown"):
        for sniffed, rules in ((False, None), (True, None), (False, FLAG_TOKENS)):
            monkeypatch.setattr(auditor, "READ_RUN", 0)
            one_by_one = _row_of(kind, sniffed, rules)
            assert one_by_one["output_text"] == whole, (kind, sniffed)
            if rules is not None:  # flag rules: their gate checks the text, a run at a time
                assert {v["rule_id"] for v in one_by_one["verdicts"]} == {"tok42-seen", "teens"}, kind
            for run_bytes in (32 * 1024, 100):  # one run read at the end; runs that fill
                monkeypatch.setattr(auditor, "READ_RUN", run_bytes)
                assert _row_of(kind, sniffed, rules) == one_by_one, (kind, sniffed, rules, run_bytes)


FLAG_CODE_NAME = parse_rules("""
[[rule]]
id = "code"
kind = "keywords"
keywords = ["Nightjar"]
action = "flag"
""")


def _flagged_at_the_end(kind: str, encoding: str | None, monkeypatch) -> dict:
    """The row of a stream whose very last text is a keyword a flag rule looks for (only
    the end decides it: more letters could follow), ended or cut by ``kind``; a compressed
    one read with a backlog (one slice per call), drained as the proxy's task does."""
    monkeypatch.setattr(auditor, "CALL_SECONDS", 0.0)
    h, store = hooks(FLAG_CODE_NAME)
    flow = chat_flow()
    h.request(flow)
    flow.response = response_headers(SSE | ({"content-encoding": encoding} if encoding else {}))
    h.responseheaders(flow)
    body = b"".join(chunk("filler text " * 10) for _ in range(400)) + chunk("the plan is ") + chunk("Nightjar")
    for i in range(0, len(data := gzip.compress(body) if encoding else body), 4096):
        flow.response.stream(data[i : i + 4096])
    state = h.flows[flow.id]
    while state.auditor.drain():  # (what the event loop reads between chunks and after the body)
        pass
    _end(h, flow, kind)
    return store.rows[-1]


def test_flag_rules_decide_a_match_at_the_very_end_however_the_exchange_ends(monkeypatch) -> None:
    """A match only the end decides is flagged whether the body ended or was cut by
    either side or by the proxy stopping, read in runs or, compressed, from a backlog."""
    for encoding in (None, "gzip"):
        for kind in ("complete", "client", "upstream", "shutdown"):
            row = _flagged_at_the_end(kind, encoding, monkeypatch)
            assert (row["output_text"] or "").endswith("Nightjar"), (kind, encoding)
            assert [v["rule_id"] for v in row["verdicts"]] == ["code"], (kind, encoding)


def test_a_gate_that_stopped_holding_gets_the_last_checks_when_the_exchange_is_cut() -> None:
    """Under ``failure=open`` an event too large to check makes a blocking gate stop
    holding: the client then gets every byte, and a match only the end decides is still
    recorded, as a verdict (it stopped nothing), however the exchange ends."""
    for kind in ("complete", "client", "upstream", "shutdown"):
        h, store = hooks(BLOCK_WORD)
        h.filters.filterset = FilterSet(BLOCK_WORD, failure="open")
        h.max_event_bytes = 300
        flow = chat_flow()
        h.request(flow)
        flow.response = response_headers(SSE)
        h.responseheaders(flow)
        big = chunk("y" * 600)  # (cut across chunks: the reader holds more than it may check)
        sent = b""
        for piece in (big[:400], big[400:], chunk("The plan is called "), chunk("Nightjar")):
            got = flow.response.stream(piece)
            sent += got if isinstance(got, bytes) else b"".join(got)
        _end(h, flow, kind)
        row = store.rows[-1]
        assert b"Nightjar" in sent, kind
        assert ("code-names", "block") in [(v["rule_id"], v["action"]) for v in row["verdicts"]], kind


class FlagTheEnd(BaseFilter):
    """A user filter that flags every stream's end (the last piece, ``final``)."""

    name = "flag-the-end"

    def check_output(self, piece: OutputPiece) -> Verdict | None:
        return Verdict("flag", "the-end", "") if piece.final else None


def test_the_end_of_a_stream_is_checked_once() -> None:
    """The body's end checks the end of every stream; the exchange's end does not check
    it again (a user filter would be asked twice), here for a gate that stopped holding."""
    h, store = hooks()
    h.filters.filterset = FilterSet((), [FlagTheEnd()], failure="open")
    h.max_event_bytes = 300
    flow = chat_flow()
    h.request(flow)
    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    big = chunk("y" * 600)
    for piece in (big[:400], big[400:], chunk("the end"), b""):
        flow.response.stream(piece)
    h.response(flow)
    assert [v["rule_id"] for v in store.rows[-1]["verdicts"]].count("the-end") == 1


def test_an_ndjson_answer_whose_last_line_has_no_line_feed_is_checked_by_flag_rules() -> None:
    """Ollama's last line without its line feed becomes a frame only when the body ends:
    the client parses it, and flag rules check it too."""
    for final_lf in (b"\n", b""):
        h, store = hooks(FLAG_CODE_NAME)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        request = http.Request.make(
            "POST", "http://localhost:11434/api/chat", orjson.dumps(body), {"content-type": "application/json"}
        )
        flow = tflow.tflow(req=request)
        h.request(flow)
        flow.response = response_headers({"content-type": "application/x-ndjson"})
        h.responseheaders(flow)
        lines = [
            {"model": "m", "message": {"role": "assistant", "content": t}, "done": d}
            for t, d in (("It is ", False), ("Nightjar.", True))
        ]
        flow.response.stream(b"\n".join(orjson.dumps(line) for line in lines) + final_lf)
        flow.response.stream(b"")
        h.response(flow)
        row = store.rows[-1]
        assert (row["dialect"], row["output_text"]) == ("ollama", "It is Nightjar."), final_lf
        assert [v["rule_id"] for v in row["verdicts"]] == ["code"], final_lf


def test_a_tap_that_fails_under_flag_rules_still_passes_the_chunk(monkeypatch) -> None:
    """Blocking filters fail closed (the chunk is withheld); flag rules hold nothing, so
    the chunk goes on, unless the proxy already ended the stream."""

    def broken(self, chunk, now=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(auditor.StreamAuditor, "feed", broken)
    for rules, stopped, passes in (
        (FLAG_CODE_NAME, False, True),
        (BLOCK_WORD, False, False),
        (FLAG_CODE_NAME, True, False),
    ):
        h, _ = hooks(rules)
        flow = chat_flow()
        h.request(flow)
        flow.response = response_headers(SSE)
        h.responseheaders(flow)
        h.flows[flow.id].auditor.stopped = stopped
        assert flow.response.stream(chunk("a")) == (chunk("a") if passes else []), (rules, stopped)


def test_a_run_of_tiny_chunks_is_read_at_256_chunks() -> None:
    """An upstream sending a byte at a time does not make a flow hold thousands of objects."""
    h, _ = hooks()
    flow = chat_flow()
    h.request(flow)
    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    body = b"".join(chunk(f"tok{i} ") for i in range(60))
    reading = h.flows[flow.id].auditor
    for i in range(len(body)):
        flow.response.stream(body[i : i + 1])
        assert len(reading._run) < READ_RUN_CHUNKS
    assert reading.record.event_count >= 55  # read as the runs filled, not at the end


def test_the_last_run_is_read_in_the_response_hook_before_later_addons_see_the_flow() -> None:
    """mitmproxy runs ``-w``'s saving and mitmdump's printing after this addon's
    ``response`` hook: the record of a stream read in runs is settled, and the flow given
    its body and comment, within the hook, with an event loop running and whether or not
    its tasks run eagerly (mitmproxy's do; ``asyncio.run``'s do not)."""

    async def scenario() -> tuple[list[dict], http.HTTPFlow]:
        h, store = hooks()
        flow = chat_flow()
        h.request(flow)
        flow.response = response_headers(SSE)
        h.responseheaders(flow)
        for piece in (chunk("a"), chunk("b"), b"data: [DONE]\n\n", b""):
            flow.response.stream(piece)
        h.response(flow)
        return list(store.rows), flow

    rows, flow = asyncio.run(scenario())
    assert [row["status"] for row in rows] == ["in_progress", "completed"]
    assert rows[-1]["output_text"] == "ab"
    assert flow.comment.endswith("completed") and flow.response.raw_content


def test_a_backlog_read_to_its_end_is_not_written_again_at_shutdown() -> None:
    """A drain task that settled its exchange (and wrote it) before its done-callback ran
    is still in the table when the proxy stops: its record is not submitted twice."""

    async def scenario() -> list[dict]:
        h, store = hooks()
        flow = chat_flow()
        h.request(flow)
        flow.response = response_headers(SSE | {"content-encoding": "gzip"})
        h.responseheaders(flow)
        flow.response.stream(gzip.compress(chunk("a") + b"data: [DONE]\n\n"))
        flow.response.stream(b"")
        state = h.flows.pop(flow.id)
        task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        await task  # done; its callbacks have not run
        h._record_complete(flow, state)
        h.draining[task] = (state.auditor, state, "complete", None)
        h.done()
        return store.rows

    rows = asyncio.run(scenario())
    assert [row["status"] for row in rows] == ["in_progress", "completed"]


# -- a long-lived stream of turns (Cursor's agent over Connect) -----------------------------------

CONNECT = {"content-type": "application/connect+proto", "connect-protocol-version": "1"}


def _agent_flow(h: ExchangeHooks) -> http.HTTPFlow:
    """Cursor's agent stream, its first prompt sent (turn 0 opened and written ahead)."""
    request = http.Request.make("POST", "https://api2.cursor.sh/agent.v1.AgentService/Run", b"", CONNECT)
    flow = tflow.tflow(req=request)
    h.requestheaders(flow)
    flow.request.stream(env(m(1, m(2, m(1, m(1, f(1, "first question")))))))
    return flow


def _text(text: str) -> bytes:
    return env(m(1, m(1, f(1, text))))


TURN_ENDED = env(m(1, m(14, f(1, 3), f(2, 5))))


def test_turns_read_only_as_the_body_ends_are_each_written_once(monkeypatch) -> None:
    """A compressed backlog read after the body ended holds turn 0's end and all of turn 1
    (its answer only: nothing opened it): both are written, each once, with their own
    text; the record settled at the end is the current turn's, not the first one's."""
    monkeypatch.setattr(auditor, "CALL_SECONDS", 0.0)  # one slice per chunk: the rest waits
    h, store = hooks()
    flow = _agent_flow(h)
    flow.response = response_headers(CONNECT | {"content-encoding": "gzip"})
    h.responseheaders(flow)
    body = _text("a" * 40_000) + TURN_ENDED + _text("second answer") + end_stream()
    flow.response.stream(gzip.compress(body))
    flow.response.stream(b"")
    h.response(flow)  # (no event loop: the backlog is read at once)
    final = [(r["turn"], r["status"], len(r["output_text"] or "")) for r in store.rows if r["status"] != "in_progress"]
    assert final == [(0, "completed", 40_000), (1, "completed", len("second answer"))]
    assert len({r["id"] for r in store.rows if r["status"] != "in_progress"}) == 2


@pytest.mark.parametrize("filtered", [False, True])
def test_what_a_client_sends_after_its_exchange_is_recorded_changes_no_record(filtered: bool) -> None:
    """mitmproxy calls the request's stream callable while the client still sends, after
    the response hook wrote the final record: a message read then went into that record,
    whose row the writer holds (it shares the request body): a row changed after it was
    handed over, or after it was sealed (``verify``: modified). Unread now; with request
    filters it does not go upstream unchecked either."""
    rules = parse_rules('[[rule]]\nid = "k"\nkind = "keywords"\nkeywords = ["Nightjar"]\naction = "block"')
    h, store = hooks(rules if filtered else None)
    flow = _agent_flow(h)
    flow.response = response_headers(CONNECT)
    h.responseheaders(flow)
    for piece in (_text("answer 0"), end_stream(), b""):
        flow.response.stream(piece)
    h.response(flow)
    final = [r for r in store.rows if r["status"] != "in_progress"]
    before = orjson.dumps([r["request_body"] for r in final])
    late = env(m(1, m(2, m(1, m(1, f(1, "a later question about Nightjar"))))))
    assert flow.request.stream(late) == ([] if filtered else late)
    assert orjson.dumps([r["request_body"] for r in final]) == before
    assert [(r["status"], r["turn"]) for r in store.rows] == [("in_progress", 0), ("completed", 0)]


# -- a compressed request body ------------------------------------------------------------------

BOMB_SIZE = 256 * 1024 * 1024  # JSON whitespace: a valid body, a few hundred KB in gzip


def gzip_body(head: bytes, spaces: int = 0) -> bytes:
    """``head`` then ``spaces`` spaces, gzip-encoded a MiB at a time (never whole in memory)."""
    encoder = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [encoder.compress(head)]
    for start in range(0, spaces, 1 << 20):
        out.append(encoder.compress(b" " * min(1 << 20, spaces - start)))
    return b"".join(out) + encoder.flush()


def gzip_chat_flow(body: bytes) -> http.HTTPFlow:
    flow = chat_flow()
    flow.request.headers["content-encoding"] = "gzip"
    flow.request.raw_content = body
    return flow


def chat_json(text: str) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "stream": True})


def test_a_compressed_request_is_read_as_the_upstream_reads_it() -> None:
    h, store = hooks(BLOCK_WORD)
    flow = gzip_chat_flow(gzip_body(chat_json("about Nightjar")))
    h.request(flow)
    assert isinstance(h.flows[flow.id], AnsweredByProxy)
    h, store = hooks()
    flow = gzip_chat_flow(gzip_body(chat_json("hello")))
    h.request(flow)
    (row,) = store.rows
    assert row["request_body"]["messages"] == [{"role": "user", "content": "hello"}] and row["findings"] == []


def test_a_compression_bomb_request_is_not_decoded_whole_and_the_failure_policy_decides() -> None:
    """mitmproxy's get_content decoded all of it at once: 256 MiB in memory and about a
    second of the event loop for this body, 32 GiB for a 32 MB one."""
    sent = gzip_body(chat_json("hi"), BOMB_SIZE)
    h, store = hooks()
    flow = gzip_chat_flow(sent)
    tracemalloc.start()  # (the process's peak RSS says nothing once an earlier test peaked higher)
    try:
        h.request(flow)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024  # far below the 256 MiB the body decodes to
    assert flow.request.raw_content == sent  # what goes upstream is untouched
    (row,) = store.rows
    assert row["dialect"] == "openai-chat" and row["request_body"] is None  # recognised by its line
    ((code, detail),) = [(f["code"], f["detail"]) for f in row["findings"]]
    assert code == "request_too_large" and "compression ratio over 100:1" in detail
    assert f"sha256 {hashlib.sha256(sent).hexdigest()}" in detail

    h, store = hooks(BLOCK_WORD)  # closed: what no filter could read is refused
    flow = gzip_chat_flow(sent)
    h.request(flow)
    assert isinstance(h.flows[flow.id], AnsweredByProxy)
    h.response(flow)
    (row,) = store.rows
    assert [v["rule_id"] for v in row["verdicts"]] == ["filter_error"]
    assert "request_too_large" in row["verdicts"][0]["reason"]


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", lambda b: zlib.compress(b, wbits=31)),
        ("deflate", zlib.compress),
        ("br", brotli.compress),
        ("zstd", zstd.compress),
        ("gzip, br", lambda b: brotli.compress(zlib.compress(b, wbits=31))),
    ],
)
def test_a_compressed_request_is_read_whatever_the_record_keeps_and_not_past_its_bound(coding, encode) -> None:
    """llm_audit_max_record_bytes bounds what a record keeps, not what can be checked: a
    body read whole uncompressed is read whole compressed (under `closed`, a lower
    record limit refused larger compressed requests). Past the bound of what is
    decoded, it is not read."""
    body = chat_json("x" * 3000)
    h, store = hooks()
    h.max_record_bytes = 2048
    flow = chat_flow()
    flow.request.headers["content-encoding"] = coding
    flow.request.raw_content = encode(body)
    h.request(flow)
    (row,) = store.rows
    assert row["findings"] == [] and row["request_body"]["messages"][0]["content"] == "x" * 3000
    data, findings = request_content(flow.request, 2048)
    assert data is None and [f.code for f in findings] == ["request_too_large"]
    assert "decoded size over the 2048 bytes read" in findings[0].detail
    assert request_content(flow.request, 4096) == (body, [])


@pytest.mark.parametrize(
    ("coding", "sent", "code", "body"),
    [
        ("gzip", b"not gzip", "request_decode_failed", "not gzip"),  # nothing decodes: the bytes as sent
        ("gzip", gzip_body(chat_json("hi")) + b"junk", "request_decode_failed", orjson.loads(chat_json("hi"))),
        ("snappy", chat_json("hi"), "request_decode_failed", orjson.loads(chat_json("hi"))),  # unknown: as sent
    ],
)
def test_a_request_whose_coding_fails_is_read_as_far_as_it_decodes(coding, sent, code, body) -> None:
    h, store = hooks()
    flow = chat_flow()
    flow.request.headers["content-encoding"] = coding
    flow.request.raw_content = sent
    h.request(flow)
    (row,) = store.rows
    assert row["findings"][0]["code"] == code and row["request_body"] == body
    h, store = hooks(BLOCK_WORD)  # a server's decoder may read on: under `closed`, refused
    flow = chat_flow()
    flow.request.headers["content-encoding"] = coding
    flow.request.raw_content = sent
    h.request(flow)
    assert isinstance(h.flows[flow.id], AnsweredByProxy)


def test_text_behind_what_the_decoder_gives_up_on_is_not_let_through() -> None:
    """A benign gzip member, 65 empty ones (the decoder stops at 64: no encoder makes
    more) and the word: Python's and Go's gzip read on to the word. So does a second
    Content-Encoding header line, which Go's Header.Get does not read. Under `closed`
    both are refused; the record says why."""
    empty = b"".join(gzip_body(b"") for _ in range(65))
    cases = {
        "empty members": (
            {"content-encoding": "gzip"},
            gzip_body(b'{"model": "m", "messages": [')
            + empty
            + gzip_body(b'{"role": "user", "content": "Nightjar"}]}'),
        ),
        "header twice": ({}, gzip_body(chat_json("about Nightjar"))),
    }
    for name, (headers, sent) in cases.items():
        h, store = hooks(BLOCK_WORD)
        flow = chat_flow()
        flow.request.headers.update(headers)
        if name == "header twice":
            flow.request.headers.set_all("content-encoding", ["gzip", "br"])
        flow.request.raw_content = sent
        h.request(flow)
        assert isinstance(h.flows[flow.id], AnsweredByProxy), name
        h.response(flow)
        assert "request_decode_failed" in [f["code"] for f in store.rows[-1]["findings"]], name


# -- a large request is read off the event loop ---------------------------------------------------


def many_messages_flow(count: int, last: str) -> http.HTTPFlow:
    """A chat request of ``count`` tiny messages and then ``last``: costly to read for its size."""
    messages = [{"role": "user", "content": "ab"}] * count + [{"role": "user", "content": last}]
    body = orjson.dumps({"model": "m", "messages": messages, "stream": True})
    request = http.Request.make(
        "POST", "https://api.openai.com/v1/chat/completions", body, {"content-type": "application/json"}
    )
    return tflow.tflow(req=request)


def test_a_large_request_is_read_in_a_thread_while_the_event_loop_runs_on() -> None:
    """Its reading and the rules' check ran on the event loop and stalled every stream
    meanwhile; now the loop's other tasks run while it is read. The outcome is the same:
    blocked with the rule's verdict, or recorded whole."""

    async def run(text: str, rules) -> tuple[list, int, Store]:
        h, store = hooks(rules)
        flow = many_messages_flow(100_000, text)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        ticker = asyncio.get_running_loop().create_task(tick())
        await asyncio.sleep(0)
        pending = h.request(flow)
        assert pending is not None  # a coroutine mitmproxy awaits
        await pending
        ticker.cancel()
        return [type(h.flows[flow.id]).__name__], ticks, store

    state, ticks, store = asyncio.run(run("about Nightjar", BLOCK_WORD))
    assert state == ["AnsweredByProxy"] and ticks > 0 and store.rows == []
    state, ticks, store = asyncio.run(run("hello", None))
    assert state == ["Recording"] and ticks > 0
    (row,) = store.rows
    assert len(row["request_body"]["messages"]) == 100_001


def test_a_small_request_is_read_at_once_even_with_a_loop_running() -> None:
    async def run() -> object:
        h, store = hooks(BLOCK_WORD)
        flow = chat_flow("about Nightjar")
        pending = h.request(flow)
        assert isinstance(h.flows[flow.id], AnsweredByProxy)
        return pending

    assert asyncio.run(run()) is None


def test_a_small_compressed_body_is_read_at_once_unless_it_decodes_large() -> None:
    """Every compressed body went to the reader thread, so a 100-byte gzip request waited
    behind any large one; now only one that decodes past what is read on the loop does."""

    async def run(text: str) -> tuple[object, Store]:
        h, store = hooks()
        flow = gzip_chat_flow(gzip_body(chat_json(text)))
        pending = h.request(flow)
        if pending is not None:
            await pending
        return pending, store

    pending, store = asyncio.run(run("hello"))
    assert pending is None and store.rows[-1]["request_body"]["messages"][0]["content"] == "hello"
    pending, store = asyncio.run(run("x" * 100_000))  # 200 bytes of gzip, 100 KB of JSON
    assert pending is not None and store.rows[-1]["request_body"]["messages"][0]["content"] == "x" * 100_000


@pytest.mark.parametrize("coding", [None, "gzip"])
def test_a_sniffed_streams_request_is_read_on_the_loop_only_up_to_1_mib(coding) -> None:
    """A request only its answer's first event revealed is read in the tap, on the event
    loop: 30 MiB of it took some 200 ms there. At most 1 MiB of it is read now."""
    h, store = hooks()
    body = orjson.dumps({"note": "x" * (2 << 20)})
    request = http.Request.make("POST", "https://example.com/events", body, {"content-type": "application/json"})
    if coding:
        request.headers["content-encoding"] = coding
        request.raw_content = gzip_body(body)
    flow = tflow.tflow(req=request)
    h.request(flow)
    flow.response = response_headers(SSE)
    h.responseheaders(flow)
    flow.response.stream(chunk("Hi"))
    stream_through(h, flow, b"data: [DONE]\n\n")
    h.response(flow)
    row = store.rows[-1]
    assert row["output_text"] == "Hi" and row["request_body"] is None
    assert [f["code"] for f in row["findings"]] == ["request_too_large"]


def test_a_large_request_no_dialect_claims_by_its_line_never_waits_for_the_reader() -> None:
    """The reader thread reads requests one at a time: an upload through the proxy that
    no dialect recognises by its line and headers must not queue behind a costly one."""

    async def run() -> object:
        h, store = hooks(BLOCK_WORD)
        request = http.Request.make(
            "POST", "https://example.com/upload", b"x" * (1 << 20), {"content-type": "image/png"}
        )
        flow = tflow.tflow(req=request)
        pending = h.request(flow)
        assert flow.id not in h.flows and store.rows == []
        return pending

    assert asyncio.run(run()) is None


def test_a_key_in_an_unknown_content_encoding_is_kept_only_as_its_fingerprint() -> None:
    """The finding names the coding it could not decode: a header's value, which may
    hold a key (a client's or an upstream's); the record keeps its fingerprint."""
    key = "sk-proj-" + "A" * 74 + "T3BlbkFJ" + "B" * 74
    h, store = hooks()
    flow = chat_flow()
    flow.request.headers["content-encoding"] = key
    h.request(flow)
    (row,) = store.rows
    assert row["findings"][0]["code"] == "request_decode_failed" and key not in orjson.dumps(row).decode()
    flow.response = response_headers(SSE)
    flow.response.headers["content-encoding"] = key
    h.responseheaders(flow)
    stream_through(h, flow, chunk("Hi") + b"data: [DONE]\n\n")
    h.response(flow)
    assert "decode_failed" in [f["code"] for f in store.rows[-1]["findings"]]
    assert key not in orjson.dumps(store.rows[-1]).decode()


# -- a large JSON answer is read off the event loop -----------------------------------------------


def many_blocks(count: int, last: str) -> bytes:
    """An Anthropic message of ``count`` tiny text blocks and then ``last``: costly to read for its size."""
    content = [{"type": "text", "text": "ab "}] * count + [{"type": "text", "text": last}]
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": content}
    return orjson.dumps(message | {"stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": count}})


def answering(h: ExchangeHooks) -> http.HTTPFlow:
    """An Anthropic request through the hooks, its JSON answer's headers in: the body next."""
    flow = messages_flow()
    h.request(flow)
    flow.response = response_headers({"content-type": "application/json"})
    h.responseheaders(flow)
    return flow


def messages_flow() -> http.HTTPFlow:
    body = {"model": "claude", "max_tokens": 100_000, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    return tflow.tflow(
        req=http.Request.make("POST", "https://api.anthropic.com/v1/messages", orjson.dumps(body), headers)
    )


async def answered(h: ExchangeHooks, body: bytes, ticks: list[int]) -> http.HTTPFlow:
    """A non-streamed Anthropic exchange through the hooks, as mitmproxy runs them, while
    a ticker counts the event loop's turns; returns once the hook's wait is over."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.001)
            ticks[0] += 1

    ticker = asyncio.get_running_loop().create_task(tick())
    flow = answering(h)
    if isinstance(h.flows[flow.id], HeldWhole):
        flow.response.raw_content = body  # mitmproxy held it whole
    else:
        stream_through(h, flow, body)
    pending = h.response(flow)
    assert pending is not None  # mitmproxy awaits the hook: the loop runs meanwhile
    await pending
    ticker.cancel()
    assert not h.draining and flow.comment  # settled before later addons see the flow
    return flow


@pytest.mark.parametrize("rules", [None, BLOCK_WORD], ids=["passed", "held"])
def test_a_large_json_answer_is_read_in_a_thread_while_the_event_loop_runs_on(rules) -> None:
    """Its reading (and the rules' check) ran on the event loop and stalled every stream
    meanwhile; now the loop's other tasks run while it is read. The outcome is the same:
    recorded whole, or (held) blocked and replaced."""
    body = many_blocks(50_000, "about Nightjar")

    async def run() -> tuple[http.HTTPFlow, Store, int]:
        h, store = hooks(rules)
        ticks = [0]
        flow = await answered(h, body, ticks)
        return flow, store, ticks[0]

    flow, store, ticks = asyncio.run(run())
    row = store.rows[-1]
    assert ticks > 0 and row["output_text"] == "ab " * 50_000 + "about Nightjar"
    if rules is None:  # (and mitmproxy's views, saved flows, have the copy of what the client got)
        assert row["status"] == "completed" and flow.response.raw_content == body
    else:
        assert row["status"] == "blocked" and b"Nightjar" not in flow.response.content


def test_a_small_json_answer_is_read_at_once() -> None:
    async def run() -> tuple[object, Store]:
        h, store = hooks()
        flow = answering(h)
        stream_through(h, flow, many_blocks(1, "hello"))
        return h.response(flow), store

    pending, store = asyncio.run(run())
    assert pending is None and store.rows[-1]["status"] == "completed"


def test_an_answer_being_read_when_the_proxy_stops_is_read_and_written_once() -> None:
    """The proxy stops while the reader thread reads an answer, or before it got to it:
    the reader finishes what it reads first (the record is not written while the thread
    still changes it), what waited for it is read at once, and each record is written
    once, whole, as the exchange ended (the client had all of it)."""

    async def run() -> Store:
        h, store = hooks()
        for _ in range(2):  # (the second waits for the reader)
            flow = answering(h)
            stream_through(h, flow, many_blocks(50_000, "bye"))
            assert h.response(flow) is not None and h.draining  # read in the thread
        h.done()
        await asyncio.sleep(0.05)
        return store

    store = asyncio.run(run())
    finals = [row for row in store.rows if row["status"] != "in_progress"]
    assert len(finals) == 2
    for row in finals:
        assert row["status"] == "completed" and row["output_text"] == "ab " * 50_000 + "bye"


def test_a_large_answer_the_upstream_cut_is_read_in_a_thread_and_written_as_cut() -> None:
    """What came of a whole answer the upstream cut is still read (a dialect may take
    what it can of it), off the loop as a complete one is, and written as cut."""

    async def run() -> tuple[Store, bool]:
        h, store = hooks()
        flow = answering(h)
        body = many_blocks(50_000, "bye")
        flow.response.stream(body[:-10])  # the upstream hung up before its end
        flow.server_conn.state = ConnectionState.CLOSED
        flow.client_conn.state = ConnectionState.OPEN
        flow.error = Error("connection closed")
        h.error(flow)
        off_loop = bool(h.draining)
        while h.draining:
            await asyncio.sleep(0.01)
        return store, off_loop

    store, off_loop = asyncio.run(run())
    row = store.rows[-1]
    assert off_loop and row["status"] == "upstream_aborted"
    assert [f["code"] for f in row["findings"]] == ["response_invalid_json"]  # (as read on the loop)


def test_a_held_answer_whose_wait_mitmproxy_cancels_is_still_recorded() -> None:
    """mitmproxy awaits the check of a held answer; should it cancel that wait (the
    client went away), the reading goes on and the record is written all the same."""

    async def run() -> Store:
        h, store = hooks(BLOCK_WORD)
        flow = answering(h)
        assert isinstance(h.flows[flow.id], HeldWhole)
        flow.response.raw_content = many_blocks(50_000, "about Nightjar")
        pending = h.response(flow)
        assert pending is not None
        pending.cancel()
        while h.draining:
            await asyncio.sleep(0.01)
        return store

    store = asyncio.run(run())
    assert store.rows[-1]["status"] == "blocked"
