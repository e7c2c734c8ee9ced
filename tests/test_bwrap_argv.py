"""The bwrap backend's argv, built as pure functions: checked whole."""

from __future__ import annotations

from dataclasses import replace

import pytest

from guilds.sandbox.bwrap.bwrap_argv import (
    AGENT_UID_BASE,
    AGENT_UID_SPAN,
    INIT,
    LIMITS_SCRIPT,
    RELAY,
    BwrapConfig,
    Limits,
    agent_uid,
    bwrap_argv,
    enter_argv,
    limited_argv,
    parent_folders,
)

UID = 1500000001
CONFIG = BwrapConfig(
    home="/srv/agents/a1",
    state_bytes=256 << 20,
    clock="/var/lib/guilds/sandboxes/a1.clock",
    helpers=(("guilds-code", "/var/lib/guilds/helpers/guilds-code-0123.pyz"),),
    local_bin=(("rgx", None), ("node", "/opt/node/bin/node")),
    hidden=("/var/lib/guilds",),
    python="/usr/bin/python3",
    uid=UID,
    gid=UID,
    system=(("/usr", None), ("/etc", None), ("/bin", "usr/bin")),
    tmp_bytes=1 << 30,
    idle_seconds=1800,
    info_fd=7,
    ready_fd=9,
)
AS_AGENT = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--no-new-privs",
            "--bounding-set=-all", "--inh-caps=-all", "--"]
ROOT_CAPS = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
             "--cap-add", "CAP_SETPCAP"]
TAIL = ["--info-fd", "7", "--chdir", "/", "--", *AS_AGENT,
        "/usr/bin/python3", "-I", "-S", "-c", INIT, "/run/guilds-clock", "1800", "9"]
SYSTEM = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--symlink", "usr/bin", "/bin"]
KERNEL = ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
          "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
SHM = ["--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm"]
TMP_RUN = ["--perms", "1777", "--size", str(1 << 30), "--tmpfs", "/tmp",
           "--perms", "0755", "--size", str(1 << 20), "--tmpfs", "/run"]
LOCAL_BIN = [
    "--tmpfs", "/usr/local/bin",
    "--ro-bind", "/usr/local/bin/rgx", "/usr/local/bin/rgx",
    "--symlink", "/opt/node/bin/node", "/usr/local/bin/node",
    "--ro-bind", "/var/lib/guilds/helpers/guilds-code-0123.pyz", "/usr/local/bin/guilds-code",
    "--remount-ro", "/usr/local/bin",
]
PARENTS = ["--perms", "0755", "--dir", "/srv", "--perms", "0755", "--dir", "/srv/agents"]
BINDS = ["--bind", "/srv/agents/a1", "/srv/agents/a1",
         "--perms", "0700", "--size", str(256 << 20), "--tmpfs", "/run/guilds",
         "--ro-bind", "/var/lib/guilds/sandboxes/a1.clock", "/run/guilds-clock"]
READ_ONLY = ["--remount-ro", "/dev", "--remount-ro", "/run", "--remount-ro", "/"]
NAMESPACES = ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
HEAD = ["bwrap", *SYSTEM, "--dev", "/dev", *SHM, *KERNEL, *TMP_RUN]


def test_the_default_sandbox_as_root():
    assert bwrap_argv(CONFIG) == [
        *HEAD, *LOCAL_BIN, *PARENTS, *BINDS, "--tmpfs", "/var/lib/guilds", *READ_ONLY,
        *NAMESPACES, "--unshare-net", "--as-pid-1", *ROOT_CAPS, *TAIL,
    ]


