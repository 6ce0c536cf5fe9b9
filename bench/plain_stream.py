"""The baseline proxy: mitmdump streaming event streams, and nothing else.

Without this mitmproxy buffers every response whole, which no one can do in front of
SSE; setting ``flow.response.stream = True`` in ``responseheaders`` is the standard
way to pass them through, so plain mitmdump with this file is what the audit addon is
compared with (``mitmdump -s bench/plain_stream.py``).

``--set plain_stream_callable=true`` streams them through a stream callable that returns
every chunk unchanged instead: any addon that reads a stream's bytes, as the audit does,
must take mitmproxy's callable path, so this variant's CPU beside plain's is the part of
the audit's overhead no change to the addon can remove (the ``callable`` variant of
``scripts/bench``).
"""

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader


def load(loader: Loader) -> None:
    loader.add_option(
        "plain_stream_callable",
        bool,
        False,
        "Stream event streams through a callable that returns each chunk as it came.",
    )


def _same(chunk: bytes) -> bytes:
    return chunk


def responseheaders(flow: http.HTTPFlow) -> None:
    response = flow.response
    if response is None:  # never, in this hook: mitmproxy calls it with the response's headers
        return
    content_type = response.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() == "text/event-stream":
        response.stream = _same if ctx.options.plain_stream_callable else True
