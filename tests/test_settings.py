"""The agent's settings file: every key, its defaults, and a clear error naming each bad key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from guilds.config.settings import (
    DEFAULT_MAX_TOOL_CALLS,
    AgentSettings,
    coding_flag,
    data_dir,
    default_settings,
    default_settings_file,
    exposed,
    load_settings,
)
from guilds.errors import ConfigError

FULL = """
[agent]
id = "web-agent"
home = "/srv/agents/web"
sandbox = "local"
coding = false
max_tool_calls = 7
ports = "30000-30009"
network = true
result_max_bytes = 4096

[secrets]
OPENAI_API_KEY = "sk-test-1234567890"

[repos.web]
path = "code/web"
token = "ghp_abcdefghijklmnop"

[repos.api]
"""


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def load(tmp_path: Path, text: str, env: dict | None = None) -> AgentSettings:
    return load_settings(write(tmp_path, text), env=env or {})


def test_every_key_is_read(tmp_path):
    s = load(tmp_path, FULL)
    assert s.id == "web-agent"
    assert s.home == Path("/srv/agents/web")
    assert (s.sandbox, s.coding, s.network) == ("local", False, True)
    assert (s.max_tool_calls, s.ports, s.result_max_bytes) == (7, (30000, 30009), 4096)
    assert dict(s.secrets) == {"OPENAI_API_KEY": "sk-test-1234567890"}
    assert [(r.name, r.path, r.token) for r in s.repos] == [
        ("web", "code/web", "ghp_abcdefghijklmnop"),
        ("api", "repos/api", ""),
    ]
    assert sorted(s.secret_values()) == ["ghp_abcdefghijklmnop", "sk-test-1234567890"]


def test_an_empty_file_gives_the_defaults_with_the_home_beside_it(tmp_path):
    s = load(tmp_path, "")
    assert s.id == "agent1"
    assert s.home == (tmp_path / "home").resolve()
    assert (s.sandbox, s.coding, s.max_tool_calls) == ("auto", True, DEFAULT_MAX_TOOL_CALLS)
    assert (s.ports, s.result_max_bytes, s.repos) == ((20000, 20099), 8192, ())
    assert (s.transport, s.max_in_flight) == ("auto", 64)


@pytest.mark.parametrize("text, expected", [
    ('transport = "resident"\nmax_in_flight = 1', ("resident", 1)),
    ('transport = "exec"\nmax_in_flight = 4096', ("exec", 4096)),
])
def test_transport_and_its_bound(tmp_path, text, expected):
    s = load(tmp_path, f"[agent]\n{text}")
    assert (s.transport, s.max_in_flight) == expected


def test_a_relative_home_resolves_against_the_files_folder(tmp_path):
    assert load(tmp_path, '[agent]\nhome = "agents/a"').home == (tmp_path / "agents/a").resolve()


def test_result_max_bytes_falls_back_to_the_environment(tmp_path):
    assert load(tmp_path, "", env={"CODE_RESULT_MAX_BYTES": "2048"}).result_max_bytes == 2048
    assert (
        load(tmp_path, "[agent]\nresult_max_bytes = 3000", env={"CODE_RESULT_MAX_BYTES": "2048"}).result_max_bytes
        == 3000
    )


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ('[agent]\nsandbx = "local"', {}, "agent.sandbx: unknown key"),
        ('[agnt]\nid = "a"', {}, "agnt: unknown key"),
        ('[repos.web]\ntokn = "abcdef"', {}, "repos.web.tokn: unknown key"),
        ('[agent]\nsandbox = "vm"', {}, "agent.sandbox: must be one of auto, local, bwrap, docker, kubernetes"),
        ('[agent]\nharness = "aider"', {}, "agent.harness: must be one of claude-code, codex"),
        ('[agent]\ntransport = "ssh"', {}, "agent.transport: must be one of auto, resident, exec"),
        ("[agent]\nmax_in_flight = 0", {}, "agent.max_in_flight: must be from 1 to 4096, got 0"),
        ("[agent]\nmax_in_flight = 4097", {}, "agent.max_in_flight: must be from 1 to 4096, got 4097"),
        ('[agent]\nmax_in_flight = "64"', {}, "agent.max_in_flight: must be an integer"),
        ('[agent]\nmax_tool_calls = "200"', {}, "agent.max_tool_calls: must be an integer"),
        ("[agent]\nmax_tool_calls = 0", {}, "agent.max_tool_calls: must be at least 1, got 0"),
        ("[agent]\nmax_tool_calls = true", {}, "agent.max_tool_calls: must be an integer"),
        ('[agent]\ncoding = "false"', {}, "agent.coding: must be true or false"),
        ("[agent]\nnetwork = 1", {}, "agent.network: must be true, false or a list of hosts, got 1"),
        ("[agent]\nports = 20000", {}, "agent.ports: must be a string 'first-last'"),
        ('[agent]\nports = "20000"', {}, "agent.ports: must be 'first-last'"),
        ('[agent]\nports = "30000-20000"', {}, "agent.ports: must be a block within 1-65535"),
        ('[agent]\nports = "1-70000"', {}, "agent.ports: must be a block within 1-65535"),
        ('[agent]\nid = "../x"', {}, "agent.id: must be letters, digits"),
        ("[agent]\nhome = 3", {}, "agent.home: must be a string"),
        ('[agent]\nhome = ""', {}, "agent.home: must not be empty"),
        ("[agent]\nresult_max_bytes = 100", {}, "agent.result_max_bytes: must be from 1024 to 65536, got 100"),
        ("", {"CODE_RESULT_MAX_BYTES": "lots"}, "CODE_RESULT_MAX_BYTES: must be an integer"),
        ("", {"CODE_RESULT_MAX_BYTES": "999999"}, "CODE_RESULT_MAX_BYTES: must be from 1024 to 65536"),
        ('[secrets]\n"BAD-NAME" = "abcdef"', {}, "secrets.BAD-NAME: not an environment variable name"),
        ("[secrets]\nTOKEN = 12345", {}, "secrets.TOKEN: must be a string"),
        ('[secrets]\nTOKEN = "abc"', {}, "secrets.TOKEN: at least 4 characters"),
        ('[secrets]\nHOME = "/elsewhere"', {}, "secrets.HOME: reserved"),
        ('secrets = "x"', {}, "secrets: must be a table"),
        ('[repos]\nweb = "x"', {}, "repos.web: must be a table"),
        ('[repos.web]\npath = "../outside"', {}, "repos.web.path: must be a folder inside the home"),
        ('[repos.web]\npath = "/abs"', {}, "repos.web.path: must be a folder inside the home"),
        ('[repos."a/b"]', {}, "repos.a/b: must be letters, digits"),
        ('[repos.web]\ntoken = "ab"', {}, "repos.web.token: at least 4 characters"),
        ('[agent]\nnetwork = "github.com"', {}, "agent.network: must be true, false or a list of hosts"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = []', {}, "agent.network: an empty list allows nothing"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = [""]', {}, "agent.network[0]: must not be empty"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = [3]', {}, "agent.network[0]: must be a string"),
        ('[agent]\nsandbox = "local"\nnetwork = ["github.com"]', {},
         "agent.network: a list of hosts is enforced only by the bwrap, docker and kubernetes sandboxes, not 'local'"),
        ('[kubernetes]\negress_address = "node.example"', {},
         "kubernetes.egress_address: must be an IP address such as \"10.244.0.1\""),
        ('[kubernetes]\nchannel = "tcp"', {}, "kubernetes.channel: must be one of exec, direct"),
        ('[kubernetes]\nmode = "claim"\nchannel = "direct"', {},
         "kubernetes.channel: \"direct\" is for mode \"pod\""),
        ('[secrets.T]\nvalue = "abcdef"\nhosts = ["github.com"]', {},
         "secrets.T.hosts: only with agent.network a list of hosts"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org"]\n[secrets.T]\nhosts = ["a.org"]', {},
         "secrets.T.value: missing"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org"]\n[secrets.T]\nvalue = "ab"', {},
         "secrets.T.value: at least 4 characters"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org"]\n[secrets.T]\nvalue = "abcd"\nhost = []', {},
         "secrets.T.host: unknown key"),
        ('[repos.web]\ntoken = "abcdef"\ntoken_hosts = ["github.com"]', {},
         "repos.web.token_hosts: only with agent.network a list of hosts"),
        ('[egress.resolve]\n"a.org" = "10.0.0.1"', {}, "egress.resolve: only with agent.network a list of hosts"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org"]\n[egress.resolve]\n"a.org" = "nowhere"', {},
         "egress.resolve.a.org: must be an IP address"),
        ('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org", "http://b.org/"]', {},
         "agent.network: 'http://b.org/' has a port that is not a number"),
        (('[agent]\nsandbox = "bwrap"\nnetwork = ["a.org"]\n[repos.web]\ntoken = "abcdef"\n'
         'token_hosts = ["10.0.0.0/8"]'), {}, "repos.web.token_hosts: a secret's hosts name hosts"),
    ],
)
def test_a_bad_key_is_named(tmp_path, text, env, message):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text, env)
    assert message in str(err.value)


def test_bad_toml_and_a_missing_file_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(tmp_path, "[agent\nid = 1")
    with pytest.raises(ConfigError, match="no such settings file"):
        load_settings(tmp_path / "nope.toml")


@pytest.mark.parametrize(("mode", "who"), [(0o640, "group"), (0o604, "others"), (0o644, "group and others")])
@pytest.mark.parametrize("text", ['[secrets]\nKEY = "sk-12345678"', '[repos.web]\ntoken = "ghp_12345678"'])
def test_a_file_with_secrets_others_may_read_is_refused(tmp_path, text, mode, who):
    path = write(tmp_path, text, mode)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    assert str(caught.value) == (f"{path}: holds secrets or tokens and {who} may read it "
                                 f"(mode {mode:04o}): chmod 600 {path}")
    assert exposed(path) == str(caught.value)
    path.chmod(0o600)
    assert load_settings(path, env={}).secret_values() and exposed(path) is None


@pytest.mark.parametrize("mode", [0o644, 0o620, 0o602, 0o700])
def test_a_file_without_secrets_or_only_writable_by_others_is_read(tmp_path, mode):
    """Read bits count: the check is about who may read a secret."""
    assert load_settings(write(tmp_path, '[repos.web]\npath = "w"', mode), env={}).repos[0].path == "w"
    if mode & 0o044 == 0:
        assert load_settings(write(tmp_path, '[secrets]\nKEY = "sk-12345678"', mode), env={}).secrets


def test_a_file_that_became_readable_stops_the_coding_flag(tmp_path):
    path = write(tmp_path, '[secrets]\nKEY = "sk-12345678"')
    flag = coding_flag(path)
    assert flag() is True
    path.write_text('[agent]\ncoding = false\n[secrets]\nKEY = "sk-12345678"\n')
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        flag()


def test_data_dir_follows_guilds_data(tmp_path):
    assert data_dir({"GUILDS_DATA": str(tmp_path)}) == tmp_path
    assert data_dir({}) == Path.home() / ".local/share/guilds"


def test_the_embedded_default_writes_its_file_once(tmp_path):
    data = tmp_path / "data"
    s = default_settings(data, env={})
    path = default_settings_file(data)
    assert path == data / "settings.toml"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert s.home == (data / "home").resolve() and s.coding is True
    path.write_text(path.read_text().replace("max_tool_calls = 200", "max_tool_calls = 5"))
    assert default_settings(data, env={}).max_tool_calls == 5  # never overwritten


def test_the_coding_flag_is_read_afresh(tmp_path):
    path = write(tmp_path, "[agent]\ncoding = true\n")
    flag = coding_flag(path)
    assert flag() is True
    path.write_text("[agent]\ncoding = false\n")
    assert flag() is False
    path.write_text("[agent]\ncoding = 1\n")
    with pytest.raises(ConfigError, match=r"agent\.coding"):
        flag()


def test_a_list_keeps_the_network_off_and_names_what_each_secret_is_for(tmp_path):
    s = load(tmp_path, (
        '[agent]\nsandbox = "docker"\nnetwork = ["github.com", "*.example.org", "10.1.2.0/24"]\n'
        '[secrets]\nPLAIN = "plain-value"\n[secrets.PYPI]\nvalue = "pypi-value"\nhosts = ["upload.example.org"]\n'
        '[repos.web]\ntoken = "ghp_abcdef"\n[repos.docs]\ntoken = "ghp_123456"\ntoken_hosts = ["git.corp"]\n'
        '[egress.resolve]\n"git.corp" = "10.1.2.3"\n'))
    assert (s.network, s.egress) == (False, ("github.com", "*.example.org", "10.1.2.0/24"))
    assert dict(s.secrets) == {"PLAIN": "plain-value", "PYPI": "pypi-value"}
    assert dict(s.secret_hosts) == {"PYPI": ("upload.example.org",)}
    assert [(r.name, r.token_hosts) for r in s.repos] == [("web", None), ("docs", ("git.corp",))]
    assert dict(s.egress_resolve) == {"git.corp": "10.1.2.3"}
    assert sorted(s.secret_values()) == ["ghp_123456", "ghp_abcdef", "plain-value", "pypi-value"]


def test_true_and_false_are_as_before(tmp_path):
    on, off = load(tmp_path, "[agent]\nnetwork = true"), load(tmp_path, "[agent]\nnetwork = false")
    assert (on.network, on.egress, off.network, off.egress) == (True, (), False, ())
