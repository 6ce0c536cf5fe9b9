"""The one reader of request bodies: the conversation and the declared tools, any API's shape.

The dialects (the tools a request declares, to spot a call to an undeclared one), the
request filters (the words a client sends), mitmproxy's view and ``llm-audit show`` (both)
must never disagree on what a request says, so none of them reads a body's shape itself:
they all read it here. Shapes are read by shape rather than by dialect (the same shapes
travel behind gateways and compatible servers).

The conversation, as plain ``(role, text)`` messages (:func:`extract_messages`):

- OpenAI Chat and llm-stream ``messages``: ``content`` a string or a list of parts,
  assistant ``tool_calls``;
- OpenAI Responses and LMSP ``instructions`` and ``input`` (a string or a list of
  messages and items such as ``function_call`` / ``function_call_output``);
- Anthropic ``system`` and ``messages`` with content blocks (text, thinking,
  ``tool_use`` input, ``tool_result`` content);
- Gemini ``systemInstruction`` and ``contents[].parts[]`` (text, ``functionCall`` args,
  ``functionResponse``);
- Ollama ``/api/chat`` ``messages`` (``thinking``, ``tool_calls`` whose ``arguments`` is
  an object) and ``/api/generate`` ``system``, ``prompt``, ``suffix`` and ``template``
  (read as the shapes above read them);
- the protobuf dialects' readings (Cursor, Windsurf, gRPC): their ``messages``, and their
  ``unmapped_strings`` (fields no path maps: context the model reads, a moved prompt) as
  a ``context`` message before the conversation;
- Bedrock Converse ``system`` and ``messages`` with content blocks (``text``,
  ``toolUse`` input, ``toolResult`` content, ``reasoningContent``), and Titan's
  ``inputText`` (InvokeModel; other models' native bodies use the shapes above);
- legacy Completions ``prompt`` (a string, or a batch of strings: one message each) and
  ``suffix`` (the text after the insertion point, which the model reads too). A prompt
  of token ids cannot be read without the model's tokenizer: :func:`token_prompts` says
  so, and the request filters treat it as text they could not check.

The parts of one message are joined with newlines. Tool arguments and results are part
of the text: they go upstream like any other words. Images, audio and other binary parts
are skipped.

The declared tools, as ``(name, description)`` (:func:`declared_tools`; their names alone:
:func:`tool_names`), from every shape at once: OpenAI Chat ``tools[].function`` and
``tools[].custom``, the legacy ``functions[]``, Responses, LMSP, llm-stream and Anthropic
``tools[]`` (Responses' built-in tools have no name and are no declaration), Gemini
``tools[].functionDeclarations[]`` (or ``function_declarations``), Bedrock Converse
``toolConfig.tools[].toolSpec``. A body mixing shapes
declares every tool any of them names.

Pure: no I/O, nothing of the proxy; it never raises, whatever the body holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from storage.prepare import json_text

# Keys holding text the model reads: a string, or nested parts, blocks and calls.
_TEXT_KEYS = (
    "text", "thinking", "refusal", "arguments", "output",
    "content", "parts", "tool_calls", "function", "functionCall", "functionResponse", "summary",
    "toolUse", "toolResult", "reasoningContent", "reasoningText",  # Bedrock Converse
)  # fmt: skip
# Keys holding structured tool arguments or results (JSON-encoded into the text); an
# ``arguments`` object is Ollama's (OpenAI sends a string, read as text).
_JSON_KEYS = ("input", "args", "response", "arguments", "json")
# Item types of the Responses API that carry no role of their own.
_ITEM_ROLES = {"function_call": "assistant", "function_call_output": "tool", "reasoning": "assistant"}
# Gemini's role names, mapped to the common ones.
_ROLES = {"model": "assistant", "function": "tool"}
_MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation: who said it and its text."""

    role: str
    text: str


