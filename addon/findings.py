"""Stable finding codes, in one place.

Findings are stored with each exchange (``findings`` column: a JSON list of
``{code, detail}``) and are meant to be queried, so a code never changes meaning once
released. docs/findings.md lists them, generated from this table (docs/_generate.py);
a test fails when that page is stale.
"""

CODES: dict[str, str] = {
    # SSE layer (addon.framing.sse)
    "sse_line_too_long": "A single SSE line exceeded the size limit; it was skipped (bytes still passed through).",
    "sse_event_too_long": "A single SSE event exceeded the size limit; it was skipped (bytes still passed through).",
    "sse_invalid_utf8": "The stream contained bytes that are not valid UTF-8; they were read as U+FFFD.",
    "sse_incomplete_event": "The body ended in the middle of an SSE event; the partial event was discarded.",
    # NDJSON layer (addon.framing.ndjson)
    "ndjson_line_too_long": "A single NDJSON line exceeded the size limit; it was skipped (bytes still passed through).",
    "ndjson_unterminated_line": "The NDJSON body's last line has no line feed (its servers end every line); "
    "it was read as a line.",
    # AWS event stream (addon.framing.eventstream)
    "eventstream_crc_mismatch": "An AWS event-stream message's prelude or message CRC-32 is wrong (bytes still passed); "
    "after a bad prelude the rest of the body cannot be framed and is not read.",
    "eventstream_invalid": "An AWS event-stream message has impossible lengths (the rest of the body is not read) or "
    "malformed headers (the message is read with the headers before the fault).",
    "eventstream_message_too_long": "An AWS event-stream message exceeded llm_audit_max_event_bytes; it was skipped "
    "(bytes still passed through).",
    "eventstream_incomplete": "The body ended in the middle of an AWS event-stream message; the partial message was "
    "discarded.",
    # WebSocket messages (addon.framing.ws_json, addon.mitm.websocket)
    "ws_message_too_large": "A WebSocket message exceeded llm_audit_max_event_bytes; it was not read (it still "
    "passed through).",
    "output_withheld": "A content filter blocked server output outside any answer of a WebSocket connection (a title "
    "or follow-up suggestions after it): that message was not delivered; the detail names the rule.",
    "websocket_closed": "How a WebSocket connection ended: the close code, who closed it, after how many turns; on a "
    "turn record, the connection ended during that answer.",
    "realtime_error": "An OpenAI Realtime error event about a client event or outside a response (recoverable: "
    "the session stays open); the detail gives its type, code and message.",
    "ws_usage_after_turn": "Token usage arrived after its turn had ended (Gemini Live usageMetadata after "
    "turnComplete): not added to the next turn; the detail gives the counts.",
    "ws_go_away": "The server announced it will close the WebSocket connection soon (Gemini Live goAway); the "
    "detail gives the time left.",
    "copilot_challenge": "Consumer Copilot asked the client to pass a bot check (challenge event); the detail "
    "gives its method.",
    # SignalR hub protocol (addon.framing.signalr, addon.dialects.signalr, addon.dialects.copilot_chathub)
    "signalr_invalid": "A SignalR record is malformed (not JSON or MessagePack, not an object or array, an unknown "
    "type, an impossible length prefix: then the rest of that direction is not read); it still passed through.",
    "signalr_record_too_large": "A SignalR record exceeded llm_audit_max_event_bytes; it was skipped (it still "
    "passed through).",
    "signalr_unmapped": "A turn of a SignalR hub the project does not know carried items, results or invocations "
    "it cannot map to answer text; their strings were checked as shown text, and the detail names their targets.",
    "signalr_missing_completion": "A SignalR connection ended while an invocation had no Completion.",
    "copilot_throttled": "Copilot reported that the conversation reached its user-message limit.",
    # transport
    "decode_failed": "The Content-Encoding could not be decoded for inspection; the bytes passed through unchanged.",
    "audit_internal_error": "The auditor itself failed on this exchange; traffic was not affected.",
    "proxy_shutdown": "The proxy shut down while the exchange was still open.",
    "turn_idle_timeout": "A turn of a long-lived stream (Cursor's chat) was recorded as ended because nothing "
    "arrived for llm_audit_turn_idle_seconds; its end marker never came (its field may have moved).",
    "stored_reduced": "A value the database cannot hold as it is was reduced before the record was sealed "
    "(cut to a size, stored as JSON text, characters replaced, ...); the detail names the column, what was done "
    "and, for cut values, the full length and the SHA-256 of the whole.",
    "termination_not_sent": "A content filter cut a compressed stream: the dialect's closing events could not be "
    "appended (the upstream ignored Accept-Encoding: identity); the stream just ends.",
    # request side
    "request_invalid_json": "The request body is not JSON even to a lenient reader; it was forwarded unchanged "
    "(stored as text) or, with request filters, handled by llm_filter_failure.",
    "request_too_large": "The request body's Content-Encoding decodes to more than 256 MiB, or at a compression "
    "bomb's ratio (or a sniffed stream's request is over 1 MiB): it was not read or stored (the detail gives the "
    "reason, the sizes and the SHA-256 of the bytes sent); or its JSON (a body over 1 MiB) would make more than "
    "512 MiB of Python objects, as estimated from its size, brackets, commas and colons, so it was not read but stored as "
    "text. Forwarded unchanged or, with request filters, handled by llm_filter_failure.",
    "request_decode_failed": "The request body's Content-Encoding could not be decoded (unknown, bad data, more "
    "empty members than an encoder makes, or the header sent twice): what decoded was read, and with request "
    "filters llm_filter_failure decides, since the server's decoder may read on.",
    "request_path_obscured": "No dialect knows the request's path as sent, but one knows it as servers that "
    "decode it route it (percent-decoded, as uvicorn and so vLLM and FastAPI servers, or Go's net/http, do; "
    "repeated slashes merged and dot segments resolved, as nginx does; path parameters after ';' dropped, as Java "
    "servers do; backslashes read as slashes, as WHATWG URL parsers (Node, Deno, Workers) do; or any of that in "
    "lower case, as ASP.NET Core and IIS route): it was read as that; the detail gives "
    "both.",
    "request_lenient_json": "The request body (or a streamed request's message: Connect JSON, a Copilot client "
    "message) is JSON only as Python "
    "servers read it (NaN, Infinity, 1e400, a lone surrogate escape, a byte order mark); it was read that way.",
    "request_missing_field": "The request envelope lacks a REQUIRED field (llm-stream draft section 4.2).",
    "request_invalid_field": "A request envelope field has the wrong type or value.",
    "request_token_prompt": "A legacy Completions prompt is token ids, which the request filters cannot read.",
    "strings_unread": "A payload a dialect reads without a schema (a SignalR hub's invocation arguments, items or "
    "results; a Connect or gRPC message of a service nobody mapped; an OpenAI Chat content part of an unknown "
    "type; a Bedrock model payload no reader knows) held strings past what it reads: nested deeper than 32 levels "
    "(a content part: 6), or past the first 4096 strings (Connect, gRPC; also a JSON message that is no JSON to "
    "any reader; a SignalR hub's client message: 100,000), or past the first 100,000 JSON values (objects, "
    "arrays, numbers: a SignalR hub's message, a Connect JSON message), or past 64 KiB of text (Bedrock). No filter "
    "checked them; the detail says which bound cut them. With blocking filters llm_filter_failure decided, in a "
    "client's message (a WebSocket message, a streamed request's) and in an answer alike (closed: blocked, open: "
    "let through with this finding).",
    # llm-stream event envelope (draft section 5)
    "invalid_json": "An event's data is not exactly one JSON object (draft section 5.1).",
    "text_interleaved": "Text of one kind came for two content blocks (or output items) open at once, or for more "
    "OpenAI Realtime responses in progress at once than are told apart (8); a client puts each together on its "
    "own, the filters read the text in arrival order, so with blocking filters llm_filter_failure decided "
    "(closed: blocked).",
    "lenient_json": "An event's data (or a Bedrock chunk, a Connect message or EndStreamResponse, a SignalR record "
    "or handshake, a Copilot message) is JSON only as lenient readers take it (NaN, Infinity, 1e400, a lone surrogate escape), as the "
    "clients' SDKs do; it was read that way, and its text checked by the filters.",
    "first_event_not_stream_start": "The first event is not stream.start (draft section 5.3.1).",
    "stream_start_seq_not_zero": "stream.start does not carry seq 0 (draft section 5.2.1).",
    "seq_invalid": "An event's seq is missing or not a non-negative integer.",
    "seq_gap": "seq skipped one or more numbers: events were lost (draft section 5.2.1).",
    "seq_repeat": "seq repeated an earlier number.",
    "seq_decrease": "seq went backwards.",
    "seq_exhausted": "seq reached 2^53 or beyond; the draft says such a stream SHOULD be terminated (section 8.4).",
    "type_mismatch": "The JSON type field differs from the SSE event field (draft section 5.2).",
    "version_mismatch": 'The envelope\'s v is not "1.0".',
    "unknown_event_type": "An event type the draft does not define.",
    "missing_field": "An event lacks a REQUIRED field.",
    "event_after_stream_end": "Events arrived after stream.end (draft section 5.3.7).",
    "missing_stream_end": "The stream ended without its terminal event (llm-stream stream.end, [DONE], message_stop, ...).",
    "missing_content_stop": "A content block was never terminated by content.stop (draft section 5.4).",
    "undeclared_tool": "A tool call names a tool the request did not declare (llm-stream draft section 8.2).",
    # response side, any dialect
    "response_invalid_json": "A response body that should be JSON is not one JSON object.",
    "json_too_costly": "A whole response body (a JSON answer or an error body), a streamed event or a Connect JSON "
    "message over 1 MiB whose parse would make more than 512 MiB of Python objects, as estimated from its size, "
    "brackets, commas and colons (32 MiB of empty objects made 1.15 GB): it was not read. It passed unchanged; with "
    "blocking filters llm_filter_failure decided (closed: refused, or the stream ended).",
    "response_invalid_utf8": "A JSON response body holds bytes that are not UTF-8; it was read with U+FFFD in their place.",
    "response_refused": "mitmproxy refused the upstream's response (e.g. Content-Length with chunked, or over "
    "body_size_limit); the client got mitmproxy's error.",
    "body_too_large": "A non-stream response body exceeded llm_audit_max_record_bytes decoded; it passed unread "
    "(held for blocking filters, llm_filter_failure decided: closed refused it).",
    "content_truncated": "The exchange carried more content than llm_audit_max_record_bytes: the record keeps what "
    "fits; the detail gives the kept and true sizes and the SHA-256 of the raw upstream body.",
    "inspection_stopped": "Decoding the body would exceed the exchange's decode budget (a compression bomb): "
    "inspection stopped there, the bytes passed unchanged; the detail gives the reason, sizes and SHA-256.",
    "usage_invalid": "A token count the upstream reported is negative or beyond 2^53 (no exchange uses that many): "
    "that count is not recorded (NULL); the detail names it and its value.",
    "record_limit": "The answer named more than one record keeps of what it counts rather than sizes: choices "
    "past the first 128 (OpenAI's n is at most 128), tool calls past the first 4096, stop reasons over 64 "
    "characters (cut). Those events were left out of the record (their bytes still passed); the detail says "
    "which and how many. Or more than a dialect remembers of what it names: content blocks open at once, output "
    "items, parts or calls (4096), blocks with text open at once (64): past them nothing new is remembered, their "
    "text still recorded and checked; once per exchange, the detail says which.",
    "tool_call_truncated": "A tool call was cut off (token limit or stream end); its arguments are kept as received.",
    "event_id_invalid": "An SSE event id is not the integer the protocol requires (LMSP: integers from 1).",
    "event_id_not_increasing": "SSE event ids did not strictly increase.",
    "message_start_content": "An Anthropic message_start carried content blocks (Anthropic sends none): the SDKs' "
    "final message starts from them, so they were recorded and checked by the output filters.",
    "final_text_mismatch": "A stream's final text (Responses *.done, response.completed) differs from its deltas; "
    "the deltas are recorded, the final text was checked by the output filters.",
    "bedrock_unknown_payload": "A Bedrock InvokeModel answer (or stream chunk) of a model whose native JSON the "
    "dialect does not know: no text was read from it (the body is kept).",
    "unknown_content_part": "A content part of a type the dialect does not know; its strings were read as answer text.",
    # Connect / gRPC envelopes (addon.framing.envelope) and protobuf payloads
    "envelope_too_large": "A Connect/gRPC message (its envelope, or what a compressed one decompresses to) exceeded "
    "llm_audit_max_event_bytes; it was skipped (bytes still passed through).",
    "envelope_decompress_failed": "A compressed Connect/gRPC message could not be decompressed (no or an unknown "
    "message encoding, corrupt data); it was skipped (bytes still passed through).",
    "envelope_reserved_flags": "A Connect/gRPC envelope set flag bits its protocol reserves; it was read as a message.",
    "envelope_incomplete": "The body ended inside a Connect/gRPC envelope; the partial message was discarded.",
    "end_stream_invalid": "A Connect EndStreamResponse or a gRPC status (trailers) is not what the protocol defines; "
    "the detail says how.",
    "protobuf_invalid": "A protobuf message is not valid wire format (truncated, a bad tag); what could be read was "
    "read.",
    "protobuf_budget": "A protobuf message held more fields than the proxy parses in reading one (50,000, its nested "
    "messages included): the record keeps what was read before; the filters still read all its text (its bytes "
    "as text, request and answer).",
    "protobuf_unmapped": "A protobuf message holds fields the dialect does not map (the schema moved, or a message "
    "kind it does not know); the detail gives the fields and the strings found in them.",
    "server_prompt": "The response disclosed the prompt the server built for the model (Cursor's filled_prompt); "
    "the detail gives its size, SHA-256 and its text (cut at 8 KiB).",
}

#: Findings of a dialect's reading that mean it could not read a request message whole
#: (``strings_unread``: strings past what a reader of unknown payloads reads): the
#: request filters could not check it, so the failure policy decides.
UNREAD_MESSAGE = frozenset(
    {"protobuf_invalid", "request_decode_failed", "request_invalid_json", "request_too_large", "strings_unread"}
)
