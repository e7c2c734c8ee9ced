"""The sandbox's side of the egress proxy, piece by piece: the commands' environment
(the helper's proxy variables naming the call, GH_HOST for an enterprise host),
placeholders, the hosts a token is for, the decisions read into the record and
shown in a call's Metadata."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from guilds.config.settings import parse_settings
from guilds.errors import ConfigError
from guilds.record.store import Store
from guilds.record.values import decision_rows
from guilds.sandbox import get_sandbox
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.sandbox.egress_side import Egress
from guilds.sandbox.egress_side.decision_log import read_decisions
from guilds.sandbox.egress_side.environment import TRUST_VARS, sandbox_env
from guilds.sandbox.egress_side.files import EgressFiles, egress_files, prepare
from guilds.sandbox.egress_side.placeholders import bound_values, placeholder, repos_entries
from guilds.sandbox.egress_side.proxy_setup import proxy_config
from guilds.toolbox import Toolbox
from guilds.web.views import egress_rows
from guilds_code import command, runstate
from guilds_code.protocol import Request

TOKEN = "ghp_" + "a1b2c3d4" * 4


def request(home: str) -> Request:
    return Request("shell", {"command": "true"}, "run-1", "agent1", "c0ffee", home, home)


def settings(tmp_path: Path, **repo):
    data = {"agent": {"home": str(tmp_path / "home"), "sandbox": "bwrap", "network": ["github.com", "git.corp"]},
            "secrets": {"PLAIN": "plain-value-1", "PYPI": {"value": "pypi-value-123", "hosts": ["upload.example.org"]}},
            "repos": {"web": {"token": TOKEN, **repo}}}
    return parse_settings(data, tmp_path, env={})


def files(tmp_path: Path) -> EgressFiles:
    return egress_files(str(tmp_path / "data"), "agent1")


@pytest.fixture
def state(tmp_path, monkeypatch):
    root = tmp_path / "state"
    (root / "agent1").mkdir(parents=True)
    monkeypatch.setenv("GUILDS_STATE_DIR", str(root))
    return root / "agent1"


def test_the_helper_names_the_call_in_the_proxy_variables_and_tells_gh_its_host(state, tmp_path, monkeypatch):
    repo, other = str(tmp_path / "home/repos/web"), str(tmp_path / "home/repos/gh")
    (state / "repos.json").write_text(json.dumps({repo: {"token": "placeholder-1", "gh_host": "git.corp"},
                                                  other: "placeholder-2"}))
    monkeypatch.setenv(command.EGRESS_PROXY_ENV, "127.0.0.1:3128")
    req = request(str(tmp_path / "home"))
    env = command.command_env(req, repo, runstate.load_repo_tokens(req))
    assert {env[n] for n in command.PROXY_VARS} == {"http://run-1%2Fc0ffee:@127.0.0.1:3128"}
    assert env["GIT_HTTP_PROXY_AUTHMETHOD"] == "basic"
    gh = (env["GH_TOKEN"], env["GH_HOST"], env["GH_ENTERPRISE_TOKEN"])
    assert gh == ("placeholder-1", "git.corp", "placeholder-1")
    on_github = command.command_env(req, other, runstate.load_repo_tokens(req))
    assert on_github["GH_TOKEN"] == "placeholder-2" and "GH_HOST" not in on_github


def test_without_the_proxy_the_environment_is_as_before(state, tmp_path, monkeypatch):
    repo = str(tmp_path / "home/repos/web")
    (state / "repos.json").write_text(json.dumps({repo: "token-1234"}))
    for name in (command.EGRESS_PROXY_ENV, *command.PROXY_VARS):
        monkeypatch.delenv(name, raising=False)
    req = request(str(tmp_path / "home"))
    env = command.command_env(req, repo, runstate.load_repo_tokens(req))
    assert env["GH_TOKEN"] == "token-1234"
    assert not {command.EGRESS_PROXY_ENV, "GH_HOST", "GIT_HTTP_PROXY_AUTHMETHOD", *command.PROXY_VARS} & set(env)


def test_a_placeholder_has_the_length_of_its_value_and_stays_the_same():
    key = os.urandom(32)
    first = placeholder(key, "repos.web", TOKEN)
    assert len(first) == len(TOKEN) and first != TOKEN and first.isalnum()
    assert placeholder(key, "repos.web", TOKEN) == first
    assert placeholder(key, "repos.docs", TOKEN) != first
    assert placeholder(os.urandom(32), "repos.web", TOKEN) != first
    assert len(placeholder(key, "x", "y" * 100)) == 100


@pytest.mark.parametrize(("url", "host"), [
    ("https://github.com/owner/repo.git", "github.com"),
    ("https://x-access-token@GitHub.com/owner/repo", "github.com"),
    ("git@git.corp:team/repo.git", "git.corp"),
    ("ssh://git@git.corp:2222/team/repo.git", "git.corp"),
])
def test_the_origin_remote_names_the_token_hosts_by_default(tmp_path, url, host):
    folder = tmp_path / "home" / "repos" / "web"
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "remote", "add", "origin", url], check=True)
    bound = bound_values(settings(tmp_path), files(tmp_path), str(tmp_path / "home"))["repos.web"]
    assert bound.hosts == (("github.com", "api.github.com") if host == "github.com" else (host,))
    assert bound.gh_host == (None if host == "github.com" else host)


def test_a_repository_without_origin_gives_its_token_to_no_host_unless_named(tmp_path):
    home = str(tmp_path / "home")
    assert bound_values(settings(tmp_path), files(tmp_path), home)["repos.web"].hosts == ()
    named = bound_values(settings(tmp_path, token_hosts=["git.corp"]), files(tmp_path), home)["repos.web"]
    assert (named.hosts, named.gh_host) == (("git.corp",), "git.corp")


def test_the_sandbox_sees_placeholders_and_the_proxy_config_holds_the_values(tmp_path):
    s = settings(tmp_path, token_hosts=["github.com", "api.github.com"])
    files = egress_files(str(tmp_path / "data"), s.id)
    key = prepare(files)
    assert oct(os.stat(files.path("placeholder.key")).st_mode & 0o777) == "0o600"
    assert prepare(files) == key
    bound = bound_values(s, files, str(s.home))
    env = sandbox_env(s, bound)
    assert env["PYPI"] == bound["secrets.PYPI"].placeholder and "pypi-value-123" not in env.values()
    assert "PLAIN" not in env  # a plain string stays as before: agent_env gives it
    assert {env[n] for n in TRUST_VARS} == {"/run/guilds-egress/trust.pem"}
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    entries = repos_entries(s, str(s.home), bound)
    assert entries == {str(s.home / "repos" / "web"): bound["repos.web"].placeholder}
    config = proxy_config(s, files, bound, clock="/c", idle_seconds=60)
    assert {(x["name"], x["value"]) for x in config["secrets"]} == {("repos.web", TOKEN), ("PYPI", "pypi-value-123")}
    assert config["allow"] == ["github.com", "git.corp"]


def test_decisions_are_read_once_and_a_half_written_line_waits(tmp_path):
    files = egress_files(str(tmp_path / "data"), "agent1")
    prepare(files)
    line = {"time": 1.5, "host": "github.com", "port": 443, "allowed": True, "reason": "listed",
            "bytes_up": 10, "bytes_down": 20, "tag": "run-1/c0ffee"}
    with open(files.path("decisions.jsonl"), "w") as fh:
        fh.write(json.dumps(line) + "\n" + '{"host": "half')
    assert read_decisions(files) == [line]
    assert read_decisions(files) == []
    with open(files.path("decisions.jsonl"), "a") as fh:
        fh.write('.example", "port": 80, "allowed": false, "reason": "not listed", "tag": "../x"}\n')
    later = read_decisions(files)
    assert [d["host"] for d in later] == ["half.example"]
    rows = decision_rows([line, *later], "run-2", "beef")
    assert [(r["run_id"], r["call_id"], r["allowed"]) for r in rows] == [
        ("run-1", "c0ffee", True), ("run-2", "beef", False)]  # a bad tag: the call that read it
    assert egress_rows(rows)[0].value == "github.com:443 allowed · 10 B up, 20 B down"
    assert egress_rows(rows)[1].value == "half.example:80 refused: not listed"


def test_an_allowlist_made_in_code_is_refused_where_nothing_enforces_it(tmp_path):
    listed = replace(settings(tmp_path), sandbox="local")
    with pytest.raises(ConfigError, match="enforced only by the bwrap, docker and kubernetes sandboxes, not 'local'"):
        get_sandbox(listed, tmp_path / "data")


class CountingEgress(Egress):
    """The real egress, counting its keeps."""

    keeps = 0

    def keep(self) -> None:
        self.keeps += 1
        super().keep()


@pytest.mark.bwrap
@pytest.mark.parametrize("transport", ["exec", "resident"])
async def test_the_proxy_is_kept_once_per_call_on_either_transport(tmp_path, transport):
    """The toolbox keeps the sandbox's egress once before each call; the backend's exec keeps
    it no more (the exec transport's helper process is one exec per call)."""
    missing = unavailable()
    if missing is not None:
        pytest.skip(f"bwrap: {missing}")
    s = parse_settings({"agent": {"id": f"kept-{transport}", "home": str(tmp_path / "home"), "sandbox": "bwrap",
                                  "network": ["example.test"], "transport": transport}}, tmp_path, env={})
    sandbox = get_sandbox(s, tmp_path / "data", idle_seconds=120)
    sandbox.egress = CountingEgress(s, tmp_path / "data", idle_seconds=120)
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        toolbox = Toolbox(s, sandbox, store)
        try:
            for calls in (1, 2, 3):
                result = await toolbox.call("run-1", "shell", {"command": "echo $HTTPS_PROXY"})
                assert "127.0.0.1:3128" in result.text, result.text
                assert sandbox.egress.keeps == calls
        finally:
            await toolbox.close()
            await sandbox.stop()
