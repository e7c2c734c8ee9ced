"""The endpoint's lock: `guilds serve` answers only whoever holds its token.

    server_token(data_dir) -> str          the token, made on first run (0600 file)
    EndpointLock(app, lock)                ASGI middleware in front of /mcp and the app
    Lock(token, hosts)                     what the middleware checks
    host_names(host, extra) -> names       the Host header names a bind accepts

Every HTTP request, in order:

1. **Host**: the Host header's name (port aside) must be one of ``lock.hosts``
   (else 400): a page of another site that rebinds its DNS name to this
   address is refused (DNS rebinding).
2. **Origin**: a request that carries an Origin must come from this very
   origin, ``http(s)://<its Host header>`` (else 403): another site's page
   cannot drive the endpoint from a visitor's browser.
3. **Token** (when ``lock.token`` is set):
   - ``Authorization: Bearer <token>``: every route; the only way into the MCP
     endpoint (``lock.resource_path``), which takes no cookie of any kind;
   - a one-time ``?token=<token>`` on a GET of the app: answered by a redirect
     to the same URL without it, setting the cookie ``guilds-session-<port>``
     (HttpOnly, SameSite=Strict, Path=/) to a new login session's random value
     (``guilds.web.sessions``), so the token stays neither in the address bar
     nor in the browser: a browser sends a cookie of 127.0.0.1 to every port
     of it, and whatever else listens there receives a session, not the token;
   - that cookie, on the app's routes: a live session lets in. The Cookie
     header is read pair by pair (``name=value`` between semicolons), so another
     local app's cookie that is not a plain token (JSON, spaces, quotes) does
     not hide the session's.
   Else 401. Tokens are compared in constant time; sessions are looked up by
   their SHA-256.
4. **Logout**: ``POST /logout`` (``LOGOUT_PATH``), let in as any route, ends the
   session its cookie holds, on the server, and clears the cookie; any other
   method there is answered 405. It takes ``Origin: null`` as well (what a
   browser sends for the app's own form, its pages being ``no-referrer``). Without a token (``--no-token``) there is no
   session to end: it only says so.

The token file is ``<data folder>/serve.token``, 0600, made once with
O_EXCL (two servers starting at once share one token). Whoever has the token
runs commands as the agent and reads every run.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from ..config.private import FILE_MODE, read_private
from ..errors import RecordError
from ..limits import APP_SESSION_MAX_AGE_SECONDS
from .sessions import Sessions

TOKEN_FILE = "serve.token"
TOKEN_BYTES = 32
"""256 random bits, as 43 URL-safe characters."""
MIN_TOKEN_CHARS = 32
"""A token file holding fewer characters is refused (an edited or truncated file)."""
COOKIE_PREFIX = "guilds-session-"
"""The session cookie's name ends with the server's port: two servers on one machine keep apart."""
TOKEN_PARAM = "token"
LOGOUT_PATH = "/logout"
LOGGED_OUT = ("Logged out: this browser's session has ended on the server. Open the URL `guilds serve` "
              "printed (it ends in ?token=...) to log in again.")
NO_LOGIN = "This server takes no token (--no-token): there is no login to end."
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
METADATA_PREFIX = "/.well-known/oauth-protected-resource"
"""RFC 9728's well-known path of a protected resource's metadata."""
PRINCIPAL_KEY = "guilds.principal"
"""The ASGI scope key of a let-in request's principal."""
RESOURCE_NAME = "guilds"


