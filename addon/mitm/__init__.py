"""The mitmproxy adapter: the only package of the project that imports mitmproxy.

Shaped like mitmproxy's own ``mitmproxy/addons/*.py``: one addon class per concern, its
options beside it (``load``/``configure``/hooks), each given the others it needs in its
constructor (``addon/llm_audit.py`` builds them in order):

- :mod:`addon.mitm.store`: :class:`~addon.mitm.store.AuditStore`, the database options,
  the writer's lifecycle, the start-up watchdog, ``submit(record)``;
- :mod:`addon.mitm.content_filters`: :class:`~addon.mitm.content_filters.ContentFilters`,
  the filter options, loading and reloading, the request check;
- :mod:`addon.mitm.hooks`: :class:`~addon.mitm.hooks.ExchangeHooks`, the flow hooks, the
  size options and the flow list annotations.

Their helpers: :mod:`addon.mitm.flow_state` (each live flow's state),
:mod:`addon.mitm.tap` (the stream callable), :mod:`addon.mitm.flow_record` (what a flow
tells the record), :mod:`addon.mitm.answers` (the proxy's own answers to blocked
exchanges), :mod:`addon.mitm.contentview` (the "LLM stream" view),
:mod:`addon.mitm.early_end` (mitmproxy's private API) and
:mod:`addon.mitm.printed_output` (no credential in what mitmdump prints). Everything
else under ``addon/`` is sans-IO and knows nothing of mitmproxy
(``tests/unit/test_layering.py``).
"""
