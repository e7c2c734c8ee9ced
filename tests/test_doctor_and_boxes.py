"""`guilds doctor` and `guilds sandbox list|stop|rm`: the console script, on this machine's real
bubblewrap, Docker engine, SQLite and PostgreSQL."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guilds.sandbox.bwrap.bwrap_argv import unavailable as bwrap_unavailable
from guilds.sandbox.docker.docker_engine import unavailable as docker_unavailable

GUILDS = shutil.which("guilds", path=os.path.dirname(sys.executable))
IMAGE = os.environ.get("GUILDS_SANDBOX_IMAGE", "guilds-sandbox:latest")
NO_BWRAP = bwrap_unavailable()
NO_DOCKER = docker_unavailable(IMAGE)


def settings(tmp_path: Path, sandbox: str, agent: str = "agent1") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nid = "{agent}"\nhome = "home"\nsandbox = "{sandbox}"\n'
                    f'[docker]\nimage = "{IMAGE}"\n')
    return path


def guilds(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "GUILDS_DATA": str(tmp_path / "data"), **env}
    full.pop("GUILDS_DATABASE_URL", None) if "GUILDS_DATABASE_URL" not in env else None
    return subprocess.run([GUILDS, *argv], check=False, capture_output=True, text=True, env=full, timeout=180)


def lines(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """doctor's lines by check name: 'ok', 'no' or '--' followed by the detail."""
    out = {}
    for line in proc.stdout.splitlines()[:-1]:
        mark, rest = line[:4].strip(), line[5:]
        name, _, detail = rest.partition(": ")
        out[name] = f"{mark} {detail}"
    return out


def test_doctor_on_a_local_agent(tmp_path):
    proc = guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "local")))
    found = lines(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert found["rg"].startswith("ok ripgrep ") and found["run record"].startswith("ok sqlite+aiosqlite:///")
    assert found["data folder"] == f"ok {tmp_path / 'data'} (made on first use)"
    assert found["sandbox python"].startswith("ok ")
    assert found["bubblewrap"].startswith("ok " if NO_BWRAP is None else "-- ")
    assert proc.stdout.splitlines()[-1] == "agent agent1: sandbox local can run"


@pytest.mark.parametrize(("network", "said"), [
    ("false", "ok false: commands have no network"),
    ('["github.com"]\nsandbox = "kubernetes"', (
        "ok a list of 1 entry: commands reach only those, through the egress proxy; on kubernetes only where the "
        "cluster enforces NetworkPolicy (each new pod is checked before its first call and refused if not) "
        "(docs/network.md)")),
    ("true", ("ok true: unfiltered, commands reach every host and, on bwrap, the host's loopback services; "
             "a list of hosts filters it (docs/network.md)")),
    ('["github.com", "10.1.2.0/24"]', ("ok a list of 2 entries: commands reach only those, through the "
                                      "egress proxy (docs/network.md)")),
])
def test_doctor_says_what_the_network_setting_lets_through(tmp_path, network, said):
    path = tmp_path / "agent.toml"
    sandbox = "" if "sandbox" in network else 'sandbox = "bwrap"\n'
    path.write_text(f'[agent]\nhome = "home"\nnetwork = {network}\n{sandbox}')
    assert lines(guilds(tmp_path, "doctor", "--config", str(path)))["network"] == said


def test_doctor_fails_when_the_configured_sandbox_cannot_run(tmp_path):
    proc = guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "docker")),
                  DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    found = lines(proc)
    assert proc.returncode == 1
    assert found["docker"].startswith(f"no no engine answers at unix://{tmp_path}/no-engine.sock")
    assert found["docker"].endswith("-> start the Docker engine, or set DOCKER_HOST to one")
    assert proc.stdout.splitlines()[-1] == "agent agent1: sandbox docker cannot run here (see the lines marked no)"


