"""The sandbox's passwd and group files: the host's, the agent's uid and gid named when the
host names neither (a uid the host names keeps its name)."""

from __future__ import annotations

import os

from guilds.sandbox.bwrap.bwrap_argv import agent_uid
from guilds.sandbox.bwrap.bwrap_users import USER_NAME, users_texts, write_users


def test_an_unnamed_uid_gets_the_agents_name():
    uid = agent_uid("named-test")
    passwd, group = users_texts(uid, uid, "/work/home")
    assert passwd.splitlines()[-1] == f"{USER_NAME}:x:{uid}:{uid}:guilds agent:/work/home:/bin/bash"
    assert group.splitlines()[-1] == f"{USER_NAME}:x:{uid}:"
    with open("/etc/passwd") as host:
        assert passwd.startswith(host.read())


def test_a_uid_the_host_names_is_left_as_it_is(tmp_path):
    passwd, group = users_texts(0, 0, "/root")
    with open("/etc/passwd") as host_passwd, open("/etc/group") as host_group:
        assert (passwd, group) == (host_passwd.read().rstrip("\n") + "\n", host_group.read().rstrip("\n") + "\n")
    paths = write_users(tmp_path / "etc", 0, 0, "/root")
    assert [os.stat(p).st_mode & 0o777 for p in paths] == [0o644, 0o644]
