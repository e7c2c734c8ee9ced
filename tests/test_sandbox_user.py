"""A template's user inside the sandbox (``AgentSettings.user``): the passwd and group lines,
``sudo`` run by a real sh, the backends' specs (the home bound at the user's home), and
the templates ``guilds serve --e2b`` serves."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from guilds.config.settings import E2B_USER, AgentSettings, DockerSettings, SandboxUser
from guilds.config.templates import Served, Template, with_user
from guilds.sandbox.bwrap.bwrap_argv import BwrapConfig, bwrap_argv
from guilds.sandbox.bwrap.bwrap_users import write_users
from guilds.sandbox.docker import docker_spec as spec
from guilds.sandbox.sandbox_user import SUDO, container_files, sudo_file, users_texts

PASSWD = ["root:x:0:0:root:/root:/bin/bash", "user:x:1000:1000::/home/user:/bin/bash",
          "guilds:x:65532:65532:guilds agent:/nonexistent:/bin/sh", "nobody:x:65534:65534::/:/bin/false"]
GROUP = ["root:x:0:", "user:x:1000:", "guilds:x:65532:"]


def test_the_uid_and_gid_are_named_user_and_nothing_else_names_them():
    passwd, group = users_texts(PASSWD, GROUP, 65532, 65532, E2B_USER, "/bin/sh")
    assert passwd.splitlines() == ["root:x:0:0:root:/root:/bin/bash", "nobody:x:65534:65534::/:/bin/false",
                                   "user:x:65532:65532::/home/user:/bin/sh"]
    assert group.splitlines() == ["root:x:0:", "user:x:65532:"]


def test_root_keeps_its_name_even_for_uid_0():
    passwd, group = users_texts(PASSWD, GROUP, 0, 0, E2B_USER, "/bin/sh")
    assert passwd.splitlines()[0] == "root:x:0:0:root:/root:/bin/bash"
    assert passwd.splitlines()[-1] == "user:x:0:0::/home/user:/bin/sh"
    assert group.splitlines() == ["root:x:0:", "guilds:x:65532:", "user:x:0:"]


def test_bwrap_names_the_uid_user_only_when_the_settings_say_so(tmp_path):
    plain = Path(write_users(tmp_path / "a", 1500000001, 1500000001, "/h")[0]).read_text()
    assert plain.splitlines()[-1].startswith("guilds:x:1500000001:")
    named = Path(write_users(tmp_path / "b", 1500000001, 1500000001, "/home/user", E2B_USER)[0]).read_text()
    assert named.splitlines()[-1].startswith("user:x:1500000001:1500000001::/home/user:")
    assert oct(os.stat(tmp_path / "b" / "passwd").st_mode & 0o777) == "0o644"


def test_a_container_gets_its_images_users_renamed_and_sudo():
    files = container_files("\n".join(PASSWD), "\n".join(GROUP), 65532, 65532, E2B_USER)
    assert [(path, mode) for path, _, mode in files] == [
        ("/etc/passwd", 0o644), ("/etc/group", 0o644), ("/usr/local/bin/sudo", 0o755)]
    assert b"guilds:" not in files[0][1] and files[0][1].endswith(b"user:x:65532:65532::/home/user:/bin/sh\n")
    assert files[2][1] == SUDO.encode()


def test_the_bwrap_sandbox_binds_the_home_at_the_users_home():
    config = BwrapConfig(home="/data/agent-homes/a1", home_inside="/home/user", state_bytes=1, clock="/c",
                         helpers=(), python="/usr/bin/python3", uid=7, gid=7, system=(("/usr", None),))
    argv = bwrap_argv(config)
    at = argv.index("--bind")
    assert argv[at - 4:at + 3] == ["--perms", "0755", "--dir", "/home",  # its parent made, 0755
                                   "--bind", "/data/agent-homes/a1", "/home/user"]
    assert argv.count("/data/agent-homes/a1") == 1 and "/data/agent-homes" not in argv
    same = bwrap_argv(dataclasses.replace(config, home_inside=""))
    at = same.index("--bind")
    assert same[at - 8:at + 3] == ["--perms", "0755", "--dir", "/data", "--perms", "0755", "--dir",
                                   "/data/agent-homes", "--bind", "/data/agent-homes/a1", "/data/agent-homes/a1"]


def test_the_docker_container_binds_the_home_at_the_users_home():
    kwargs = {"agent_id": "a1", "idle_seconds": 90, "base_env": {}, "user": (65532, 65532), "network": False}
    got = spec.container_spec(DockerSettings(), home="/h/a1", inside="/home/user", **kwargs)
    assert got["volumes"]["/h/a1"] == {"bind": "/home/user", "mode": "rw"} and got["working_dir"] == "/home/user"
    plain = spec.container_spec(DockerSettings(), home="/h/a1", **kwargs)
    assert plain["volumes"]["/h/a1"] == {"bind": "/h/a1", "mode": "rw"} and plain["working_dir"] == "/h/a1"


def test_the_home_inside_is_the_users_or_the_host_path():
    settings = AgentSettings(id="a", home=Path("/h/a"))
    assert settings.home_inside() == "/h/a"
    assert dataclasses.replace(settings, user=E2B_USER).home_inside() == "/home/user"


def test_serving_e2b_names_every_templates_user_but_one_naming_its_own():
    own = SandboxUser(name="dev", home="/home/dev")
    served = Served(templates={
        "default": Template(name="default", settings=AgentSettings(id="a", home=Path("/h/a"))),
        "mine": Template(name="mine", settings=AgentSettings(id="m", home=Path("/h/m"), user=own))})
    named = with_user(served, E2B_USER)
    assert named.templates["default"].settings.user == E2B_USER
    assert named.templates["mine"].settings.user == own
    assert served.templates["default"].settings.user is None  # the served templates untouched
    agent = named.templates["default"].for_agent("a-1", Path("/data/agent-homes/a-1"))
    assert (agent.user, agent.home_inside(), agent.home) == (E2B_USER, "/home/user", Path("/data/agent-homes/a-1"))


@pytest.fixture(scope="module")
def sudo(tmp_path_factory) -> Path:
    return sudo_file(tmp_path_factory.mktemp("sudo"))


def _sudo(sudo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(sudo), *args], capture_output=True, text=True, timeout=10,
                          env={"PATH": os.environ["PATH"], **(env or {})}, check=False)


def test_sudo_is_written_once_runnable_by_all(sudo):
    assert sudo_file(sudo.parent) == sudo and oct(sudo.stat().st_mode & 0o777) == "0o755"
    assert sudo.read_text() == SUDO


@pytest.mark.parametrize("args", [(), ("-u", "root"), ("-uroot",), ("--user=root",), ("-E", "-n", "-H"),
                                  ("-g", f"#{os.getgid()}"), ("-u", f"#{os.getuid()}"), ("--",),
                                  ("-p", "prompt:", "-S")])
def test_sudo_runs_its_command_as_the_same_uid_in_the_same_environment(sudo, args):
    ran = _sudo(sudo, *args, "sh", "-c", "id -u; echo $FOO", env={"FOO": "kept"})
    assert (ran.returncode, ran.stdout.split(), ran.stderr) == (0, [str(os.getuid()), "kept"], "")


def test_sudo_runs_a_shell_command_with_i_and_s(sudo):
    for flag in ("-i", "-s", "--login"):
        ran = _sudo(sudo, flag, "echo", "a", "b", env={"SHELL": "/bin/sh"})
        assert ran.stdout == "a b\n", flag


@pytest.mark.parametrize("args", [("-u", "nobody", "id"), ("--user=nobody", "id"), ("-g", "daemon", "id"),
                                  ("-unobody", "id")])
def test_sudo_refuses_another_user(sudo, args):
    ran = _sudo(sudo, *args)
    assert ran.returncode == 1 and ran.stdout == ""
    assert ran.stderr.startswith("sudo: this sandbox runs everything as ") and "no user or group '" in ran.stderr


@pytest.mark.parametrize("args", [(), ("-u",), ("-E",), ("-p",)])
def test_sudo_without_a_command_says_its_usage(sudo, args):
    ran = _sudo(sudo, *args)
    assert (ran.returncode, ran.stderr) == (1, "usage: sudo [-u user] command [args...]\n")


def test_sudo_asks_no_password_and_lists_what_it_allows(sudo):
    assert _sudo(sudo, "-v").returncode == 0 and _sudo(sudo, "-k").returncode == 0
    listed = _sudo(sudo, "-l")
    assert listed.returncode == 0 and "NOPASSWD: ALL" in listed.stdout
    assert "runs the command as" in _sudo(sudo, "-V").stdout
