"""The one wiring: settings, data folder, environment and overrides, checked like the file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from guilds.config.settings import parse_settings
from guilds.errors import ConfigError
from guilds.fronts.wiring import apply_overrides, open_toolbox, resolve


def settings_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nhome = "home"\nsandbox = "local"\n{extra}')
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sandbox": "vm"}, "agent.sandbox: must be one of auto, local, bwrap, docker, kubernetes, got 'vm'"),
        ({"max_tool_calls": 0}, "agent.max_tool_calls: must be at least 1, got 0"),
        ({"sandbx": "local"}, "agent.sandbx: unknown key"),
        ({"docker.memory": 2}, "docker.memory: must be a string, got 2"),
        ({"docker.mem": "2g"}, "docker.mem: unknown key"),
        ({"secrets.HOME": "x" * 12}, "secrets.HOME: reserved"),
        ({"vm.size": 1}, "vm.size: not a settings key"),
        ({"home": ""}, "agent.home: must not be empty"),
    ],
)
def test_an_override_is_checked_like_the_file(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as caught:
        resolve(settings_file(tmp_path), data_dir=tmp_path / "data", env={}, overrides=overrides)
    assert message in str(caught.value)


def test_overrides_win_over_the_file_and_keep_the_rest(tmp_path):
    path = settings_file(tmp_path, 'id = "a7"\n[docker]\nmemory = "4g"\n[secrets]\nOLD_TOKEN = "old-secret-value"\n')
    wired = resolve(path, data_dir=tmp_path / "data", env={},
                    overrides={"sandbox": "docker", "home": "elsewhere", "docker.image": "img:1",
                               "secrets.NEW_TOKEN": "new-secret-value"})
    s = wired.settings
    assert (s.id, s.sandbox, s.home) == ("a7", "docker", Path.cwd() / "elsewhere")
    assert (s.docker.image, s.docker.memory) == ("img:1", "4g")
    assert dict(s.secrets) == {"OLD_TOKEN": "old-secret-value", "NEW_TOKEN": "new-secret-value"}
    assert wired.settings_file == path.resolve()


def test_the_coding_flag_follows_the_file_unless_overridden(tmp_path):
    path = settings_file(tmp_path)
    live = resolve(path, data_dir=tmp_path / "data", env={})
    fixed = resolve(path, data_dir=tmp_path / "data", env={}, overrides={"coding": True})
    assert live.coding() and fixed.coding()
    path.write_text('[agent]\nhome = "home"\ncoding = false\n')
    assert live.coding() is False and fixed.coding() is True


def test_settings_as_an_object_and_the_data_folder_from_the_environment(tmp_path):
    settings = parse_settings({"agent": {"home": str(tmp_path / "h"), "sandbox": "local"}}, tmp_path, env={})
    wired = resolve(settings, env={"GUILDS_DATA": str(tmp_path / "d")}, overrides={"max_tool_calls": 3})
    assert wired.data_dir == tmp_path / "d" and wired.settings_file is None
    assert wired.settings.max_tool_calls == 3 and settings.max_tool_calls == 200
    assert apply_overrides(settings, None) is settings


def test_without_a_file_the_data_folders_default_is_written_private(tmp_path):
    data = tmp_path / "data"
    wired = resolve(env={"GUILDS_DATA": str(data)})
    assert wired.settings_file == data / "settings.toml" and wired.settings.home == data / "home"
    assert stat.S_IMODE(data.stat().st_mode) == 0o700


async def test_the_opened_toolbox_runs_a_call_and_records_it(tmp_path):
    wired = resolve(settings_file(tmp_path), data_dir=tmp_path / "data", env={})
    async with open_toolbox(wired) as toolbox:
        result = await toolbox.call("w1", "shell", {"command": "echo wired"})
        calls = await toolbox.store.calls("w1")
    assert result.text == "wired\nremaining_tool_calls: 199" and not result.is_error
    assert [c.tool for c in calls] == ["shell"]
    assert (tmp_path / "data" / "guilds.db").exists()


@pytest.mark.parametrize("given", ["data", "./nested/../data"])
def test_a_relative_data_folder_is_made_absolute_from_the_working_folder(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    wired = resolve(settings_file(tmp_path), data_dir=given, env={})
    assert wired.data_dir.is_absolute() and wired.data_dir.resolve() == (tmp_path / "data").resolve()
