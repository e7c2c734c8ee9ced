"""Checks for the settings file: each returns the value or raises ConfigError naming the key."""

from __future__ import annotations

import math
import posixpath
from typing import Any, Iterable, Mapping

from guilds_code import limits, protocol

from ..errors import ConfigError


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def known(table: Mapping[str, Any], where: str, keys: Iterable[str]) -> None:
    """Refuse the first key of table that is not in keys, by its full name."""
    keys = tuple(keys)
    for key in table:
        if key not in keys:
            full = f"{where}.{key}" if where else key
            raise ConfigError(f"{full}: unknown key (known: {', '.join(keys)})")


def table(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a table, got {_show(value)}")
    return value


def string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string, got {_show(value)}")
    if "\x00" in value:
        raise ConfigError(f"{key}: must not contain a NUL character")
    return value


def boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {_show(value)}")
    return value


def integer(value: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer, got {_show(value)}")
    if value < lo or (hi is not None and value > hi):
        span = f"at least {lo}" if hi is None else f"from {lo} to {hi}"
        raise ConfigError(f"{key}: must be {span}, got {value}")
    return value


def int_text(text: str, key: str) -> int:
    try:
        value = float(text) if "." in text else int(text)
    except ValueError:
        raise ConfigError(f"{key}: must be an integer, got {_show(text)}") from None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        raise ConfigError(f"{key}: must be an integer, got {_show(text)}")
    return int(value)


def choice(value: Any, key: str, choices: Iterable[str]) -> str:
    value = string(value, key)
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(f"{key}: must be one of {', '.join(choices)}, got {_show(value)}")
    return value


def name(value: Any, key: str) -> str:
    """A name that becomes a file name: [A-Za-z0-9._-], no '..', at most 128."""
    value = string(value, key)
    if not is_safe_name(value):
        raise ConfigError(
            f"{key}: must be letters, digits, '.', '_' or '-' (at most "
            f"{limits.NAME_MAX_CHARS}, no '..'), got {_show(value)}"
        )
    return value


def is_safe_name(value: str) -> bool:
    """True when value can name a file: the protocol's rule for run, agent and call ids."""
    return protocol.is_safe_name(value)


def env_name(value: str, key: str) -> str:
    if not protocol.is_env_name(value):
        raise ConfigError(f"{key}: not an environment variable name")
    return value


def ports(value: Any, key: str) -> tuple[int, int]:
    """'a-b' (1 <= a <= b <= 65535) -> (a, b)."""
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string 'first-last', got {_show(value)}")
    first, sep, last = value.partition("-")
    if not (sep and first.strip().isdigit() and last.strip().isdigit()):
        raise ConfigError(f"{key}: must be 'first-last' like '20000-20099', got {_show(value)}")
    a, b = int(first), int(last)
    if not 1 <= a <= b <= 65535:
        raise ConfigError(f"{key}: must be a block within 1-65535, first <= last, got {_show(value)}")
    return a, b


def relative_path(value: str, key: str) -> str:
    """A folder relative to the home that stays inside it; returned normalized."""
    norm = posixpath.normpath(value)
    if not value or value.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise ConfigError(f"{key}: must be a folder inside the home, relative to it, got {_show(value)}")
    return norm
