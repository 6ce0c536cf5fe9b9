"""The LMSP 1.0 dialect: Responses-style generation, streaming and resumable task events.

Recognised by the request line (the path may sit under a prefix; the ``/lmsp/v1/``
part decides):

- ``POST /lmsp/v1/responses``: create a response, a JSON response object or, with
  ``"stream": true``, an event stream (spec section 6.1-6.3);
- ``GET /lmsp/v1/responses/{response_id}``: a stored response object (section 6.2);
- ``GET /lmsp/v1/tasks/{task_id}/events``: a task's event stream, resumed after the id
  in ``?after=N`` or the ``Last-Event-ID`` header (``after`` wins) (section 6.4).
  The task id goes to the record's ``task_id``, which links the exchanges of a task.

The events are the Responses ones (read by
:class:`~addon.dialects.responses.ResponsesNormalizer`), with LMSP's differences:
the SSE event name is the type (the data has none), lifecycle data carries
``response_id``, ``status``, ``usage`` and ``error`` at the top level,
``response.cancelled`` and ``error`` are final events too, errors are RFC 9457
problem objects (``type``, ``title``, ``status``, ``detail``, ``code``), and function
calls arrive whole in ``response.output_item.done``.

Checked here: every event MUST carry an integer ``id`` that increases strictly within
the response, starting at 1 (findings ``event_id_invalid``,
``event_id_not_increasing``). A resumed stream must only replay ids after the one
asked for.

Resumption without counting twice: the dialect remembers, per task, the highest event
id already audited (a bounded LRU that lives as long as the proxy). Events of a task
stream at or below it were recorded with an earlier exchange: they still update the
reader's state and are checked, but give no text, tool calls or usage. Their
lifecycle facts (response id, stop reason, error, end of stream) still settle this
exchange's own status. The ``*.done`` repeats of an item opened before this stream
began fill nothing in when that part of the task was audited here (they would repeat
it), and fill in the whole item when it was not (they are then its only record).
Each replayed event is reported as :class:`Replayed`, so the record counts it in
``replayed_events`` instead of ``event_count``.

When a content filter stops an exchange, the response fails: ``response.failed`` whose
``error`` is a problem object (``about:blank``, status 400, ``code``
``content_filtered``, the rule and reason as ``detail``), its event id following the
last one and its ``response_id`` the stream's, carrying the response's ``output`` as the
client received it (LMSP defines ``content_filtered`` as an error code, and no
content-filter reason for ``incomplete``, so a filtered response is a failed one). A
held synchronous answer is replaced by the problem document (HTTP 400), as a failed
synchronous request is answered. A request blocked before it went
upstream gets ``response.created`` (id 1) and ``response.failed`` (id 2) for a new
response when it asked for a stream, else the problem document itself with HTTP 400
(``application/problem+json``), as section 6.2 answers failed synchronous requests.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from addon.dialects import (
    BlockedResponse,
    Dialect,
    Normalizer,
    RequestSummary,
    RequestView,
    costly_finding,
    error_body_events,
    json_object,
    str_field,
)
from addon.dialects.blocking import (
    BLOCKED_STATUS,
    FILTERED_CODE,
    block_message,
    event_stream,
    frame,
    json_response,
    random_id,
)
from addon.dialects.responses import ResponsesNormalizer, problem_error
from addon.events import Event, Finding, Replayed, ResponseMeta, StreamError, TextDelta, ToolCallDelta, Usage
from addon.framing import Frame
from exchange.request import tool_names

PREFIX = "/lmsp/v1/"
TASK_MEMORY = 10_000  # tasks whose audited event ids are remembered
MAX_ID_DIGITS = 18  # longer "integers" are not parsed (int() of huge strings is slow)
PROBLEM_MEDIA_TYPE = "application/problem+json"
_COUNTED = (TextDelta, ToolCallDelta, Usage)  # what a replayed event must not add again


def _counted(event: Event) -> bool:
    """Whether an earlier exchange already recorded ``event`` when its event was audited:
    content and usage, and the finding that goes with a call (``undeclared_tool``)."""
    return isinstance(event, _COUNTED) or (isinstance(event, Finding) and event.code == "undeclared_tool")


@dataclass(slots=True)
class LMSPRequestSummary(RequestSummary):
    """The request summary, plus where a task events request resumes."""

    resume_after: int | None = None


class TaskProgress:
    """Per task id, the highest event id already audited; least recently used go first."""

    def __init__(self, size: int = TASK_MEMORY) -> None:
        self.size = size
        self._high: OrderedDict[str, int] = OrderedDict()

    def get(self, task_id: str) -> int | None:
        return self._high.get(task_id)

    def advance(self, task_id: str, event_id: int) -> None:
        high = self._high.get(task_id)
        if high is None or event_id > high:
            self._high[task_id] = event_id
        self._high.move_to_end(task_id)
        if len(self._high) > self.size:
            self._high.popitem(last=False)

    def __len__(self) -> int:
        return len(self._high)


def event_id(value: str) -> int | None:
    """An SSE event id as LMSP's positive integer, else ``None``."""
    if 0 < len(value) <= MAX_ID_DIGITS and value.isascii() and value.isdigit():
        n = int(value)
        return n if n >= 1 else None
    return None


