"""The egress proxy: an HTTP proxy on a Unix socket that lets a sandbox reach listed hosts only.

What it takes from a client (the sandbox's relay):

- ``CONNECT host:port``: decided on that target alone (``policy.Allowlist.decide``),
  after resolving the name once (a pinned name from ``resolve`` is not looked up; a
  name that is not listed is never looked up); the tunnel goes to one of the
  checked addresses, never to a second lookup's. For a host a secret is for, the
  proxy ends the client's TLS itself (a leaf of ``ca.CertificateAuthority``), opens
  TLS to the host verifying its certificate against the host's trust store
  (``SSL_CERT_FILE`` honoured), and passes each request through: its ``Host`` must
  name the CONNECT target, a secret's placeholder becomes its value where the
  credential goes (``Authorization``, ``swap.swap_headers``), and the values become
  placeholders again in what comes back (``swap.Scrubber``). A host with header
  rules (``rules.Rules``) is intercepted the same way, each request given its
  rules' headers (replacing the client's of the same name); without an authority
  such a tunnel is refused. Any other tunnel is passed on as bytes.
- a plain HTTP request in absolute form (``GET http://host/path``) to a listed
  host, whose ``Host`` header (if any) names the URL's host; one request per
  connection, no secrets (a value never crosses the network in clear) but its
  host's rules' headers, and every secret's value scrubbed from the answer (a host
  that kept one shows the placeholder).

A rule's value is scrubbed as a secret's is, everywhere a secret's is.

Every refusal is an answer with a status, its one-line reason as both the status
line's phrase and the body (``guilds egress: api.example.com:443 is not in
agent.network``), and a line in the decisions file; no secret's value is in either
(``swap.scrub_text``). A failure the proxy did not foresee is answered 500 and
logged as one line on stderr (the proxy's log). At most ``EGRESS_CONNECTIONS_MAX``
connections are served at once; one more is answered 503 at once. ``Proxy-Authorization: Basic
base64(TAG:)`` names the call (the tag) and never goes further.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import SplitResult, urlsplit

from ..limits import (
    EGRESS_CONNECT_SECONDS,
    EGRESS_CONNECTIONS_MAX,
    EGRESS_HEAD_READ_SECONDS,
    EGRESS_PIPE_CHUNK,
    EGRESS_RESOLVE_SECONDS,
    EGRESS_TAG_MAX_CHARS,
)
from .decisions import DecisionLog, DecisionRecord
from .framing import Counter, pipe_body, request_framing, response_framing
from .http_head import BadHead, Head, HeadGone, parse_head, read_head
from .policy import Allowlist, IPAddress, address_of, normalize_host, split_host_port
from .proxy_config import ProxyConfig
from .rules import Headers
from .swap import Scrubber, Secret, scrub_text, swap_headers
from .tunnel import HostSide, splice

if TYPE_CHECKING:
    from .ca import CertificateAuthority

_Connection = TypeVar("_Connection", bound=tuple[Any, Any])

_HOP_HEADERS = ("Proxy-Authorization", "Proxy-Connection", "Keep-Alive", "Upgrade", "TE")
"""Headers that speak to the proxy or to one hop only, never passed on."""
ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
"""The answer to an allowed CONNECT, once the host has answered."""


class Refused(Exception):
    """A connection the proxy will not make: the status to answer and the one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def refusal_bytes(status: int, reason: str) -> bytes:
    """The whole answer to a refused request: the reason is the status line's phrase and the body."""
    phrase = reason.replace("\r", " ").replace("\n", " ")
    body = (phrase + "\n").encode("latin-1", "replace")
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1", "replace") + body


