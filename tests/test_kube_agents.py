"""Agents made on demand from a template in kubernetes' claim mode (guilds.agents.claim_pools,
guilds.sandbox.kubernetes.kube_claims): the template's settings read and checked, and on a
cluster (tests marked ``kubernetes``) each agent a SandboxClaim of its own on the template's
SandboxWarmPool, whose replicas follow the demand; two agents in two pods that cannot read
each other's files; one removed leaving the other answering; a make past a cap leaving no
claim; a restarted server finding its live agents' claims again and reaping the expired.
Real SQLite, the real agent-sandbox controller on the test cluster."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

import kube_kit
from guilds.config.templates import served_by
from guilds.errors import BadInput, ConfigError
from guilds.fronts.wiring import resolve
from guilds.sandbox.kubernetes import kube_claim_spec as claims
from guilds.sandbox.kubernetes import kube_spec as spec
from kube_kit import no_pool_left  # noqa: F401 - a fixture of this module
from test_agent_pool import opened

MEMORY = "228Mi"
"""A memory no other test asks for: the templates and pools of this module are its own."""


def server(tmp_path: Path, *, pool: str = "spare = 1\nmax = 2", kube: str = "", agents_max: int = 3) -> Path:
    """Settings whose own agent is local, serving the template ``kc``: kubernetes in claim mode on
    the test cluster (its home path holds f.txt on this machine), with the pool table given."""
    home = tmp_path / "kc-home"
    home.mkdir(exist_ok=True)
    (home / "f.txt").write_text("from the template\n")
    table = kube_kit.settings_table(memory=MEMORY, cpu="100m")
    lines = "\n".join(f'{key} = "{value}"' for key, value in table.items())
    path = tmp_path / "server.toml"
    path.write_text(f"""
[agent]
id = "server1"
home = "home"
sandbox = "local"

[templates.kc.agent]
home = "kc-home"
sandbox = "kubernetes"
[templates.kc.kubernetes]
mode = "claim"
{lines}
{kube}
[templates.kc.pool]
{pool}

[agents]
max = {agents_max}
max_per_owner = {agents_max}
""")
    path.chmod(0o600)
    return path


def template(tmp_path: Path, settings: Path):
    wired = resolve(settings, data_dir=tmp_path / "data", env={})
    return served_by(wired.settings, wired.settings_file, {}).template("kc")


# --- the settings


def test_a_claim_template_s_pool_sizes_its_warm_pool_and_its_agents_homes_are_in_their_pods(tmp_path):
    kc = template(tmp_path, server(tmp_path, pool="spare = 2\nmax = 3"))
    assert (kc.pool.spare, kc.pool.max) == (2, 3)
    assert kc.settings.kubernetes.sized_by_server and kc.settings.kubernetes.warm == 2  # made at spare
    made = kc.for_agent("kc-0123456789ab", tmp_path / "data" / "agent-homes" / "kc-0123456789ab")
    assert made.id == "kc-0123456789ab" and made.home == tmp_path / "kc-home"  # one SandboxTemplate for all
    without = template(tmp_path, server(tmp_path, pool="max = 0", kube="warm = 4"))
    assert not without.settings.kubernetes.sized_by_server and without.settings.kubernetes.warm == 4


@pytest.mark.parametrize(("pool", "kube", "line"), [
    ("max = 2", "warm = 3", ("templates.kc.kubernetes.warm: the template's pool sizes its warm pool "
                             "(templates.kc.pool): leave warm out")),
    ("max = 2", "keep_home = true", ("templates.kc.pool: a warm pool holds sandboxes to claim, and "
                                     "kubernetes.keep_home gives each agent a Sandbox of its own instead: "
                                     "leave one out")),
])
def test_a_claim_template_s_pool_refuses_what_would_size_it_twice(tmp_path, pool, kube, line):
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        template(tmp_path, server(tmp_path, pool=pool, kube=kube))


async def test_no_agent_of_a_claim_template_is_made_ahead_on_this_machine(tmp_path):
    async with opened(tmp_path, server(tmp_path), pool=False) as agent:
        agents = await agent.agents()
        assert agents.pools.pools == {} and set(agents.pools.claims.pools) == {"kc"}


# --- on a cluster


def custom(plural: str, name: str) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(kube_kit.core().api_client).get_namespaced_custom_object(
        claims.EXTENSIONS, claims.VERSION, kube_kit.NAMESPACE, plural, name)


def gone(plural: str, name: str) -> bool:
    try:
        custom(plural, name)
    except Exception as exc:  # noqa: BLE001 - the client's 404
        return getattr(exc, "status", None) == 404
    return False


def claims_of(pool: str) -> set[str]:
    """The names of the agents' claims on the pool (those not being deleted)."""
    from kubernetes import client

    items = client.CustomObjectsApi(kube_kit.core().api_client).list_namespaced_custom_object(
        claims.EXTENSIONS, claims.VERSION, kube_kit.NAMESPACE, claims.CLAIMS,
        label_selector=f"{claims.LABEL_TEMPLATE}={pool},{spec.LABEL_AGENT}")["items"]
    return {item["metadata"]["name"] for item in items if not item["metadata"].get("deletionTimestamp")}


