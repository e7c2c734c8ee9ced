"""What the toolbox tests share: settings, a store, the real local sandbox, and a
fake sandbox that implements the seam for logic the real helper cannot reach."""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

from guilds.config.settings import AgentSettings, parse_settings
from guilds.errors import SandboxError
from guilds.record.store import Store
from guilds.sandbox.base import ExecResult
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox import Toolbox
from guilds_code.protocol import Reply, error_envelope, ok_envelope


def make_settings(tmp_path: Path, *, agent: Mapping[str, Any] | None = None,
                  secrets: Mapping[str, str] | None = None,
                  repos: Mapping[str, Any] | None = None) -> AgentSettings:
    data = {"agent": {"home": str(tmp_path / "home"), "sandbox": "local", **(agent or {})},
            "secrets": dict(secrets or {}), "repos": dict(repos or {})}
    return parse_settings(data, tmp_path, env={})


@contextlib.asynccontextmanager
async def sandbox_toolbox(settings: AgentSettings, data: Path, **sandbox: Any) -> AsyncIterator[Toolbox]:
    """A Toolbox over the real sandbox settings name (data: its folder and the record's;
    sandbox: get_sandbox's keywords); stopped at the end, and a kubernetes agent's pod
    and claim removed."""
    from guilds.sandbox import get_sandbox

    box = get_sandbox(settings, data, **sandbox)
    async with Store(f"sqlite:///{data}/guilds.db") as store:
        toolbox = Toolbox(settings, box, store)
        try:
            yield toolbox
        finally:
            await toolbox.close()
            await box.stop()
            if box.name == "kubernetes":
                import asyncio

                import kube_kit

                await asyncio.to_thread(kube_kit.remove_agent, box.pod)  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def local_toolbox(tmp_path: Path, store: Store | None = None, **kw: Any) -> AsyncIterator[Toolbox]:
    """A Toolbox over the real local sandbox (the built helper, real bash) and real SQLite."""
    settings = make_settings(tmp_path, **kw)
    async with contextlib.AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(Store(f"sqlite:///{tmp_path}/guilds.db"))
        toolbox = Toolbox(settings, LocalSandbox(settings, tmp_path / "data"), store)
        stack.push_async_callback(toolbox.close)
        yield toolbox


Answer = Callable[[dict], ExecResult]


def ok(text: str, meta: dict | None = None) -> ExecResult:
    return ExecResult(0, ok_envelope(Reply(text, meta or {})), b"")


def refused(error: str) -> ExecResult:
    return ExecResult(0, error_envelope(error), b"")


@dataclass
class FakeSandbox:
    """The Sandbox seam, answering each helper request with ``answer(request)``."""

    answer: Answer
    home: str = "/home/agent"
    state_dir: str = "/run/guilds"
    python: str = "python3"
    name: str = "fake"
    egress: None = None
    requests: list[dict] = field(default_factory=list)
    started: int = 0

    def helper_path(self, name: str) -> str:
        return f"/usr/local/bin/{name}"

    async def start(self) -> None:
        self.started += 1

    async def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float) -> ExecResult:
        request = json.loads(base64.b64decode(argv[-1]))
        self.requests.append(request)
        return self.answer(request)

    async def write_file(self, path: str, data: bytes) -> None:
        raise AssertionError("no request file expected")

    async def open_process(self, argv: Sequence[str]):
        raise SandboxError(f"the {self.name} sandbox runs no long-lived process")

    async def stop(self) -> None:
        pass
