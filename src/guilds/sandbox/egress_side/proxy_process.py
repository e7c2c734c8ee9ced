"""The egress proxy's process, one per agent with ``agent.network`` a list
(docs/network.md): started detached from its config (``python -m guilds.egress``),
found alive by its pidfile and its socket (or TCP port), started again when it died
or its settings changed, stopped with the sandbox."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ...config.settings import AgentSettings
from ...errors import SandboxError
from ...limits import EGRESS_START_POLL_SECONDS, EGRESS_START_SECONDS
from .._spawn import spawn_detached
from .files import SOCKET_NAME, EgressFiles, locked, read_text, write_private
from .placeholders import bound_values
from .proxy_setup import Listen, proxy_config, settings_digest, write_trust_bundle


def ensure_proxy(files: EgressFiles, digest: str, make_config: Callable[[], Mapping[str, Any]],
                 listen: Listen | None = None) -> None:
    """The agent's proxy running: found alive and started from the same settings
    (digest), else started anew with make_config(), detached, and waited for until it
    listens. Alive: its process runs and its socket (listen: its TCP port) answers (one
    hung or whose socket went is replaced). A repository's default hosts are the pinned
    ones (``origins.pinned_origins``)."""
    from ...egress.proxy_config import write_config

    config_path, digest_path = files.path("proxy.json"), files.path("proxy.digest")
    with locked(files):
        pid = proxy_pid(files)
        serving = pid is not None and _answers(files, listen)
        if serving and read_text(digest_path) == digest:
            return
        if pid is not None:
            _terminate(pid)
        config = make_config()
        try:
            write_config(config_path, config)
        except ValueError as exc:
            raise SandboxError(f"the egress proxy's config: {exc}") from None
        write_private(digest_path, digest)
        Path(config["pidfile"]).unlink(missing_ok=True)
        from .._host_folder import real_python

        spawn_detached([real_python(), "-m", "guilds.egress", config_path], env=_proxy_env(),
                       log_path=files.path("proxy.log"), pass_fds=())
        deadline = time.monotonic() + EGRESS_START_SECONDS
        while proxy_pid(files) is None:
            if time.monotonic() > deadline:
                raise SandboxError(f"the egress proxy did not start: {_log_tail(files)}")
            time.sleep(EGRESS_START_POLL_SECONDS)


def _answers(files: EgressFiles, listen: Listen | None) -> bool:
    from ...egress.daemon import is_listening, is_serving

    if listen is None:
        return is_serving(os.path.join(files.shared, SOCKET_NAME))
    port = proxy_port(files)
    return port is not None and is_listening(listen.address, port)


def keep_proxy(settings: AgentSettings, files: EgressFiles, *, home: str, clock: str,
               idle_seconds: float, listen: Listen | None = None) -> None:
    """At each call: the proxy's idle clock moved, the proxy started when it is not running
    (or was started from other settings). listen: on TCP (``config.proxy_config``);
    its address and credential are part of the settings, its port only asked for."""
    Path(clock).touch(mode=0o644)
    os.utime(clock)
    resolve = settings.egress_resolve

    def config() -> dict[str, Any]:
        bound = bound_values(settings, files, home)
        write_trust_bundle(files)
        return proxy_config(settings, files, bound, clock=clock, idle_seconds=idle_seconds, resolve=resolve,
                            listen=listen)

    where = None if listen is None else (listen.address, listen.credential)
    ensure_proxy(files, settings_digest(settings, idle_seconds, sorted(resolve.items()), where), config, listen)


def stop_proxy(files: EgressFiles) -> None:
    with locked(files):
        pid = proxy_pid(files)
        if pid is not None:
            _terminate(pid)


def proxy_pid(files: EgressFiles) -> int | None:
    """The pid of the agent's proxy when it runs (its pidfile names a live
    ``guilds.egress`` process of this config), else None."""
    try:
        pid = int(Path(files.path("proxy.pid")).read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if files.path("proxy.json").encode() in cmdline.split(b"\0") else None


def proxy_port(files: EgressFiles) -> int | None:
    """The TCP port the agent's proxy listens on (its pidfile's second field), when it runs."""
    try:
        fields = Path(files.path("proxy.pid")).read_text().split()
    except OSError:
        return None
    if len(fields) < 2 or not fields[1].isdigit() or proxy_pid(files) is None:
        return None
    return int(fields[1])


def _terminate(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + EGRESS_START_SECONDS
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(EGRESS_START_POLL_SECONDS)
    if _running(pid):  # hung: it does not get to keep the socket
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """pid exists and has not exited (a zombie nobody reaped yet has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _proxy_env() -> dict[str, str]:
    """The proxy's environment: this process's (SSL_CERT_FILE is honoured upstream), with
    PYTHONPATH so that ``-m guilds.egress`` finds this very package."""
    package_root = str(Path(__file__).resolve().parents[3])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}


def _log_tail(files: EgressFiles) -> str:
    text = read_text(files.path("proxy.log")) or "(no log)"
    return " ".join(text.splitlines()[-3:])