def test_doctor_names_each_known_settings_file_others_may_read(tmp_path):
    b = tmp_path / "b.toml"
    b.write_text('[agent]\nid = "agentb"\nhome = "b-home"\nsandbox = "local"\n[secrets]\nKEY = "b-secret-1234"\n')
    b.chmod(0o600)
    assert guilds(tmp_path, "call", "shell", '{"command": "true"}', "--config", str(b)).returncode == 0
    b.chmod(0o644)  # B's settings, known to the data folder, readable by all since
    a = settings(tmp_path, "local")
    proc = guilds(tmp_path, "doctor", "--config", str(a))
    said = [line for line in proc.stdout.splitlines() if "settings file:" in line]
    assert said == [f"ok   settings file: {a}: secrets, if any, readable by its owner only",
                    (f"no   settings file: {b}: holds secrets or tokens and group and others may read it "
                     f"(mode 0644) -> chmod 600 {b}")], proc.stdout
    refused = guilds(tmp_path, "call", "shell", '{"command": "true"}', "--config", str(b))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (f"guilds: {b}: holds secrets or tokens and group and others may read it "
                              f"(mode 0644): chmod 600 {b}\n")


def test_doctor_names_an_unreachable_record_without_its_password(tmp_path):
    proc = guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "local")),
                  GUILDS_DATABASE_URL="postgresql://guilds:hunter2secret@127.0.0.1:1/none")
    assert proc.returncode == 1 and "hunter2secret" not in proc.stdout + proc.stderr
    assert lines(proc)["run record"].startswith("no 127.0.0.1:1/none: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.bwrap
@pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}")
def test_bwrap_sandbox_list_stop_rm(tmp_path):
    agent = f"boxes-{secrets.token_hex(3)}"
    config = str(settings(tmp_path, "bwrap", agent))
    assert guilds(tmp_path, "call", "shell", '{"command": "true"}', "--config", config).returncode == 0
    listed = guilds(tmp_path, "sandbox", "list", "--config", config).stdout
    bwrap = [line.split() for line in listed.splitlines() if line.startswith("bwrap")]  # other engines' too
    assert [row[:2] + row[-1:] for row in bwrap] == [["bwrap", agent, "running"]]
    stopped = guilds(tmp_path, "sandbox", "stop", "--config", config)
    assert stopped.stdout == f"stopped the bwrap sandbox of agent {agent}\n"
    listed = guilds(tmp_path, "sandbox", "list", "--config", config).stdout
    assert [line.split() for line in listed.splitlines() if line.startswith("bwrap")] == [
        ["bwrap", agent, "no", "process", "stopped"]]
    base = tmp_path / "data" / "sandboxes" / agent
    # .etc: the sandbox's passwd and group, made where the host names not the agent's uid
    made = [ext for ext in ("lock", "log", "clock", "etc") if Path(f"{base}.{ext}").exists()]
    assert made[:3] == ["lock", "log", "clock"]
    removed = guilds(tmp_path, "sandbox", "rm", "--config", config).stdout.splitlines()
    assert removed == [f"stopped the bwrap sandbox of agent {agent}",
                       *(f"removed {base}.{ext}" for ext in made)]
    assert not any(base.parent.iterdir()) and (tmp_path / "home").is_dir()
    assert agent not in guilds(tmp_path, "sandbox", "list", "--config", config).stdout


@pytest.mark.bwrap
@pytest.mark.skipif(NO_BWRAP is not None, reason=f"bwrap: {NO_BWRAP}")
def test_the_egress_proxy_outlives_the_call_and_ends_with_the_sandbox(tmp_path):
    agent = f"egress-{secrets.token_hex(3)}"
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nid = "{agent}"\nhome = "home"\nsandbox = "bwrap"\nnetwork = ["example.invalid"]\n')
    config = str(path)
    called = guilds(tmp_path, "call", "shell", '{"command": "echo $HTTPS_PROXY"}', "--config", config)
    assert called.returncode == 0 and "@127.0.0.1:3128" in called.stdout, called.stdout + called.stderr
    folder = tmp_path / "data" / "egress" / agent
    pid = int((folder / "proxy.pid").read_text())
    assert b"guilds.egress" in Path(f"/proc/{pid}/cmdline").read_bytes()  # the call has exited; it lives on
    assert guilds(tmp_path, "sandbox", "stop", "--config", config).returncode == 0
    try:
        left = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        left = b""
    assert not left  # gone (or a zombie nobody reaped yet)
    removed = guilds(tmp_path, "sandbox", "rm", "--config", config).stdout.splitlines()
    assert removed[-1] == f"removed {folder}" and not folder.exists()