def principal(token: str | None) -> str:
    """Who a token is, without the token: "token:<16 hex of its SHA-256>"; "" for no token."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:16] if token else ""


def principal_of_scope(scope: Mapping[str, Any]) -> str:
    """The principal EndpointLock put in a request's scope; "" where no lock or no token."""
    return str(scope.get(PRINCIPAL_KEY, ""))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: only this machine can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_names(host: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The Host header names accepted when serving on ``host``: the loopback names,
    the address served on, and for any other bind the machine's own names, plus extra."""
    names = [*LOOPBACK_NAMES, host.strip("[]")]
    if not is_loopback(host):
        names += [socket.gethostname(), socket.getfqdn()]
    names += extra
    return tuple(dict.fromkeys(n.lower() for n in names if n and n not in ("0.0.0.0", "::")))


def server_token(data_dir: Path) -> str:
    """The server's token: read from the token file, or made there on first run (0600)."""
    path = Path(data_dir) / TOKEN_FILE
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return _read_token(path)
    except OSError as exc:
        raise RecordError(f"cannot make the token file {path}: {exc.strerror or exc}") from None
    try:
        os.write(fd, token.encode() + b"\n")
    except OSError as exc:
        os.unlink(path)
        raise RecordError(f"cannot write the token file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return token


def _read_token(path: Path) -> str:
    token = read_private(path).strip()
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise RecordError(f"the token file {path} does not hold a token; remove it to make a new one")
    return token


@dataclass(frozen=True)
class Lock:
    """What EndpointLock checks: ``token`` (None: no token asked, loopback only) and the
    Host header names accepted; ``resource_path``: the MCP endpoint's path."""

    token: str | None
    hosts: tuple[str, ...]
    resource_path: str = "/mcp"


def host_name(host_header: str) -> str:
    """The name of a Host header value, without its port: ``[::1]:80`` -> ``::1``."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


class EndpointLock:
    """ASGI middleware: the Host, Origin and token checks of the module docstring;
    ``sessions``: the app's login sessions (None: no login, the token alone is taken)."""

    def __init__(self, app: Callable, lock: Lock, sessions: Sessions | None = None):
        self.app, self.lock, self.sessions = app, lock, sessions

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket":  # none is served: refused before any check
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = await self._refusal(scope, headers)
        if refusal is None:
            await self.app({**scope, PRINCIPAL_KEY: principal(self.lock.token)}, receive, send)
        else:
            await _respond(send, *refusal)

    async def _refusal(self, scope: dict, headers: dict[str, str]) -> tuple[int, str, list] | None:
        host = headers.get("host", "")
        if host_name(host).lower() not in self.lock.hosts:
            return 400, "Invalid host header", []
        if (self.lock.token is not None and scope["path"] in self._metadata_paths()
                and scope.get("method") in ("GET", "HEAD")):
            return 200, self._metadata(scope, host), [(b"content-type", b"application/json"),
                                                      (b"access-control-allow-origin", b"*")]
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host) and not _logout_form(scope, origin):
            return 403, "Cross-origin request refused", []
        token = self.lock.token
        if scope["path"] == LOGOUT_PATH and scope.get("method") != "POST":
            return 405, "Log out with POST /logout", [(b"allow", b"POST")]
        if token is None:
            return (200, NO_LOGIN, []) if scope["path"] == LOGOUT_PATH else None
        resource = self._is_resource(scope["path"])
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        offered = [v for k, v in query if k == TOKEN_PARAM]
        if offered and not resource and scope.get("method") in ("GET", "HEAD"):
            return await self._login(scope, query, offered[0], token)
        bearer = _same(_bearer(headers.get("authorization")), token)
        if resource:
            return None if bearer else _unauthorized(self._challenge(scope, host, "authorization" in headers),
                                                     RESOURCE_REFUSAL)
        values = cookie_values(headers.get("cookie", ""), _cookie_name(scope))
        if not (bearer or await self._session_held(values, token)):
            return _unauthorized()
        return await self._logout(scope, values) if scope["path"] == LOGOUT_PATH else None

    async def _session_held(self, values: list[str], token: str) -> bool:
        if self.sessions is None:
            return False
        for value in values:
            if await self.sessions.holds(value, principal(token)):
                return True
        return False

    async def _login(self, scope: dict, query: list[tuple[str, str]], offered: str,
                     token: str) -> tuple[int, str, list]:
        """The one-time URL: a new session in the cookie, and the same URL without the token."""
        if not _same(offered, token) or self.sessions is None:
            return _unauthorized()
        rest = urlencode([(k, v) for k, v in query if k != TOKEN_PARAM])
        path = "/" + quote(scope.get("root_path", "") + scope["path"]).lstrip("/")  # never //other.host
        location = path + (f"?{rest}" if rest else "")
        set_cookie = _session_cookie(scope, await self.sessions.start(principal(token)),
                                     round(APP_SESSION_MAX_AGE_SECONDS))
        return 303, "Logged in", [(b"location", location.encode()), (b"set-cookie", set_cookie)]

    async def _logout(self, scope: dict, values: list[str]) -> tuple[int, str, list]:
        """The sessions the cookie names end here, and the browser is told to drop the cookie."""
        if self.sessions is not None:
            for value in values:
                await self.sessions.end(value)
        return 200, LOGGED_OUT, [(b"set-cookie", _session_cookie(scope, "", 0))]

    def _is_resource(self, path: str) -> bool:
        base = self.lock.resource_path.rstrip("/")
        return path == base or path.startswith(base + "/")

    def _metadata_paths(self) -> tuple[str, str]:
        return METADATA_PREFIX + self.lock.resource_path, METADATA_PREFIX

    def _metadata(self, scope: dict, host: str) -> str:
        """The RFC 9728 document of the MCP endpoint, as this Host reaches it."""
        return json.dumps({"resource": f"{_scheme(scope)}://{host}{self.lock.resource_path}",
                           "bearer_methods_supported": ["header"], "resource_name": RESOURCE_NAME})

    def _challenge(self, scope: dict, host: str, token_sent: bool) -> bytes:
        url = f"{_scheme(scope)}://{host}{self._metadata_paths()[0]}"
        return f'Bearer resource_metadata="{url}"'.encode() + (b', error="invalid_token"' if token_sent else b"")


def _scheme(scope: dict) -> str:
    return "https" if scope.get("scheme") == "https" else "http"


APP_REFUSAL = ("This server needs its token: open the URL `guilds serve` printed (it ends in ?token=...; "
               "again after the login sat idle or the token changed), or send the header "
               f"Authorization: Bearer <token> (the token is in the data folder's {TOKEN_FILE}).")
RESOURCE_REFUSAL = ("The MCP endpoint needs the header Authorization: Bearer <token> (the token is in the data "
                    f"folder's {TOKEN_FILE}); it takes no cookie.")


def _unauthorized(challenge: bytes = b"Bearer", text: str = APP_REFUSAL) -> tuple[int, str, list]:
    return 401, text, [(b"www-authenticate", challenge)]


def _logout_form(scope: dict, origin: str) -> bool:
    """The app's own Log out form: a browser sends ``Origin: null`` for a form of a page served
    with ``Referrer-Policy: no-referrer``. Taken at the logout only, which can do no more than
    end the session the request's own cookie names."""
    return origin == "null" and scope["path"] == LOGOUT_PATH and scope.get("method") == "POST"


def _same_origin(origin: str, host: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower() and not parts.path


def _cookie_name(scope: dict) -> str:
    server = scope.get("server") or (None, None)
    return f"{COOKIE_PREFIX}{server[1] or 0}"


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def _session_cookie(scope: dict, value: str, max_age: int) -> bytes:
    """The Set-Cookie of the session cookie (max_age 0: the browser drops it)."""
    return f"{_cookie_name(scope)}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict".encode()


def cookie_values(header: str, name: str) -> list[str]:
    """Every value a Cookie header gives name, pair by pair: ``name=value`` between
    semicolons, spaces around each trimmed. A pair that is not one (no ``=``, JSON, quotes,
    spaces inside) is another app's and is skipped, never the end of the reading."""
    values = []
    for pair in header.split(";"):
        key, sep, value = pair.partition("=")
        if sep and key.strip() == name:
            values.append(value.strip())
    return values


async def _respond(send: Callable, status: int, text: str, headers: list) -> None:
    body = (text + "\n").encode()
    plain = [(b"content-type", b"text/plain; charset=utf-8")]
    kind = [] if any(name == b"content-type" for name, _ in headers) else plain
    await send({"type": "http.response.start", "status": status, "headers": [
        *kind, (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"), *headers]})
    await send({"type": "http.response.body", "body": body})