def tag_of(head: Head) -> str:
    """The call's tag from ``Proxy-Authorization: Basic base64(TAG:)``, "" without a good one."""
    value = head.get("Proxy-Authorization") or ""
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        user = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")[0]
    except (binascii.Error, ValueError):
        return ""
    if len(user) > EGRESS_TAG_MAX_CHARS or not user.isprintable():
        return ""
    return user


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class EgressProxy:
    """One sandbox's proxy: ``handle`` serves one client connection."""

    def __init__(self, config: ProxyConfig, log: DecisionLog, ca: CertificateAuthority | None = None) -> None:
        self.allow: Allowlist = config.allow
        self.rules = config.headers
        self.secrets = (*config.secrets, *self.rules.hidden())
        """Every value scrubbed: the secrets', then the rules' (for no host: never put in)."""
        self.resolve = config.resolve
        self.log = log
        self.ca = ca
        self._upstream_tls = ssl.create_default_context()
        self._upstream_tls.set_alpn_protocols(["http/1.1"])
        self._serving: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def close(self) -> None:
        """Cut every connection still served (each still writes its decision)."""
        self._stopping = True
        for task in self._serving:
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one connection from the sandbox, whatever happens; never raises."""
        record = DecisionRecord(host="", port=0)
        task = asyncio.current_task()
        if len(self._serving) >= EGRESS_CONNECTIONS_MAX:  # a flood from inside holds no more of the host
            self._refuse(writer, record, 503, f"guilds egress: {EGRESS_CONNECTIONS_MAX} connections are open "
                                              "through the proxy already; close some and try again")
            writer.close()
            return
        if task is not None:
            self._serving.add(task)
        try:
            raw = await asyncio.wait_for(read_head(reader), EGRESS_HEAD_READ_SECONDS)
            head = parse_head(raw)
            record.tag = tag_of(head)
            if head.first[0] == "CONNECT":
                await self._tunnel(head, reader, writer, record)
            else:
                await self._forward(head, reader, writer, record)
        except (BadHead, Refused) as refusal:
            self._refuse(writer, record, refusal.status, refusal.reason)
        except TimeoutError:
            self._refuse(writer, record, 408, "the request head did not arrive in time")
        except (HeadGone, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a side went away (or TLS failed): nothing to answer
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except Exception as unforeseen:  # noqa: BLE001 (a connection's fault never ends the proxy)
            self._unforeseen(writer, record, unforeseen)
        finally:
            if task is not None:
                self._serving.discard(task)
            if record.allowed:
                self.log.write(record)
            if self._stopping:  # no TLS goodbye to wait for: the process is ending
                writer.transport.abort()
            else:
                writer.close()

    def _unforeseen(self, writer: asyncio.StreamWriter, record: DecisionRecord, error: Exception) -> None:
        """A failure no branch foresaw: one line in the log, a 500 to the client."""
        line = scrub_text(f"{type(error).__name__}: {error}", self.secrets).replace("\n", " ")[:300]
        sys.stderr.write(f"guilds egress: serving a connection failed: {line}\n")
        sys.stderr.flush()
        self._refuse(writer, record, 500, "guilds egress: the proxy failed serving this request; see its log")

    def _refuse(self, writer: asyncio.StreamWriter, record: DecisionRecord, status: int, reason: str) -> None:
        reason = scrub_text(reason, self.secrets)
        record.allowed, record.reason = False, reason
        self.log.write(record)
        if not writer.is_closing():
            writer.write(refusal_bytes(status, reason))

    async def _decide(self, host: str, port: int, record: DecisionRecord) -> list[IPAddress]:
        """The addresses host:port may be reached at; Refused when it may not go out."""
        record.host, record.port = host, port
        literal = address_of(host)
        addresses: list[IPAddress] = []
        if literal is not None:
            addresses = [literal]
        elif host in self.resolve:
            addresses = [self.resolve[host]]
        elif self.allow.name_listed(host, port):  # a name not listed is never looked up
            addresses = await self._lookup(host, port)
        decision = self.allow.decide(host, port, addresses)
        if not decision.allowed:
            raise Refused(403, decision.reason)
        record.allowed, record.reason = True, decision.reason
        return addresses

    async def _lookup(self, host: str, port: int) -> list[IPAddress]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM),
                                           EGRESS_RESOLVE_SECONDS)
        except (OSError, TimeoutError) as failed:
            raise Refused(502, f"guilds egress: {_target(host, port)} does not resolve ({failed})") from None
        found: list[IPAddress] = []
        for info in infos:
            address = address_of(str(info[4][0]).partition("%")[0])
            if address is not None and address not in found:
                found.append(address)
        return found

    async def _open(self, host: str, port: int, addresses: Sequence[IPAddress],
                    tls: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream to the first checked address that answers (TLS verified for host when tls)."""
        return await self._first_answering(host, port, addresses, lambda address: asyncio.open_connection(
            address, port, ssl=self._upstream_tls if tls else None, server_hostname=host if tls else None,
            limit=EGRESS_PIPE_CHUNK))

    async def _open_raw(self, host: str, port: int, addresses: Sequence[IPAddress],
                        client: asyncio.StreamWriter, down: Counter) -> HostSide:
        """A raw tunnel's connection to the first checked address that answers."""
        loop = asyncio.get_running_loop()
        _, side = await self._first_answering(host, port, addresses, lambda address: loop.create_connection(
            lambda: HostSide(client, down, ESTABLISHED), address, port))
        return side

    async def _first_answering(self, host: str, port: int, addresses: Sequence[IPAddress],
                               connect: Callable[[str], Awaitable[_Connection]]) -> _Connection:
        failure = "no address"
        for address in addresses:
            try:
                return await asyncio.wait_for(connect(str(address)), EGRESS_CONNECT_SECONDS)
            except ssl.SSLCertVerificationError as bad:
                raise Refused(502, f"guilds egress: the certificate of {_target(host, port)} "
                                   f"failed verification: {bad.verify_message}") from None
            except (OSError, TimeoutError) as failed:
                failure = str(failed) or type(failed).__name__
        raise Refused(502, f"guilds egress: {_target(host, port)} cannot be reached ({failure})")

    async def _tunnel(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      record: DecisionRecord) -> None:
        host, port = _connect_target(head.first[1])
        addresses = await self._decide(host, port, record)
        secrets = [s for s in self.secrets if s.is_for(host, port)]
        headers = self.rules.for_host(host)
        if headers and self.ca is None:
            raise Refused(502, f"guilds egress: {_target(host, port)} has header rules, and the proxy has no "
                               "certificate authority to set them with")
        up, down = Counter(), Counter()
        try:
            if self.ca is not None and (secrets or headers):
                upstream = await self._open(host, port, addresses, tls=True)
                try:
                    writer.write(ESTABLISHED)
                    await writer.start_tls(self.ca.server_context(host), ssl_handshake_timeout=EGRESS_CONNECT_SECONDS)
                    await self._intercepted((host, port), (secrets, headers), (reader, writer), upstream, (up, down))
                finally:
                    upstream[1].close()
            else:
                await splice(reader, await self._open_raw(host, port, addresses, writer, down), up)
        finally:
            record.bytes_up, record.bytes_down = up.bytes, down.bytes

    async def _intercepted(self, host_port: tuple[str, int], puts: tuple[Sequence[Secret], Headers],
                           client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                           upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                           counters: tuple[Counter, Counter]) -> None:
        """Pass the requests of one intercepted tunnel, each checked, swapped (puts: the secrets
        for its host, the headers its rules set), until one side ends."""
        (host, port), (secrets, headers) = host_port, puts
        while True:
            try:
                head = parse_head(await read_head(client[0]))
            except HeadGone:
                return
            target = head.first[1]
            if not target.startswith("/"):
                raise BadHead(400, "a request inside a tunnel must have a path (origin form)")
            _check_host_header(head, host, port, required=True)
            head.headers, encoded = swap_headers(head.headers, secrets)
            head.remove(*_HOP_HEADERS)
            _set_all(head, headers)
            head.set("Accept-Encoding", "identity")  # the scrubber must see the body as sent
            scrubber = functools.partial(Scrubber, self.secrets, encoded)  # every value, not only this host's
            if not await _exchange(head, client, upstream, counters, scrubber):
                return

    async def _forward(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       record: DecisionRecord) -> None:
        url, host, port = _absolute_target(head.first[1])
        addresses = await self._decide(host, port, record)
        _check_host_header(head, host, port, required=False)
        upstream = await self._open(host, port, addresses, tls=False)
        up, down = Counter(), Counter()
        try:
            head.first = (head.first[0], (url.path or "/") + (f"?{url.query}" if url.query else ""), head.first[2])
            head.remove(*_HOP_HEADERS, "Connection")
            _set_all(head, self.rules.for_host(host))
            head.set("Connection", "close")
            scrubber = functools.partial(Scrubber, self.secrets) if self.secrets else None
            await _exchange(head, (reader, writer), upstream, (up, down), scrubber)
        finally:
            record.bytes_up, record.bytes_down = up.bytes, down.bytes
            upstream[1].close()


