"""What the app tests share: a run record filled through the real toolbox (local sandbox,
the built helper, real bash, SQLite), the app over it, and a fast filler for big runs."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures import secret_forms
from guilds.agents.registry import Agents
from guilds.config import templates
from guilds.fronts.serve import build_app
from guilds.record.engine import normalize_url
from guilds.record.rows import row_text
from guilds.record.schema import agents, calls, runs
from guilds.record.store import Store
from guilds.toolbox import Toolbox
from guilds.web.endpoint_lock import Lock, host_names
from toolbox_kit import local_toolbox, make_settings

SECRET = "sk-live-0123456789abcdef"
TOKEN = "test-token-0123456789abcdefghijklmnopqrstuv"
"""The served app's token: every request carries it (AUTH), the browser logs in with ?token=."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOCK = Lock(TOKEN, host_names("127.0.0.1"))
NOTES = "# Notes\n\n- first\n- <script>alert(1)</script>\n"
# (tool, args): the flow the app tests look at, seq by seq from 1.
FLOW = [
    ("shell", {"command": "for i in $(seq 1 3000); do echo line $i $API_KEY; done"}),
    ("file_read", {"path": "notes.md"}),
    ("file_read", {"path": "notes.md"}),
    ("shell", {"command": "echo '{\"ok\": true, \"items\": [1, 2]}'"}),
    ("shell", {"command": f"echo {SECRET}; exit 3"}),
    ("shell", {"command": "sleep 0.2", "background": True}),
    ("shell_status", {}),
    ("shell_status", {"id": "b1"}),
    ("code_search", {"pattern": "first", "path": "notes.md"}),
    ("code_task", {"brief": "add a test"}),
    ("shell", {"command": "sleep 5", "timeout_seconds": 1}),
]


FORMS_COMMAND = f"python3 {shlex.quote(secret_forms.__file__)} DEPLOY_KEY 3000"
"""An elided output ending in each escaped form of $DEPLOY_KEY (tests/fixtures/secret_forms.py)."""
SPLITS_COMMAND = "python3 -c " + shlex.quote(
    "import os; s = os.environ['DEPLOY_KEY']\n"
    "print('entity: &#x%x;%s' % (ord(s[0]), s[1:]))\n"
    "print('emphasis: %s*%s*' % (s[:3], s[3:]))\n"
    "print('code span: %s`%s`' % (s[:4], s[4:]))\n"
    "print('image: ![%s*%s*](/static/favicon.svg)' % (s[:3], s[3:]))")
"""Markdown that puts $DEPLOY_KEY back together, though the text holds it in no one piece."""


