"""``llm-audit serve``: a read-only web application for the people who read the audit.

One more thin layer over the library the ``llm-audit`` command uses (:mod:`storage.query`
for the selection and the totals, :mod:`exchange.transcript` for what an exchange says,
:mod:`storage.chain` for its hashes, :mod:`cli.formats` for the exports), served by
Starlette and uvicorn with server-rendered Jinja2 pages: no script, no front-end build.

- :mod:`review.database`: the database opened read-only (SQLite ``mode=ro``, PostgreSQL
  read-only transactions);
- :mod:`review.auth`: the password, sessions, login slowing, the access log;
- :mod:`review.headers`: the security headers every response carries;
- :mod:`review.origin`: requests from other sites' pages refused (but links to a page);
- :mod:`review.selection`: the list's filters and keyset pages from a query string;
- :mod:`review.exchange_page`, :mod:`review.overview`, :mod:`review.charts`: what the
  pages show;
- :mod:`review.text`: recorded text made visible and inert;
- :mod:`review.app`: the routes.
"""