def extract_messages(body: Any, cut: list[str] | None = None, read: set[int] | None = None) -> list[Message]:
    """The messages of a request body, system prompts first; ``[]`` for other bodies.

    ``cut`` gets a note for each message with text nested deeper than the reader goes
    (``_MAX_DEPTH`` levels: no API nests its parts so deep, so only a body built to hide
    text from the filters does; a permissive server may read it all the same). ``read``
    gets the ``id`` of every string and structure of ``body`` the messages hold
    (:func:`strings_beside` reads the others)."""
    if not isinstance(body, dict):
        return []
    cut = [] if cut is None else cut
    read = set() if read is None else read
    out: list[Message] = []
    _add(out, "system", body.get("system"), cut, read)  # Anthropic
    _add(out, "system", body.get("instructions"), cut, read)  # Responses, LMSP
    for key in ("systemInstruction", "system_instruction"):  # Gemini
        _add(out, "system", body.get(key), cut, read)
    unmapped = body.get("unmapped_strings")  # a protobuf dialect's reading: fields it could not map
    if isinstance(unmapped, list) and unmapped:  # (context the model reads, a prompt whose field moved)
        read.add(id(unmapped))
        _add(out, "context", "\n".join(s for s in unmapped if isinstance(s, str)), cut, read)
    for key in ("messages", "contents"):  # Chat, llm-stream, Anthropic; Gemini
        items = body.get(key)
        if isinstance(items, list):
            for item in items:
                _add_item(out, item, cut, read)
    prompt = body.get("prompt")  # legacy Completions
    for item in prompt if isinstance(prompt, list) else [prompt]:
        if isinstance(item, str):
            _add(out, "user", item, cut, read)
    if isinstance(body.get("suffix"), str):
        _add(out, "user", body["suffix"], cut, read)
    if isinstance(body.get("template"), str):  # Ollama /api/generate: the prompt template, text the model reads
        _add(out, "system", body["template"], cut, read)
    if isinstance(body.get("inputText"), str):  # Amazon Titan on Bedrock InvokeModel
        _add(out, "user", body["inputText"], cut, read)
    items = body.get("input")  # Responses, LMSP
    if isinstance(items, str):
        _add(out, "user", items, cut, read)
    elif isinstance(items, list):
        for item in items:
            _add_item(out, item, cut, read)
    return out


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool a request declares: its name, and its description as sent ("" if none)."""

    name: str
    description: str = ""


def declared_tools(body: Any) -> list[Tool]:
    """The tools a request body declares, in the order it lists them; ``[]`` for other bodies."""
    if not isinstance(body, dict):
        return []
    config = body.get("toolConfig")  # Bedrock Converse: toolConfig.tools[].toolSpec
    lists = [body.get("tools"), body.get("functions"), config.get("tools") if isinstance(config, dict) else None]
    return [
        Tool(spec["name"], spec["description"] if isinstance(spec.get("description"), str) else "")
        for items in lists
        for spec in _tool_specs(items)
        if isinstance(spec.get("name"), str)
    ]


def tool_names(body: Any) -> frozenset[str]:
    """The names of the tools a request body declares (empty when it declares none)."""
    return frozenset(tool.name for tool in declared_tools(body))


def _tool_specs(items: Any) -> list[dict[str, Any]]:
    """The objects of a ``tools`` (or ``functions``) list that may name a tool: each item,
    its ``function`` and ``custom`` (Chat), and its function declarations (Gemini)."""
    specs: list[Any] = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            specs += [item, item.get("function"), item.get("custom"), item.get("toolSpec")]
            for nested in ("functionDeclarations", "function_declarations"):
                if isinstance(item.get(nested), list):
                    specs += item[nested]
    return [spec for spec in specs if isinstance(spec, dict)]


def token_prompts(body: Any) -> bool:
    """Whether a Completions body's ``prompt`` holds token ids (a list of integers, or of
    lists of them): text the model reads that no filter can."""
    prompt = body.get("prompt") if isinstance(body, dict) else None
    if not isinstance(prompt, list):
        return False
    return any(isinstance(p, int) or (isinstance(p, list) and p) for p in prompt)


def _add_item(out: list[Message], item: Any, cut: list[str], read: set[int]) -> None:
    if isinstance(item, str):
        _add(out, "user", item, cut, read)
    elif isinstance(item, dict):
        role, kind = item.get("role"), item.get("type")
        if not isinstance(role, str):
            role = _ITEM_ROLES.get(kind, "user") if isinstance(kind, str) else "user"
        _add(out, _ROLES.get(role, role), item, cut, read)


def _add(out: list[Message], role: str, value: Any, cut: list[str], read: set[int]) -> None:
    parts: list[str] = []
    if _collect(value, parts, 0, read):
        cut.append(f"a {role} message's text nested deeper than {_MAX_DEPTH} levels")
    text = "\n".join(p for p in parts if p)
    if text:
        out.append(Message(role, text))


def _collect(value: Any, parts: list[str], depth: int, read: set[int]) -> bool:
    """The text of ``value`` into ``parts`` (what it took into ``read``); whether text
    lay deeper than ``_MAX_DEPTH``."""
    if depth > _MAX_DEPTH:
        return _holds_text(value)
    deeper = False
    if isinstance(value, str):
        parts.append(value)
        read.add(id(value))
    elif isinstance(value, list):
        for v in value:
            deeper = _collect(v, parts, depth + 1, read) or deeper
    elif isinstance(value, dict):
        for key in _TEXT_KEYS:
            if key in value and not (key in _JSON_KEYS and isinstance(value[key], dict | list)):
                deeper = _collect(value[key], parts, depth + 1, read) or deeper
        for key in _JSON_KEYS:
            if isinstance(value.get(key), dict | list):
                parts.append(_json(value[key]))
                read.add(id(value[key]))
    return deeper


@dataclass(slots=True)
class Beside:
    """The strings of a body the conversation does not hold (:func:`strings_beside`)."""

    text: list[str]  # the rest of the body: documents, prompt variables, fields nobody lists
    declared: list[str]  # tool declarations and output schemas: the application's, not the user's
    whole: bool = True  # every value was walked (False: the body holds more than the budget)


def strings_beside(body: Any, read: set[int], budget: int = 1_000_000) -> Beside:
    """The strings of ``body`` the conversation does not hold (``read``: what
    :func:`extract_messages` took), in order: a document block's text, a prompt
    template's variables, fields of shapes this reader does not know; and apart, those of
    the tools it declares and the schemas of the output it asks for (:data:`_DECLARING_KEYS`),
    which the application writes, with their sample addresses and test card numbers. The
    model reads text wherever an API puts it, and a list of the keys that hold it is never
    complete, so the request filters read these too (beside the messages).

    Left out: object keys; a string (or a list of strings) that is structure or a label
    rather than text (:func:`_labels`: a ``role``, ``type`` or id anywhere, the request's
    own settings such as ``model`` or ``user`` at its top; an object under such a key is
    read: a schema's property may be called ``user``), and the request's ``metadata``;
    and bytes in base64 (:func:`_binary`: a data URL of a media type that is not text,
    and base64 where a key or its sibling says bytes, such as a thinking block's
    ``signature``), which the model does not read as words. At most ``budget`` values
    are walked (``whole`` says whether that was all)."""
    out = Beside([], [])
    stack: list[tuple[Any, Any, dict[str, Any] | None, bool]] = [(body, None, None, False)]
    while stack:
        budget -= 1
        if budget < 0:
            out.whole = False
            break
        value, key, parent, declared = stack.pop()
        if id(value) in read:
            continue
        top = parent is body
        if isinstance(value, str):
            if value and not (_labels(key, top) or _binary(value, key, parent)):
                (out.declared if declared else out.text).append(value)
        elif isinstance(value, list):
            if not (_labels(key, top) and all(isinstance(v, str) for v in value)):
                stack.extend((v, key, parent, declared) for v in reversed(value))
        elif isinstance(value, dict):
            here = value is body
            stack.extend(
                (v, k, value, declared or (here and k in _DECLARING_KEYS and isinstance(v, dict | list)))
                for k, v in reversed(value.items())
                if not (here and k == "metadata")
            )
    return out


def _labels(key: Any, top: bool) -> bool:
    """Whether strings under ``key`` are names and labels, not text (see :func:`strings_beside`):
    a message's or a part's ``role``, ``type`` or id anywhere, the request's own settings
    (``model``, ``user``, ``stop``, …) only at its top (a document may hold a ``user``)."""
    if not isinstance(key, str):
        return False
    return key in _STRUCTURE_KEYS or key.endswith(("_id", "Id")) or (top and key in _LABEL_KEYS)


def _binary(value: str, key: Any, parent: dict[str, Any] | None) -> bool:
    """Whether ``value`` is bytes in base64 rather than text: a data URL of a media type
    that is not text; or a value in base64's alphabet (text with spaces or punctuation is
    never skipped for its key) under a key that holds only base64, or the ``data``
    or ``bytes`` of a source or part whose type, media type or format says bytes."""
    if value.startswith("data:"):
        kind, _, rest = value[5:].partition(",")
        return bool(rest) and kind.endswith(";base64") and not kind.startswith("text/")
    if not _BASE64(value):  # (text: spaces, punctuation; whatever a key or a sibling says)
        return False
    if key in _BASE64_KEYS:
        return True
    if key in ("data", "bytes") and parent is not None:
        media = next((parent[k] for k in _MEDIA_KEYS if isinstance(parent.get(k), str)), "")
        form = parent.get("format")  # (OpenAI's input_audio: "wav", "mp3")
        return not media.startswith("text/") and (
            parent.get("type") in ("base64", "redacted_thinking")
            or bool(media)
            or key == "bytes"
            or (isinstance(form, str) and form not in _TEXT_FORMATS)
        )
    return False


# Top-level keys of what the application declares (an object or a list under them): its
# tools and the output's schema (Chat, Responses, Anthropic, Gemini, Ollama, vLLM).
_DECLARING_KEYS = frozenset(
    {
        "tools", "functions", "toolConfig", "tool_config", "response_format", "text", "format", "output_config",
        "output_format", "generationConfig", "generation_config", "guided_json", "structured_outputs",
    }
)  # fmt: skip
# Keys whose string values are structure, not text, wherever they are (see strings_beside).
_STRUCTURE_KEYS = frozenset({"role", "type", "id", "object", "mime_type", "mimeType", "media_type", "detail"})
# The request's own settings: labels at its top level.
_LABEL_KEYS = frozenset(
    {
        "model", "user", "safety_identifier", "prompt_cache_key", "service_tier", "reasoning_effort", "encoding",
        "stop", "tool_choice",
    }
)  # fmt: skip
_BASE64 = re.compile(r"[A-Za-z0-9+/=_-]+").fullmatch
# Keys whose values are only ever base64: a thinking block's signature, encrypted reasoning, images made.
_BASE64_KEYS = frozenset({"signature", "encrypted_content", "b64_json", "redacted_thinking"})
_MEDIA_KEYS = ("media_type", "mimeType", "mime_type")
_TEXT_FORMATS = frozenset({"txt", "text", "md", "markdown", "html", "csv"})
#: The role of the message of what a request declares (tools, output schemas), which the
#: PII detectors do not read: the application's samples, not the user's data.
DECLARED = "declared"


def _holds_text(value: Any, budget: int = 10_000) -> bool:
    """Whether ``value`` holds text the reader would take, at any depth (walked without
    recursion, at most ``budget`` values: past it, as if it did)."""
    stack = [value]
    while stack:
        budget -= 1
        if budget < 0:
            return True
        item = stack.pop()
        if isinstance(item, str):
            if item:
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item[key] for key in (*_TEXT_KEYS, *_JSON_KEYS) if key in item)
    return False


def _json(value: Any) -> str:
    """The JSON text of a structured field, however deeply nested (orjson writes 254 levels
    at most: deeper tool input must still be checked, not make the request unaudited)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json_text(value)
