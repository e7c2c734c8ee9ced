"""What per-call checkpoints add to a real agent session: the same commands replayed with and without.

Run (root, bubblewrap, overlayfs): .venv/bin/python bench/checkpoint_session_bench.py [--rounds N] [--mb 100]

The home is a ~100 MB git repository (``checkpoint_bench.make_repo``: whole packages of this
venv's site-packages, committed). A session is ``SESSION``: the commands an agent runs on a
task (looks with git and rg, edits with sed and heredocs, a test written and run, commits,
diffs), each a ``shell`` call on bwrap. Four agents replay it, their calls taking turns
command by command in a new shuffled order each time:

- an agent made on demand from a template whose home is the repository (an overlay home), with
  ``agent.checkpoints`` on, and one with it off;
- a server's own agent whose home is a plain folder holding a copy of the repository, on and off
  (each its own server on the same machine).

Each round makes the four agents anew (the plain homes copied again), so every session starts
from the same tree. Prints the median time of each command per agent and the whole session's,
and the session's ratio on / off for each kind of home, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from checkpoint_bench import make_repo  # noqa: E402

import guilds  # noqa: E402

GIT = "git -c user.name=agent -c user.email=agent@example.invalid"
SESSION = (
    "git status --short | head -5; git log --oneline | head -3",
    "rg -l 'def __init__' --glob '*.py' | head -5",
    "f=$(git ls-files '*.py' | head -1); sed -n '1,20p' \"$f\" | wc -l",
    "f=$(git ls-files '*.py' | head -1); sed -i '1i # edited by the agent' \"$f\" && head -2 \"$f\"",
    "mkdir -p work && cat > work/calc.py <<'EOF'\ndef add(a, b):\n    return a + b\n\n\n"
    "def mul(a, b):\n    return a * b\nEOF",
    "cat > work/test_calc.py <<'EOF'\nimport unittest\n\nfrom calc import add, mul\n\n\n"
    "class T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\nEOF",
    "(cd work && python3 -m unittest -q test_calc 2>&1 | tail -1)",
    f"{GIT} add -A && {GIT} commit -qm 'calc and its test' && git log --oneline | head -1",
    "sed -i 's/return a \\* b/return a * b  # product/' work/calc.py && git diff --stat",
    "(cd work && python3 -m unittest -q test_calc 2>&1 | tail -1)",
    "for f in $(git ls-files '*.py' | sed -n '2,4p'); do printf '\\n# note\\n' >> \"$f\"; done; "
    "git diff --stat | tail -1",
    f"{GIT} commit -qam 'notes' && git diff HEAD~1 --stat | tail -1",
    "cat > work/README.md <<'EOF'\n# calc\n\nAdds and multiplies.\nEOF\nwc -l work/README.md",
    f"{GIT} add -A && {GIT} commit -qm readme && git log --oneline | wc -l",
    "git show --stat HEAD | tail -2; ls work",
)
"""The session's commands, in order: what an agent runs on a small task in a repository."""
LABELS = (
    'git status and git log',
    'rg for a definition',
    'sed -n: the first lines of a file',
    'sed -i: a line put at the top of a file',
    'a heredoc: a new module in a new folder',
    'a heredoc: its unittest',
    'the unittest run',
    'git add and commit',
    'sed -i: a line of the module changed, git diff',
    'the unittest run again',
    'a loop appending to three files, git diff',
    'git commit -a, git diff HEAD~1',
    'a heredoc: a README',
    'git add and commit',
    'git show, ls',
)
"""What each command of SESSION does, for the table."""

OWN = """
[agent]
id = "{id}"
home = "{home}"
sandbox = "bwrap"
checkpoints = {on}
max_tool_calls = 10000000
"""
TEMPLATES = """
[templates.on.agent]
home = "{repo}"
sandbox = "bwrap"
checkpoints = true
max_tool_calls = 10000000

[templates.off.agent]
home = "{repo}"
sandbox = "bwrap"
checkpoints = false
max_tool_calls = 10000000
"""
PATHS = ("overlay home, on", "overlay home, off", "plain folder, on", "plain folder, off")


