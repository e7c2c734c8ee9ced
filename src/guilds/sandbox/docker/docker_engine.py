"""The docker backend's edge with the engine: connecting, the exec stream, its errors.

- ``connect(base_url)``: a client for base_url (default DOCKER_HOST, else the
  local socket), after a probe of a unix socket that closes what it opened
  (the SDK's own failed connect leaves its socket to the garbage collector);
- ``exec_stream(api, exec_id, deadline, exited)``: starts an exec and reads
  its multiplexed stream from the HTTP response's buffered reader (the SDK's
  ``exec_start(socket=True)`` hands over the bare socket: bytes the reader had
  already buffered would be lost, and the connection could not be closed);
- ``exited`` and ``exit_code``: the exec as ``exec_inspect`` sees it;
- ``engine_errors(what, where)``: the SDK's errors as SandboxError, in this one place;
- ``unavailable()``: why the backend cannot run here, for tests and ``auto``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import socket
import ssl
import time
from typing import Any, Callable, Iterator

import docker
import requests

from ...config.settings import DEFAULT_SANDBOX_IMAGE
from ...errors import SandboxError
from ...limits import (
    DOCKER_CHECK_SECONDS,
    DOCKER_CLIENT_TIMEOUT_SECONDS,
    DOCKER_EXIT_STATUS_POLL_SECONDS,
    DOCKER_EXIT_STATUS_WAIT_SECONDS,
    DOCKER_EXITED_POLL_SECONDS,
)
from .._container import POOL_THREADS
from .._spawn import DRAIN_SECONDS, STDERR_KEEP_BYTES, STDOUT_MAX_BYTES
from . import docker_spec as spec

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
_READ = 64 * 1024


def where(base_url: str | None) -> str:
    return base_url or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def connect(base_url: str | None, *, timeout: float = DOCKER_CLIENT_TIMEOUT_SECONDS) -> docker.DockerClient:
    """A client of the engine at base_url (DOCKER_HOST's when None); raises what the SDK raises."""
    _probe(where(base_url), timeout)
    kw = {"timeout": timeout, "max_pool_size": POOL_THREADS}
    return docker.DockerClient(base_url=base_url, **kw) if base_url else docker.from_env(**kw)


@contextlib.contextmanager
def engine_errors(what: str, base_url: str | None) -> Iterator[None]:
    """Map the SDK's errors to SandboxError naming what was being done."""
    try:
        yield
    except docker.errors.APIError as exc:
        raise SandboxError(spec.api_error_text(what, exc.status_code,
                                               str(exc.explanation or exc))) from exc
    except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
        raise SandboxError(f"docker: {what}: the engine is not reachable at {where(base_url)} "
                           f"({exc}); start it or set DOCKER_HOST") from exc


@functools.cache
def unavailable(image: str = DEFAULT_SANDBOX_IMAGE) -> str | None:
    """Why this backend cannot run here (no engine at DOCKER_HOST, no image), or None."""
    try:
        client = connect(None, timeout=DOCKER_CHECK_SECONDS)
    except (OSError, docker.errors.DockerException) as exc:
        return f"no engine answers at {where(None)} ({exc})"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"image {image} missing (build it with `guilds sandbox image`)"
    except docker.errors.DockerException as exc:
        return f"the engine at {where(None)} fails: {exc}"
    finally:
        client.close()
    return None


def exited(api: Any, exec_id: str) -> bool:
    """The exec ended with a status (one not started yet has no status either)."""
    info = api.exec_inspect(exec_id)
    return not info.get("Running") and info.get("ExitCode") is not None


def exit_code(api: Any, exec_id: str) -> int | None:
    """The exec's exit status, once recorded (the stream can end a moment before)."""
    for _ in range(round(DOCKER_EXIT_STATUS_WAIT_SECONDS / DOCKER_EXIT_STATUS_POLL_SECONDS)):
        info = api.exec_inspect(exec_id)
        if not info.get("Running"):
            return info.get("ExitCode")
        time.sleep(DOCKER_EXIT_STATUS_POLL_SECONDS)
    return None


def exec_stream(api: Any, exec_id: str, deadline: float, exited: Callable[[], bool]
                ) -> tuple[bytes, bytes, bool]:
    """Start the exec and read it (``read_frames``); the connection is closed after."""
    response = api._post_json(api._url("/exec/{0}/start", exec_id),
                              data={"Tty": False, "Detach": False}, stream=True,
                              headers={"Connection": "Upgrade", "Upgrade": "tcp"})
    try:
        api._raise_for_status(response)
        return read_frames(response.raw._fp.fp, deadline, exited)
    finally:
        response.close()


def attach(api: Any, exec_id: str) -> Any:
    """Start the exec with its stdin attached; the streamed response (the caller closes it)."""
    response = api._post_json(api._url("/exec/{0}/start", exec_id),
                              data={"Tty": False, "Detach": False}, stream=True,
                              headers={"Connection": "Upgrade", "Upgrade": "tcp"})
    api._raise_for_status(response)
    return response


def read_frames(reader: Any, deadline: float, exited: Callable[[], bool]
                ) -> tuple[bytes, bytes, bool]:
    """Read the exec's stream until EOF or the deadline: (stdout head, stderr tail, complete).

    reader is the response's buffered reader; its socket is made non-blocking
    and waited on with poll (not select: a server holding many agents has
    descriptors past FD_SETSIZE, which select refuses). After DOCKER_EXITED_POLL_SECONDS without output
    ``exited()`` is asked: once the process has exited, what is left is read for
    DRAIN_SECONDS, so a process it left behind holding the stream cannot pin the call.
    """
    sock = reader.raw._sock
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    buf, out, err = b"", bytearray(), bytearray()
    while (left := deadline - time.monotonic()) > 0:
        chunk = _available(reader)
        if chunk == b"":
            if not poller.poll(math.ceil(min(left, DOCKER_EXITED_POLL_SECONDS) * 1000)):
                if exited():
                    deadline = min(deadline, time.monotonic() + DRAIN_SECONDS)
                continue
            if not (chunk := _available(reader)):
                return bytes(out), bytes(err), True  # readable and empty: the end
        frames, buf = spec.split_frames(buf + chunk)
        for stream, payload in frames:
            if stream == spec.STDOUT:
                out += payload[: STDOUT_MAX_BYTES - len(out)]
            else:
                err += payload
                del err[:-STDERR_KEEP_BYTES]
    return bytes(out), bytes(err), exited()


def _available(reader: Any) -> bytes:
    """What the reader has now, buffered or on the socket; b"" when nothing (or the end)."""
    try:
        return reader.read1(_READ) or b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return b""


def _probe(url: str, timeout: float) -> None:
    """Connect to a unix:// engine once, closing the socket whatever happens."""
    if url.startswith("unix://"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(url[len("unix://"):])