def test_local_rm_removes_the_agents_state_and_bad_input_is_named(tmp_path):
    config = str(settings(tmp_path, "local"))
    guilds(tmp_path, "call", "shell", '{"command": "true"}', "--config", config)
    state = tmp_path / "data" / "state" / "agent1"
    assert state.is_dir()
    removed = guilds(tmp_path, "sandbox", "rm", "--config", config).stdout.splitlines()
    assert removed == ["stopped the local sandbox of agent agent1", f"removed {state}"] and not state.exists()
    again = guilds(tmp_path, "sandbox", "rm", "--config", config)
    assert (again.returncode, again.stdout) == (0, "stopped the local sandbox of agent agent1\n")
    bad = guilds(tmp_path, "sandbox", "stop", "../x", "--config", config)
    assert bad.returncode == 2 and bad.stderr.startswith("guilds: agent.id: must be letters")


@pytest.mark.docker
@pytest.mark.skipif(NO_DOCKER is not None, reason=f"docker: {NO_DOCKER}")
def test_docker_sandbox_list_and_rm_with_its_volume(tmp_path):
    agent = f"boxes-{secrets.token_hex(3)}"
    config = str(settings(tmp_path, "docker", agent))
    call = guilds(tmp_path, "call", "shell", '{"command": "echo in"}', "--config", config)
    assert call.stdout.startswith("in\n"), call.stderr
    listed = [line.split() for line in guilds(tmp_path, "sandbox", "list", "--config", config).stdout.splitlines()]
    mine = [row for row in listed if row[1] == agent]
    assert mine and mine[0][:3] == ["docker", agent, f"guilds-{agent}"] and mine[0][3] == "Up"
    removed = guilds(tmp_path, "sandbox", "rm", agent, "--config", config).stdout.splitlines()
    assert removed == [f"stopped the docker sandbox of agent {agent}", f"removed container guilds-{agent}",
                       f"removed volume guilds-{agent}-state"]
    listed = guilds(tmp_path, "sandbox", "list", "--config", config).stdout
    assert f"guilds-{agent}" not in listed


