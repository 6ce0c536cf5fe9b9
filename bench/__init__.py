"""``scripts/bench``: the addon measured against its peers and against plain mitmdump.

Benchmarks are not tests: they print a table and write a JSON file of results
(``BENCHMARKS.md`` records a run). ``--smoke`` runs every section with tiny sizes so
that CI can keep the script working (``tests/e2e/test_bench_smoke.py``).

One module per concern: :mod:`bench.parsing` (SSE parsers), :mod:`bench.overhead`
(proxy CPU and per-event delay, with and without content filters), :mod:`bench.writes`
(the audit writer and the spool), :mod:`bench.memory` (proxy RSS), :mod:`bench.query`
(``llm-audit list`` / ``stats``); :mod:`bench.processes`, :mod:`bench.client` and
:mod:`bench.workloads` are what they share.
"""
