"""The bwrap sandbox's state root: a sized tmpfs of its own, off the data folder's filesystem.

Real bwrap: the agent fills /run/guilds and is stopped at ``bwrap.state_size``
while the data folder (the run record's filesystem) takes nothing; calls still
run and answer once it is full; the orchestrator's writes into it never follow
a link the agent planted there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guilds.config.settings import AgentSettings, BwrapSettings, Repo
from guilds.errors import SandboxError
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox
from guilds.toolbox.transport import call_helper

NO_BWRAP = unavailable()
pytestmark = [pytest.mark.bwrap, pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}")]

STATE_SIZE = 4 << 20
TOKEN = "ghp_token-5d1e7f2a"
MIB = 1 << 20


@pytest.fixture
async def box(tmp_path):
    settings = AgentSettings(id="agent1", home=tmp_path / "home", sandbox="bwrap",
                             repos=(Repo("web", "repos/web", TOKEN),),
                             bwrap=BwrapSettings(state_size=STATE_SIZE))
    sandbox = BwrapSandbox(settings, tmp_path / "data")
    await sandbox.start()
    yield sandbox
    await sandbox.stop()


async def run(box, script: str, timeout: float = 20) -> tuple[int | None, str, str]:
    result = await box.exec(["bash", "-c", script], timeout=timeout)
    assert not result.timed_out, result
    return result.exit_code, result.stdout.decode(), result.stderr.decode()


def bytes_under(folder: Path) -> int:
    """What the files under folder hold (links not followed)."""
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(folder) for f in files)


FREE = "python3 -c 'import os; s = os.statvfs(\"/run/guilds\"); print(s.f_bavail * s.f_frsize)'"


async def test_the_state_root_is_a_tmpfs_of_its_size_owned_by_the_agent(box, tmp_path):
    code, out, _ = await run(box, "stat -f -c '%T %b %S' /run/guilds; stat -c '%u %a' /run/guilds; id -u")
    kind, blocks, block_size = out.split("\n")[0].split()
    assert code == 0 and kind == "tmpfs" and int(blocks) * int(block_size) == STATE_SIZE
    assert out.split("\n")[1:3] == [f"{box.uid} 700", str(box.uid)]
    assert not (tmp_path / "data" / "sandboxes" / "agent1").exists()  # no host folder behind it


async def test_a_fill_stops_at_the_size_and_the_data_folder_takes_nothing(box, tmp_path):
    before = bytes_under(tmp_path / "data")
    _code, out, err = await run(box, f"head -c {STATE_SIZE + MIB} /dev/zero > /run/guilds/fill; echo $?; "
                                    "stat -c %s /run/guilds/fill")
    status, size = out.split()
    assert status == "1" and "No space left on device" in err
    assert int(size) <= STATE_SIZE
    assert bytes_under(tmp_path / "data") - before < MIB


async def test_exactly_what_is_free_fits_and_one_byte_more_does_not(box):
    code, out, _ = await run(box, f"free=$({FREE}); head -c $free /dev/zero > /run/guilds/edge && echo fits; "
                                  f"{FREE}; head -c 1 /dev/zero >> /run/guilds/edge || echo full")
    assert (code, out.split()) == (0, ["fits", "0", "full"])


async def test_a_background_command_writing_past_the_size_is_stopped_there(box):
    code, out, _ = await run(box, f"(head -c {8 * STATE_SIZE} /dev/zero > /run/guilds/bg.log "
                                  "2>/run/guilds/bg.err; echo $? > ~/bg.status) & wait; "
                                  "cat ~/bg.status; stat -c %s /run/guilds/bg.log")
    status, size = out.split()
    assert (code, status) == (0, "1") and int(size) <= STATE_SIZE


async def test_calls_still_answer_once_the_state_root_is_full(box):
    await run(box, f"head -c {STATE_SIZE} /dev/zero > /run/guilds/fill")
    request = {"op": "shell", "args": {"command": "echo still answers"}, "run_id": "r1",
               "agent_id": "agent1", "call_id": "c1", "home": box.home, "cwd": box.home}
    envelope = await call_helper(box, request, wait=30)
    assert envelope["ok"] is True and envelope["text"].startswith("still answers"), envelope
    with pytest.raises(SandboxError) as caught:  # a request file that cannot be written: one line
        await box.write_file(f"{box.state_dir}/requests/r1-c2.json", b"x" * MIB)
    assert str(caught.value) == ("write_file: cannot write requests/r1-c2.json under /run/guilds: "
                                 "No space left on device")
    await run(box, "rm /run/guilds/fill")
    await box.write_file(f"{box.state_dir}/requests/r1-c2.json", b"x" * MIB)  # room again: written


async def test_a_link_planted_at_repos_json_is_replaced_not_followed(box, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("host file\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(victim, 0o666)  # writable by anyone: only the no-follow walk keeps it whole
    code, _, err = await run(box, f'ln -sf "{victim}" /run/guilds/agent1/repos.json')
    assert code == 0, err
    await box.start()  # writes repos.json again
    assert victim.read_text() == "host file\n"
    code, out, _ = await run(box, "stat -c %F /run/guilds/agent1/repos.json; cat /run/guilds/agent1/repos.json")
    assert out.startswith("regular file\n") and TOKEN in out


@pytest.mark.parametrize("planted", ["requests", "agent1"])
async def test_a_linked_folder_in_the_state_root_is_not_followed(box, tmp_path, planted):
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o777)
    os.chmod(outside, 0o777)
    os.chmod(tmp_path, 0o755)
    code, _, err = await run(box, f'rm -rf /run/guilds/{planted}; ln -s "{outside}" /run/guilds/{planted}')
    assert code == 0, err
    with pytest.raises(SandboxError, match=f"write_file: cannot write {planted}/x.json under /run/guilds: "):
        await box.write_file(f"{box.state_dir}/{planted}/x.json", b"{}")
    assert list(outside.iterdir()) == []


async def test_a_new_sandbox_starts_with_an_empty_state_root(box):
    await run(box, "echo left > /run/guilds/left")
    await box.stop()
    await box.start()
    _code, out, _ = await run(box, "ls -A /run/guilds; ls -A /run/guilds/agent1")
    assert out.split() == ["agent1", "repos.json"]


async def test_a_host_state_folder_left_by_an_earlier_layout_goes_at_the_next_start(box, tmp_path):
    old = tmp_path / "data" / "sandboxes" / "agent1" / "state" / "agent1"
    old.mkdir(parents=True)
    (old / "repos.json").write_text('{"/x": "ghp_old-token"}')
    await box.stop()
    await box.start()
    assert not (tmp_path / "data" / "sandboxes" / "agent1").exists()


async def test_a_reused_pid_is_not_written_into(box):
    from guilds.sandbox.bwrap import bwrap_sandbox as bubblewrap

    pid, start = box._ensure_init()
    with (
        pytest.raises(SandboxError, match="ended before its state root could be written"),
        bubblewrap._state_root(pid, start + 1),
    ):
        pass


async def test_the_state_root_is_charged_to_the_sandboxs_memory_cgroup(box):
    memory = [p for p in box._process_limits().cgroup_procs if "pids" not in p.split("/")]
    if not memory:
        pytest.skip("no memory cgroup can be made here")
    stat = Path(os.path.dirname(memory[0])) / "memory.stat"

    def shared() -> int:  # a tmpfs file's pages are the cgroup's shmem (the rest of its use moves meanwhile)
        fields = dict(line.split() for line in stat.read_text().splitlines())
        return int(fields["shmem"])

    before = shared()
    await run(box, f"head -c {3 * MIB} /dev/urandom > /run/guilds/kept")
    assert shared() - before >= 3 * MIB


GUILDS = shutil.which("guilds", path=os.path.dirname(sys.executable))


def test_calls_through_the_cli_once_the_agent_filled_its_state_root(tmp_path):
    """Each `guilds call` is a new orchestrator process: its start rewrites repos.json,
    which a full state root refuses; the call still runs, with one warning line."""
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nid = "full1"\nhome = "home"\nsandbox = "bwrap"\ntransport = "exec"\n'
                      '[bwrap]\nstate_size = "1m"\n')
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}

    def call(command: str) -> subprocess.CompletedProcess:
        return subprocess.run([GUILDS, "call", "shell", json.dumps({"command": command}), "--config", str(config)],
                              check=False, capture_output=True, text=True, env=env, timeout=120)

    try:
        filled = call("head -c 2M /dev/zero > /run/guilds/fill 2>/dev/null; echo filled")
        assert (filled.returncode, filled.stdout.split("\n")[0], filled.stderr) == (0, "filled", "")
        small = call("echo still answers")
        assert (small.returncode, small.stdout.split("\n")[0]) == (0, "still answers")
        assert small.stderr == ("bwrap: write_file: cannot write full1/repos.json under /run/guilds: "
                                "No space left on device; the one written before stays\n")
        big = call(": " + "A" * 70_000 + "; echo big")  # past the argv switch: a request file
        said = big.stdout.split("\n")[0]
        assert said.startswith("sandbox error: write_file: cannot write requests/") and said.endswith(
            " under /run/guilds: No space left on device")
        assert "Traceback" not in big.stderr + small.stderr
    finally:
        subprocess.run(
            [GUILDS, "sandbox", "stop", "--config", str(config)], check=False, env=env, capture_output=True, timeout=60
        )
