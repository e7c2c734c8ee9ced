"""``Egress``: one agent's side of the egress proxy (``agent.network`` a list;
docs/network.md), the one object a backend holds for it (the ``Sandbox`` protocol's
``egress``; None without a list)."""

from __future__ import annotations

import os
from typing import Any

from ...config.settings import AgentSettings
from ...errors import SandboxError
from .._host_folder import checked_id
from .decision_log import read_decisions
from .environment import sandbox_env
from .files import BUNDLE_NAME, EGRESS_INSIDE, egress_files, remove_files
from .placeholders import Bound, bound_values, repos_entries
from .proxy_process import keep_proxy, stop_proxy


class Egress:
    """One agent's egress: its proxy's files (``files``), the values the proxy puts in for
    their hosts (``bound``) and the proxy's process, as the backend and the toolbox use them:

    - ``env()`` over every command's environment, ``repos_entries()`` for repos.json;
      the backend binds ``files.shared`` at EGRESS_INSIDE and its init runs the relay
      (``relay.RELAY``);
    - ``keep()`` before each call (the toolbox's, once per call; blocking): the proxy
      running, started again when it died or its settings changed;
    - ``stop()`` with the sandbox, ``remove()`` with what it keeps, ``decisions()`` at
      each call's end (what the proxy decided since the last read).

    The real values of host-bound secrets and repository tokens never leave ``files``:
    the sandbox gets placeholders of the same length.
    """

    reads_origins = True
    """A repository token's default hosts come from its .git/config on this host
    (``origins``); a backend whose home is elsewhere says False."""

    def __init__(self, settings: AgentSettings, data_dir: str | os.PathLike, *, idle_seconds: float,
                 clock: str | None = None) -> None:
        """idle_seconds: the proxy's idle stop; clock: the idle clock's file (default: one
        in the agent's egress folder), moved at each ``keep()``."""
        self.settings, self.idle_seconds = settings, idle_seconds
        self.home = str(settings.home)
        self.files = egress_files(os.path.realpath(data_dir), checked_id(settings))
        self.clock = clock or self.files.path("clock")
        self._pinned = not self.reads_origins or os.path.isdir(self.home)
        self._bound = bound_values(settings, self.files, self.home if self.reads_origins else None)

    @property
    def bound(self) -> dict[str, Bound]:
        """The host-bound values by name (``placeholders.bound_values``). Made before its home
        (an agent made on demand), a repository token's default hosts are read once the home
        exists, before the sandbox first uses them (``origins.pinned_origins``)."""
        if not self._pinned and os.path.isdir(self.home):
            self._pinned = True
            self._bound = bound_values(self.settings, self.files, self.home)
        return self._bound

    @classmethod
    def data_folder(cls, settings: AgentSettings, data_dir: str | os.PathLike | None,
                    backend: str) -> str | os.PathLike | None:
        """data_dir, when agent.network is a list; None without a list. SandboxError when
        there is a list and no data folder to keep the proxy's files in."""
        if not settings.egress:
            return None
        if data_dir is None:
            raise SandboxError(f"agent.network is a list, and the {backend} sandbox was given no data folder "
                               "for the egress proxy")
        return data_dir

    def env(self) -> dict[str, str]:
        """Over every command's environment: the proxy variables, the trust bundle's, and
        each host-bound secret's placeholder in place of its value."""
        return sandbox_env(self.settings, self.bound, bundle=self.bundle_inside())

    def bundle_inside(self) -> str:
        """The trust bundle's path inside the sandbox."""
        return f"{EGRESS_INSIDE}/{BUNDLE_NAME}"

    def repos_entries(self) -> dict[str, Any]:
        """repos.json's mapping: each repository folder -> its token's placeholder."""
        return repos_entries(self.settings, self.home, self.bound)

    def keep(self) -> None:
        """The proxy's idle clock moved; the proxy started when it is not running."""
        keep_proxy(self.settings, self.files, home=self.home, clock=self.clock, idle_seconds=self.idle_seconds)

    def stop(self) -> None:
        stop_proxy(self.files)

    def remove(self) -> list[str]:
        """The proxy stopped and the agent's egress folder removed; its path when it was there."""
        self.stop()
        return remove_files(self.files)

    def decisions(self) -> list[dict[str, Any]]:
        """The proxy's decisions since the last read (by any process), as it wrote them."""
        return read_decisions(self.files)
