"""The ``llm-audit`` command: a thin application layer over :mod:`storage` (and, for
``hosts``, over :mod:`addon.hosts`).

Each command group is one module that registers its parsers and runs them by calling a
storage function and printing the result: :mod:`cli.query` (list, search, show, stats,
export), :mod:`cli.integrity` (checkpoint, verify, erase, purge), :mod:`cli.db` (db
upgrade, current, roles), :mod:`cli.status`, :mod:`cli.hosts`. :mod:`cli.common` holds
what they share (``--db``, one-line errors); :mod:`cli.main` puts them together.
Presentation for a person lives beside them: :mod:`cli.terminal`, :mod:`cli.tables`,
:mod:`cli.formats` and :mod:`cli.show` (the page of ``show``, over
:mod:`exchange.transcript`).
"""