def _set_all(head: Head, headers: Headers) -> None:
    """head with each of headers set, any the client sent of the same name (any case) gone."""
    for name, value in headers:
        head.set(name, value)


def _absolute_target(target: str) -> tuple[SplitResult, str, int]:
    """A plain request's ``http://host[:port]/…`` split, its host normalized and its port;
    BadHead (400) naming what is wrong."""
    try:
        url = urlsplit(target)
        named = url.hostname
    except ValueError:
        raise BadHead(400, f"the request target is not a URL: {target[:80]!r}") from None
    if url.scheme.lower() != "http" or not named:
        raise BadHead(400, "the proxy takes CONNECT host:port, or a plain request to an absolute http:// URL")
    host = normalize_host(named)
    try:
        port = url.port or 80
    except ValueError:
        host = None
    if host is None:
        raise BadHead(400, f"the URL's host is not a host name or address: {url.netloc[:80]!r}")
    return url, host, port


def _connect_target(target: str) -> tuple[str, int]:
    try:
        raw_host, port = split_host_port(target)
    except ValueError:
        port = None
        raw_host = ""
    host = normalize_host(raw_host) if raw_host else None
    if host is None or port is None:
        raise BadHead(400, f"the CONNECT target is not host:port: {target[:80]!r}")
    return host, port


