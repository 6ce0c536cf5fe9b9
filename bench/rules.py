"""The content-filter loads: 100 rules of every kind (section 3), and the TTFT section's rule sets.

The 100 rules are of the kinds a deployment writes, all blocking: keyword lists (project
code names), regular expressions (internal host names, ticket and employee numbers,
customer ids), the secrets detector and the PII detector (e-mail, card, IBAN), the
detectors once per direction (a rule scoped to requests and one to responses, as a
deployment that treats them differently writes them). Each keyword and pattern is a
little different so that none can share work with another. Every pattern is in the
syntax RE2 accepts (no lookarounds, no backreferences): user patterns are compiled by
RE2 where it is installed. None matches the benchmark's traffic, so every exchange is
checked in full and passes.
"""

from __future__ import annotations

from pathlib import Path

KEYWORD_RULES = 48
REGEX_RULES = 48
KEYWORDS_PER_RULE = 5
_BIRDS = ("Nightjar", "Kestrel", "Bluefin", "Osprey", "Merganser", "Whimbrel", "Dunlin", "Shrike")
_PATTERNS = (
    r"\b[a-z0-9-]+\.corp{i}\.example\.com\b",
    r"\bPRJ{i:03d}-[A-Z]{{4}}-\d{{2}}\b",
    r"\bEMP{i:02d}\d{{6}}\b",
    r"(?i)\bcustomer[-_ ]id[:= ]+c{i}x\d{{5,8}}\b",
    r"\bINC-{i}\d{{5}}-(?:sev1|sev2)\b",
)


def _rule(rule_id: str, kind: str, body: str = "", scope: str = "both") -> str:
    return f'[[rule]]\nid = "{rule_id}"\nkind = "{kind}"\n{body}scope = "{scope}"\naction = "block"\n'


def _keywords(i: int) -> str:
    words = [f"{_BIRDS[(i + k) % len(_BIRDS)]}-{i:02d}{k}" for k in range(KEYWORDS_PER_RULE)]
    return "keywords = [" + ", ".join(f'"{w}"' for w in words) + "]\n"


def rules_toml() -> str:
    """The 100 rules of section 3 as a ``llm_rules`` TOML file."""
    parts = [_rule(f"bench-keywords-{i:03d}", "keywords", _keywords(i)) for i in range(KEYWORD_RULES)]
    parts += [
        _rule(f"bench-regex-{i:03d}", "regex", f"pattern = '{_PATTERNS[i % len(_PATTERNS)].format(i=i)}'\n")
        for i in range(REGEX_RULES)
    ]
    for kind in ("secrets", "pii"):
        parts += [_rule(f"bench-{kind}-{scope}", kind, scope=scope) for scope in ("request", "response")]
    return "\n".join(parts)


RULE_COUNT = KEYWORD_RULES + REGEX_RULES + 4
DESCRIPTION = (
    f"{RULE_COUNT} blocking rules: {KEYWORD_RULES} keyword lists ({KEYWORDS_PER_RULE} keywords each), "
    f"{REGEX_RULES} regex, secrets and PII (email, card, IBAN) for requests and for responses (bench/rules.py)"
)

TTFT_RULES = {
    "keyword": _rule("bench-keyword", "keywords", 'keywords = ["Nightjar"]\n'),
    "secrets+pii": _rule("bench-secrets", "secrets") + "\n" + _rule("bench-pii", "pii"),
}
"""The TTFT section's rule sets: one blocking keyword rule alone; secrets plus PII (all types)."""


def write_rules(folder: Path) -> Path:
    path = folder / "bench-rules.toml"
    path.write_text(rules_toml())
    return path


def write_ttft_rules(folder: Path) -> dict[str, Path]:
    out = {}
    for name, text in TTFT_RULES.items():
        out[name] = folder / f"ttft-{name.replace('+', '-')}.toml"
        out[name].write_text(text)
    return out