def replicas(pool: str) -> int | None:
    return None if gone(claims.POOLS, pool) else custom(claims.POOLS, pool)["spec"]["replicas"]


async def until(check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.25)
    return value


def pod_uid(made) -> str:
    return kube_kit.core().read_namespaced_pod(made.opened.sandbox.pod, kube_kit.NAMESPACE).metadata.uid


async def said(made, command: str) -> str:
    return (await made.call(f"r-{made.id}", "shell", {"command": command})).text


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_two_agents_of_a_claim_template_are_two_claims_apart_and_one_removed_leaves_the_other(tmp_path):
    settings = server(tmp_path, pool="spare = 1\nmax = 2")
    async with opened(tmp_path, settings) as agent:
        agents = await agent.agents()
        assert agents.pools.claims.targets() == {"kc": 1}  # the pool made at its spare, at the start
        first = await agent.make_agent("kc", owner="alice")
        second = await agent.make_agent("kc", owner="bob")
        claim_a, claim_b = spec.object_name(first.id), spec.object_name(second.id)
        pool = custom(claims.CLAIMS, claim_a)["spec"]["warmPoolRef"]["name"]
        try:
            assert claims_of(pool) == {claim_a, claim_b}
            assert pod_uid(first) != pod_uid(second)
            # the pool follows the demand: spare 1 + 2 makes, at most 2; no agent made ahead here
            await until(lambda: replicas(pool) == 2, "the warm pool at 2 replicas")
            assert agents.pools.claims.targets() == {"kc": 2}
            assert agents.pools.pools == {} and await agents.store.agents(statuses=("pooled",)) == []
            home = str((tmp_path / "kc-home").resolve())
            assert first.record.home == second.record.home == home  # one path, in each agent's own pod
            assert "mine-a" in await said(first, "echo mine-a > mine.txt; cat mine.txt")
            assert "No such file" in await said(second, f"cat {home}/mine.txt; ls -A {home}")
            assert "f.txt" not in await said(second, f"ls -A {home}")  # the home starts empty in the pod
            assert not (tmp_path / "data" / "agent-homes").exists()  # nothing of them on this machine
            with pytest.raises(BadInput, match=r"^fork: not served on kubernetes \(the home of agent kc-\w+ is not"):
                await agent.fork(first.id, 1)

            removed = await agent.remove_agent(first.id)
            assert f"claim {kube_kit.NAMESPACE}/{claim_a}" in removed, removed
            await until(lambda: gone(claims.CLAIMS, claim_a), "the first agent's claim gone")
            assert claims_of(pool) == {claim_b} and replicas(pool) is not None
            assert "still" in await said(second, "echo still")
            assert (tmp_path / "kc-home" / "f.txt").read_text() == "from the template\n"  # the template's untouched
        finally:
            for record in await agents.live():
                await agents.remove(record.id)
    assert replicas(pool) == 0  # the server's stop: no sandbox left waiting


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_a_make_past_a_cap_leaves_no_claim_and_a_restart_finds_the_live_claims_and_reaps_the_expired(tmp_path):
    settings = server(tmp_path, pool="spare = 0\nmax = 2", agents_max=2)
    async with opened(tmp_path, settings) as agent:
        kept = await agent.make_agent("kc", owner="bob")
        expiring = await agent.make_agent("kc", owner="bob")
        pool = custom(claims.CLAIMS, spec.object_name(kept.id))["spec"]["warmPoolRef"]["name"]
        held = {spec.object_name(kept.id), spec.object_name(expiring.id)}
        assert claims_of(pool) == held
        with pytest.raises(BadInput, match=r"^(owner 'bob'|this server) holds 2 agents"):
            await agent.make_agent("kc", owner="bob")
        assert claims_of(pool) == held  # the refused make made no claim
        await said(kept, "echo kept > note")
        kept_pod, kept_claim = pod_uid(kept), custom(claims.CLAIMS, spec.object_name(kept.id))["metadata"]["uid"]
        await agent.expire_agent(expiring.id, 0.1)
    await asyncio.sleep(0.2)
    try:
        async with opened(tmp_path, settings, pool=False) as agent:
            assert [a.id for a in await agent.list_agents()] == [kept.id]
            await until(lambda: gone(claims.CLAIMS, spec.object_name(expiring.id)), "the expired agent's claim gone")
            found = await agent.made_agent(kept.id, owner="bob")
            assert (await said(found, "cat note")).startswith("kept")
            assert pod_uid(found) == kept_pod  # its claim found again, not made anew
            assert custom(claims.CLAIMS, spec.object_name(kept.id))["metadata"]["uid"] == kept_claim
            assert claims_of(pool) == {spec.object_name(kept.id)}
    finally:
        async with opened(tmp_path, settings, pool=False) as agent:
            for record in await agent.list_agents():
                await agent.remove_agent(record.id)


