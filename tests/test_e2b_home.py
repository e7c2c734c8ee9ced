"""E2B's home and user through the unmodified E2B Python SDK, on bwrap, docker and kubernetes
(pod and claim mode): the
sandbox's home is /home/user, its user is named ``user`` (``whoami``, ``~``, a file's owner
and group), absolute paths under /home/user reach the home, a command or terminal runs in
any folder of the sandbox it names, and ``sudo`` runs its command
as that same user, never as root; none of the user's files can be changed from inside. Where
the home is on this machine (bwrap, docker), the agent's home there is what is bound at /home/user."""

from __future__ import annotations

import os

import pytest
from e2b import InvalidArgumentException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize

from e2b_kit import E2BServer, e2b_server, home_of

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap", "docker", "kubernetes", "kubernetes-claim"),
              pytest.mark.skipif(os.geteuid() != 0, reason="an agent's own uid needs a root orchestrator")]


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp(f"e2b-home-{backend}"), backend) as served:
        yield served


@pytest.fixture(scope="module")
def sbx(server: E2BServer):
    with pytest.MonkeyPatch.context() as patch:
        server.export(patch)
        box = Sandbox.create(timeout=300)
        yield box
        box.kill()


def test_whoami_home_and_working_folder_are_e2bs(sbx):
    out = sbx.commands.run("whoami; id -un; id -gn; echo ~; echo $HOME; pwd; grep ^user: /etc/passwd | cut -d: -f6")
    assert out.stdout.split() == ["user", "user", "user", "/home/user", "/home/user", "/home/user", "/home/user"]
    assert sbx.commands.run("pwd", cwd="/home/user").stdout.strip() == "/home/user"


def test_absolute_paths_under_home_user_reach_the_home(server, sbx, backend):
    sbx.commands.run("echo written-inside > /home/user/x.txt")
    assert sbx.files.read("/home/user/x.txt") == "written-inside\n"
    info = sbx.files.write("/home/user/y.txt", "written-outside")
    assert info.path == "/home/user/y.txt"
    assert sbx.files.write("z.txt", "relative").path == "/home/user/z.txt"
    assert sbx.commands.run("cat ~/y.txt /home/user/z.txt").stdout == "written-outsiderelative"
    assert [e.path for e in sbx.files.list("/home/user") if e.name == "y.txt"] == ["/home/user/y.txt"]
    if not backend.startswith("kubernetes"):  # there the home is the pod's volume, not this machine's
        host = home_of(sbx, server.data)
        assert (host / "x.txt").read_text() == "written-inside\n"
        assert (host / "y.txt").read_text() == "written-outside"


def test_files_are_owned_by_user(sbx):
    sbx.files.write("owned.txt", "mine")
    sbx.commands.run("touch made.txt")
    for name in ("owned.txt", "made.txt"):
        info = sbx.files.get_info(name)
        assert (info.owner, info.group) == ("user", "user"), name
    assert sbx.commands.run("stat -c '%U:%G' /home/user/made.txt").stdout.strip() == "user:user"


def test_sudo_runs_the_command_as_the_same_user_without_root(sbx):
    assert sbx.commands.run('sudo echo "$FOO"', envs={"FOO": "bar"}).stdout.strip() == "bar"
    assert sbx.commands.run('sudo echo "$FOO"').stdout.strip() == ""
    uid = sbx.commands.run("id -u").stdout.strip()
    assert uid != "0"
    for command in ("sudo id -u", "sudo -u root id -u", "sudo -E -n id -u", "sudo -i id -u", "sudo -- id -u"):
        assert sbx.commands.run(command).stdout.strip() == uid, command
    assert sbx.commands.run("sudo whoami").stdout.strip() == "user"
    denied = sbx.commands.run("sudo touch /etc/guilds-root-test; echo $?; ls /root 2>&1; echo end")
    assert denied.stdout.split()[0] != "0" and "end" in denied.stdout
    refused = sbx.commands.run("sudo -u nobody id -u; echo status $?")
    assert "status 1" in refused.stdout and "no user or group 'nobody'" in refused.stderr
    assert "usage: sudo" in sbx.commands.run("sudo; true").stderr
    assert sbx.commands.run("grep -c NoNewPrivs:.*1 /proc/self/status").stdout.strip() == "1"


def test_the_user_s_names_and_sudo_cannot_be_changed_from_inside(sbx):
    """/etc/passwd, /etc/group and sudo are root's (docker, bwrap) or read-only mounts (kubernetes)."""
    attempts = ("echo 'user:x:0:0::/root:/bin/sh' >> /etc/passwd", "echo 'root:x:0:user' >> /etc/group",
                "echo 'exec /bin/sh' > /usr/local/bin/sudo", "chmod 0777 /etc/passwd",
                "mv /etc/passwd /etc/passwd.old", "cp /bin/true /usr/local/bin/sudo", "rm -f /usr/local/bin/sudo")
    before = sbx.commands.run("cat /etc/passwd /etc/group /usr/local/bin/sudo | sha256sum").stdout
    for attempt in attempts:
        assert sbx.commands.run(f"{attempt}; echo status $?").stdout.strip().endswith("status 1"), attempt
    assert sbx.commands.run("cat /etc/passwd /etc/group /usr/local/bin/sudo | sha256sum").stdout == before
    assert sbx.commands.run("sudo whoami; stat -c %a /etc/passwd").stdout.split() == ["user", "644"]


def test_a_command_or_terminal_runs_in_any_folder_of_the_sandbox(sbx):
    assert sbx.commands.run("pwd", cwd="/").stdout.strip() == "/"
    assert sbx.commands.run("pwd", cwd="/usr/bin").stdout.strip() == "/usr/bin"
    assert sbx.commands.run("pwd", cwd="~").stdout.strip() == "/home/user"
    output: list[bytes] = []
    terminal = sbx.pty.create(PtySize(80, 24), cwd="/")
    sbx.pty.send_stdin(terminal.pid, b"echo in:$PWD\nexit\n")
    assert terminal.wait(on_pty=output.append).exit_code == 0
    assert "in:/\r\n" in b"".join(output).decode()
    for missing in ("/no/such/folder", "/etc/passwd"):
        with pytest.raises(InvalidArgumentException, match="is not a folder of the sandbox"):
            sbx.commands.run("pwd", cwd=missing)


@pytest.mark.backends("bwrap")
def test_python_is_the_sandboxs_python3_as_in_e2bs_images(sbx):
    """E2B's programs run ``python`` (its images have it): on bwrap, where the host has none,
    a link to the sandbox's python3 in /usr/local/bin; the host's own, where it has one."""
    out = sbx.commands.run("python -c 'import sys; print(sys.version_info[0])'; command -v python")
    assert out.stdout.split()[0] == "3", out
    changed = sbx.commands.run("ln -sf /bin/sh /usr/local/bin/python 2>&1 || echo refused")
    assert changed.stdout.strip().endswith("refused")  # the link is read-only, as the helpers beside it


def test_the_python_alias_is_made_only_where_there_is_none(tmp_path):
    from guilds.sandbox.bwrap.bwrap_argv import python_alias

    bins = tmp_path / "bin"
    bins.mkdir()
    assert python_alias((), "/usr/bin/python3", (str(bins),)) == (("python", "/usr/bin/python3"),)
    assert python_alias((("python", None),), "/usr/bin/python3", (str(bins),)) == ()
    assert python_alias((), None, (str(bins),)) == ()
    (bins / "python").symlink_to("nowhere")  # a dangling link counts: the host's name wins
    assert python_alias((), "/usr/bin/python3", (str(bins),)) == ()
