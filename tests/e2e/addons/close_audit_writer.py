"""A test addon: closes llm-audit's database writer once the proxy runs, as if the
database had been lost without a word, to prove the addon then stops the proxy.

Loaded with ``-s`` after the addon by tests/e2e/test_recorder_guard.py.
"""

from mitmproxy import ctx


class CloseAuditWriter:
    def running(self) -> None:
        store = ctx.master.addons.get("auditstore")  # addon.mitm.store.AuditStore
        store.writer.close()
        store.writer = None


addons = [CloseAuditWriter()]