class LMSP(Dialect):
    name = "lmsp"
    provider = "lmsp"

    def __init__(self, task_memory: int = TASK_MEMORY) -> None:
        self.tasks = TaskProgress(task_memory)

    def matches(self, request: RequestView) -> bool:
        route = _route(request.path)
        if route is None:
            return False
        if request.method == "POST":
            return route == "responses"
        if request.method == "GET":
            return _task_of_events(route) is not None or _response_of(route) is not None
        return False

    def sniff(self, first_event: Frame) -> bool:
        if first_event.event != "response.created":
            return False
        obj = json_object(first_event.data)
        return obj is not None and isinstance(obj.get("response_id"), str) and "response" not in obj

    def summarize(self, body: Any, request: RequestView) -> RequestSummary:
        route = _route(request.path) or ""
        task_id = _task_of_events(route) if request.method == "GET" else None
        if task_id is not None:
            summary = LMSPRequestSummary(stream=True, task_id=task_id)
            summary.resume_after = self._resume_point(request, summary.findings)
            return summary
        if not isinstance(body, dict):
            return LMSPRequestSummary()
        stream = body.get("stream")
        return LMSPRequestSummary(
            model=str_field(body, "model"),
            stream=stream if isinstance(stream, bool) else None,
            declared_tools=tool_names(body),  # built-in tools have no name
        )

    @staticmethod
    def _resume_point(request: RequestView, findings: list[Finding]) -> int | None:
        """``?after=N``, else ``Last-Event-ID``: the last event id the client has."""
        after = parse_qs(request.query).get("after")
        name, value = ("after", after[-1]) if after else ("Last-Event-ID", request.headers.get("last-event-id"))
        if value is None:
            return None
        value = value.strip()
        if value == "0":
            return 0  # everything: ids start at 1
        n = event_id(value)
        if n is None:
            findings.append(Finding("request_invalid_field", f"{name} is {value[:40]!r}, not an event id"))
        return n

    def normalizer(self, request: RequestSummary) -> Normalizer:
        resume_after = request.resume_after if isinstance(request, LMSPRequestSummary) else None
        tasks = self.tasks if request.task_id else None
        return LMSPNormalizer(tasks, request.task_id, resume_after, request.declared_tools)

    def blocked_response(
        self, summary: RequestSummary, request_view: RequestView, rule_id: str, reason: str, streaming: bool
    ) -> BlockedResponse:
        if streaming:
            normalizer = self.normalizer(summary)
            return event_stream(normalizer.ending(rule_id, reason), normalizer.writer)
        return json_response(filter_problem(rule_id, reason), BLOCKED_STATUS, PROBLEM_MEDIA_TYPE)


def filter_problem(rule_id: str, reason: str) -> dict[str, Any]:
    """The RFC 9457 problem object of a block, with LMSP's machine-readable ``code``."""
    detail = block_message(rule_id, reason)
    return {
        "type": "about:blank",
        "title": "Bad Request",
        "status": BLOCKED_STATUS,
        "detail": detail,
        "code": FILTERED_CODE,
    }


def _route(path: str) -> str | None:
    """What follows ``/lmsp/v1/`` in the path (trailing slash dropped), or ``None``."""
    at = path.find(PREFIX)
    if at < 0:
        return None
    return path[at + len(PREFIX) :].rstrip("/")


def _task_of_events(route: str) -> str | None:
    """The task id of ``tasks/{task_id}/events``."""
    parts = route.split("/")
    if len(parts) == 3 and parts[0] == "tasks" and parts[1] and parts[2] == "events":
        return parts[1]
    return None


def _response_of(route: str) -> str | None:
    """The response id of ``responses/{response_id}``."""
    head, _, response_id = route.partition("/")
    return response_id if head == "responses" and response_id and "/" not in response_id else None


