"""The suite in parallel (pytest-xdist, ``--dist loadgroup``): which tests share a worker.

A test that touches something one process at a time must own (the Kubernetes test
namespace and the node's cpu, the Docker engine's containers of a fixed agent id,
its processes found on the host by their command line) carries an ``xdist_group``:
a group's tests run one after another on one worker, beside the other groups and
the ungrouped tests. What can be made one's own is made so
instead: each worker has a PostgreSQL database of its own (``own_postgres``), its
own basetemp (under a short one of the run's, ``short_basetemp``), and picks free ports.

The rules, first match wins (``group_of``):

- an ``xdist_group`` the test names itself;
- ``cluster``: a test marked ``kubernetes``, and every other run of the same test
  function (on docker, bwrap, local; exec or resident): the cluster's objects and
  those runs' containers are named after fixed agent ids, its pools and templates
  are deleted by the module that made them, its node has two cores, and a test's
  runs look for their processes on the host by one command line. The marker
  ``cluster`` is given to them too: ``-m cluster`` selects them (CI runs them once
  the cluster is up, the rest beside its build). The docker tests of no such
  function name their agents apart (a random id) and follow the rules below;
- a fixture broader than a test (module, class or package scope) that the test's
  module defines: its module's name, so the fixture (a served app, a network namespace
  with its hosts, an E2B server) is set up once and its tests keep their order;
- a test function's runs (its parameters): the function, one run after another, as
  they look for their processes on the host by one command line.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import tempfile

import pytest

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""This process's worker id under xdist (``gw0``, ``gw1``...), empty when serial."""
SHARED_MARKERS = ("kubernetes",)
"""Markers whose tests, and their function's other runs, share the group SHARED."""
SHARED = "cluster"
WIDE_SCOPES = ("module", "class", "package")
MODULE_ONLY = ("no_pool_left",)
"""Module-scoped fixtures that hold nothing a test shares (cleanup after a module's tests)."""


def _function(item: pytest.Item) -> str:
    """The test function item runs (all its parameters' runs alike): module::name."""
    return f"{item.nodeid.split('::', 1)[0]}::{getattr(item, 'originalname', item.name)}"


def group_of(item: pytest.Item, shared_functions: set[str]) -> str | None:
    """The group item runs in (None: any worker, alone); see the module's docstring.
    shared_functions: the functions with a run marked by one of SHARED_MARKERS."""
    if item.get_closest_marker("xdist_group"):
        return None  # named by the test; xdist reads it
    if _function(item) in shared_functions:
        return SHARED
    module = item.nodeid.split("::", 1)[0]
    stem = module.rsplit("/", 1)[-1].removesuffix(".py")
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        wide = [d for d in defs if d.scope in WIDE_SCOPES and name not in MODULE_ONLY]
        if any(d.baseid.split("::", 1)[0] == module for d in wide):
            return stem
    if getattr(item, "callspec", None) is not None:
        return f"{stem}::{getattr(item, 'originalname', item.name)}"
    return None


class Groups:
    """The plugin (tests/conftest.py registers it) that gives each test its group."""

    @pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        shared = {_function(item) for item in items
                  if any(item.get_closest_marker(marker) for marker in SHARED_MARKERS)}
        for item in items:
            group = group_of(item, shared)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))
            if group == SHARED:
                item.add_marker(SHARED)

    @pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after xdist marked them
    def pytest_collection_modifyitems_carried(self, items: list[pytest.Item]) -> None:
        """xdist (3.8) marks a grouped test by appending ``@group`` to ``item._nodeid``,
        which pytest 9 no longer reads (an item's nodeid comes from ``item._id``): without
        this, loadgroup silently groups nothing. A no-op where the nodeid already carries
        the mark (pytest 8)."""
        for item in items:
            marked = getattr(item, "_nodeid", None)
            if isinstance(marked, str) and "@" in marked and item.nodeid != marked and hasattr(item, "_id"):
                path, _, rest = marked.partition("::")  # the mark after the params: one name, no params
                item._id = type(item._id)(path=path, names=tuple(rest.split("::")))


async def _admin(url: str, statements: list[str], stale_prefix: str = "") -> None:
    """Run statements on url's server; with stale_prefix, first drop the databases named
    <stale_prefix><pid> whose run (that pid) is gone."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        if stale_prefix:
            for row in await conn.fetch("SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
                                        stale_prefix):
                pid = row["datname"][len(stale_prefix):]
                if pid.isdigit() and not _running(int(pid)):
                    await conn.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def own_postgres() -> None:
    """Under xdist, point GUILDS_TEST_POSTGRES_URL at a database of this worker's own,
    made now and dropped at the end (``drop_own_postgres``): <name>_<worker>_<run's pid>.
    The record's tests drop and make their tables: two workers, or two runs at once,
    on one database would drop each other's."""
    url = os.environ.get("GUILDS_TEST_POSTGRES_URL")
    if not url or not WORKER:
        return
    base, _, name = url.rpartition("/")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise pytest.UsageError(f"GUILDS_TEST_POSTGRES_URL: the database name {name!r} is not a plain name")
    own = f"{name}_{WORKER}_{os.getppid()}"
    asyncio.run(_admin(url, [f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)', f'CREATE DATABASE "{own}"'],
                       stale_prefix=f"{name}_{WORKER}_"))
    os.environ["GUILDS_TEST_POSTGRES_URL"] = f"{base}/{own}"
    os.environ[_SHARED_URL] = url


_SHARED_URL = "GUILDS_TEST_POSTGRES_URL_SHARED"
"""The database named before own_postgres, to drop this worker's own from at the end."""


def drop_own_postgres() -> None:
    url, own = os.environ.get(_SHARED_URL), os.environ.get("GUILDS_TEST_POSTGRES_URL", "")
    if url and WORKER:
        asyncio.run(_admin(url, [f'DROP DATABASE IF EXISTS "{own.rpartition("/")[2]}" WITH (FORCE)']))


BASETEMP_PREFIX = "guilds-t"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def short_basetemp(config: pytest.Config) -> None:
    """In a parallel run's controller with no --basetemp: the run's basetemp is
    $TMPDIR/guilds-t<pid> (earlier runs' whose process is gone removed), no longer than
    a serial run's pytest-of-<user>/pytest-<n>. Each worker's folder under it adds
    ``popen-gw<n>``, and a socket path in a test's folder (the egress proxy's, under
    the data folder) must stay within the 107 bytes a Unix socket's path may take."""
    if WORKER or config.option.basetemp or not getattr(config.option, "numprocesses", None):
        return
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{BASETEMP_PREFIX}*")):
        pid = folder.rsplit(BASETEMP_PREFIX, 1)[1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    config.option.basetemp = os.path.join(tempfile.gettempdir(), f"{BASETEMP_PREFIX}{os.getpid()}")
