"""Entry point for ``mitmdump -s addon/llm_audit.py`` (and mitmproxy, mitmweb).

It only builds the addon list from the adapter's addons (:mod:`addon.mitm`) and
registers the "LLM stream" content view. The project's packages (``addon``,
``storage``) are imported by their full names; when the project is not installed into
the running Python, its root folder is put on ``sys.path`` first.

mitmproxy calls each hook on the addons in list order: the exchange and WebSocket hooks
come before the store, so that at shutdown their ``done`` submits the exchanges still
open before the store's ``done`` closes the writer; the OpenTelemetry export comes last
and flushes what they handed it.
"""

import sys
from pathlib import Path

try:
    import addon.mitm  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from addon.mitm import contentview
from addon.mitm.content_filters import ContentFilters
from addon.mitm.hooks import ExchangeHooks
from addon.mitm.otel import OtelExport
from addon.mitm.store import AuditStore
from addon.mitm.websocket import WebSocketHooks

contentview.register()
store = AuditStore()
filters = ContentFilters(store)
hooks = ExchangeHooks(store, filters)
addons = [hooks, WebSocketHooks(store, filters, hooks), filters, store, OtelExport(store)]