def test_an_orchestrator_not_root_makes_a_user_namespace_with_its_own_dev():
    config = replace(CONFIG, userns=True, local_bin=(), helpers=(), hidden=())
    dev = ["--perms", "0755", "--size", str(1 << 20), "--tmpfs", "/dev"]
    for name in ("null", "zero", "full", "random", "urandom", "tty"):
        dev += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    dev += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
            "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr"]
    assert bwrap_argv(config) == [
        "bwrap", "--unshare-user", *SYSTEM, *dev, *SHM, *KERNEL, *TMP_RUN,
        "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin", *PARENTS, *BINDS, *READ_ONLY,
        *NAMESPACES, "--unshare-net", "--as-pid-1", "--cap-drop", "ALL",
        "--info-fd", "7", "--chdir", "/", "--", "setpriv", "--no-new-privs", "--inh-caps=-all", "--",
        "/usr/bin/python3", "-I", "-S", "-c", INIT, "/run/guilds-clock", "1800", "9",
    ]


def test_network_on_keeps_the_resolver_behind_run():
    config = replace(CONFIG, network=True, keep_run=("/run/systemd/resolve/stub-resolv.conf",))
    assert bwrap_argv(config) == [
        *HEAD, "--ro-bind-try", "/run/systemd/resolve/stub-resolv.conf",
        "/run/systemd/resolve/stub-resolv.conf",
        *LOCAL_BIN, *PARENTS, *BINDS, "--tmpfs", "/var/lib/guilds", *READ_ONLY,
        *NAMESPACES, "--as-pid-1", *ROOT_CAPS, *TAIL,
    ]


def test_a_list_keeps_the_network_off_and_binds_the_proxy_folder_with_the_relay_in_init():
    config = replace(CONFIG, egress_dir="/var/lib/guilds/egress/a1/run")
    relay_tail = [*TAIL[:-8], "/usr/bin/python3", "-I", "-S", "-c", RELAY + INIT, "/run/guilds-clock", "1800", "9",
                  "/run/guilds-egress/proxy.sock", "3128"]
    assert bwrap_argv(config) == [
        *HEAD, "--ro-bind", "/var/lib/guilds/egress/a1/run", "/run/guilds-egress",
        *LOCAL_BIN, *PARENTS, *BINDS, "--tmpfs", "/var/lib/guilds", *READ_ONLY,
        *NAMESPACES, "--unshare-net", "--as-pid-1", *ROOT_CAPS, *relay_tail,
    ]
    compile(RELAY + INIT, "<init>", "exec")


def test_a_home_inside_the_hidden_data_folder_is_bound_after_hiding_it():
    config = replace(CONFIG, home="/var/lib/guilds/home", local_bin=(), helpers=())
    assert bwrap_argv(config) == [
        *HEAD, "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin",
        "--tmpfs", "/var/lib/guilds",
        "--perms", "0755", "--dir", "/var", "--perms", "0755", "--dir", "/var/lib",
        "--perms", "0755", "--dir", "/var/lib/guilds",
        "--bind", "/var/lib/guilds/home", "/var/lib/guilds/home", *BINDS[3:], *READ_ONLY,
        *NAMESPACES, "--unshare-net", "--as-pid-1", *ROOT_CAPS, *TAIL,
    ]


def test_a_home_beside_the_data_folder_is_not_inside_it():
    config = replace(CONFIG, home="/tmp/agents/h", local_bin=(), helpers=())
    assert bwrap_argv(config) == [
        *HEAD, "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin",
        "--perms", "0755", "--dir", "/tmp/agents",  # /tmp itself is the sized tmpfs: left as it is
        "--bind", "/tmp/agents/h", "/tmp/agents/h", *BINDS[3:],
        "--tmpfs", "/var/lib/guilds", *READ_ONLY,
        *NAMESPACES, "--unshare-net", "--as-pid-1", *ROOT_CAPS, *TAIL,
    ]


def test_other_agents_and_settings_files_are_hidden_after_the_home():
    config = replace(CONFIG, local_bin=(), helpers=(), hidden=("/var/lib/guilds", "/etc/agents/b"),
                     hidden_files=("/etc/a1.toml",))
    assert bwrap_argv(config) == [
        *HEAD, "--tmpfs", "/usr/local/bin", "--remount-ro", "/usr/local/bin", *PARENTS, *BINDS,
        "--tmpfs", "/var/lib/guilds", "--tmpfs", "/etc/agents/b", "--ro-bind", "/dev/null", "/etc/a1.toml",
        *READ_ONLY, *NAMESPACES, "--unshare-net", "--as-pid-1", *ROOT_CAPS, *TAIL,
    ]


