"""Trying to get out of the sandbox, as an attacker in the agent's commands would.

Run on every isolating backend this machine has (bwrap, docker, kubernetes). ``local``
isolates nothing (its docs say so), so none of this is asked of it.
No test writes to a sysctl: a knob is only checked with ``[ -w ]`` and opened
for writing with nothing written.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import backend_kit
import kube_kit
import parallel_kit
from guilds.config.settings import AgentSettings, BwrapSettings, DockerSettings
from guilds.sandbox import get_sandbox

pytestmark = pytest.mark.backends(*backend_kit.ISOLATING)
KNOBS = ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sysrq-trigger",
         "/proc/sys/vm/drop_caches")
PIDS_LIMIT = 64
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")


def settings_for(root: Path, backend: str, agent: str = "escape1", **kw) -> AgentSettings:
    """agent's settings; its id ends in the worker's (a parallel run's other workers run
    agents of these names at once, and the bwrap uid and its process count go by the id)."""
    settings = AgentSettings(
        id=agent + parallel_kit.WORKER, home=root / agent / "home", sandbox=backend,
        secrets={"B_SECRET": "b-secret-93c1f0"},
        bwrap=BwrapSettings(pids_limit=PIDS_LIMIT, memory=256 << 20, tmp_size=16 << 20),
        docker=DockerSettings(image=IMAGE, pids_limit=PIDS_LIMIT, memory="256m"), **kw,
    )
    return kube_kit.kube_settings(settings) if backend == "kubernetes" else settings


def pids_limit(box) -> int:
    """kubernetes: the node's podPidsLimit (the pod spec has none of its own)."""
    return kube_kit.POD_PIDS_LIMIT if box.name == "kubernetes" else PIDS_LIMIT


@pytest.fixture
async def make(tmp_path):
    made = []

    async def _make(backend: str, agent: str = "escape1", **kw):
        box = get_sandbox(settings_for(tmp_path, backend, agent), tmp_path / agent / "data", **kw)
        made.append(box)
        await box.start()
        return box

    yield _make
    for box in made:
        await box.stop()
        if box.name == "kubernetes":
            await asyncio.to_thread(kube_kit.remove_agent, box.pod)


@pytest.fixture
async def jail(backend, make):
    """A started sandbox of each isolating backend (tests/backend_kit.py)."""
    return await make(backend)


async def run(box, script: str, timeout: float = 30):
    return await box.exec(["bash", "-c", script], timeout=timeout)


async def out(box, script: str, timeout: float = 30) -> str:
    result = await run(box, script, timeout)
    assert result.exit_code == 0 and not result.timed_out, result
    return result.stdout.decode()


def pid_namespace_of(box) -> str:
    """The pid namespace of the sandbox's init, as the host names it."""
    if box.name == "bwrap":
        pid = json.loads(Path(box._record).read_text())["pid"]
    elif box.name == "kubernetes":
        pid = kube_kit.container_pid(box.pod)
    else:
        pid = box.client.api.inspect_container(box.container)["State"]["Pid"]
    return os.readlink(f"/proc/{pid}/ns/pid")


