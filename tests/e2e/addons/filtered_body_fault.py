"""A test addon that breaks the making of a filtered answer in a real mitmdump.

Loaded with a second ``-s`` by tests/e2e/test_output_filters_proxy.py. It replaces
``OpenAIChatNormalizer.filtered_body`` in the proxy process with one that raises, as a bug
would: the blocked answer must still not reach the client.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from addon.dialects.openai_chat import OpenAIChatNormalizer


def _broken(self, rule_id, reason):
    raise RuntimeError("filtered_body is broken")


OpenAIChatNormalizer.filtered_body = _broken
