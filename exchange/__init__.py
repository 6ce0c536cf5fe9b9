"""What an exchange said, read and rendered without I/O, for every view of it.

The proxy's content view in mitmproxy (:mod:`addon.mitm.contentview`), the content filters
(:mod:`addon.filters`) and ``llm-audit show`` (:mod:`cli.show`) all read the same
things, so they read them here: :mod:`exchange.request` (the one reader of request
bodies: the conversation and the declared tools, in any dialect's shape; the dialects read
the tools there too) and :mod:`exchange.transcript` (each part of an exchange
as the text a person reads). It sits above :mod:`storage` and below both ``addon`` and
``cli``, so neither the proxy nor the command has to import the other.
"""
