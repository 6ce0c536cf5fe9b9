"""Entry point for ``mitmdump -s addon/llm_audit.py`` (and mitmproxy, mitmweb).

It only builds the addon list and registers the "LLM stream" content view. The
project's packages (``addon``, ``storage``) are imported by their full names; when the
project is not installed into the running Python, its root folder is put on
``sys.path`` first.
"""

import sys
from pathlib import Path

try:
    import addon.proxy  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from addon import contentview
from addon.proxy import LLMAudit

contentview.register()
addons = [LLMAudit()]
