"""The content-filter load of section 3: 100 regular-expression rules and the secrets detector.

The patterns are of the kinds a deployment writes (internal host names, project code
names, ticket and employee numbers, customer ids), each a little different so that
none can share work with another, all scoped to requests and responses, and blocking;
none matches the benchmark's traffic, so every exchange is checked in full and passes.
"""

from __future__ import annotations

from pathlib import Path

_KINDS = (
    r"\b[a-z0-9-]+\.corp{i}\.example\.com\b",
    r"\bPRJ{i:03d}-[A-Z]{{4}}-\d{{2}}\b",
    r"\bEMP{i:02d}\d{{6}}\b",
    r"(?i)\bcustomer[-_ ]id[:= ]+c{i}x\d{{5,8}}\b",
    r"\bINC-{i}\d{{5}}-(?:sev1|sev2)\b",
)


def rules_toml(count: int = 100) -> str:
    """``count`` regex rules plus one secrets rule, as a ``llm_rules`` TOML file."""
    parts = []
    for i in range(count):
        pattern = _KINDS[i % len(_KINDS)].format(i=i)
        parts.append(
            f'[[rule]]\nid = "bench-regex-{i:03d}"\nkind = "regex"\npattern = \'{pattern}\'\n'
            'scope = "both"\naction = "block"\n'
        )
    parts.append('[[rule]]\nid = "bench-secrets"\nkind = "secrets"\nscope = "both"\naction = "block"\n')
    return "\n".join(parts)


def write_rules(folder: Path, count: int = 100) -> Path:
    path = folder / "bench-rules.toml"
    path.write_text(rules_toml(count))
    return path