def settings_file(root: Path, name: str, text: str) -> Path:
    path = root / f"{name}.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


async def server(stack: AsyncExitStack, settings: Path, data: Path) -> guilds.Agent:
    return await stack.enter_async_context(
        guilds.open(settings, data_dir=data, env={**os.environ, "GUILDS_DATA": str(data)}))


async def one_round(root: Path, repo: Path, n: int, times: dict[str, list[list[float]]]) -> None:
    """The four agents made anew, then the session replayed, their calls taking turns."""
    homes = {on: root / f"plain-{on}-{n}" for on in ("true", "false")}
    for home in homes.values():
        subprocess.run(["cp", "-a", str(repo), str(home)], check=True)
    async with AsyncExitStack() as stack:
        on_text = OWN.format(id=f"sesson{n}", home=homes["true"], on="true") + TEMPLATES.format(repo=repo)
        off_text = OWN.format(id=f"sessoff{n}", home=homes["false"], on="false")
        on = await server(stack, settings_file(root, f"on{n}", on_text), root / f"data-on-{n}")
        off = await server(stack, settings_file(root, f"off{n}", off_text), root / f"data-off-{n}")
        made = {"overlay home, on": await on.make_agent("on"), "overlay home, off": await on.make_agent("off")}
        try:
            agents = {**made, "plain folder, on": on, "plain folder, off": off}
            spent = await session(agents, n)
        finally:
            for agent in made.values():
                await on.remove_agent(agent.id)
        for name in PATHS:
            times.setdefault(name, []).append(spent[name])
    for home in homes.values():
        shutil.rmtree(home, ignore_errors=True)


async def session(agents: dict, n: int) -> dict[str, list[float]]:
    """SESSION replayed by every agent (each in a run of its own), the calls taking turns
    command by command; each call's ms per agent."""
    runs = {name: f"s{n}-{i}" for i, name in enumerate(PATHS)}
    for name, agent in agents.items():  # each sandbox started before the session
        await agent.call(runs[name], "shell", {"command": "true"})
    spent: dict[str, list[float]] = {name: [] for name in PATHS}
    for command in SESSION:
        for name in random.sample(PATHS, len(PATHS)):
            t0 = time.perf_counter()
            result = await agents[name].call(runs[name], "shell", {"command": command})
            spent[name].append((time.perf_counter() - t0) * 1000)
            if "exit_code" in result.text:
                raise SystemExit(f"{name}: {command!r} failed:\n{result.text}")
    return spent


def report(times: dict[str, list[list[float]]], files: int, size: int, rounds: int) -> None:
    session = {name: statistics.median(sum(r) for r in rounds_) for name, rounds_ in times.items()}
    per_command = {name: [statistics.median(r[i] for r in rounds_) for i in range(len(SESSION))]
                   for name, rounds_ in times.items()}
    print(f"tree: {files} paths, {size / 1e6:.0f} MB; {len(SESSION)} commands; median of {rounds} rounds; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| home | session, checkpoints off, ms | session, checkpoints on, ms | on / off | added a call, ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind in ("overlay home", "plain folder"):
        on, off = session[f"{kind}, on"], session[f"{kind}, off"]
        print(f"| {kind} | {off:.0f} | {on:.0f} | {on / off:.2f} | {(on - off) / len(SESSION):.1f} |")
    print("\n| command | " + " | ".join(PATHS) + " |")
    print("| --- |" + " ---: |" * len(PATHS))
    for i, label in enumerate(LABELS):
        print(f"| {label} | " + " | ".join(f"{per_command[name][i]:.1f}" for name in PATHS) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cksession-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        files, size = make_repo(repo, opts.mb)
        times: dict[str, list[list[float]]] = {}
        for n in range(opts.rounds):
            asyncio.run(one_round(root, repo, n, times))
        report(times, files, size, opts.rounds)


if __name__ == "__main__":
    main()
