"""Where a server's create goes: timings of each step, taken inside a real `guilds serve`.

Python imports this module at start when its folder is on PYTHONPATH (the
``sitecustomize`` hook). With ``GUILDS_BENCH_PROFILE`` set to a file, it wraps
the steps of an E2B create and kill (the record's writes, the home's copy, the
sandbox's start and its parts, the process service's start, the calls to it)
and appends one line per step run to that file: ``<step> <milliseconds>``.
Without the variable it does nothing. bench/e2b_create_bench.py starts its
server with it (``--profile``) and prints each step's count and median.

A step's time is from its call to its end, waits included: an async step
that runs in a thread (``bwrap.start``) includes the wait for a free thread,
which its thread's own part (``bwrap._start``) does not.
"""

from __future__ import annotations

import functools
import inspect
import os
import time

_OUT = os.environ.get("GUILDS_BENCH_PROFILE")


def _write(step: str, started: float) -> None:
    line = f"{step} {(time.perf_counter() - started) * 1000:.3f}\n".encode()
    fd = os.open(_OUT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # type: ignore[arg-type]
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _timed(owner: object, name: str, step: str, *, by_first_arg: bool = False) -> None:
    """owner.name timed as step (``by_first_arg``: step.<the first argument>, an envd op);
    a name this tree does not have is left out."""
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        return
    is_classmethod = isinstance(raw, classmethod)
    fn = raw.__func__ if is_classmethod else getattr(owner, name)

    def label(args: tuple) -> str:
        return f"{step}.{args[1]}" if by_first_arg and len(args) > 1 else step

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                _write(label(args), started)
    else:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _write(label(args), started)
    setattr(owner, name, classmethod(wrapper) if is_classmethod else wrapper)


def _install() -> None:
    from guilds.agents import pool, registry
    from guilds.config import agents as known_agents
    from guilds.fronts.e2b import control, process_api, sandboxes
    from guilds.fronts.e2b.envd_channel import EnvdChannel
    from guilds.record.store import Store
    from guilds.sandbox.bwrap import bwrap_sandbox
    from guilds.sandbox.bwrap.bwrap_sandbox import BwrapSandbox
    from guilds.sandbox.docker.docker_sandbox import DockerSandbox

    for owner, name, step in (
        (control.ControlPlane, "create", "http.create"),
        (control.ControlPlane, "kill", "http.kill"),
        (sandboxes.Sandboxes, "create", "e2b.create"),
        (sandboxes.Sandboxes, "kill", "e2b.kill"),
        (registry.Agents, "make", "agents.make"),
        (registry.Agents, "_made", "agents._made (without the pool)"),
        (pool.Pools, "take", "pool.take"),
        (pool, "answers", "pool.answers (the probe of a pooled agent)"),
        (pool, "alive", "pool.alive (the look at a pooled agent)"),
        (registry.Agents, "remove", "agents.remove"),
        (registry, "copy_home", "home.copy"),
        (registry, "make_home", "home.make"),
        (registry, "remove_home", "home.remove"),
        (known_agents, "remember", "agents.remember_entry"),
        (Store, "admit_agent", "record.admit_agent"),
        (Store, "mark_agent", "record.mark_agent"),
        (Store, "begin_call", "record.begin_call"),
        (Store, "finish_call", "record.finish_call"),
        (BwrapSandbox, "start", "bwrap.start"),
        (BwrapSandbox, "_start", "bwrap._start (in its thread)"),
        (BwrapSandbox, "_launch", "bwrap._launch (spawn to ready)"),
        (BwrapSandbox, "_fingerprint", "bwrap._fingerprint"),
        (BwrapSandbox, "_process_limits", "bwrap._process_limits (cgroup)"),
        (BwrapSandbox, "_give_state_root", "bwrap._give_state_root"),
        (BwrapSandbox, "remove", "bwrap.remove"),
        (bwrap_sandbox, "own_tree", "bwrap.own_tree (home chown)"),
        (DockerSandbox, "start", "docker.start"),
        (DockerSandbox, "_ensure_created", "docker._ensure_created"),
        (DockerSandbox, "_fill_and_start", "docker._fill_and_start"),
        (DockerSandbox, "remove", "docker.remove"),
        (EnvdChannel, "open", "envd.open"),
        (process_api.ProcessApi, "start", "http.command_start (to the stream's head)"),
    ):
        _timed(owner, name, step)
    _timed(EnvdChannel, "call", "envd.call", by_first_arg=True)


if _OUT:
    _install()
