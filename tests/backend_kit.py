"""One fixture for "this test on each backend": ``backend``, the sandbox setting's name.

A test (or a fixture it uses, of any scope up to module) that takes ``backend`` runs
once per backend, ``local``, ``bwrap``, ``docker``, ``kubernetes`` (pod mode) and
``kubernetes-claim`` (claim mode), or on those its ``backends`` marker names::

    pytestmark = pytest.mark.backends(*backend_kit.ISOLATING)

Each run carries its backend's marker (``bwrap``, ``docker``, ``kubernetes``: ``-m``
selects by it) and is skipped, saying why, where this machine lacks the backend.
tests/conftest.py parametrizes; a test that parametrizes ``backend`` itself (a
record's database) is left alone.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import kube_kit

NAMES = ("local", "bwrap", "docker", "kubernetes", "kubernetes-claim")
"""Every backend, in the order a test's runs are listed."""
ISOLATING = ("bwrap", "docker", "kubernetes")
"""The backends that isolate the agent (``local`` isolates nothing; claim mode's pod is pod mode's)."""
MARKER = {"bwrap": "bwrap", "docker": "docker", "kubernetes": "kubernetes", "kubernetes-claim": "kubernetes"}


@functools.cache
def why_not(name: str) -> str | None:
    """Why this machine cannot run backend name (None: it can); asked once per process."""
    if name == "bwrap":
        from guilds.sandbox.bwrap.bwrap_argv import unavailable

        return unavailable()
    if name == "docker":
        from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable

        return docker_unavailable()
    if name.startswith("kubernetes"):
        return kube_kit.WHY
    return None


def param(name: str) -> Any:
    """backend name as a parameter: its marker, and skipped where the machine lacks it."""
    if name not in NAMES:
        raise ValueError(f"no backend {name!r} (known: {', '.join(NAMES)})")
    marks = []
    if name in MARKER:
        why = why_not(name)
        marks = [getattr(pytest.mark, MARKER[name]), pytest.mark.skipif(why is not None, reason=f"{name}: {why}")]
    return pytest.param(name, id=name, marks=marks)


def _parametrized_by_test(metafunc: pytest.Metafunc) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if "backend" in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return True
    return False


def parametrize(metafunc: pytest.Metafunc) -> None:
    """Run the test once per backend if it (or a fixture it uses) takes ``backend``."""
    if "backend" not in metafunc.fixturenames or _parametrized_by_test(metafunc):
        return
    chosen = metafunc.definition.get_closest_marker("backends")
    names = chosen.args if chosen else NAMES
    metafunc.parametrize("backend", [param(name) for name in names], scope="module")
