"""Requests to a port of an E2B sandbox from outside (``sandbox.get_host(port)``), proxied in.

A request is one of a sandbox's port when it names both, in one of E2B's two forms:

- host: its Host is ``<port>-<sandbox id>.<domain>``, ``<domain>`` a name this server
  answers to (the endpoint lock's names; the create answer's ``domain`` is one, with the
  server's port), which is what ``get_host`` builds;
- headers: ``E2b-Sandbox-Port`` (not the process service's, ``ENVD_PORT``) and
  ``E2b-Sandbox-Id``, its Host one of the server's own names.

Port ``ENVD_PORT`` in the host form is the in-sandbox API (``in_sandbox``), as in E2B.
Any other port is reached through a relay inside the sandbox (``ingress_reach``): only
what listens in the sandbox's own network is reached, never another sandbox's port or
one of the host's. Answers of E2B's proxy, JSON ``{"sandboxId", "message", ...}``:

- 403 when the sandbox is private (``ingress_options``) and ``e2b-traffic-access-token``
  is missing or not its token (another sandbox's is not);
- 502 when the sandbox is unknown, killed or never was, and 409 while it is paused (one
  whose create asked for auto-resume is resumed instead, and the request served);
- 502 ``The sandbox is running but port is not open`` when nothing of it listens there,
  when the port is one of guilds' own services in it (its egress relay), or when the
  server there breaks off before a whole response head;
- 429 past ``E2B_INGRESS_MAX_PER_SANDBOX`` requests to the sandbox's ports at once;
- 400 for a port out of 1..65535 or a header form without the sandbox's id.

The request goes in and its answer comes back streamed (``ingress_http``), one relay
per request; a WebSocket is the upgrade made again to the port and its messages passed
both ways (``ingress_ws``), on one relay while it is open. Ingress requests are not
calls of the sandbox's run.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import ipaddress
import json
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import GuildsError
from ...limits import E2B_INGRESS_MAX_PER_SANDBOX
from .connect import ConnectError
from .ingress_http import TOKEN_HEADER, NotPassedOn, forward
from .ingress_reach import PortClosed, PortLink, open_port
from .ingress_ws import proxy, websocket_answers
from .sandboxes import PAUSED, E2BSandbox, Sandboxes

ENVD_PORT = 49983
"""The port of a sandbox's process service in E2B (the SDKs' ``envd_port``)."""
_HOST_FORM = re.compile(r"([0-9]{1,5})-([A-Za-z0-9]+)\.(.+)")
PORT_NOT_OPEN = "The sandbox is running but port is not open"


@dataclass(frozen=True)
class Target:
    sandbox_id: str
    port: int
    host: str
    """The Host header the client sent."""


class Refused(Exception):
    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(body.get("message", ""))
        self.status, self.body = status, body


def host_name(host_header: str) -> str:
    """The name of a Host header value, without its port."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def target_of(headers: dict[str, str], hosts: tuple[str, ...]) -> Target | None:
    """The sandbox port a request names (the module docstring's forms), or None when it names
    none; Refused (400) for a bad one."""
    host = headers.get("host", "")
    named = _HOST_FORM.fullmatch(host)
    if named is not None and host_name(named[3]).lower() in hosts:
        return Target(named[2], _port(named[1]), host)
    port = headers.get("e2b-sandbox-port")
    if port is None or port.strip() == str(ENVD_PORT) or host_name(host).lower() not in hosts:
        return None
    sandbox_id = headers.get("e2b-sandbox-id", "")
    if not sandbox_id:
        raise Refused(400, {"message": "E2b-Sandbox-Port without E2b-Sandbox-Id", "code": 400})
    return Target(sandbox_id, _port(port.strip()), host)


def domain_of(base_url: str) -> str:
    """The domain of the sandboxes' host names for a server at base_url: its name (a loopback
    address as ``localhost``) and its port."""
    parts = urllib.parse.urlsplit(base_url)
    name = parts.hostname or "localhost"
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(name).is_loopback:
            name = "localhost"
    if ":" in name:
        name = f"[{name}]"
    return name if parts.port is None else f"{name}:{parts.port}"


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise Refused(400, {"message": f"invalid sandbox port {text[:16]!r}", "code": 400})
    return int(text)