def test_the_file_s_own_agent_in_claim_mode_with_a_top_level_pool_leaves_its_warm_pool_to_the_server(tmp_path):
    """The default template's pool ([pool]) sizes the warm pool the file's own agent claims from:
    that agent's sandbox, made from the same settings, must never size it back to kubernetes.warm."""
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nid = "own1"\nhome = "home"\nsandbox = "kubernetes"\n'
                    '[kubernetes]\nmode = "claim"\n[pool]\nspare = 1\nmax = 3\n')
    wired = resolve(path, data_dir=tmp_path / "data", env={})
    own = wired.settings.kubernetes
    assert own.sized_by_server and own.warm == 1
    assert served_by(wired.settings, wired.settings_file, {}).template("default").settings.kubernetes == own
    path.write_text(path.read_text().replace('mode = "claim"', 'mode = "claim"\nwarm = 4'))
    with pytest.raises(ConfigError, match=r"^kubernetes\.warm: the template's pool sizes its warm pool \(pool\): "
                                          r"leave warm out$"):
        resolve(path, data_dir=tmp_path / "data", env={})


def test_the_loader_s_refusal_is_told_apart_from_a_command_that_ran():
    """A pod without the agent's secrets file (one made anew under the claim's name) refuses by
    the loader's one line and status, which nothing of the command wrote: then the call looks
    again; a command that ran and said the same words among others is its own result."""
    import subprocess

    refused = subprocess.run(claims.loaded_argv("a1", ["echo", "ran"]), capture_output=True, check=False)
    assert refused.stdout == b"" and claims.found_no_file("a1", refused.returncode, refused.stderr)
    assert not claims.found_no_file("a2", refused.returncode, refused.stderr)  # another agent's file
    assert not claims.found_no_file("a1", 1, refused.stderr)
    assert not claims.found_no_file("a1", refused.returncode, b"ran\n" + refused.stderr)