def _check_host_header(head: Head, host: str, port: int, *, required: bool) -> None:
    """Refuse a request whose Host header names another host (or port) than its target."""
    values = head.values("Host")
    if not values and not required:
        return
    named: tuple[str | None, int | None] = (None, None)
    if len(values) == 1:
        try:
            raw_host, named_port = split_host_port(values[0].strip())
            named = (normalize_host(raw_host), named_port)
        except ValueError:
            pass
    if named[0] != host or named[1] not in (None, port):
        shown = values[0][:80] if values else "(none)"
        raise Refused(403, f"guilds egress: the Host header {shown!r} differs from the target {_target(host, port)}")


async def _exchange(head: Head, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                    counters: tuple[Counter, Counter], scrubber: Callable[[], Scrubber] | None) -> bool:
    """One request and its answer (interim answers too); True when the connection may carry another."""
    up, down = counters
    framing = request_framing(head)
    upstream[1].write(head.encode())
    up.bytes += len(head.encode())
    sending = asyncio.create_task(pipe_body(client[0], upstream[1], framing, up))
    try:
        answer = await _relay_answer(head.first[0], upstream[0], client[1], down, scrubber)
        done = sending.done() and sending.exception() is None
    finally:
        if not sending.done():
            sending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(sending, return_exceptions=True)
    closes = any("close" in (h.get("Connection") or "").lower() for h in (head, answer))
    return done and not closes and answer.first[0] == "HTTP/1.1" and head.first[2] == "HTTP/1.1"


async def _relay_answer(method: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        down: Counter, make_scrubber: Callable[[], Scrubber] | None) -> Head:
    """Pass the answer to method back, values scrubbed when make_scrubber; return its final head."""
    while True:
        raw = await read_head(reader)
        scrubber = make_scrubber() if make_scrubber else None
        head = parse_head(scrubber.scrub(raw) if scrubber else raw, request=False)  # an error quotes it scrubbed
        status = int(head.first[1])
        if status == 101:
            raise BadHead(502, "the host switched protocols, which the proxy does not pass")
        writer.write(head.encode())
        down.bytes += len(head.encode())
        framing = response_framing(head, method)
        await pipe_body(reader, writer, framing, down, scrubber.feed if scrubber else None,
                        scrubber.flush if scrubber else None)
        if status >= 200:
            if framing.until_close:
                head.set("Connection", "close")
            return head