class Ingress:
    """The ASGI handler of requests that name a sandbox's port (``target_of``)."""

    def __init__(self, sandboxes: Sandboxes, in_sandbox: Callable):
        """in_sandbox: the E2B routes' app, for ``ENVD_PORT`` in the host form."""
        self.sandboxes, self.in_sandbox = sandboxes, in_sandbox
        self.serving: collections.Counter[str] = collections.Counter()
        """The requests under way, by sandbox id."""

    async def __call__(self, scope: dict, receive: Callable, send: Callable, target: Target) -> None:
        if scope["type"] == "websocket":
            if (await receive())["type"] != "websocket.connect":
                return  # the client went before its upgrade was read
            send = websocket_answers(scope, send)
        if target.port == ENVD_PORT and scope["type"] == "websocket":
            await _answer(send, 400, {"message": "the in-sandbox API serves no WebSocket", "code": 400})
            return
        if target.port == ENVD_PORT:
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"e2b-sandbox-id"]
            await self.in_sandbox({**scope, "headers": [*headers, (b"e2b-sandbox-id", target.sandbox_id.encode())]},
                                  receive, send)
            return
        try:
            box = await self._allowed(scope, target)
        except Refused as refused:
            await _answer(send, refused.status, refused.body)
            return
        if self.serving[box.id] >= E2B_INGRESS_MAX_PER_SANDBOX:
            await _answer(send, 429, _too_many(box.id))
            return
        self.serving[box.id] += 1
        try:
            await self._serve(scope, receive, send, box, target)
        finally:
            self.serving[box.id] -= 1
            if not self.serving[box.id]:
                del self.serving[box.id]

    async def _serve(self, scope: dict, receive: Callable, send: Callable, box: E2BSandbox, target: Target) -> None:
        try:
            link = await self._link(box, target.port)
        except Refused as refused:
            await _answer(send, refused.status, refused.body)
            return
        host = box.ingress.host_for(target.port, target.host)
        try:
            if scope["type"] == "websocket":
                await proxy(scope, receive, send, link, host)
            else:
                await forward(scope, receive, send, link, host)
        except PortClosed:
            await _answer(send, 502, _not_open(box.id, target.port))
        except NotPassedOn as exc:
            await _answer(send, 400, {"sandboxId": box.id, "code": 400,
                                      "message": f"the request cannot be passed on: {exc}"})
        finally:
            await link.close()

    async def _allowed(self, scope: dict, target: Target) -> E2BSandbox:
        """The sandbox, running (woken first when paused with auto-resume) and its token (if any)
        given; Refused otherwise."""
        try:
            box = self.sandboxes.get(None, target.sandbox_id)
        except ConnectError:
            raise Refused(502, {"sandboxId": target.sandbox_id, "message": "The sandbox was not found",
                                "code": 502}) from None
        token = box.ingress.traffic_token
        if token is not None:
            given = _header(scope, TOKEN_HEADER)
            if given is None:
                raise Refused(403, _token_body(box.id, "is missing"))
            if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
                raise Refused(403, _token_body(box.id, "is invalid"))
        if box.state == PAUSED and not box.lifecycle.auto_resume:
            raise Refused(409, {"sandboxId": box.id, "message": "The sandbox is paused", "code": 409,
                                "canAutoResume": False})
        try:
            await self.sandboxes.awake(box)
        except (ConnectError, GuildsError) as exc:
            raise Refused(502, {"sandboxId": box.id, "code": 502,
                                "message": f"The sandbox could not be resumed: {exc}"}) from None
        return box

    async def _link(self, box: E2BSandbox, port: int) -> PortLink:
        if port in _own_ports(box):
            raise Refused(502, _not_open(box.id, port))
        try:
            return await open_port(box, port)
        except (PortClosed, TimeoutError):
            raise Refused(502, _not_open(box.id, port)) from None


def _own_ports(box: E2BSandbox) -> set[int]:
    """The ports of guilds' own services inside the sandbox: its egress relay's (as its proxy
    variables name it)."""
    egress = box.sandbox.egress
    if egress is None:
        return set()
    ports = set()
    for name, value in egress.env().items():
        if name.lower().endswith("_proxy"):
            with contextlib.suppress(ValueError):
                ports.add(urllib.parse.urlsplit(value).port)
    return {port for port in ports if port is not None}


def _token_body(sandbox_id: str, what: str) -> dict[str, Any]:
    which = "Token header" if what == "is missing" else "Provided token in header"
    return {"sandboxId": sandbox_id, "code": 403,
            "message": f"Sandbox is secured with traffic access token. {which} '{TOKEN_HEADER}' {what}"}


def _too_many(sandbox_id: str) -> dict[str, Any]:
    return {"sandboxId": sandbox_id, "code": 429, "connectionLimit": E2B_INGRESS_MAX_PER_SANDBOX,
            "message": f"The sandbox has too many concurrent incoming connections "
                       f"(limit: {E2B_INGRESS_MAX_PER_SANDBOX})"}


def _not_open(sandbox_id: str, port: int) -> dict[str, Any]:
    return {"sandboxId": sandbox_id, "message": PORT_NOT_OPEN, "port": str(port)}


def _header(scope: dict, name: str) -> str | None:
    for key, value in scope["headers"]:
        if key.decode("latin-1").lower() == name:
            return value.decode("latin-1")
    return None


async def answer_refused(send: Callable, refused: Refused) -> None:
    await _answer(send, refused.status, refused.body)


async def _answer(send: Callable, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json; charset=utf-8"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
