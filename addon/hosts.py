"""Which hosts to decrypt when only inference traffic should be: mitmproxy's ``--allow-hosts``.

Auditing AI traffic must not mean reading everyone's banking sessions. With
``--allow-hosts REGEX`` mitmproxy decrypts only connections whose ``host:port`` (the
CONNECT target, the TLS SNI, the Host header or the server's address) the expression
matches; every other connection passes through as an opaque tunnel, with the server's
own certificate. The hosts are the known inference API hosts of
:mod:`addon.dialects.providers` plus the user's own (a gateway, a local model server),
from a file with one host pattern per line:

    # comments and blank lines are ignored
    llm-gateway.corp.example        # the host and its subdomains, any port
    *.inference.corp.example        # * : any run of letters, digits, "-" and "."
    10.0.0.5:8443                   # only this port

``llm-audit hosts`` prints the expression; ``scripts/proxy --llm-hosts-only`` passes it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from pathlib import Path

from addon.dialects.providers import HOSTS, host_regex

EXTRA_HOSTS_ENV = "LLM_AUDIT_EXTRA_HOSTS"
_PATTERN = re.compile(r"(?P<host>[a-z0-9*](?:[a-z0-9.*-]*[a-z0-9*])?)(?::(?P<port>[0-9]{1,5}))?", re.IGNORECASE)


def server_name(host: str, sni: str | None, host_header: str | None) -> str:
    """The name of the server a client asked for, as the records give it (``server_address``).

    A request's ``host`` is that name in the regular and reverse modes. In transparent and
    local capture mode it is only the address the connection was intercepted on: the name
    is then the TLS SNI (which mitmproxy checked the upstream's certificate against), else
    the ``Host`` header; the address stays when the client named no host.
    """
    if not _is_address(host):
        return host
    for name in (sni, _authority_host(host_header or "")):
        if name and not _is_address(name):
            return name.lower().rstrip(".")
    return host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _authority_host(authority: str) -> str:
    """``host`` of a ``Host`` header ``host[:port]`` or ``[v6]:port``."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.partition(":")[0]


#: The largest hosts file read: thousands of patterns fit in a few KiB.
MAX_HOSTS_FILE = 1 << 20


class HostsError(ValueError):
    """A hosts file that cannot be read or has a line that is not a host pattern."""


def read_extra_hosts(path: Path) -> list[str]:
    """The host patterns of a user's hosts file, in order. Only a regular file of at most
    :data:`MAX_HOSTS_FILE` bytes is read (``/dev/zero`` or a pipe would never end)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise HostsError(f"the hosts file {str(path)!r} is not a regular file; name a file of host patterns")
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTS_FILE + 1)
        if len(data) > MAX_HOSTS_FILE:
            raise HostsError(f"the hosts file {str(path)!r} is over {MAX_HOSTS_FILE >> 20} MiB; is it a hosts file?")
        lines = data.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HostsError(f"cannot read the hosts file {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None
    patterns = []
    for number, line in enumerate(lines, 1):
        pattern = line.split("#", 1)[0].strip()
        if not pattern:
            continue
        if _parse(pattern) is None:
            raise HostsError(
                f"{path}:{number}: {pattern!r} is not a host pattern; write one host per line, "
                "e.g. llm.example.com, *.corp.example or 10.0.0.5:8443"
            )
        patterns.append(pattern.lower())
    return patterns


def _parse(pattern: str) -> re.Match[str] | None:
    """A host pattern's host and port; ``None`` if it is not one (``*`` alone names no host)."""
    m = _PATTERN.fullmatch(pattern)
    if m is None or not re.search("[a-z0-9]", m["host"], re.IGNORECASE) or int(m["port"] or 1) > 65535:
        return None
    return m


def known_hosts() -> list[str]:
    """The host patterns of the known inference APIs."""
    return [pattern for pattern, _ in HOSTS]


def allow_hosts_expression(extra: list[str]) -> str:
    """One ``--allow-hosts`` regular expression for the known hosts and ``extra`` patterns.

    mitmproxy searches it (ignoring case) in ``host:port`` strings, so it is anchored at
    both ends: ``api.openai.com.evil.example`` does not match.
    """
    any_port = [host_regex(p) for p in known_hosts()]
    one_port = []
    for pattern in extra:
        m = _parse(pattern)
        if m is None:
            raise HostsError(f"{pattern!r} is not a host pattern")
        if m["port"]:
            one_port.append(f"{host_regex(m['host'])}:{int(m['port'])}")
        else:
            any_port.append(host_regex(m["host"]))
    alternatives = [f"(?:{'|'.join(any_port)}):[0-9]+", *one_port]
    return f"^(?:{'|'.join(alternatives)})$"


HOSTS_EXAMPLES = f"""\
mitmproxy then decrypts (and the addon audits) only connections to these hosts; every
other HTTPS connection passes through undecrypted, with the server's own certificate.
Plain-HTTP proxy requests are always seen: only CONNECT tunnels can pass through.

FILE (default: ${EXTRA_HOSTS_ENV}) adds hosts: one per line, '#' comments; a host
covers its subdomains, '*' any run of letters, digits, '-' and '.', ':PORT' one port.

examples:
  mitmdump -s addon/llm_audit.py --allow-hosts "$(llm-audit hosts)"
  llm-audit hosts --extra /etc/llm-audit/hosts       # plus a gateway, a local model server
  llm-audit hosts --list
  LLM_AUDIT_EXTRA_HOSTS=/etc/llm-audit/hosts scripts/proxy --llm-hosts-only
"""


def hosts_output(extra_file: str | None, listing: bool) -> str:
    """What ``llm-audit hosts`` prints: the expression, or with ``listing`` the patterns."""
    extra = read_extra_hosts(Path(extra_file).expanduser()) if extra_file else []
    return "\n".join([*known_hosts(), *extra]) if listing else allow_hosts_expression(extra)
