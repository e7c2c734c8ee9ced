"""The kubernetes backend's edge with the cluster: connecting, pods/exec, its errors.

- ``connect()``: a CoreV1Api from the kubeconfig (KUBECONFIG, else
  ~/.kube/config), else from the service account of the pod this runs in;
- ``exec_stream(core, ...)``: a command over the pods/exec websocket, with
  optional stdin, read until it closes or the deadline (stdout head, stderr
  tail, the final Status of channel 3);
- ``open_exec(core, ...)``: a command over a pods/exec websocket with stdin
  kept open (the resident helper), offering v5.channel.k8s.io then v4;
- ``api_errors(what, namespace)``: the client's errors as SandboxError, in this one place;
- ``ignoring(status)``: an ApiException of that status passes (404 on delete, 409 on create);
- ``PodGone``: an exec refused because the pod is not there (HTTP 404 on the
  websocket's handshake): nothing ran, so the call may be made again on a new pod.

The client is imported only here and only when used.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from typing import Any, Iterator

from ...errors import SandboxError
from ...limits import KUBERNETES_FRAME_WAIT_SECONDS
from .._spawn import STDERR_KEEP_BYTES, STDOUT_MAX_BYTES
from . import kube_spec as spec
from .kube_wire import PodGone, WireError

_HANDSHAKE = re.compile(r"Handshake status (\d{3})")


@contextlib.contextmanager
def handshake_errors() -> Iterator[None]:
    """A refused websocket handshake as the API's own error: its HTTP status and body
    (the client reports it as status 0, which would read as an unreachable cluster)."""
    from kubernetes.client.exceptions import ApiException
    from websocket import WebSocketBadStatusException

    try:
        yield
    except (ApiException, WebSocketBadStatusException) as exc:
        text = str(exc.reason if isinstance(exc, ApiException) else exc)
        found = _HANDSHAKE.search(text)
        if found is None or (isinstance(exc, ApiException) and exc.status):
            raise
        status, body = int(found.group(1)), text.rsplit("-+-+-", 1)[-1].strip()
        if not body.startswith("{"):  # the kubelet's own refusals are plain text
            body = json.dumps({"message": body})
        if status == 404:
            raise PodGone(spec.api_error_text("exec", 404, "", body, "")) from exc
        refused = ApiException(status=status, reason=text.split("-+-+-", 1)[0].strip())
        refused.body = body
        raise refused from exc




def connect(api_client: Any = None) -> Any:
    """A CoreV1Api on api_client, else on the kubeconfig's cluster, else in-cluster."""
    from kubernetes import client, config

    if api_client is None:
        try:
            api_client = config.new_client_from_config()
        except config.ConfigException:
            config.load_incluster_config()
            api_client = client.ApiClient()
    return client.CoreV1Api(api_client)


def _client_errors() -> tuple[type[BaseException], ...]:
    """The client's error types, when it was imported (else none of them can be raised)."""
    if "kubernetes.client" not in sys.modules:
        return ()
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError, ConfigException


@contextlib.contextmanager
def api_errors(what: str, namespace: str) -> Iterator[None]:
    """Map the client's errors and a Wire's to SandboxError naming what was being done
    (without importing the client where it was not imported)."""
    try:
        yield
    except WireError as exc:
        raise SandboxError(spec.api_error_text(what, exc.status, exc.reason, exc.body or None, namespace)) from exc
    except Exception as exc:
        known = _client_errors()
        if known and isinstance(exc, known[0]):
            raise SandboxError(spec.api_error_text(what, exc.status or 0, exc.reason or "",  # type: ignore[attr-defined]
                                                   exc.body, namespace)) from exc  # type: ignore[attr-defined]
        if isinstance(exc, (*known[1:], OSError)):
            raise SandboxError(spec.api_error_text(what, 0, str(exc), None, namespace)) from exc
        raise


@contextlib.contextmanager
def ignoring(status: int) -> Iterator[None]:
    """A refusal of that status passes (the client's or a Wire's)."""
    try:
        yield
    except Exception as exc:
        known: tuple[type[BaseException], ...] = (WireError, *_client_errors()[:1])
        if not isinstance(exc, known) or getattr(exc, "status", None) != status:
            raise


def exec_stream(core: Any, pod: str, namespace: str, command: list[str], stdin: bytes,
                deadline: float) -> tuple[bytes, bytes, bytes, bool]:
    """Run command in the pod's sandbox container: (stdout head, stderr tail, status, complete).

    The exec goes through an ApiClient of its own: ``stream`` swaps its client's request
    method for a websocket one while it runs, so a call of another thread on a shared
    client (writing the secret, deleting the pod) would go out as a websocket handshake."""
    from kubernetes import client
    from kubernetes.stream import stream

    own = client.CoreV1Api(client.ApiClient(core.api_client.configuration))
    with handshake_errors():
        ws = stream(own.connect_get_namespaced_pod_exec, pod, namespace, container=spec.CONTAINER,
                    command=command, stdin=bool(stdin), stdout=True, stderr=True, tty=False,
                    _preload_content=False, binary=True)
    out, err = bytearray(), bytearray()
    try:
        if stdin:
            ws.write_stdin(stdin)
        while ws.is_open() and (left := deadline - time.monotonic()) > 0:
            ws.update(timeout=min(left, KUBERNETES_FRAME_WAIT_SECONDS))
            out += (ws.read_channel(1) or b"")[: STDOUT_MAX_BYTES - len(out)]  # "" when none came
            err += ws.read_channel(2) or b""
            del err[:-STDERR_KEEP_BYTES]
        return bytes(out), bytes(err), ws.read_channel(3), not ws.is_open()
    finally:
        ws.close()
        if ws.sock is not None:  # after the server's close frame, close() leaves the socket open
            ws.sock.shutdown()


EXEC_PROTOCOLS = "v5.channel.k8s.io,v4.channel.k8s.io"
"""Offered in this order: v5 can close stdin alone (channel 255); v4 only by closing."""


def open_exec(core: Any, pod: str, namespace: str, command: list[str]) -> Any:
    """A connected ``websocket.WebSocket`` to pods/exec of command, stdin attached."""
    from kubernetes.stream.ws_client import create_websocket, get_websocket_url

    config = core.api_client.configuration
    if getattr(config, "refresh_api_key_hook", None):
        config.refresh_api_key_hook(config)
    query = [("container", spec.CONTAINER), ("stdin", "true"), ("stdout", "true"),
             ("stderr", "true"), ("tty", "false"), ("command", list(command))]
    url = get_websocket_url(f"{config.host}/api/v1/namespaces/{namespace}/pods/{pod}/exec", query)
    headers = {"sec-websocket-protocol": EXEC_PROTOCOLS}
    token = config.get_api_key_with_prefix("BearerToken")
    if token:
        headers["authorization"] = token
    with handshake_errors():
        return create_websocket(config, url, headers)
