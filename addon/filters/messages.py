"""The conversation reader now lives in :mod:`exchange.messages`, shared by the filters,
mitmproxy's view and ``llm-audit show``.

This name remains only for :mod:`addon.dialects.openai_completions`, which the framing
work is rewriting in parallel; it goes when that module imports :mod:`exchange.messages`.
"""

from exchange.messages import Message, extract_messages, token_prompts

__all__ = ["Message", "extract_messages", "token_prompts"]
