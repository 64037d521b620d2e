"""The console's access link: who may open the pages when the console holds a token.

``AccessGate`` is an ASGI middleware in front of everything but ``/healthz``: the link's
``?token=`` becomes a session cookie, a Bearer token serves scripts, anything else gets 401. A
console with no token (behind an authenticating proxy) has no gate.

Why and how: docs/console.md, "Limits" (one key, the operator's powers).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_PARAMETER = "token"
OPEN_PATHS = frozenset({"/healthz"})
"""Answered without the token: the liveness probe says nothing about the jobs."""
MIN_TOKEN_LENGTH = 32

REFUSED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mdq console: access link needed</title>
<style>body{font:16px/1.5 system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;
color:#1b1f24}code{background:#eef1f4;padding:0 .25rem}</style></head>
<body><main>
<h1>This console needs its access link</h1>
<p>The link is the console's address with its token, printed by <code>mdq up</code>. On the
machine that runs the stack, as the account that started it, <code>mdq console</code> prints it
again.</p>
</main></body></html>
"""


def read_token(path: Path) -> str:
    """The token in ``path``; refused when it is too short to be a secret."""
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{path}: the console's token must be at least {MIN_TOKEN_LENGTH} characters"
        )
    return token


def session_value(token: str) -> str:
    """What the session cookie holds: an HMAC of the token (the token itself never sits in a
    cookie)."""
    return hmac.new(token.encode(), b"mdq-console-session", hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    """The session cookie's name for the console on ``port`` (cookies ignore ports)."""
    return f"mdq_console_{port}"


class AccessGate:
    """Lets through only requests that carry the console's token or its session cookie."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self._app = app
        self._token = token
        self._session = session_value(token)

    def _is(self, given: str | None, expected: str) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), expected.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self._app(scope, receive, send)
            return
        request = Request(scope)
        port = (scope.get("server") or ("", 0))[1] or 0
        name = cookie_name(port)
        given = request.query_params.get(TOKEN_PARAMETER)
        if given is not None:
            if not self._is(given, self._token):
                await HTMLResponse(REFUSED_PAGE, status_code=401)(scope, receive, send)
                return
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != TOKEN_PARAMETER]
            target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303)
            response.set_cookie(name, self._session, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        bearer = request.headers.get("authorization", "")
        if self._is(request.cookies.get(name), self._session) or (
            bearer.startswith("Bearer ") and self._is(bearer.removeprefix("Bearer "), self._token)
        ):
            await self._app(scope, receive, send)
            return
        await HTMLResponse(REFUSED_PAGE, status_code=401)(scope, receive, send)
