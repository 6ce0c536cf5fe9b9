"""The baseline proxy: mitmdump streaming event streams, and nothing else.

Without this mitmproxy buffers every response whole, which no one can do in front of
SSE; setting ``flow.response.stream = True`` in ``responseheaders`` is the standard
way to pass them through, so plain mitmdump with this file is what the audit addon is
compared with (``mitmdump -s bench/plain_stream.py``).
"""

from mitmproxy import http


def responseheaders(flow: http.HTTPFlow) -> None:
    response = flow.response
    if response is None:  # never, in this hook: mitmproxy calls it with the response's headers
        return
    content_type = response.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        response.stream = True