def host_uids_in(namespace: str) -> dict[int, int]:
    """host pid -> real uid of every process in that pid namespace."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        found[int(entry)] = int(uid_line.split()[1])
    return found


async def test_no_process_is_root_inside_or_on_the_host(jail):
    assert (await out(jail, "id -u; id -g")).split() != ["0", "0"]
    assert "0" not in (await out(jail, "id -u")).split()
    call = asyncio.create_task(run(jail, "sleep 2.71"))
    await asyncio.sleep(1)
    uids = host_uids_in(pid_namespace_of(jail))
    await call
    assert len(uids) >= 2  # the init and the call at least
    assert 0 not in uids.values(), uids


async def test_the_kernel_knobs_are_not_writable(jail):
    checks = " ".join(f'[ -w {k} ] && echo "writable {k}";' for k in KNOBS)
    assert await out(jail, checks + " echo checked") == "checked\n"
    # opened for writing, nothing written: refused, never a value in a knob
    probe = ("import os,sys\nfor k in sys.argv[1:]:\n try:\n  os.close(os.open(k,os.O_WRONLY))\n"
             "  print('opened',k)\n except OSError as e:print(type(e).__name__)")
    said = await out(jail, f"python3 -c \"$0\" {' '.join(KNOBS)}".replace("$0", probe.replace('"', '\\"')))
    assert "opened" not in said, said


async def test_host_secrets_and_other_agents_are_unreadable(make, jail, tmp_path):
    other = await make(jail.name, "escapeB")
    await out(other, 'echo "b home file" > ~/b.txt')
    b = tmp_path / "escapeB"
    b.mkdir(exist_ok=True)  # kubernetes: the homes are claims, no host folder
    (b / "agent.toml").write_text('[secrets]\nB_SECRET = "b-secret-93c1f0"\n')
    db = b / "data" / "guilds.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", (f"import sqlite3; c=sqlite3.connect({str(db)!r}); "
                    "c.execute('create table calls(x)'); c.commit()")], check=True)
    mine = tmp_path / "escape1" / "data"
    script = f"""
        cat /etc/shadow 2>/dev/null && echo READ-shadow
        ls /root 2>/dev/null | head -1 | grep -q . && echo READ-root
        cat {b}/agent.toml 2>/dev/null && echo READ-settings
        cat {other.home}/b.txt 2>/dev/null && echo READ-home
        ls {other.home} 2>/dev/null | grep -q . && echo LIST-home
        python3 -c "import sqlite3; sqlite3.connect('file:{db}?mode=ro', uri=True).execute('select * from calls')" \
            2>/dev/null && echo READ-record
        ls -A {mine} 2>/dev/null | grep -q . && echo LIST-own-data
        echo checked
    """  # noqa: S608 - a shell script; its one query names a fixed table
    assert await out(jail, script) == "checked\n"


async def test_a_host_socket_is_unreachable_with_the_network_off(jail):
    folder = Path(f"/var/tmp/guilds-escape-{os.getpid()}")
    folder.mkdir(mode=0o755)
    path = folder / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        os.chmod(path, 0o777)
        server.listen(1)
        probe = (
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]);print('CONNECTED')\n"
            "except OSError as e:print(type(e).__name__)"
        )
        said = await out(jail, f"python3 -c '{probe}' {path}")
        assert "CONNECTED" not in said and said.strip(), said
    finally:
        server.close()
        path.unlink(missing_ok=True)
        folder.rmdir()


async def test_a_fork_loop_stops_at_the_pids_limit(jail):
    loop = ("import os,time\nn=0\nwhile True:\n try:\n  pid=os.fork()\n except OSError:\n  break\n"
            " if pid==0:\n  time.sleep(3);os._exit(0)\n n+=1\nprint(n)")
    began = time.monotonic()
    forked = int(await out(jail, f"python3 -c '{loop}'", timeout=60))
    assert 0 < forked < pids_limit(jail)
    assert time.monotonic() - began < 30
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks


async def test_a_tmpfs_fill_stops_at_its_size(jail):
    said = await out(jail, "head -c 100m /dev/zero > /dev/shm/fill; echo status=$?; "
                           "stat -c %s /dev/shm/fill; rm /dev/shm/fill")
    status, size = said.split()
    assert status != "status=0"
    assert 0 < int(size) <= 64 << 20


@pytest.mark.backends("bwrap")
async def test_bwrap_tmp_is_sized_from_the_settings(make, backend):
    box = await make(backend)
    said = await out(box, "head -c 40m /dev/zero > /tmp/fill; echo status=$?; stat -c %s /tmp/fill")
    status, size = said.split()
    assert status != "status=0" and int(size) <= 16 << 20


async def test_memory_is_bounded(jail):
    result = await run(jail, "python3 -c 'b = bytearray(768 << 20); print(len(b))'", timeout=60)
    assert result.exit_code != 0 and b"805306368" not in result.stdout


async def test_touching_everything_writable_does_not_keep_the_sandbox(make, backend):
    # A new pod's setup (its helpers checked, its files written) takes execs of its own, and
    # counts as idle time: on a loaded machine more than 2 s.
    idle = 5 if backend == "kubernetes" else 2
    box = await make(backend, idle_seconds=idle)
    touch_all = ("while :; do find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o "
                 "-writable -print0 2>/dev/null | xargs -0 touch 2>/dev/null; touch /dev/shm; sleep 0.2; done")
    await out(box, f"setsid bash -c '{touch_all}' >/dev/null 2>&1 < /dev/null & echo started")
    namespace = pid_namespace_of(box)
    deadline = time.monotonic() + 10 + idle
    while host_uids_in(namespace) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not host_uids_in(namespace), "the agent kept its sandbox alive by touching files"



AS_USER = """
import asyncio, json, sys
from pathlib import Path
from guilds.sandbox import get_sandbox
from guilds.config.settings import AgentSettings

async def main():
    root = Path(sys.argv[1])
    box = get_sandbox(AgentSettings(id="user1", home=root / "home", sandbox="auto"), root / "data")
    await box.start()
    try:
        await box.write_file(box.state_dir + "/requests/r1-c1.json", b"{}")
        script = ('id -u; [ -w /proc/sys/kernel/core_pattern ] && echo knob-writable; '
                  'cat /etc/shadow >/dev/null 2>&1 && echo shadow-read; echo hi > ~/f && cat ~/f; '
                  'stat -f -c "%T %b %S" /run/guilds; cat /run/guilds/requests/r1-c1.json; echo; '
                  'ls /run/guilds/user1')
        result = await box.exec(["bash", "-c", script], timeout=30)
        print(json.dumps([box.name, result.exit_code, result.stdout.decode()]))
    finally:
        await box.stop()

asyncio.run(main())
"""
USER_UID = 1500000077
SYSTEM_PYTHON = "/usr/bin/python3"
PACKAGES = ("guilds", "guilds_code", "guilds_harness")


def readable_packages(dest: Path) -> Path:
    """A copy of the packages in dest, for a uid that may not read the checkout's folders."""
    source = Path(__file__).resolve().parents[1] / "src"
    for name in PACKAGES:
        shutil.copytree(source / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


@pytest.mark.bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
                    reason="needs root to become another user, and /usr/bin/python3")
def test_an_orchestrator_not_root_gets_bwrap_in_a_user_namespace(tmp_path):
    work = Path(f"/var/tmp/guilds-userns-{os.getpid()}")
    work.mkdir(mode=0o700)
    os.chown(work, USER_UID, USER_UID)
    src = str(readable_packages(work / "src"))
    try:
        done = subprocess.run(
            ["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups", "--",
             SYSTEM_PYTHON, "-c", AS_USER, str(work)],
            check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(work), "PYTHONPATH": src, "LANG": "C.UTF-8"},
            capture_output=True, timeout=120)
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    name, code, said = json.loads(done.stdout.decode().splitlines()[-1])
    uid, hi, state_root, request, repos = said.splitlines()
    assert (name, code, uid, hi, request, repos) == ("bwrap", 0, str(USER_UID), "hi", "{}", "repos.json")
    kind, blocks, block_size = state_root.split()  # the state root: its own tmpfs here too
    assert kind == "tmpfs" and int(blocks) * int(block_size) == 256 << 20
