"""Tool-call arguments as the tool reads them: JSON text with its string escapes decoded.

A tool call's arguments stream as JSON text, and the tool receives ``json.loads`` of
them: ``{"city": "Vi\\u0065nna"}`` is Vienna to the tool, and a ``\\u0041KIA`` key is an
AWS key. So the output filters read the arguments with every escape decoded (``\\"``,
``\\\\``, ``\\/``, ``\\b\\f\\n\\r\\t``, ``\\uXXXX``, a surrogate pair as its one
character), wherever it is: a backslash is only valid JSON inside a string, and an
invalid escape is kept as it is. Pieces may cut an escape anywhere; its start is held
until it is whole (eleven characters at most, a surrogate pair's), and the character it
makes counts as the piece's that completes it, which is the earliest a client can read
it too.

Why by hand: ``json.loads`` reads only whole documents, and arguments arrive in pieces;
the escapes are a fixed, small table.
"""

from __future__ import annotations

_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonEscapes:
    """Decodes the JSON string escapes of a text that arrives in pieces."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""  # the start of an escape the last piece cut

    def feed(self, text: str) -> str:
        """The next piece, its whole escapes decoded (an escape it leaves cut is held)."""
        if self._held:
            text, self._held = self._held + text, ""
        find = text.find
        i = find("\\")
        if i < 0:
            return text
        out: list[str] = []
        start, n = 0, len(text)
        while i >= 0:
            out.append(text[start:i])
            if i + 1 == n:  # a lone backslash at the end: the escape goes on in the next piece
                self._held = text[i:]
                return "".join(out)
            c = text[i + 1]
            if c == "u":
                digits = text[i + 2 : i + 6]
                if not all(d in _HEX for d in digits):  # not an escape: kept as it is
                    out.append("\\u")
                    start = i + 2
                elif len(digits) < 4:  # (only hex digits so far, at the end)
                    self._held = text[i:]
                    return "".join(out)
                else:
                    code = int(digits, 16)
                    if 0xD800 <= code < 0xDC00:  # a high surrogate: with the low one after it, one character
                        low = text[i + 6 : i + 12]
                        if len(low) < 6 and "\\u".startswith(low[:2]) and all(d in _HEX for d in low[2:]):
                            self._held = text[i:]  # (the low one may still come)
                            return "".join(out)
                        if low[:2] == "\\u" and all(d in _HEX for d in low[2:]) and 0xDC00 <= int(low[2:], 16) < 0xE000:
                            out.append(chr(0x10000 + ((code - 0xD800) << 10) + int(low[2:], 16) - 0xDC00))
                            start = i + 12
                            i = find("\\", start)
                            continue
                    out.append(chr(code))
                    start = i + 6
            else:
                out.append(_SIMPLE.get(c, text[i : i + 2]))
                start = i + 2
            i = find("\\", start)
        out.append(text[start:])
        return "".join(out)
