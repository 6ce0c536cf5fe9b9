"""Who may read: the password, sessions, slowed logins, and the access log.

There is no default password: ``serve`` refuses to start without one, read from a file
only its owner can read (``--password-file``) or from ``$LLM_AUDIT_SERVE_PASSWORD``. A
login compares in constant time and earns a session: a random id, kept in memory
(logging out, or restarting the server, ends it) and sent in a cookie signed with a
secret made at start (``itsdangerous``), HttpOnly and SameSite=Strict. Failed logins are
slowed (a pause each) and limited per minute, so the password cannot be guessed at
speed. Every request is logged (who, what page, when, the status), never its content.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

ACCESS_LOG = "llm-audit.serve.access"
log = logging.getLogger(ACCESS_LOG)

ENV_VAR = "LLM_AUDIT_SERVE_PASSWORD"
COOKIE = "llm_audit_session"
SESSION_SECONDS = 8 * 3600  # a working day; then log in again
MIN_PASSWORD = 12  # characters: a password shorter than this is refused at start
FAILURE_PAUSE = 1.0  # seconds a failed login waits before it is answered
FAILURES_PER_MINUTE = 10  # beyond this, logins are refused for the rest of the minute
PATH_SAFE = "/:@!$&'()*+,;=-._~"  # what a logged path shows unencoded: RFC 3986's pchar but "%"


class PasswordError(Exception):
    """No usable password; the message is one line that names the fix."""


def read_password(password_file: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The password: the first line of ``password_file`` (owner-only), else ``$LLM_AUDIT_SERVE_PASSWORD``."""
    if password_file:
        path = Path(password_file).expanduser()
        try:
            mode = path.stat().st_mode
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise PasswordError(f"cannot read the password file {path}: {e.strerror or e}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PasswordError(
                f"the password file {path} can be read by others (mode {stat.S_IMODE(mode):o}): chmod 600 {path}"
            )
        password = text.splitlines()[0].strip() if text.strip() else ""
        where = f"the password file {path}"
    else:
        password = environ.get(ENV_VAR, "").strip()
        where = f"${ENV_VAR}"
        if not password:
            raise PasswordError(
                f"no password: set {ENV_VAR} or pass --password-file FILE (one line, chmod 600); "
                "there is no default password"
            )
    if len(password) < MIN_PASSWORD:
        raise PasswordError(f"the password in {where} is shorter than {MIN_PASSWORD} characters: choose a longer one")
    return password


@dataclass
class Sessions:
    """The logged-in sessions of one server run, and the pace of failed logins."""

    password: str = field(repr=False)  # neither may reach a log line or a traceback's locals
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _live: dict[str, tuple[str, float]] = field(default_factory=dict, repr=False)  # id: (name, expiry)
    _failures: deque[float] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._signer = TimestampSigner(self.secret, salt="llm-audit-serve-session")

    def check_password(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.password.encode())

    def too_many_failures(self) -> bool:
        """Whether logins are refused for now: too many failures in the last minute."""
        now = time.monotonic()
        while self._failures and self._failures[0] < now - 60:
            self._failures.popleft()
        return len(self._failures) >= FAILURES_PER_MINUTE

    def failed(self) -> None:
        self._failures.append(time.monotonic())

    def start(self, name: str) -> str:
        """A new session for ``name``; the signed cookie value."""
        now = time.time()
        for old in [sid for sid, (_, until) in self._live.items() if until < now]:  # memory stays bounded
            del self._live[old]
        session_id = secrets.token_urlsafe(24)
        self._live[session_id] = (name, now + SESSION_SECONDS)
        return self._signer.sign(session_id).decode()

    def who(self, cookie: str | None) -> str | None:
        """The name of a live session's cookie, else None (unsigned, expired, logged out)."""
        if not cookie:
            return None
        try:
            session_id = self._signer.unsign(cookie, max_age=SESSION_SECONDS).decode()
        except (BadSignature, SignatureExpired):
            return None
        live = self._live.get(session_id)
        if live is None or live[1] < time.time():
            self._live.pop(session_id, None)
            return None
        return live[0]

    def end(self, cookie: str | None) -> None:
        try:
            self._live.pop(self._signer.unsign(cookie or "", max_age=SESSION_SECONDS).decode(), None)
        except (BadSignature, SignatureExpired):
            pass


def log_access(client: str, who: str | None, method: str, path: str, status: int) -> None:
    """One access line: client, who (the name given at login), what, the answer's status.

    Every field may come from whoever sends a request (the path, before any login; the
    client, from a loopback proxy's ``X-Forwarded-For``; the name, typed at login): the
    path is written percent-encoded and the others with their unprintable characters
    escaped, so that no request can end the line and forge the next one, or send escape
    sequences to the terminal that shows the log.
    """
    log.info(
        "%s %s %s %s %d",
        _printable(client),
        _printable(who or "-"),
        _printable(method),
        quote(path, safe=PATH_SAFE),
        status,
    )


def _printable(text: str) -> str:
    """``text`` with what a terminal would act on, or a reader misread, escaped (and ``\\`` doubled)."""
    return "".join(c if c.isprintable() and c != "\\" else ascii(c)[1:-1] for c in text)
