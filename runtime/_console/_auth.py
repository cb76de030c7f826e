"""Who may use the console: a one-time login URL, then a session cookie; CSRF tokens for actions.

``stratagem console`` holds the operator's credentials (it talks to the agents through the
operator API, as the CLI does). A browser gets in only by opening the login URL the command
printed, once: its token is spent on first use, and the browser gets a session cookie instead
(``HttpOnly``, ``SameSite=Strict``, ``Secure`` over TLS). Each session has its own CSRF token,
which every action must send back (a form field or the ``X-CSRF-Token`` header); an action from
another origin is refused before that. Sessions live in this process only: a restarted console
prints a new login URL and every old cookie stops working.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

__all__ = ["CSRF_FIELD", "CSRF_HEADER", "Session", "Sessions"]

CSRF_FIELD: Final = "csrf_token"
"""The form field an action's CSRF token travels in."""
CSRF_HEADER: Final = "x-csrf-token"
"""The header an action's CSRF token travels in (htmx sends it on every request)."""


@dataclass(slots=True)
class Session:
    """One browser signed in as the operator.

    Attributes:
        session_id: The cookie's value (a secret: whoever holds it acts as the operator).
        csrf_token: What every action of this session must send back.
        created: When it signed in (wall clock).
        seen: When it last made a request (wall clock).
    """

    session_id: str
    csrf_token: str
    created: float
    seen: float

    def csrf_ok(self, sent: str | None) -> bool:
        """Whether ``sent`` is this session's CSRF token (compared in constant time)."""
        return bool(sent) and hmac.compare_digest(str(sent), self.csrf_token)


@dataclass(slots=True)
class Sessions:
    """The login tokens not yet used and the sessions signed in.

    Args:
        idle_s: A session unused this long is signed out.
        clock: Wall-clock seconds (a test passes its own).
    """

    idle_s: float = 12 * 3600.0
    clock: Callable[[], float] = time.time
    _logins: set[str] = field(default_factory=set)
    _sessions: dict[str, Session] = field(default_factory=dict)

    def login_token(self) -> str:
        """A new one-time login token (what the login URL carries)."""
        token = secrets.token_urlsafe(32)
        self._logins.add(token)
        return token

    def sign_in(self, token: str) -> Session | None:
        """Spend a login token on a new session; ``None`` when it is unknown or already spent."""
        if token not in self._logins:
            return None
        self._logins.discard(token)
        now = self.clock()
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now, now)
        self._sessions[session.session_id] = session
        return session

    def session(self, session_id: str | None) -> Session | None:
        """The live session a cookie names (its idle time restarts), else ``None``."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.idle_s:
            del self._sessions[session_id]
            return None
        session.seen = now
        return session

    def sign_out(self, session_id: str) -> None:
        """End a session (its cookie stops working)."""
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)
