"""Reading Responses-style traffic: the part the OpenAI Responses API and LMSP 1.0 share.

Both protocols answer with a *response* made of output items (``message``,
``reasoning``, ``function_call``) and stream it as named events (``response.created``,
``response.output_item.added``, ``response.output_text.delta``, ...,
``response.completed``). This module reads them; it registers no dialect.
:mod:`addon.dialects.openai_responses` and :mod:`addon.dialects.lmsp` configure and
extend :class:`ResponsesNormalizer`.

What the stream carries, and how it maps to the common events:

- Lifecycle events describe the response: OpenAI nests it (``{"response": {"id",
  "model", "status", "usage", "error", "incomplete_details", "output"}}``), LMSP puts
  ``response_id``, ``status``, ``usage``, ``error`` at the top level of the data. Both
  shapes are read the same way: the nested ``response`` object when there is one, else
  the data itself.
- Text arrives as deltas keyed by output item (``item_id``) and part: answer text by
  ``content_index`` (``response.output_text.delta``), refusals likewise
  (``response.refusal.delta``), reasoning by ``summary_index``
  (``response.reasoning_summary_text.delta``) or ``content_index``
  (``response.reasoning_text.delta``). A response has one answer, so everything is
  choice 0.
- Function-call arguments stream keyed by ``item_id`` (the ``fc_...`` item id), but the
  call's ``call_id`` (``call_...``, what the tool result must reference) and ``name``
  only appear in ``response.output_item.added`` / ``.done``. The record keys calls by
  item id and stores ``call_id`` as the call's id. Custom tool calls
  (``custom_tool_call``: free-form ``input`` instead of ``arguments``) are read the
  same way.
- ``*.done`` events, ``response.output_item.done`` and the output of the final
  response repeat the whole text or arguments. They are never appended again: they are
  compared with what the deltas gave and only fill in what is missing (all of it when
  no delta came, the tail when the deltas stopped short). When they disagree with the
  deltas, the deltas are kept (they are what a streaming client showed), the finding
  ``final_text_mismatch`` says so, and the final text goes to the output filters as
  :class:`~addon.events.ShownText` (what a client reading the final event shows:
  ``response.output_text``, ``get_final_response()``), so it is checked before the event
  carrying it is released.
- Final events (``response.completed``, ``.incomplete``, ``.failed``; dialects add
  more) give usage, the stop reason (the response ``status``, or
  ``incomplete_details.reason`` such as ``max_output_tokens``), errors, and end the
  stream. A function call the final response marks ``incomplete`` (cut by the token
  limit) is left incomplete, so the record reports it as truncated.
- ``error`` events come in several shapes (OpenAI documents top-level ``code`` /
  ``message`` but sends a nested ``error`` object; LMSP nests an RFC 9457 problem
  object); :func:`error_event` reads them all.

Everything here runs per event on the proxy's event loop: no copies of the parsed
JSON, dictionary dispatch, and odd input (wrong types, missing fields) is skipped,
never raised on.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, ClassVar

from addon.dialects import JsonEventNormalizer, LimitNotice, OpenBlocks, int_field, str_field
from addon.events import (
    Event,
    Finding,
    Finish,
    ResponseMeta,
    ShownText,
    StreamEnd,
    StreamError,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from addon.filters.json_text import JsonEscapes
from addon.framing import Frame
from addon.record import MAX_TOOL_CALLS

# Statuses after which a response no longer changes (a stop reason).
FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
# Item statuses that say a call was cut before its arguments were whole.
UNFINISHED_ITEM_STATUSES = frozenset({"incomplete", "in_progress", "queued"})
# Output item types that are calls the client executes, and where their payload is.
CALL_PAYLOAD = {"function_call": "arguments", "custom_tool_call": "input"}
# Output item type -> the fields that carry its text, which output_so_far rebuilds from the deltas.
TEXT_PAYLOAD = {
    "message": ("content",),
    "reasoning": ("summary", "content"),
    **{kind: (field,) for kind, field in CALL_PAYLOAD.items()},
}
# Content part type -> (field holding the text, common TextDelta kind).
PART_TEXT = {
    "output_text": ("text", "text"),
    "refusal": ("refusal", "refusal"),
    "reasoning_text": ("text", "reasoning"),
    "summary_text": ("text", "reasoning"),
}
# Content part type -> (where its deltas are kept, the event field indexing it).
PART_SPACE = {
    "summary_text": ("summary", "summary_index"),
    "reasoning_text": ("reasoning", "content_index"),
}
NO_ERROR_OBJECT = "the response failed without an error object"
# What each of a response's tables (parts, calls, items) remembers: a response has a few
# dozen; the record keeps no more tool calls. Past it, an upstream naming a new one per event.
MAX_KEYS = MAX_TOOL_CALLS
TEXT_DELTA = "response.output_text.delta"


def usage_event(usage: Any) -> Usage | None:
    """A Responses ``usage`` object as :class:`Usage`; ``None`` when there is none.

    ``input_tokens_details.cached_tokens`` is read from the cache,
    ``input_tokens_details.cache_write_tokens`` written to it, and
    ``output_tokens_details.reasoning_tokens`` spent on reasoning (part of
    ``output_tokens``).
    """
    if not isinstance(usage, dict):
        return None
    inp = usage.get("input_tokens_details")
    out = usage.get("output_tokens_details")
    inp = inp if isinstance(inp, dict) else {}
    out = out if isinstance(out, dict) else {}
    return Usage(
        input_tokens=int_field(usage, "input_tokens"),
        output_tokens=int_field(usage, "output_tokens"),
        cache_read_input_tokens=int_field(inp, "cached_tokens"),
        cache_write_input_tokens=int_field(inp, "cache_write_tokens"),
        reasoning_output_tokens=int_field(out, "reasoning_tokens"),
    )


def problem_error(err: dict[str, Any]) -> StreamError:
    """An error object as :class:`StreamError`: OpenAI ``{type, code, message}`` or an
    RFC 9457 problem object ``{type, title, status, detail, code}``.

    The code is ``code``, else the ``type``; a problem ``type`` URI gives its last path
    segment (``.../errors/event_history_expired`` -> ``event_history_expired``) and
    ``about:blank`` gives none. The message is ``message``, else ``detail``, else
    ``title``.
    """
    code = str_field(err, "code") or _code_from_type(str_field(err, "type"))
    message = str_field(err, "message") or str_field(err, "detail") or str_field(err, "title")
    return StreamError(code, message)


def _code_from_type(kind: str | None) -> str | None:
    if not kind or kind == "about:blank":
        return None
    if "/" in kind:
        return kind.rstrip("/").rpartition("/")[2] or None
    return kind


def error_event(obj: dict[str, Any]) -> StreamError:
    """The data of an ``error`` event: a nested ``error`` object, or ``code`` /
    ``message`` at the top level (where ``type`` is the event's own, ``"error"``)."""
    err = obj.get("error")
    if isinstance(err, dict):
        return problem_error(err)
    if isinstance(err, str):
        return StreamError(str_field(obj, "code"), err)
    return StreamError(str_field(obj, "code"), str_field(obj, "message"))


class ResponsesNormalizer(JsonEventNormalizer):
    """Responses-style events and response objects into common events.

    Dialects configure it with :attr:`FINAL_EVENTS` and may override
    :meth:`event_type`. :attr:`continuation` is set by a dialect that knows the stream
    does not start at the response's beginning (a resumed stream): an output item
    that was not announced (``response.output_item.added``) in this stream is then
    taken to have been recorded with an earlier exchange, and its ``*.done`` repeats
    fill nothing in.
    """

    FINAL_EVENTS: ClassVar[frozenset[str]] = frozenset({"response.completed", "response.incomplete", "response.failed"})
    ignores_done = True  # not part of the protocol; some gateways append it

    def __init__(self, declared_tools: frozenset[str] | None = None) -> None:
        super().__init__()
        self.declared_tools = declared_tools  # None: unknown, nothing is checked
        self.continuation = False
        self.errored = False  # an error event or a failed response was seen
        # Text streamed so far per (item id, part space, part index); after its done
        # event a part holds the one final string.
        self.parts: dict[tuple[str, str, int], list[str]] = {}
        self.arguments: dict[str, list[str]] = {}  # argument fragments per call item id
        self.opened: set[str] = set()  # items announced in this stream
        self.item_at: dict[int, str] = {}  # output_index -> item id
        self.undeclared: set[str] = set()  # calls already reported as undeclared
        self.disagreeing: set[tuple[tuple[str, str, int], int]] = set()  # (part, hash of a final text) seen
        # What the client received, kept only when keeps_delivered (see output_so_far):
        self.items: dict[int, dict[str, Any]] = {}  # output_index -> item as added or done, text left out
        self.items_done: set[int] = set()
        self.item_places: dict[str, int] = {}  # item id -> its output_index
        self.part_types: dict[tuple[str, int], str] = {}  # (item id, content_index) -> part type
        self.blocks = OpenBlocks()  # the parts that got text, by item, for interleaving
        self.free_form: set[str] = set()  # custom tool calls: their input is free text, not JSON
        self.fast_part: Any = None  # the open part whose text deltas text_of may read alone
        self.keys_limit = LimitNotice(
            f"output items, parts or calls past the first {MAX_KEYS} of a table not kept: "
            "their final texts are read as they come, not compared"
        )

    # -- dispatch -------------------------------------------------------------------------

    def event_type(self, event: Frame, obj: dict[str, Any]) -> str:
        """The event's type: the JSON ``type`` (OpenAI), else the SSE event name."""
        kind = obj.get("type")
        return kind if isinstance(kind, str) else event.event

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        kind = self.event_type(event, obj)
        out: list[Event] = []
        if kind in self.FINAL_EVENTS:
            if kind == "error":
                self._error(obj, out)
                out.append(StreamEnd())
            else:
                self._final(kind, obj, out)
            return out
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, obj, out)
        return out  # unknown event types are ignored: vendors add new ones all the time

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """``response.output_text.delta``, nearly every event of a stream: the delta is
        kept with its part (as :meth:`_text_delta` keeps it) and returned alone."""
        if self.event_type(event, obj) != TEXT_DELTA or TEXT_DELTA in self.FINAL_EVENTS:
            return None
        delta = obj.get("delta")
        if type(delta) is not str or not delta:
            return None
        key = (self._item_id(obj), "content", int_field(obj, "content_index") or 0)
        got = self.parts.get(key)
        if got is None and len(self.parts) >= MAX_KEYS:
            return None  # (past the parts remembered: on_json reads it, with the finding)
        if key != self.fast_part and (self.blocks.full or self._enter(key, "text", "content")):
            return None  # (interleaved, or past the blocks remembered: on_json reads it, with the finding)
        if got is None:
            self.parts[key] = [delta]
        else:
            got.append(delta)
        return delta

    def on_end(self, cut: bool = False) -> list[Event]:
        if not self.ended and self.errored:
            return []  # the error says why the stream stopped
        return super().on_end(cut)

    def on_response(self, response: dict[str, Any]) -> list[Event]:
        """A whole response object (non-streamed answer, or a retrieved response)."""
        out: list[Event] = [self._meta(response)]
        status = str_field(response, "status")
        self._output(response.get("output"), status, out)
        usage = usage_event(response.get("usage"))
        if usage is not None:
            out.append(usage)
        if status in FINAL_STATUSES:
            out.append(Finish(_stop_reason(response, status)))
        err = response.get("error")
        if isinstance(err, dict):
            out.append(problem_error(err))
        elif status == "failed":
            out.append(StreamError(None, NO_ERROR_OBJECT))
        return out

    # -- lifecycle ------------------------------------------------------------------------

    @staticmethod
    def _response(obj: dict[str, Any]) -> dict[str, Any]:
        """The response a lifecycle event describes: nested (OpenAI) or the data (LMSP)."""
        resp = obj.get("response")
        return resp if isinstance(resp, dict) else obj

    @staticmethod
    def _meta(resp: dict[str, Any]) -> ResponseMeta:
        return ResponseMeta(
            model=str_field(resp, "model"),
            response_id=str_field(resp, "id") or str_field(resp, "response_id"),
            created=int_field(resp, "created_at"),
        )

    def _lifecycle(self, obj: dict[str, Any], out: list[Event]) -> None:
        resp = self._response(obj)
        out.append(self._meta(resp))
        output = resp.get("output")
        if isinstance(output, list) and output:
            # Empty in OpenAI's and LMSP's streams, but the SDKs' response snapshot is this
            # object: whatever it holds is read (and checked) as a final response's is.
            self._output(output, str_field(resp, "status"), out)

    def _final(self, kind: str, obj: dict[str, Any], out: list[Event]) -> None:
        resp = self._response(obj)
        out.append(self._meta(resp))
        status = str_field(resp, "status") or kind.rpartition(".")[2]
        self._output(resp.get("output"), status, out)
        usage = usage_event(resp.get("usage"))
        if usage is not None:
            out.append(usage)
        out.append(Finish(_stop_reason(resp, status)))
        err = resp.get("error")
        if isinstance(err, dict):
            out.append(problem_error(err))
            self.errored = True
        elif status == "failed" and not self.errored:
            out.append(StreamError(None, NO_ERROR_OBJECT))
            self.errored = True
        out.append(StreamEnd())

    def _error(self, obj: dict[str, Any], out: list[Event]) -> None:
        out.append(error_event(obj))
        self.errored = True

    # -- output items ---------------------------------------------------------------------

    def _item_id(self, obj: dict[str, Any]) -> str:
        """The item an event is about: ``item_id``, else the item at ``output_index``."""
        item_id = obj.get("item_id")
        if isinstance(item_id, str):
            return item_id
        index = int_field(obj, "output_index") or 0
        return self.item_at.get(index) or f"#{index}"

    def _item_added(self, obj: dict[str, Any], out: list[Event]) -> None:
        item = obj.get("item")
        if not isinstance(item, dict):
            return
        index = int_field(obj, "output_index")
        if self.keeps_delivered:
            self._keep_item(index, item, done=False)
        item_id = str_field(item, "id")
        if item_id is None:
            item_id = self.item_at.get(index or 0) or f"#{index or 0}"
        elif index is not None and self._room(self.item_at, index, out):
            self.item_at[index] = item_id
        if self._room(self.opened, item_id, out):
            self.opened.add(item_id)
        kind = str_field(item, "type") or ""
        payload = CALL_PAYLOAD.get(kind)
        if kind == "custom_tool_call":
            self._free_form(item_id, out)
        if payload is not None:
            # Announce the call so that it keeps its place; arguments follow as deltas
            # (an added item whose arguments are already there counts as a first delta).
            args = item.get(payload)
            args = args if isinstance(args, str) else ""
            if args and self._room(self.arguments, item_id, out):
                self.arguments.setdefault(item_id, []).append(args)
            self._call(item_id, args, str_field(item, "call_id"), str_field(item, "name"), False, out)

    def _item_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        item = obj.get("item")
        item_id = item.get("id") if isinstance(item, dict) else None
        item_id = item_id if isinstance(item_id, str) else self._item_id(obj)
        self.blocks.end_group(item_id)  # (its parts are whole, whether or not their done events came)
        if self.fast_part is not None and self.fast_part[0] == item_id:
            self.fast_part = None
        if isinstance(item, dict):
            if self.keeps_delivered:
                self._keep_item(int_field(obj, "output_index"), item, done=True)
            self._settle_item(item, int_field(obj, "output_index"), None, out)

    def _part_ended(self, key: tuple[str, str, int]) -> None:
        """A part's done event: its text is whole (:class:`~addon.dialects.OpenBlocks`)."""
        self.blocks.end(key)
        if key == self.fast_part:
            self.fast_part = None

    def _part_added(self, obj: dict[str, Any], out: list[Event]) -> None:
        """``response.content_part.added``: which kind of part (text or refusal) an open
        message item has at each index, for :meth:`output_so_far`."""
        part = obj.get("part")
        if self.keeps_delivered and isinstance(part, dict) and isinstance(part.get("type"), str):
            key = (self._item_id(obj), int_field(obj, "content_index") or 0)
            if self._room(self.part_types, key, out):
                self.part_types[key] = part["type"]

    # -- what the client received (the output gate's normalizer) --------------------------

    def _keep_item(self, index: int | None, item: dict[str, Any], done: bool) -> None:
        """Keep an item's place and fields, not its text: the deltas in :attr:`parts` and
        :attr:`arguments` hold that once (settled to the done event's where it adds to them)."""
        item_id = item.get("id")
        if index is None:  # no output_index: the item of the same id, else the next place
            index = self.item_places.get(item_id, len(self.items)) if isinstance(item_id, str) else len(self.items)
        if not self._room(self.items, index) or isinstance(item_id, str) and not self._room(self.item_places, item_id):
            return  # (the client's copy of a response past MAX_KEYS items: not rebuilt)
        if isinstance(item_id, str):
            self.item_places[item_id] = index
        payload = TEXT_PAYLOAD.get(str_field(item, "type") or "")
        self.items[index] = {k: v for k, v in item.items() if k not in payload} if payload else item
        if done:
            self.items_done.add(index)

    def output_so_far(self) -> list[dict[str, Any]]:
        """The response's ``output`` as the client received it, for a final response
        object the proxy sends: each item with the text its deltas and done events gave,
        an item not done marked ``incomplete`` (a call's cut arguments stay cut: the
        status says the call is not whole). Needs :attr:`keeps_delivered`. One pass over
        the parts, however many items and parts the stream had."""
        texts: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for (owner, where, i), got in self.parts.items():
            texts.setdefault((owner, where), []).append((i, "".join(got)))
        return [self._rebuilt(i, self.items[i], texts) for i in sorted(self.items)]

    def _rebuilt(
        self, index: int, item: dict[str, Any], texts: dict[tuple[str, str], list[tuple[int, str]]]
    ) -> dict[str, Any]:
        item_id = str_field(item, "id") or self.item_at.get(index) or f"#{index}"
        rebuilt = item if index in self.items_done else dict(item, status="incomplete")
        kind = str_field(item, "type")  # (a hostile upstream may send any JSON here)
        if kind not in TEXT_PAYLOAD:
            return rebuilt  # an item of another type is kept whole
        rebuilt = dict(rebuilt)
        if kind in CALL_PAYLOAD:
            rebuilt[CALL_PAYLOAD[kind]] = "".join(self.arguments.get(item_id, ()))
        elif kind == "message":
            rebuilt["content"] = [
                _part(self.part_types.get((item_id, i), "output_text"), text)
                for i, text in sorted(texts.get((item_id, "content"), ()))
            ]
        else:
            rebuilt["summary"] = [
                {"type": "summary_text", "text": text} for _, text in sorted(texts.get((item_id, "summary"), ()))
            ]
            reasoning = sorted(texts.get((item_id, "reasoning"), ()))
            if reasoning:
                rebuilt["content"] = [{"type": "reasoning_text", "text": text} for _, text in reasoning]
        return rebuilt

    def _output(self, output: Any, status: str | None, out: list[Event]) -> None:
        """Settle every item of a whole response's ``output``.

        In a continuation, items not announced in this stream are skipped: the whole
        response repeats items an earlier exchange already recorded.
        """
        if isinstance(output, list):
            for index, item in enumerate(output):
                if isinstance(item, dict):
                    if self.continuation:
                        item_id = str_field(item, "id") or self.item_at.get(index)
                        if item_id not in self.opened:
                            continue
                    self._settle_item(item, index, status, out)

    def _settle_item(self, item: dict[str, Any], index: int | None, status: str | None, out: list[Event]) -> None:
        """A whole output item: fill in what the deltas did not give, complete calls."""
        item_id = str_field(item, "id") or self.item_at.get(index or 0) or f"#{index or 0}"
        kind = str_field(item, "type")  # (a hostile upstream may send any JSON here)
        if kind == "message":
            self._settle_parts(item_id, "content", item.get("content"), out)
        elif kind == "reasoning":
            self._settle_parts(item_id, "summary", item.get("summary"), out)
            self._settle_parts(item_id, "reasoning", item.get("content"), out)
        elif kind in CALL_PAYLOAD:
            item_status = item.get("status")
            whole = item_status not in UNFINISHED_ITEM_STATUSES and not (item_status is None and status == "incomplete")
            args = item.get(CALL_PAYLOAD[kind])
            self._settle_call(item_id, args, item, whole, out)

    def _settle_parts(self, item_id: str, space: str, parts: Any, out: list[Event]) -> None:
        if not isinstance(parts, list):
            return
        for index, part in enumerate(parts):
            if isinstance(part, dict):
                field_kind = PART_TEXT.get(str_field(part, "type") or "")
                if field_kind is not None:
                    text = part.get(field_kind[0])
                    if isinstance(text, str):
                        self._settle_text((item_id, space, index), text, field_kind[1], out)

    def _settle_text(self, key: tuple[str, str, int], full: str, kind: str, out: list[Event]) -> None:
        """Compare a repeated whole text with the deltas; emit only what is missing.

        A part not remembered (past :data:`MAX_KEYS` parts: :meth:`_room`) may have had its
        deltas already, as TextDelta: its whole text is then :class:`~addon.events.ShownText`,
        checked by the filters on its own and not added to the record's text (as a
        TextDelta it would double the record's text, and the filters would read the text
        joined to itself)."""
        got = self.parts.get(key)
        if got is None:
            kept = self._room(self.parts, key, out)
            if kept:
                self.parts[key] = [full]
            if full and (not self.continuation or key[0] in self.opened):
                out.append(TextDelta(full, 0, kind) if kept else ShownText(full, 0, "final_text"))
            return
        have = got[0] if len(got) == 1 else "".join(got)
        if have != full and full.startswith(have):
            out.append(TextDelta(full[len(have) :], 0, kind))
            have = full
        elif have != full:
            # a part this stream did not open, whose final text ends with its deltas, is the
            # tail of a resumed stream: no disagreement, but the whole text is still checked
            resumed = key[0] not in self.opened and full.endswith(have)
            self._disagreement(key, full, kind, out, finding=not resumed)
        self.parts[key] = [have]  # kept as one string: later repeats compare cheaply

    def _disagreement(
        self, key: tuple[str, str, int], full: str, kind: str, out: list[Event], finding: bool, shown: str | None = None
    ) -> None:
        """A final text that is not what the deltas said: each different one is checked (as
        ``shown``, when the client reads it otherwise: a call's arguments, JSON escapes
        decoded), the first one of a part is a finding."""
        seen = (key, hash(full))
        if seen in self.disagreeing:
            return
        if finding and not any(k == key for k, _ in self.disagreeing):
            out.append(Finding("final_text_mismatch", f"{kind} of {key[0]}: the final text differs from the deltas"))
        if self._room(self.disagreeing, seen, out):
            self.disagreeing.add(seen)
        if full:
            out.append(ShownText(full if shown is None else shown, 0, "final_text"))

    def _settle_call(self, item_id: str, full: Any, item: dict[str, Any] | None, whole: bool, out: list[Event]) -> None:
        """A call's whole arguments: fill in what is missing and mark it complete.

        A call not remembered (past :data:`MAX_KEYS` calls: :meth:`_room`) may have had
        its deltas already, as :class:`~addon.events.ToolCallDelta`: its whole arguments
        are then :class:`~addon.events.ShownText` (JSON escapes decoded, as the gate reads
        a call's arguments and the tool reads them), checked by the output filters on
        their own and not added to the record, and the call gets an empty fragment that
        completes it and names it. As a ToolCallDelta they would be appended to what the
        deltas gave (``{"a":1}{"a":1}`` recorded) and the filters would read the
        arguments joined to themselves. With no delta before, the record has no
        arguments for such a call (as for a part's text past the same bound)."""
        call_id = name = None
        if item is not None:
            call_id, name = str_field(item, "call_id"), str_field(item, "name")
        got = self.arguments.get(item_id)
        if got is None and not self._room(self.arguments, item_id, out):
            self._call(item_id, "", call_id, name, whole, out)
            if isinstance(full, str) and full:
                shown = full if item_id in self.free_form else JsonEscapes().feed(full)
                out.append(ShownText(shown, 0, "final_text"))
            return
        have = "" if not got else got[0] if len(got) == 1 else "".join(got)
        tail = ""
        if isinstance(full, str) and have != full and full.startswith(have):
            tail = full[len(have) :]
            have = full
        elif (
            isinstance(full, str) and have != full
        ):  # (the client's SDK may take these: checked too, as the tool reads them)
            shown = full if item_id in self.free_form else JsonEscapes().feed(full)
            self._disagreement((item_id, "arguments", 0), full, "arguments", out, finding=True, shown=shown)
        self.arguments[item_id] = [have]  # (remembered, or room for it: see above)
        self._call(item_id, tail, call_id, name, whole, out)

    def _call(
        self, item_id: str, arguments: str, call_id: str | None, name: str | None, whole: bool, out: list[Event]
    ) -> None:
        """A call fragment; a name the request did not declare is reported once per call."""
        if name is not None and self.declared_tools is not None and name not in self.declared_tools:
            if item_id not in self.undeclared and self._room(self.undeclared, item_id, out):
                self.undeclared.add(item_id)
                out.append(Finding("undeclared_tool", name))
        out.append(
            ToolCallDelta(
                item_id, arguments, id=call_id, name=name, complete=whole, free_form=item_id in self.free_form
            )
        )

    # -- deltas and their done events ------------------------------------------------------

    def _delta(self, obj: dict[str, Any], out: list[Event], space: str, index_field: str, kind: str) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, str) or not delta:
            return
        key = (self._item_id(obj), space, int_field(obj, index_field) or 0)
        got = self.parts.get(key)
        if got is not None:
            got.append(delta)
        elif self._room(self.parts, key, out):
            self.parts[key] = [delta]
        out += self._enter(key, kind, space)
        out.append(TextDelta(delta, 0, kind))

    def _enter(self, key: tuple[str, str, int], kind: str, space: str) -> list[Event]:
        """Text of ``kind`` for part ``key``: noted, a finding when interleaved (:class:`~addon.dialects.OpenBlocks`)."""
        found = self.blocks.text(key, kind, key[0])
        if kind == "text" and space == "content":
            self.fast_part = None if found else key
        return found

    def _text_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._delta(obj, out, "content", "content_index", "text")

    def _refusal_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._delta(obj, out, "content", "content_index", "refusal")

    def _summary_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._delta(obj, out, "summary", "summary_index", "reasoning")

    def _reasoning_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._delta(obj, out, "reasoning", "content_index", "reasoning")

    def _done(self, obj: dict[str, Any], out: list[Event], space: str, index_field: str, field: str, kind: str) -> None:
        full = obj.get(field)
        if isinstance(full, str):
            key = (self._item_id(obj), space, int_field(obj, index_field) or 0)
            self._settle_text(key, full, kind, out)
            self._part_ended(key)

    def _text_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._done(obj, out, "content", "content_index", "text", "text")

    def _refusal_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._done(obj, out, "content", "content_index", "refusal", "refusal")

    def _summary_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._done(obj, out, "summary", "summary_index", "text", "reasoning")

    def _reasoning_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._done(obj, out, "reasoning", "content_index", "text", "reasoning")

    def _part_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        """``response.content_part.done`` / ``response.reasoning_summary_part.done``."""
        part = obj.get("part")
        if not isinstance(part, dict):
            return
        part_type = str_field(part, "type") or ""
        field_kind = PART_TEXT.get(part_type)
        text = part.get(field_kind[0]) if field_kind else None
        if isinstance(text, str) and field_kind is not None:
            space, index_field = PART_SPACE.get(part_type, ("content", "content_index"))
            key = (self._item_id(obj), space, int_field(obj, index_field) or 0)
            self._settle_text(key, text, field_kind[1], out)
            self._part_ended(key)

    def _arguments_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, str) or not delta:
            return
        item_id = self._item_id(obj)
        got = self.arguments.get(item_id)
        if got is not None:
            got.append(delta)
        elif self._room(self.arguments, item_id, out):
            self.arguments[item_id] = [delta]
        out.append(ToolCallDelta(item_id, delta, free_form=item_id in self.free_form))

    def _input_delta(self, obj: dict[str, Any], out: list[Event]) -> None:
        """A custom tool's input: free text, read as it is (not as JSON)."""
        self._free_form(self._item_id(obj), out)
        self._arguments_delta(obj, out)

    def _arguments_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._settle_call(self._item_id(obj), obj.get("arguments"), None, True, out)

    def _input_done(self, obj: dict[str, Any], out: list[Event]) -> None:
        self._free_form(self._item_id(obj), out)
        self._settle_call(self._item_id(obj), obj.get("input"), None, True, out)

    def _free_form(self, item_id: str, out: list[Event]) -> None:
        """A custom tool call: its input is free text, not JSON."""
        if self._room(self.free_form, item_id, out):
            self.free_form.add(item_id)

    # -- bounds ---------------------------------------------------------------------------

    def _room(self, table: Collection[Any], key: Any, out: list[Event] | None = None) -> bool:
        """Whether ``table`` may keep ``key``: it holds it, or fewer than :data:`MAX_KEYS`.
        Past that, nothing new is kept there (an upstream naming a new item, part or call
        per event); their text is still read, and the first time ``out`` gets the finding
        ``record_limit``."""
        if len(table) < MAX_KEYS or key in table:
            return True
        if out is not None:
            out += self.keys_limit.reached()
        return False