def shown_text(html: str) -> str:
    """What a browser shows of an HTML fragment: its text, character references resolved, and
    its images' alt texts."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.parts: list[str] = []

        def handle_data(self, data: str) -> None:
            self.parts.append(data)

        def handle_starttag(self, tag: str, attrs: list) -> None:
            self.parts += [v or "" for k, v in attrs if k == "alt"]

    parser = Text()
    parser.feed(html)
    return "".join(parser.parts)


@dataclass
class Served:
    toolbox: Toolbox
    store: Store
    app: object


@contextlib.asynccontextmanager
async def served(tmp_path: Path, run_id: str = "run1") -> AsyncIterator[Served]:
    """A toolbox whose agent has SECRET, FLOW made in run_id, and the whole app behind LOCK (its
    lifespan, the MCP session manager, is left to a server that runs it)."""
    async with local_toolbox(tmp_path, secrets={"API_KEY": SECRET, "DEPLOY_KEY": secret_forms.SECRET}) as toolbox:
        home = Path(toolbox.sandbox.home)
        home.mkdir(parents=True, exist_ok=True)
        (home / "notes.md").write_text(NOTES)
        for tool, args in FLOW:
            await toolbox.call(run_id, tool, args)
        yield Served(toolbox, toolbox.store, build_app(toolbox.settings, toolbox.store, toolbox, lock=LOCK))


TASK_META = {  # a finished code_task's metadata, as guilds_harness.report makes it
    "status": "completed",
    "harness": "claude-code",
    "repo": "web",
    "session_id": "5f1c2b",
    "diffstat": (" src/app.py       | 4 +++-\n tests/test_app.py | 9 +++++++++\n"
                 " 2 files changed, 12 insertions(+), 1 deletion(-)"),
    "final_message": "Added a test for the empty cart and fixed the total.",
    "exit_code": 0,
    "num_turns": 3,
}


async def record_code_task(store: Store, run_id: str, agent_id: str = "agent1") -> int:
    """A finished code_task recorded through the store's API (this build's toolbox refuses code_task)."""
    now = datetime.now(UTC)
    args = {"brief": "Add a test for the empty cart, then fix what it finds.", "repo": "web"}
    slot = await store.begin_call(run_id=run_id, agent_id=agent_id, tool="code_task", args=args, call_id="ctask1",
                                  started_at=now, budget=None)
    text = (f"status: completed · claude-code · 3 turns\ndiffstat:\n{TASK_META['diffstat']}\n"
            f"final message:\n{TASK_META['final_message']}")
    meta = {**TASK_META, "call": "ctask1", "tool": "code_task", "seq": slot.seq}
    await store.finish_call(run_id=run_id, seq=slot.seq, text=text, is_error=False, meta=meta, cut=False,
                            finished_at=now, duration_ms=48_000, row=row_text("code_task", args, meta, False),
                            remaining=180)
    return slot.seq


async def fill(store: Store, run_id: str, n: int, *, agent_id: str = "agent1") -> None:
    """A run of n finished shell calls, written straight into the tables (a test needs them fast)."""
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    rows = []
    for seq in range(1, n + 1):
        args = {"command": f"echo step {seq}"}
        meta = {"exit_code": 0, "cwd": "/home/a", "timed_out": False, "call": f"c{seq}", "tool": "shell"}
        rows.append({"run_id": run_id, "seq": seq, "call_id": f"c{seq}", "tool": "shell", "args": args,
                     "text": f"step {seq}\n" * 40, "remaining": 1, "is_error": False, "meta": meta,
                     "cut": False, "counted": True, "status": "done", "started_at": t0 + timedelta(seconds=seq),
                     "finished_at": t0 + timedelta(seconds=seq), "duration_ms": 5,
                     "row": row_text("shell", args, meta, False)})
    async with store.engine.begin() as conn:
        await conn.execute(sa.insert(runs).values(id=run_id, agent_id=agent_id, created_at=t0, updated_at=t0,
                                                  next_seq=n, used_calls=n, admitted_seq=n))
        await conn.execute(sa.insert(calls), rows)


# --- a real `guilds serve` -----------------------------------------------------------
def start_serve(data: Path, *args: str, sandbox: str = "local", more_settings: str = "") -> subprocess.Popen:
    """`guilds serve` on a free port, its data folder ``data``, the local sandbox (or ``sandbox``),
    ``more_settings`` (TOML) after the [agent] table's home and sandbox; stderr piped."""
    (data.parent / "agent.toml").write_text(f'[agent]\nhome = "{data.parent / "home"}"\nsandbox = "{sandbox}"\n'
                                            + more_settings)
    (data.parent / "agent.toml").chmod(0o600)  # it may hold secrets
    env = {**os.environ, "GUILDS_DATA": str(data)}
    env.pop("GUILDS_DATABASE_URL", None)
    return subprocess.Popen([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--config",
                             str(data.parent / "agent.toml"), *args], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def printed_lines(proc: subprocess.Popen, timeout: float = 180) -> list[str]:
    """The lines `guilds serve` printed up to its MCP line (or its end): a start on a machine
    loaded by a whole parallel suite may take a minute."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("guilds serve: MCP at"):
            break
    return lines


def stop_serve(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    finally:
        proc.stderr.close()


# --- agents made on demand, in a record the app shows ---------------------------------
PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")


def record_url(backend: str, tmp_path: Path) -> str:
    """SQLite under tmp_path, or the PostgreSQL of $GUILDS_TEST_POSTGRES_URL (skipped without one)."""
    if backend == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    return normalize_url(PG_URL if backend == "postgresql" else f"sqlite:///{tmp_path}/guilds.db")


PY_SECRET = "py-template-secret-4f8a1c"
"""The secret of the template ``py`` of an AgentsRecord."""


@dataclass
class AgentsRecord:
    """A record with the serving agent's toolbox, the agents made on demand from the templates
    ``default`` and ``py`` (local sandbox), and the whole app over it, behind LOCK. Names carry
    ``tag``, so a shared PostgreSQL database holds them apart from any other test's."""

    store: Store
    own: Toolbox
    agents: Agents
    app: object
    tag: str

    def owner(self, name: str) -> str:
        return f"{name}-{self.tag}"


@contextlib.asynccontextmanager
async def agents_record(tmp_path: Path, backend: str = "sqlite") -> AsyncIterator[AgentsRecord]:
    """An AgentsRecord (the template ``py`` holds PY_SECRET); at the end its live agents removed and
    its rows dropped from the record."""
    tag = secrets.token_hex(4)
    (tmp_path / "py-home").mkdir()
    (tmp_path / "py-home" / "README").write_text("the template's home\n")
    (tmp_path / "data").mkdir(mode=0o700)
    async with Store(record_url(backend, tmp_path)) as store, \
            local_toolbox(tmp_path, store, agent={"id": f"server-{tag}"}) as own:
        py = make_settings(tmp_path, agent={"id": "py", "home": str(tmp_path / "py-home")},
                           secrets={"PY_SECRET": PY_SECRET})
        served = templates.Served(templates={"default": templates.Template(name="default", settings=own.settings),
                                             "py": templates.Template(name="py", settings=py)})
        made = Agents(served, tmp_path / "data", store)
        try:
            yield AgentsRecord(store, own, made, build_app(own.settings, store, own, lock=LOCK, agents=made), tag)
        finally:
            for agent in await made.live():
                if agent.owner.endswith(tag):
                    await made.remove(agent.id)
            await made.close()
            await _forget(store, tag)


async def _forget(store: Store, tag: str) -> None:
    """The rows an AgentsRecord made, dropped: a shared database is left as it was found."""
    async with store.engine.begin() as conn:
        ids = [row.id for row in await conn.execute(sa.select(agents.c.id).where(agents.c.owner.endswith(tag)))]
        ids.append(f"server-{tag}")
        run_ids = sa.select(runs.c.id).where(runs.c.agent_id.in_(ids))
        await conn.execute(sa.delete(calls).where(calls.c.run_id.in_(run_ids)))
        await conn.execute(sa.delete(runs).where(runs.c.agent_id.in_(ids)))
        await conn.execute(sa.delete(agents).where(agents.c.id.in_(ids)))
