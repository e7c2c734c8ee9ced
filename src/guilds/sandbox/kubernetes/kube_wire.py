"""A lean way to the API server for the claim mode's calls: JSON requests, a watch
and pods/exec websockets, with the standard library and websocket-client only.

Importing the kubernetes client costs a call process about half a second (its
thousand model classes), more than the rest of a later call in claim mode. A
``Wire`` speaks the few requests a call needs itself:

- ``Wire.from_kubeconfig()``: the kubeconfig's current context (KUBECONFIG's first
  file, else ~/.kube/config): an https server, its CA (a file or inline data, or
  ``insecure-skip-tls-verify``), and a client certificate and key (files or inline
  data) or a bearer token (inline or ``tokenFile``). A kubeconfig it does not read
  (an exec plugin, an auth provider, a user name and password; none at all)
  gives None, and the caller takes ``Wire.from_configuration`` of the kubernetes
  client's own configuration instead (in-cluster too);
- ``request(method, path, body)``: one JSON request; a refusal is ``WireError``
  (its status, reason and body, as the API server said them); inside ``kept()``,
  the thread's requests share one connection (one TLS handshake for the reads
  a later call makes), a new one taken when the server had closed it;
- ``watch(path, seconds)``: the events of a watch, one JSON object each;
- ``open_exec(namespace, pod, container, command)``: a pods/exec websocket with
  stdin, offering v5.channel.k8s.io then v4; ``exec_stream(...)``: one command
  read until it closes or the deadline (stdout head, stderr tail, channel 3's
  final Status). A handshake answered 404 is ``PodGone``: nothing ran.

Inline key data is written to a 0600 file only while the TLS context loads it.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from ...limits import KUBERNETES_FRAME_WAIT_SECONDS, KUBERNETES_REQUEST_SECONDS
from .._spawn import STDERR_KEEP_BYTES, STDOUT_MAX_BYTES
from . import kube_spec as spec

REQUEST_SECONDS = KUBERNETES_REQUEST_SECONDS
PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3


class PodGone(Exception):
    """The exec's handshake answered 404: the pod is gone; nothing ran."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class WireError(Exception):
    """The API server refused a request (status 0: it did not answer)."""

    def __init__(self, status: int, reason: str, body: str = ""):
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


def _kubeconfig() -> dict[str, Any] | None:
    import yaml  # type: ignore[import-untyped]

    path = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _named(doc: dict[str, Any], kind: str, name: Any) -> dict[str, Any]:
    for item in doc.get(kind) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return dict(item.get(kind[:-1]) or {})
    return {}


def _load_chain(context: ssl.SSLContext, user: dict[str, Any]) -> None:
    """The user's client certificate and key into context (inline data through a 0600 file)."""
    cert, key = user.get("client-certificate"), user.get("client-key")
    if cert and key:
        context.load_cert_chain(cert, key)
        return
    with tempfile.TemporaryDirectory(prefix="guilds-kube-") as folder:
        paths = []
        for field in ("client-certificate-data", "client-key-data"):
            path = os.path.join(folder, field)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64decode(user[field]))
            paths.append(path)
        context.load_cert_chain(paths[0], paths[1])