def _part(part_type: str, text: str) -> dict[str, Any]:
    """A message content part as a final response object carries it."""
    if part_type == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": []}


def _stop_reason(resp: dict[str, Any], status: str) -> str:
    """The provider's stop reason: ``incomplete_details.reason`` when incomplete, else
    the status (``completed``, ``failed``, ``cancelled``)."""
    if status == "incomplete":
        details = resp.get("incomplete_details")
        reason = str_field(details, "reason") if isinstance(details, dict) else None
        return reason or status
    return status


_HANDLERS = {
    "response.created": ResponsesNormalizer._lifecycle,
    "response.queued": ResponsesNormalizer._lifecycle,
    "response.in_progress": ResponsesNormalizer._lifecycle,
    "response.output_item.added": ResponsesNormalizer._item_added,
    "response.output_item.done": ResponsesNormalizer._item_done,
    TEXT_DELTA: ResponsesNormalizer._text_delta,
    "response.output_text.done": ResponsesNormalizer._text_done,
    "response.refusal.delta": ResponsesNormalizer._refusal_delta,
    "response.refusal.done": ResponsesNormalizer._refusal_done,
    "response.reasoning_summary_text.delta": ResponsesNormalizer._summary_delta,
    "response.reasoning_summary_text.done": ResponsesNormalizer._summary_done,
    "response.reasoning_text.delta": ResponsesNormalizer._reasoning_delta,
    "response.reasoning_text.done": ResponsesNormalizer._reasoning_done,
    "response.content_part.added": ResponsesNormalizer._part_added,
    "response.content_part.done": ResponsesNormalizer._part_done,
    "response.reasoning_summary_part.done": ResponsesNormalizer._part_done,
    "response.function_call_arguments.delta": ResponsesNormalizer._arguments_delta,
    "response.function_call_arguments.done": ResponsesNormalizer._arguments_done,
    "response.custom_tool_call_input.delta": ResponsesNormalizer._input_delta,
    "response.custom_tool_call_input.done": ResponsesNormalizer._input_done,
    "error": ResponsesNormalizer._error,
}
