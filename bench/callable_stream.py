"""The floor of any addon that reads a stream: mitmdump with an identity stream callable.

mitmproxy hands a stream callable every chunk of a response body and sends on what it
returns. An addon that inspects streamed bytes, as the audit does, cannot avoid that
path; this one does nothing else (each chunk returned as it came), so its CPU beside
plain mitmdump's (``bench/plain_stream.py``, ``stream = True``) is what the callable
path itself costs, the part of the audit's overhead no change to the addon can remove
(``mitmdump -s bench/callable_stream.py``).
"""

from mitmproxy import http


def _same(chunk: bytes) -> bytes:
    return chunk


def responseheaders(flow: http.HTTPFlow) -> None:
    response = flow.response
    if response is None:  # never, in this hook: mitmproxy calls it with the response's headers
        return
    content_type = response.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        response.stream = _same
