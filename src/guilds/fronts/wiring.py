"""The one wiring: settings, data folder, environment and overrides -> an open toolbox.

    resolve(settings=None, *, data_dir=None, env=None, overrides=None) -> Wired
    async with open_toolbox(wired) as toolbox: ...

Every front goes through here: ``guilds call``, ``guilds mcp``, ``guilds serve``
and ``guilds.open``.

- ``settings``: a settings file (path), an ``AgentSettings``, or None for the
  data folder's ``settings.toml`` (written on first run).
- ``data_dir``: the data folder; default ``$GUILDS_DATA``, else
  ``~/.local/share/guilds``. Made private (mode 0700, ``guilds.config.private``)
  when a toolbox opens.
- ``env``: read for ``$GUILDS_DATA``, ``$GUILDS_DATABASE_URL`` and
  ``$CODE_RESULT_MAX_BYTES`` (default ``os.environ``).
- ``overrides``: settings keys that win over the file, checked exactly as the
  file's keys are (``{"sandbox": "vm"}`` raises ``ConfigError("agent.sandbox:
  must be one of ...")``). A bare key is an ``[agent]`` key; a dotted one
  names its table (``"docker.image"``). A relative ``home`` resolves against
  the current folder.

The live coding flag follows the settings file; with an ``AgentSettings``, or
when ``coding`` is overridden, it is that value.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.settings import (
    CHECKPOINT_SANDBOXES,
    SANDBOXES,
    SERVED_KEYS,
    AgentSettings,
    coding_flag,
    default_settings_file,
    parse_settings,
    read_toml,
)
from ..config.settings import data_dir as default_data_dir
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..toolbox import Toolbox
    from ..toolbox.observer import Observer

SettingsSource = AgentSettings | str | os.PathLike | None


@dataclass(frozen=True)
class Wired:
    """What a front needs to open a toolbox: all checked, nothing started."""

    settings: AgentSettings
    data_dir: Path
    env: Mapping[str, str]
    coding: Callable[[], bool]
    settings_file: Path | None = None
    """The file the settings came from (None for an AgentSettings given as is)."""


OVERRIDABLE_TABLES = ("agent", "docker", "kubernetes", "secrets", "repos")


def _nested(overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{"sandbox": x, "docker.image": y} -> {"agent": {"sandbox": x}, "docker": {"image": y}}."""
    doc: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        table, _, name = key.partition(".") if "." in key else ("agent", "", key)
        if table not in OVERRIDABLE_TABLES or not name:
            raise ConfigError(f"{key}: not a settings key (KEY for [agent], or TABLE.KEY with TABLE one of "
                              f"{', '.join(OVERRIDABLE_TABLES)})")
        doc.setdefault(table, {})[name] = value
    return doc


def apply_overrides(settings: AgentSettings, overrides: Mapping[str, Any] | None,
                    env: Mapping[str, str] | None = None) -> AgentSettings:
    """settings with overrides applied, each checked as the settings file's key is.

    A secret or repository override adds to (or replaces by name) the file's ones.
    """
    if not overrides:
        return settings
    doc = _nested(overrides)
    checked = parse_settings(doc, Path.cwd(), env={} if env is None else env)
    changes: dict[str, Any] = {key: getattr(checked, key) for key in doc.get("agent", {})}
    for table in ("docker", "kubernetes"):
        if table in doc:
            fields = {key: getattr(getattr(checked, table), key) for key in doc[table]}
            changes[table] = dataclasses.replace(getattr(settings, table), **fields)
    if "secrets" in doc:
        changes["secrets"] = {**settings.secrets, **checked.secrets}
    if "repos" in doc:
        named = {repo.name: repo for repo in (*settings.repos, *checked.repos)}
        changes["repos"] = tuple(named.values())
    return dataclasses.replace(settings, **changes)


def _settings_file(source: str | os.PathLike | None, data: Path) -> Path:
    return default_settings_file(data) if source is None else Path(source).expanduser().resolve()


def resolve(settings: SettingsSource = None, *, data_dir: str | os.PathLike | None = None,
            env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Wired:
    """Read and check everything a toolbox needs; ConfigError names the bad key."""
    env = os.environ if env is None else env
    data = (Path(data_dir).expanduser() if data_dir is not None else default_data_dir(env)).absolute()
    if isinstance(settings, AgentSettings):
        loaded, path = settings, None
    else:
        if settings is None:
            make_data_dir(data)
        path = _settings_file(settings, data)
        document = read_toml(path)
        loaded = parse_settings(document, path.parent, env)
    final = apply_overrides(loaded, overrides, env)
    if path is not None and any(key in document for key in SERVED_KEYS):
        from ..config.templates import own_pooled, parse_served

        final = own_pooled(final, document)  # in claim mode the top-level [pool] sizes its warm pool
        parse_served(document, path.parent, env, final)  # a bad template stops every front, as a bad key does
    if path is None or (overrides and "coding" in overrides):
        coding = _constant(final.coding)
    else:
        coding = coding_flag(path)
    return Wired(settings=final, data_dir=data, env=env, coding=coding, settings_file=path)


def _constant(value: bool) -> Callable[[], bool]:
    return lambda: value


def make_data_dir(data: Path) -> Path:
    """The data folder, made private (0700; RecordError naming it when it cannot be)."""
    from ..config.private import private_dir

    return private_dir(data)


@contextlib.asynccontextmanager
async def open_toolbox(wired: Wired, observer: Observer | None = None) -> AsyncIterator[Toolbox]:
    """The agent's toolbox: its sandbox (not started: the first call starts it) and the run record;
    ``observer`` hears of its calls (``guilds.toolbox.observer``; None: the log lines only, and
    the traces ``wired.env`` asks for, ``guilds.observe.traces``).
    The agent is remembered in the data folder first (``guilds.config.agents``): every
    bwrap sandbox of that folder hides its home and settings file."""
    from ..config.agents import remember
    from ..observe.traces import traces_from_env
    from ..record.engine import database_url
    from ..record.store import Store
    from ..sandbox import get_sandbox, refuse_unkept_checkpoints
    from ..toolbox import Toolbox
    from ..toolbox.observer import Observer

    await refuse_unkept_checkpoints(wired.settings)
    data = make_data_dir(wired.data_dir)
    remember(data, wired.settings, wired.settings_file)
    sandbox = get_sandbox(wired.settings, data)
    async with Store(database_url(data, wired.env)) as store:
        observer = observer or Observer(traces_from_env(wired.env))
        toolbox = Toolbox(wired.settings, sandbox, store, coding=wired.coding, observer=observer)
        if wired.settings.sandbox in CHECKPOINT_SANDBOXES:
            from ..toolbox.checkpointing import AgentCheckpoints

            toolbox.checkpoints = AgentCheckpoints(toolbox, data)
        yield toolbox


def settings_options(parser: argparse.ArgumentParser) -> None:
    """--config and --sandbox, as every command that reads the settings takes them."""
    parser.add_argument("--config", help="the settings file (default: <data folder>/settings.toml)")
    parser.add_argument("--sandbox", help=f"{' | '.join(SANDBOXES)} (overrides agent.sandbox)")