KUBECONFIG_TEMPLATE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: guilds}}]
current-context: x
"""


def test_doctor_on_kubernetes_says_which_kubeconfig_and_why(tmp_path):
    config = str(settings(tmp_path, "kubernetes"))
    none = guilds(tmp_path, "doctor", "--config", config, KUBECONFIG=str(tmp_path / "missing"))
    assert none.returncode == 1
    assert lines(none)["kubernetes"] == ("no no kubeconfig (KUBECONFIG, ~/.kube/config) "
                                         "-> point KUBECONFIG at the cluster's config")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG_TEMPLATE)
    dead = guilds(tmp_path, "doctor", "--config", config, KUBECONFIG=str(kubeconfig))
    found = lines(dead)["kubernetes"]
    assert dead.returncode == 1 and found.startswith(f"no {kubeconfig}: cannot ask the cluster (")
    assert found.endswith("-> check the kubeconfig's server and credentials") and "not-a-real-token" not in found
    local = guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "local")), KUBECONFIG=str(kubeconfig))
    assert local.returncode == 0 and lines(local)["kubernetes"].startswith("-- ")


@pytest.fixture
def kube(tmp_path):
    from fixtures.fake_kube_api import FakeKubeApi

    api = FakeKubeApi()
    yield api
    api.close()


def test_kubernetes_sandbox_list_rm_and_rights(tmp_path, kube):
    from guilds.sandbox.kubernetes.kube_spec import object_name

    env = {"KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")), "DOCKER_HOST": f"unix://{tmp_path}/none"}
    config = str(settings(tmp_path, "kubernetes"))
    mine, other = object_name("agent1"), object_name("agent2")
    kube.add("pods", "guilds", mine, mine)
    kube.add("pods", "guilds", other, other, phase="Pending")
    kube.add("persistentvolumeclaims", "guilds", f"{mine}-home", mine)
    kube.add("secrets", "guilds", f"{mine}-env", mine)
    out = guilds(tmp_path, "sandbox", "list", "--config", config, **env).stdout
    listed = [line.split() for line in out.splitlines()]
    assert listed == [["kubernetes", mine, f"guilds/{mine}", "running"],
                      ["kubernetes", other, f"guilds/{other}", "pending"]]
    removed = guilds(tmp_path, "sandbox", "rm", "--config", config, **env).stdout.splitlines()
    assert removed == ["stopped the kubernetes sandbox of agent agent1", f"removed claim guilds/{mine}-home",
                       f"removed secret guilds/{mine}-env"]
    assert set(kube.objects) == {("pods", "guilds", other)}
    again = guilds(tmp_path, "sandbox", "rm", "--config", config, **env)
    assert (again.returncode, again.stdout) == (0, "stopped the kubernetes sandbox of agent agent1\n")
    ok = guilds(tmp_path, "doctor", "--config", config, **env)
    assert ok.returncode == 0 and lines(ok)["kubernetes"].startswith("ok ") and "every right" in ok.stdout
    kube.denied = {"create pods/exec"}
    denied = guilds(tmp_path, "doctor", "--config", config, **env)
    assert denied.returncode == 1
    why = "in namespace guilds the user may not create pods/exec -> grant them in guilds"
    assert why in lines(denied)["kubernetes"]


def test_auto_picks_bwrap_where_it_works_and_a_named_backend_is_never_asked():
    from guilds.sandbox import candidates, picked

    asked: list[str] = []

    def works(answer: bool):
        return lambda name: asked.append(name) or answer

    assert picked("auto", works(True)).name == "bwrap" and asked == ["bwrap"]
    assert picked("auto", works(False)).name == "local" and asked == ["bwrap", "bwrap"]
    assert [picked(name, works(False)).name for name in ("local", "bwrap", "docker", "kubernetes")] == [
        "local", "bwrap", "docker", "kubernetes"]
    assert asked == ["bwrap", "bwrap"]
    assert [kind.name for kind in candidates("auto")] == ["bwrap", "local"]
    assert not picked("auto", works(False)).isolates


def test_doctor_says_what_each_backend_offers_of_checkpoints(tmp_path):
    """local keeps them and makes new homes as copies (no uid of its own to give a layer);
    kubernetes serves none and says why (what the cluster lacks: test_kube_checkpoints.py); bwrap as
    root with overlayfs makes layers."""
    local = lines(guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "local"))))["checkpoints"]
    assert local == ("ok on local: none per call (agent.checkpoints is off); named checkpoints, rewind and fork "
                     "served; a checkpoint stores each changed file once; new homes of forks and templates are "
                     "copies (the sandbox gives its home to no uid of its own) (docs/checkpoints.md)")
    on = tmp_path / "on.toml"
    on.write_text('[agent]\nhome = "home"\nsandbox = "local"\ncheckpoints = true\n')
    assert lines(guilds(tmp_path, "doctor", "--config", str(on)))["checkpoints"].startswith(
        "ok on local: one before each shell and code_task call; ")
    kube = lines(guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "kubernetes")),
                        KUBECONFIG=str(tmp_path / "missing")))["checkpoints"]
    assert kube == ("-- not served on kubernetes here: cannot ask the cluster: no kubeconfig (KUBECONFIG, "
                    "~/.kube/config); served on local, bwrap, docker (docs/checkpoints.md)")
    if NO_BWRAP is None and os.geteuid() == 0:
        bwrap = lines(guilds(tmp_path, "doctor", "--config", str(settings(tmp_path, "bwrap"))))["checkpoints"]
        assert bwrap.startswith("ok on bwrap: ") and bwrap.endswith(
            "new homes of forks and templates are overlay layers, copy-on-write (docs/checkpoints.md)")