def test_entering_runs_the_command_as_the_agent_without_capabilities():
    helper = ["python3", "-I", "-S", "/usr/local/bin/guilds-code", "QQ=="]
    assert enter_argv(4242, "/srv/agents/a1", helper, CONFIG) == [
        "nsenter", "--target=4242", "--mount", "--uts", "--ipc", "--net", "--pid", "--root",
        "--wdns=/srv/agents/a1", "--", *AS_AGENT, "setpriv", "--pdeathsig=TERM", "--", *helper,
    ]
    assert enter_argv(4242, "/srv/agents/a1", helper, replace(CONFIG, userns=True)) == [
        "nsenter", "--target=4242", "--user", "--preserve-credentials",
        "--mount", "--uts", "--ipc", "--net", "--pid", "--root",
        "--wdns=/srv/agents/a1", "--", "setpriv", "--no-new-privs", "--inh-caps=-all", "--",
        "setpriv", "--pdeathsig=TERM", "--", *helper,
    ]


def test_limits_wrap_a_command():
    procs = ("/sys/fs/cgroup/memory/guilds/a1/cgroup.procs", "/sys/fs/cgroup/pids/guilds/a1/cgroup.procs")
    assert limited_argv(Limits(pids=512, cgroup_procs=procs), ["true"]) == [
        "/bin/sh", "-c", LIMITS_SCRIPT, "guilds-limits", "512", "0", *procs, "--", "true"]
    assert limited_argv(Limits(pids=64, memory_bytes=2 << 30), ["true"]) == [
        "/bin/sh", "-c", LIMITS_SCRIPT, "guilds-limits", "64", "2097152", "--", "true"]


def test_each_agent_has_its_own_uid_far_from_users():
    uids = {agent_uid(f"agent{i}") for i in range(1000)}
    assert len(uids) == 1000
    assert all(AGENT_UID_BASE <= u < AGENT_UID_BASE + AGENT_UID_SPAN for u in uids)
    assert agent_uid("agent1") == agent_uid("agent1")


def test_init_is_plain_python():
    compile(INIT, "<init>", "exec")


def test_bwrap_settings_and_their_edges(tmp_path):
    import pytest

    from guilds.config.settings import parse_settings
    from guilds.errors import ConfigError

    got = parse_settings({"bwrap": {"uid": 2**31 - 2, "memory": "1m", "pids_limit": 16,
                                    "tmp_size": "3G", "state_size": "1m"}}, tmp_path).bwrap
    assert (got.uid, got.memory, got.pids_limit, got.tmp_size, got.state_size) == (
        2**31 - 2, 1 << 20, 16, 3 << 30, 1 << 20)
    assert parse_settings({}, tmp_path).bwrap.state_size == 256 << 20
    for table, error in [
        ({"memory": "1023k"}, "bwrap.memory: must be at least 1m, got '1023k'"),
        ({"tmp_size": "2x"}, 'bwrap.tmp_size: must be a size such as "512m" or "2g", got \'2x\''),
        ({"state_size": "1023k"}, "bwrap.state_size: must be at least 1m, got '1023k'"),
        ({"pids_limit": 15}, "bwrap.pids_limit: must be at least 16, got 15"),
        ({"uid": -1}, "bwrap.uid: must be from 0 to 2147483646, got -1"),
        ({"gid": 5}, "bwrap.gid: unknown key"),
    ]:
        with pytest.raises(ConfigError) as caught:
            parse_settings({"bwrap": table}, tmp_path)
        assert str(caught.value).startswith(error), caught.value


def test_a_relative_home_is_refused_rather_than_walked_for_ever():
    assert parent_folders("/srv/agents/a1", ()) == ["/srv", "/srv/agents"]
    with pytest.raises(ValueError, match="absolute"):
        parent_folders("data/agent-homes/a1", ())
