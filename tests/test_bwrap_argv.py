"""The bwrap backend's argv, built as pure functions: checked whole."""

from __future__ import annotations

from dataclasses import replace

from guilds.sandbox.bwrap_argv import INIT, BwrapConfig, bwrap_argv, enter_argv

CONFIG = BwrapConfig(
    home="/srv/agents/a1",
    state="/var/lib/guilds/sandboxes/a1/state",
    helpers=(("guilds-code", "/var/lib/guilds/helpers/guilds-code-0123.pyz"),),
    local_bin=(("rgx", None), ("node", "/opt/node/bin/node")),
    hidden=("/var/lib/guilds",),
    python="/usr/bin/python3",
    idle_seconds=1800,
    info_fd=7,
    ready_fd=9,
)
TAIL = ["--cap-drop", "ALL", "--info-fd", "7", "--chdir", "/", "--",
        "/usr/bin/python3", "-I", "-S", "-c", INIT, "/run/guilds", "1800", "9"]
LOCAL_BIN = [
    "--tmpfs", "/usr/local/bin",
    "--ro-bind", "/usr/local/bin/rgx", "/usr/local/bin/rgx",
    "--symlink", "/opt/node/bin/node", "/usr/local/bin/node",
    "--ro-bind", "/var/lib/guilds/helpers/guilds-code-0123.pyz", "/usr/local/bin/guilds-code",
    "--remount-ro", "/usr/local/bin",
]
SYSTEM = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
          "--tmpfs", "/tmp", "--tmpfs", "/run"]
BINDS = ["--bind", "/srv/agents/a1", "/srv/agents/a1",
         "--bind", "/var/lib/guilds/sandboxes/a1/state", "/run/guilds"]
NAMESPACES = ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]


def test_the_default_sandbox():
    assert bwrap_argv(CONFIG) == [
        *SYSTEM, *LOCAL_BIN, *BINDS, "--tmpfs", "/var/lib/guilds",
        *NAMESPACES, "--unshare-net", "--as-pid-1", *TAIL,
    ]


def test_network_on_keeps_the_resolver_behind_run():
    config = replace(CONFIG, network=True, keep_run=("/run/systemd/resolve/stub-resolv.conf",))
    assert bwrap_argv(config) == [
        *SYSTEM, "--ro-bind-try", "/run/systemd/resolve/stub-resolv.conf",
        "/run/systemd/resolve/stub-resolv.conf",
        *LOCAL_BIN, *BINDS, "--tmpfs", "/var/lib/guilds", *NAMESPACES, "--as-pid-1", *TAIL,
    ]


def test_a_home_inside_the_hidden_data_folder_is_bound_after_hiding_it():
    config = replace(CONFIG, home="/var/lib/guilds/home", local_bin=(), helpers=())
    assert bwrap_argv(config) == [
        *SYSTEM, "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin",
        "--tmpfs", "/var/lib/guilds",
        "--bind", "/var/lib/guilds/home", "/var/lib/guilds/home",
        "--bind", "/var/lib/guilds/sandboxes/a1/state", "/run/guilds",
        *NAMESPACES, "--unshare-net", "--as-pid-1", *TAIL,
    ]


def test_a_home_beside_the_data_folder_is_not_inside_it():
    config = replace(CONFIG, home="/var/lib/guilds-home", local_bin=(), helpers=())
    assert bwrap_argv(config) == [
        *SYSTEM, "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin",
        "--bind", "/var/lib/guilds-home", "/var/lib/guilds-home",
        "--bind", "/var/lib/guilds/sandboxes/a1/state", "/run/guilds",
        "--tmpfs", "/var/lib/guilds",
        *NAMESPACES, "--unshare-net", "--as-pid-1", *TAIL,
    ]


def test_entering_runs_the_command_without_capabilities():
    helper = ["python3", "-I", "-S", "/usr/local/bin/guilds-code", "QQ=="]
    assert enter_argv(4242, "/srv/agents/a1", helper) == [
        "nsenter", "--target=4242", "--mount", "--uts", "--ipc", "--net", "--pid", "--root",
        "--wd=/srv/agents/a1", "--",
        "setpriv", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--",
        "python3", "-I", "-S", "/usr/local/bin/guilds-code", "QQ==",
    ]


def test_init_is_plain_python():
    compile(INIT, "<init>", "exec")
