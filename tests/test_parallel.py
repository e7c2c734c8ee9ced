"""The suite's parallel run (tests/parallel_kit.py), in a pytest of its own over a few
made-up tests: a group's tests share one worker (the docker and kubernetes tests and
their functions' other runs; a module-scoped fixture's; a function's runs), the rest
spread over the others; each worker's folders sit under the run's short basetemp;
each has a PostgreSQL database of its own, dropped at its end; and the backend
fixture's parameters (tests/backend_kit.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

import backend_kit
import parallel_kit

TESTS = Path(__file__).resolve().parent
PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")
CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import parallel_kit

def pytest_configure(config):
    parallel_kit.short_basetemp(config)
    parallel_kit.own_postgres()
    config.pluginmanager.register(parallel_kit.Groups(), "parallel_kit.groups")

def pytest_unconfigure(config):
    parallel_kit.drop_own_postgres()
"""
INI = """[pytest]
addopts = -n 3 --dist loadgroup -p no:cacheprovider
markers =
    docker: a marker parallel_kit groups by
    kubernetes: a marker parallel_kit groups by
    cluster: the marker parallel_kit gives
"""
NOTE = """
import os, time, pytest

def note(what, tmp_path):
    time.sleep(0.3)  # long enough that an idle worker takes the next test
    with open(os.environ["NOTES"], "a") as notes:
        notes.write(f"{what} {os.environ['PYTEST_XDIST_WORKER']} {tmp_path} "
                    f"{os.environ.get('GUILDS_TEST_POSTGRES_URL', '-')}\\n")
"""
MARKED = NOTE + """
@pytest.mark.parametrize("backend", ["local", pytest.param("kubernetes", marks=pytest.mark.kubernetes)] * 3)
def test_cluster(backend, tmp_path):
    note("cluster-" + backend, tmp_path)

@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)] * 3)
def test_docker(backend, tmp_path):
    note("docker-" + backend, tmp_path)

@pytest.mark.parametrize("i", range(6))
def test_runs(i, tmp_path):
    note("runs", tmp_path)
""" + "".join(f"""
def test_free_{i}(tmp_path):
    note("free", tmp_path)
""" for i in range(12))
MODULE_FIXTURE = NOTE + """
@pytest.fixture(scope="module")
def served():
    return "one server"

@pytest.mark.parametrize("i", range(6))
def test_served(i, served, tmp_path):
    note("served", tmp_path)
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A folder of made-up tests, run by parallel_kit's plugin."""
    folder = tmp_path_factory.mktemp("parallel")
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "pytest.ini").write_text(INI)
    (folder / "test_marked.py").write_text(MARKED)
    (folder / "test_module_fixture.py").write_text(MODULE_FIXTURE)
    return folder


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NOTES": str(folder / "notes.txt")}
    env.pop("PYTEST_XDIST_WORKER", None)  # the run's own controller, not one of this run's workers
    env.pop("PYTEST_ADDOPTS", None)
    if PG_URL:
        env["GUILDS_TEST_POSTGRES_URL"] = PG_URL
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args, str(folder)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def notes(made) -> list[list[str]]:
    """The made-up tests run in parallel: a line (what, worker, tmp_path, database) per test."""
    done = _pytest(made)
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split() for line in (made / "notes.txt").read_text().splitlines()]


def _workers(notes: list[list[str]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for what, worker, *_ in notes:
        found[what].add(worker)
    return found


def test_a_groups_tests_share_one_worker_and_the_rest_spread(notes):
    workers = _workers(notes)
    assert [len(notes), sorted(workers)] == [36, ["cluster-kubernetes", "cluster-local", "docker-docker",
                                                  "docker-local", "free", "runs", "served"]]
    cluster = workers["cluster-kubernetes"] | workers["cluster-local"]
    docker = workers["docker-docker"] | workers["docker-local"]
    assert [len(cluster), len(docker), len(workers["served"]), len(workers["runs"])] == [1, 1, 1, 1], workers
    assert len(workers["free"]) > 1, workers


def test_the_cluster_marker_selects_the_kubernetes_functions_runs(made):
    listed = _pytest(made, "-n", "0", "--collect-only", "-m", "cluster")
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert ids == [f"test_marked.py::test_cluster[{backend}{i}]" for i in range(3)
                   for backend in ("local", "kubernetes")], listed.stdout + listed.stderr


def test_each_worker_has_its_own_folder_under_the_runs_short_basetemp(notes):
    run = os.path.join(tempfile.gettempdir(), parallel_kit.BASETEMP_PREFIX)
    for _, worker, tmp_path, _ in notes:
        assert tmp_path.startswith(run) and f"/popen-{worker}/" in tmp_path, tmp_path


@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL, reason="GUILDS_TEST_POSTGRES_URL is not set")
def test_each_worker_has_a_database_of_its_own_dropped_at_its_end(notes):
    import asyncio

    import asyncpg

    by_worker = {worker: url for _, worker, _, url in notes}
    assert len(set(by_worker.values())) == len(by_worker) > 1
    base = PG_URL.rpartition("/")[2]
    assert all(url.rpartition("/")[2].startswith(f"{base}_{worker}_") for worker, url in by_worker.items())

    async def names() -> set[str]:
        conn = await asyncpg.connect(PG_URL)
        try:
            return {row["datname"] for row in await conn.fetch("SELECT datname FROM pg_database")}
        finally:
            await conn.close()

    assert not {url.rpartition("/")[2] for url in by_worker.values()} & asyncio.run(names())


def test_a_backend_param_carries_its_marker_and_an_unknown_one_is_refused():
    docker = backend_kit.param("docker")
    assert docker.values == ("docker",) and docker.id == "docker"
    assert [mark.name for mark in docker.marks] == ["docker", "skipif"]
    assert not backend_kit.param("local").marks
    assert [mark.name for mark in backend_kit.param("kubernetes-claim").marks] == ["kubernetes", "skipif"]
    with pytest.raises(ValueError, match="no backend 'podman' \\(known: local, bwrap, docker, kubernetes, "):
        backend_kit.param("podman")
