"""code_task through the whole toolbox: local sandbox, the built guilds-harness,
a stand-in `claude` that speaks Claude Code's stream-json and really edits the repo."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON
from guilds.record.store import Store
from guilds.sandbox.local import LocalSandbox
from guilds.toolbox import Toolbox
from toolbox_kit import make_settings

FIXTURES = Path(__file__).parent / "fixtures"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def fake_path(tmp_path) -> str:
    folder = tmp_path / "bin"
    folder.mkdir()
    claude = folder / "claude"
    claude.write_text(f'#!/bin/sh\nexec "{PYTHON}" "{FIXTURES / "fake_claude.py"}" "$@"\n')
    claude.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


async def test_code_task_edits_the_repo_and_reports_a_diffstat(tmp_path, fake_path):
    repo = tmp_path / "home" / "repos" / "web"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "app.py").write_text("print('hello')\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    settings = make_settings(tmp_path, repos={"web": {"path": "repos/web", "token": "ghp_tokenvalue123"}})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        tb = Toolbox(settings, LocalSandbox(settings, tmp_path / "data", path=fake_path), store)
        result = await tb.call("r1", "code_task", {"brief": "fake: write notes.md a line\nfake: say wrote it"})
        assert not result.is_error, result.text
        meta = result.meta
        assert meta["status"] == "completed" and meta["session_id"]
        assert "notes.md" in meta["diffstat"] and meta["row"].startswith("Code task")
        assert "wrote it" in result.text
        assert Path(meta["log_path"]).is_file()
        assert result.text.endswith("remaining_tool_calls: 199")
        resumed = await tb.call(
            "r1", "code_task", {"brief": "fake: append notes.md more", "session_id": meta["session_id"]}
        )
        assert resumed.meta["session_id"] == meta["session_id"], resumed.text
        record = await store.call("r1", 1)
        assert record.meta["status"] == "completed"
