"""mini-swe-agent's real DefaultAgent, with its own DeterministicModel, fixing a bug in a real
git repository through GuildsEnvironment: the real local sandbox, the built helper, SQLite."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.models.test_models import DeterministicModel, make_output

from guilds.adapters.minisweagent import GuildsEnvironment, body
from guilds.record.store import Store

SYSTEM = "You fix bugs. Reply with one bash command in a ```bash block."
INSTANCE = "Task: {{task}} (run {{run_id}} on {{system}})"
STEPS = [
    "cd src",
    "pwd && grep -n '-' calc.sh",
    "sed -i 's/\\$1 - \\$2/$1 + $2/' calc.sh && cd .. && bash test.sh",
    "exit 7",
    f"echo {'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'} && git diff",
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def make_repo(home: Path) -> Path:
    repo = home / "repos" / "calc"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "calc.sh").write_text('echo $(( $1 - $2 ))\n')
    (repo / "test.sh").write_text('[ "$(bash src/calc.sh 2 3)" = 5 ] && echo "1 passed" '
                                  '|| { echo "1 failed"; exit 1; }\n')
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    return repo


@pytest.fixture
def settings_file(tmp_path) -> Path:
    make_repo(tmp_path / "home")
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nhome = "home"\nsandbox = "local"\nmax_tool_calls = 20\n[repos.calc]\n')
    return path


async def recorded(tmp_path: Path, run_id: str) -> list:
    async with Store(f"sqlite:///{tmp_path / 'data' / 'guilds.db'}") as store:
        return await store.calls(run_id)


def test_the_real_agent_fixes_a_bug_through_guilds(tmp_path, settings_file):
    env = get_environment({"environment_class": "guilds.adapters.minisweagent.GuildsEnvironment",
                           "settings": str(settings_file), "data_dir": str(tmp_path / "data"), "run_id": "mini-1"})
    assert isinstance(env, GuildsEnvironment)
    model = DeterministicModel(outputs=[make_output(f"```bash\n{c}\n```", [{"command": c}]) for c in STEPS])
    agent = DefaultAgent(model, env, system_template=SYSTEM, instance_template=INSTANCE,
                         step_limit=10, cost_limit=0)
    try:
        result = agent.run("make calc add")
    finally:
        env.close()
    repo = tmp_path / "home" / "repos" / "calc"
    assert result["exit_status"] == "Submitted"
    assert "+echo $(( $1 + $2 ))" in result["submission"] and "remaining_tool_calls" not in result["submission"]
    assert (repo / "src" / "calc.sh").read_text() == "echo $(( $1 + $2 ))\n"
    observations = [m["content"] for m in agent.messages if m["role"] == "user"][1:]
    assert f"{repo}/src\n1:echo $(( $1 - $2 ))" in observations[1]  # the cd of step 1 carried over
    assert "<returncode>0</returncode>" in observations[2] and "1 passed" in observations[2]
    assert "<returncode>7</returncode>" in observations[3] and "remaining_tool_calls: 16" in observations[3]
    assert agent.messages[1]["content"] == f"Task: make calc add (run mini-1 on {__import__('platform').system()})"
    calls = asyncio.run(recorded(tmp_path, "mini-1"))
    assert [c.args["command"] for c in calls] == STEPS and all(c.tool == "shell" for c in calls)


def test_a_refused_call_comes_back_as_an_exception_and_the_body_helper(tmp_path, settings_file):
    env = GuildsEnvironment(settings=str(settings_file), data_dir=str(tmp_path / "data"),
                            overrides={"max_tool_calls": 1})
    try:
        first = env.execute({"command": "echo one"}, timeout=5)
        refused = env.execute({"command": "echo two"})
    finally:
        env.close()
    assert first == {"output": "one\nremaining_tool_calls: 0", "returncode": 0, "exception_info": ""}
    assert refused["returncode"] == -1 and refused["exception_info"].startswith("tool call budget exhausted")
    assert env.run_id.startswith("py-")
    assert body("x\nexit_code: 3\nremaining_tool_calls: 4") == "x"
