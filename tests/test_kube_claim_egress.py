"""agent.network a list in the kubernetes backend's claim mode: what the pool's template and
the claimed pod are given (no cluster needed), then on the test cluster a claimed pod
reaching its listed host through the proxy and nothing else, no host-bound value in
anything it reads, and the proxy's server gone: its connections closed at once, and the
next call through another server (another data folder sharing the egress key, as the
replicas of a deployment do) carrying them again through that server's proxy.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

import forge_kit
import kube_kit
from guilds.egress.ca import CertificateAuthority
from guilds.egress.shared_key import SHARED_KEY_NAME
from guilds.errors import SandboxError
from guilds.sandbox import get_sandbox
from guilds.sandbox._container import STATE_INSIDE, init_argv
from guilds.sandbox.egress_side.proxy_process import proxy_pid
from guilds.sandbox.kubernetes import kube_claim_spec as claims
from guilds.sandbox.kubernetes.kube_claims import KubeClaimSandbox
from guilds.sandbox.kubernetes.kube_egress import relay_conf, relay_of
from kube_kit import no_pool_left
from test_kube_egress import FETCH, FIND, PLAIN, UPLOAD, forge, on_cluster, run, settings_of

__all__ = ["forge", "no_pool_left"]  # fixtures of this module: the forge; the pool and template deleted after


def data_folder(path: Path, key: str) -> Path:
    """A data folder whose egress folder holds the shared key (as a deployment's init writes it)."""
    (path / "egress").mkdir(parents=True)
    (path / "egress" / SHARED_KEY_NAME).write_text(key + "\n")
    return path


def claimed_box(tmp_path: Path, data: Path, agent: str, forge_host=None) -> KubeClaimSandbox:
    box = get_sandbox(settings_of(tmp_path, agent=agent, forge=forge_host, mode="claim", warm=1), data,
                      idle_seconds=300)
    assert isinstance(box, KubeClaimSandbox)
    return box


# --- what the template and the pod are given ---------------------------------------------

def test_the_pools_pods_run_the_relay_and_hold_no_agents_value(tmp_path):
    box = claimed_box(tmp_path, tmp_path / "data", "kc1")
    template = box._template_manifest()
    container = template["spec"]["podTemplate"]["spec"]["containers"][0]
    assert container["command"] == init_argv("python3", claims.NO_IDLE_SECONDS, relay_with=relay_of(""))
    assert relay_conf("") == f"{STATE_INSIDE}/egress.json"  # one file for whichever agent claims the pod
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and env["SSL_CERT_FILE"] == f"{STATE_INSIDE}/trust.pem"
    text = json.dumps(template)
    assert "UPLOAD" not in env and UPLOAD not in text and PLAIN not in text
    assert template["spec"]["podTemplate"]["metadata"]["labels"]["guilds.network"] == "off"
    other = claimed_box(tmp_path, tmp_path / "data2", "kc2")  # another agent, the same settings: the same pool
    assert other._template_manifest()["metadata"]["name"] == template["metadata"]["name"]


def test_servers_sharing_the_key_give_one_placeholder_credential_and_authority(tmp_path):
    key = secrets.token_hex(32)
    a = claimed_box(tmp_path, data_folder(tmp_path / "a", key), "kc3")
    b = claimed_box(tmp_path, data_folder(tmp_path / "b", key), "kc3")
    lone = claimed_box(tmp_path, tmp_path / "c", "kc3")  # no shared key: a placeholder key of its own
    assert a.egress is not None and b.egress is not None and lone.egress is not None
    files_a, files_b, files_lone = ({n: d for n, d, _ in box._files()} for box in (a, b, lone))
    secrets_a = files_a[claims.secrets_file("kc3")].decode()
    assert secrets_a == files_b[claims.secrets_file("kc3")].decode() != files_lone[claims.secrets_file("kc3")].decode()
    assert f"export PLAIN={PLAIN}" in secrets_a and "export UPLOAD=" in secrets_a and UPLOAD not in secrets_a
    repos = next(f for n, f in files_a.items() if n.endswith("repos.json"))
    assert "ghp_" not in repos.decode()  # the repository token's placeholder, never the token
    assert a.egress.credential == b.egress.credential != lone.egress.credential
    ca_a = CertificateAuthority.open(a.egress.files.ca_dir)
    ca_b = CertificateAuthority.open(b.egress.files.ca_dir)
    assert ca_a.cert.public_key() == ca_b.cert.public_key()
    assert ca_a.cert.public_key() != CertificateAuthority.open(lone.egress.files.ca_dir).cert.public_key()
    other_agent = claimed_box(tmp_path, data_folder(tmp_path / "d", key), "kc4")
    assert other_agent.egress is not None and other_agent.egress.credential != a.egress.credential


def test_a_short_shared_key_is_refused_naming_its_file(tmp_path):
    data = data_folder(tmp_path / "a", "short")
    with pytest.raises(SandboxError, match=r"shared\.key: a shared egress key has at least 16 bytes$"):
        claimed_box(tmp_path, data, "kc5")


# --- on the test cluster -----------------------------------------------------------------

@on_cluster
async def test_a_claimed_pod_goes_out_through_the_proxy_and_another_server_takes_it_over(forge, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", forge.ca)  # the proxies verify the forge by the test authority
    key, agent = secrets.token_hex(32), f"kc{secrets.token_hex(4)}"
    first = claimed_box(tmp_path, data_folder(tmp_path / "a", key), agent, forge)
    second = claimed_box(tmp_path, data_folder(tmp_path / "b", key), agent, forge)
    api = f"https://{forge_kit.HOST_NAME}/api/v3/"
    try:
        await first.start()
        assert first.egress is not None and first.egress.published is not None
        assert (await run(first, "python3", "-c", FETCH, api)).startswith("401")  # reached the forge, by TLS
        refused = await run(first, "python3", "-c", FETCH, "http://unlisted.test/")
        assert refused.startswith("403 guilds egress: unlisted.test"), refused
        for value in (forge.token, UPLOAD):
            half = len(value) // 2
            found = await first.exec(["/bin/sh", "-c", FIND, value[:half], value[half:]], timeout=300)
            assert found.stdout.decode().split() == ["searched"], found
        assert PLAIN in await run(first, "/bin/sh", "-c", 'echo "$PLAIN"')

        pid = proxy_pid(first.egress.files)  # the first server's proxy dies with it
        assert pid is not None
        os.kill(pid, 9)
        said = (await run(first, "python3", "-c", FETCH, api)).splitlines()
        assert said[0] in ("URLError", "RemoteDisconnected", "ConnectionResetError"), said  # closed, never open
        assert float(said[-1]) < 5

        await second.start()  # the next call, through another server: its own proxy, told to the pod
        assert second.egress is not None and second.egress.published is not None
        assert second.pod == first.pod and second.egress.published != first.egress.published
        assert (await run(second, "python3", "-c", FETCH, api)).startswith("401")
        conf = json.loads(await run(second, "cat", relay_conf("")))
        assert conf["proxies"] == [list(second.egress.published)]  # the dead proxy left out
        assert conf["credential"] == first.egress.credential
    finally:
        await second.stop()
        await first.stop()
        kube_kit.remove_claimed(first.claim)
