"""The Anthropic Messages dialect (``POST /v1/messages``): Anthropic's own API, and any
gateway or local server that speaks it. The protocol is read by
:mod:`addon.dialects.messages`, which Bedrock and Vertex share."""

from addon.dialects.messages import AnthropicMessages

DIALECT = AnthropicMessages()