class LMSPNormalizer(ResponsesNormalizer):
    """LMSP events: Responses reading, event id checks and replay skipping."""

    FINAL_EVENTS = ResponsesNormalizer.FINAL_EVENTS | {"response.cancelled", "error"}
    filter_stop_reason = "failed"  # LMSP's outcome for a filter: a failed response, code content_filtered

    def __init__(
        self,
        tasks: TaskProgress | None,
        task_id: str | None,
        resume_after: int | None,
        declared_tools: frozenset[str] | None = None,
    ) -> None:
        super().__init__(declared_tools)
        self.tasks = tasks
        self.task_id = task_id
        self.resume_after = resume_after
        self.last_id: int | None = resume_after  # ids must go beyond this
        self.seen_any = False
        self.accepted_any = False  # an event id beyond the resume point was seen
        self.audited_before: int | None = None  # read from the task memory at the first event
        self.meta_seen = False
        self.response_id: str | None = None  # every event's data names it

    def event_type(self, event: Frame, obj: dict[str, Any]) -> str:
        """The SSE event name; the data's ``type`` only when the event has none."""
        if event.event != "message":
            return event.event
        kind = obj.get("type")
        return kind if isinstance(kind, str) else event.event

    def on_event(self, event: Frame) -> list[Event]:
        got = self.read(event)
        return [TextDelta(got)] if isinstance(got, str) else got

    def read(self, event: Frame) -> list[Event] | str:
        """The event, its id checked first; a text delta with a good id, not replayed,
        stays the text alone (see :meth:`Normalizer.read`)."""
        findings: list[Event] = []
        n = self._check_id(event, findings)
        replayed = self.audited_before is not None and n is not None and n <= self.audited_before
        got = self._read(event)
        if isinstance(got, str):
            if not replayed and not findings:
                if n is not None and self.tasks is not None and self.task_id is not None:
                    self.tasks.advance(self.task_id, n)
                return got
            got = [TextDelta(got)]
        out = got
        if replayed:
            out = [e for e in out if not _counted(e)]
            out.append(Replayed())
        elif n is not None and self.tasks is not None and self.task_id is not None:
            self.tasks.advance(self.task_id, n)
        return findings + out if findings else out

    def _check_id(self, event: Frame, findings: list[Event]) -> int | None:
        n = event_id(event.id)
        if not self.seen_any:
            self.seen_any = True
            if self.tasks is not None and self.task_id is not None:
                self.audited_before = self.tasks.get(self.task_id)
            # A stream that does not start at 1 carries the rest of a response whose
            # beginning went to an earlier exchange. When that exchange was audited here,
            # items it opened are not filled in again from their done events; when it
            # was not (the proxy restarted, or forgot the task), they are: that is the
            # only record of them.
            resumed = bool(self.resume_after) or (n is not None and n > 1)
            self.continuation = resumed and self.audited_before is not None
            if n is not None and n != 1 and not self.resume_after:
                findings.append(Finding("event_id_invalid", f"the first event id is {n}, not 1"))
        if n is None:
            detail = "missing" if event.id == "" else repr(event.id[:40])
            findings.append(Finding("event_id_invalid", f"{event.event!r}: id {detail}, not a positive integer"))
            return None
        last = self.last_id
        if last is None or n > last:
            self.last_id = n
            self.accepted_any = True
        elif not self.accepted_any and self.resume_after is not None:
            detail = f"id {n} replayed although the client asked for events after {last}"
            findings.append(Finding("event_id_not_increasing", detail))
        elif n == last:
            detail = f"id {n} again (repeated, or an event without its own id line)"
            findings.append(Finding("event_id_not_increasing", detail))
        else:
            findings.append(Finding("event_id_not_increasing", f"id {n} after {last}"))
        return n

    def text_of(self, event: Frame, obj: dict[str, Any]) -> str | None:
        """Once an event has named the response (:meth:`on_json` adds nothing then)."""
        return super().text_of(event, obj) if self.meta_seen else None

    def on_json(self, event: Frame, obj: dict[str, Any]) -> list[Event]:
        out = super().on_json(event, obj)
        if not self.meta_seen:
            # A resumed stream may not replay response.created: any event names the response.
            response_id = str_field(obj, "response_id")
            if response_id is not None:
                self.meta_seen = True
                self.response_id = response_id
                if not any(isinstance(e, ResponseMeta) for e in out):
                    out.append(ResponseMeta(response_id=response_id))
        return out

    def ending(self, rule_id: str, reason: str) -> list[Frame]:
        """``response.failed`` with the block's problem object and the output the client
        received (open items marked ``incomplete``), ids continuing; a response no event
        named yet is created first (a new ``resp_`` id)."""
        if self.ended:
            return []
        response_id = self.response_id
        events: list[tuple[str, dict[str, Any]]] = []
        if response_id is None:
            response_id = random_id("resp_")
            events.append(("response.created", {"status": "in_progress"}))
        events.append(
            (
                "response.failed",
                {
                    "status": "failed",
                    "error": filter_problem(rule_id, reason),
                    "output": self.output_so_far(),
                    "usage": None,
                },
            )
        )
        first_id = (self.last_id or 0) + 1
        return [
            frame({"response_id": response_id, **fields}, kind, event_id=first_id + n)
            for n, (kind, fields) in enumerate(events)
        ]

    def on_body(self, body: bytes, http_status: int) -> list[Event]:
        """Error bodies are problem documents (``410`` + ``event_history_expired``)."""
        if http_status >= 400:
            if (costly := costly_finding(body, "the error body")) is not None:
                return [StreamError(None, None), costly]
            obj = json_object(body)
            err = obj.get("error", obj) if obj is not None else None
            if isinstance(err, dict):
                return [problem_error(err)]
            return error_body_events(body)
        return super().on_body(body, http_status)


DIALECT = LMSP()
