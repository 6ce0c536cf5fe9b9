"""Content filters: sans-IO checks of requests and streamed output.

- :mod:`addon.filters.api`: the interface user filters implement (start here);
- :mod:`addon.filters.rules`: the TOML rules file of the built-in filters;
- :mod:`addon.filters.detectors`: credentials, card numbers, IBANs, e-mail addresses;
- :mod:`addon.filters.window`: the hold-back window that checks a stream as it arrives;
- :mod:`addon.filters.engine`: rules and user filters together, per proxy and exchange;
- :mod:`addon.filters.loader`: user filter files, reloaded when they change;
- :mod:`exchange.request` (beside ``addon``, as mitmproxy's view and ``llm-audit show``
  read it too): the conversation read from any dialect's request body.
"""