class Wire:
    """The API server at server (``https://host:port`` or ``http://``), with context for
    TLS and headers on every request (the bearer token, when there is one)."""

    def __init__(self, server: str, context: ssl.SSLContext | None, headers: dict[str, str]):
        url = urllib.parse.urlsplit(server)
        self.server, self.secure = server.rstrip("/"), url.scheme == "https"
        self.host, self.port = url.hostname or "", url.port or (443 if self.secure else 80)
        self.context, self.headers = context, headers
        self._kept = threading.local()
        """The calling thread's connection inside ``kept()``."""

    @classmethod
    def from_kubeconfig(cls) -> Wire | None:
        """The kubeconfig's current context, when it is of the kinds this reads (else None)."""
        doc = _kubeconfig()
        if doc is None:
            return None
        ctx = _named(doc, "contexts", doc.get("current-context"))
        cluster, user = _named(doc, "clusters", ctx.get("cluster")), _named(doc, "users", ctx.get("user"))
        server = str(cluster.get("server") or "")
        if not server.startswith("https://") or set(user) & {"exec", "auth-provider", "username"}:
            return None
        context = ssl.create_default_context(
            cafile=cluster.get("certificate-authority"),
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
            if cluster.get("certificate-authority-data") else None)
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if cluster.get("tls-server-name"):
            return None
        headers = {}
        token = user.get("token") or (Path(user["tokenFile"]).read_text().strip() if user.get("tokenFile") else "")
        if token:
            headers["authorization"] = f"Bearer {token}"
        elif {"client-certificate", "client-key"} <= set(user) or \
                {"client-certificate-data", "client-key-data"} <= set(user):
            _load_chain(context, user)
        return cls(server, context, headers)

    @classmethod
    def from_configuration(cls, config: Any) -> Wire:
        """The kubernetes client's ``Configuration`` (its files, its token) as a Wire."""
        if getattr(config, "refresh_api_key_hook", None):
            config.refresh_api_key_hook(config)
        context = None
        if config.host.startswith("https://"):
            context = ssl.create_default_context(cafile=config.ssl_ca_cert or None)
            if not config.verify_ssl:
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            if config.cert_file and config.key_file:
                context.load_cert_chain(config.cert_file, config.key_file)
        token = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
        return cls(config.host, context, {"authorization": token} if token else {})

    # --- JSON requests ------------------------------------------------------------------
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.secure:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """The thread's requests in the block share one connection, closed at its end."""
        if getattr(self._kept, "open", False):
            yield
            return
        self._kept.open, self._kept.conn = True, None
        try:
            yield
        finally:
            conn, self._kept.conn, self._kept.open = self._kept.conn, None, False
            if conn is not None:
                conn.close()

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json") -> dict[str, Any]:
        """One request, on a connection of its own or the thread's kept one; its JSON
        answer. Raises WireError."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "accept": "application/json"}
        if data is not None:
            headers["content-type"] = content_type
        keeping = getattr(self._kept, "open", False)
        for _ in range(2):
            conn, reused = (self._kept.conn, True) if keeping and self._kept.conn is not None else \
                (self._connection(REQUEST_SECONDS), False)
            try:
                conn.request(method, path, body=data, headers=headers)
                answer = conn.getresponse()
                text = answer.read().decode("utf-8", "replace")
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                if keeping:
                    self._kept.conn = None
                if reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionError)):
                    continue  # the server had closed the kept connection: once more on a new one
                raise WireError(0, str(exc) or type(exc).__name__) from None
            if keeping and not answer.will_close:
                self._kept.conn = conn
            else:
                conn.close()
                if keeping:
                    self._kept.conn = None
            break
        if answer.status >= 400:
            raise WireError(answer.status, answer.reason, text)
        return dict(json.loads(text or "{}"))

    def watch(self, path: str, seconds: int) -> Generator[dict[str, Any], None, None]:
        """The events of a watch request (path with its query, ``watch=1`` added) for
        at most seconds, on a connection of its own."""
        conn = self._connection(seconds + REQUEST_SECONDS)
        try:
            query = f"&watch=1&timeoutSeconds={seconds}"
            conn.request("GET", path + query, headers={**self.headers, "accept": "application/json"})
            answer = conn.getresponse()
            if answer.status >= 400:
                raise WireError(answer.status, answer.reason, answer.read().decode("utf-8", "replace"))
            for line in answer:
                if line.strip():
                    yield dict(json.loads(line))
        except (http.client.HTTPException, OSError) as exc:
            raise WireError(0, str(exc) or type(exc).__name__) from None
        finally:
            conn.close()

    # --- pods/exec ------------------------------------------------------------------------
    def open_exec(self, namespace: str, pod: str, command: list[str], *, stdin: bool = True) -> Any:
        """A connected ``websocket.WebSocket`` to pods/exec of command in the sandbox container."""
        import websocket

        query = urllib.parse.urlencode(
            [("container", spec.CONTAINER), ("stdin", str(stdin).lower()), ("stdout", "true"),
             ("stderr", "true"), ("tty", "false"), *(("command", part) for part in command)])
        scheme = "wss" if self.secure else "ws"
        url = f"{scheme}://{self.host}:{self.port}/api/v1/namespaces/{namespace}/pods/{pod}/exec?{query}"
        header = [f"{k}: {v}" for k, v in self.headers.items()]
        header.append(f"sec-websocket-protocol: {','.join(PROTOCOLS)}")
        ws = websocket.WebSocket(sslopt={"context": self.context} if self.context else {})
        try:
            ws.connect(url, header=header, timeout=REQUEST_SECONDS)
        except websocket.WebSocketBadStatusException as exc:
            ws.shutdown()
            body = exc.resp_body.decode("utf-8", "replace") if isinstance(exc.resp_body, bytes) else ""
            if exc.status_code == 404:
                raise PodGone(spec.api_error_text("exec", 404, "", body, "")) from None
            raise WireError(exc.status_code, str(exc).split("\n")[0], body) from None
        except (websocket.WebSocketException, OSError) as exc:
            ws.shutdown()
            raise WireError(0, str(exc) or type(exc).__name__) from None
        ws.settimeout(None)
        return ws

    def exec_stream(self, namespace: str, pod: str, command: list[str], stdin: bytes,
                    deadline: float) -> tuple[bytes, bytes, bytes, bool]:
        """Run command: (stdout head, stderr tail, channel 3's status, complete)."""
        from websocket import ABNF, WebSocketTimeoutException

        ws = self.open_exec(namespace, pod, command, stdin=bool(stdin))
        out, err, status, complete = bytearray(), bytearray(), bytearray(), False
        try:
            if stdin:
                ws.send_binary(bytes([STDIN]) + stdin)
            while (left := deadline - time.monotonic()) > 0:
                ws.settimeout(min(left, KUBERNETES_FRAME_WAIT_SECONDS))
                try:
                    opcode, frame = ws.recv_data_frame(True)
                except WebSocketTimeoutException:
                    continue
                except Exception:  # noqa: BLE001 - closed or reset: the end of the stream either way
                    complete = True
                    break
                if opcode == ABNF.OPCODE_CLOSE:
                    complete = True
                    break
                data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
                channel, payload = (data[0], data[1:]) if data else (-1, b"")
                if channel == STDOUT:
                    out += payload[: STDOUT_MAX_BYTES - len(out)]
                elif channel == STDERR:
                    err += payload
                    del err[:-STDERR_KEEP_BYTES]
                elif channel == STATUS:
                    status += payload
            return bytes(out), bytes(err), bytes(status), complete
        finally:
            with contextlib.suppress(Exception):
                ws.close(timeout=0)
            ws.shutdown()  # close() leaves the socket open once the server's close frame came
