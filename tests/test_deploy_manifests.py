"""deploy/kubernetes as written (no cluster: tests/test_deploy.py applies it), the serve
image's build as `guilds serve image` makes it, and the probes' answers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from guilds.config.settings import load_settings
from guilds.fronts import serve_image
from guilds.web.health import readiness

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "deploy" / "kubernetes"


def objects(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


def kinds() -> dict[str, dict]:
    every = [obj for name in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
             for obj in objects(name)]
    return {f"{obj['kind']}/{obj['metadata']['name']}": obj for obj in every}


def test_the_kustomization_holds_every_manifest_of_the_folder():
    listed = set(yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize(("doc", "role"), [("kubernetes-role.yaml", "guilds-orchestrator"),
                                           ("kubernetes-claims-role.yaml", "guilds-orchestrator-claims")])
def test_the_replicas_roles_are_the_documented_ones(doc, role):
    documented = yaml.safe_load((ROOT / "docs" / doc).read_text())
    shipped = kinds()[f"Role/{role}"]
    assert shipped["rules"] == documented["rules"]
    binding = kinds()[f"RoleBinding/{role}"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "guilds-serve"}]


def test_the_deployment_runs_replicas_with_probes_and_the_record_from_the_secret():
    deployment = kinds()["Deployment/guilds-serve"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "guilds-serve"
    serve = pod["containers"][0]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert serve["livenessProbe"]["httpGet"]["path"] == "/healthz"
    url = next(e for e in serve["env"] if e["name"] == "GUILDS_DATABASE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "guilds-serve", "key": "database-url"}
    assert "--e2b" in serve["args"]
    names = [e["name"] for e in serve["env"]]  # $(POD_IP) is expanded only when defined before
    advertised = next(e for e in serve["env"] if e["name"] == "GUILDS_ADVERTISE_URL")
    assert advertised["value"] == "http://$(POD_IP):8765" and names.index("POD_IP") < names.index(advertised["name"])


def test_the_service_the_budget_and_the_policy_select_the_replicas():
    selected = {"app.kubernetes.io/name": "guilds-serve"}
    every = kinds()
    assert every["Service/guilds-serve"]["spec"]["selector"] == selected
    assert every["Service/guilds-serve"]["spec"]["sessionAffinity"] == "None"
    assert every["PodDisruptionBudget/guilds-serve"]["spec"]["selector"]["matchLabels"] == selected
    policy = every["NetworkPolicy/guilds-serve"]["spec"]
    assert policy["podSelector"]["matchLabels"] == selected
    http, others = policy["ingress"]
    assert "from" not in http and http["ports"] == [{"protocol": "TCP", "port": "http"}]
    assert others["from"] == [{"podSelector": {"matchExpressions": [{"key": "guilds.network",
                                                                      "operator": "Exists"}]}}]


def test_the_shipped_settings_are_valid_settings():
    settings = load_settings(MANIFESTS / "settings.toml", env={})
    assert settings.sandbox == "kubernetes" and settings.kubernetes.mode == "claim"


def test_the_serve_images_dockerfile():
    text = serve_image.dockerfile("guilds-base:local", install=False, python=(3, 11), extras=("postgres",))
    lines = text.splitlines()
    assert lines[0] == "FROM guilds-base:local" and not any("apt-get" in line for line in lines)
    assert "'3.11'" in lines[1] and lines[2] == "COPY site /opt/guilds/site"
    assert "import guilds.fronts.serve, guilds.fronts.e2b, sqlalchemy.ext.asyncio, asyncpg" in text
    assert f"USER {serve_image.SERVE_UID}:{serve_image.SERVE_UID}" in lines
    assert lines[-2:] == ['ENTRYPOINT ["python3", "-m", "guilds.fronts.cli"]', 'CMD ["serve", "--host", "0.0.0.0"]']
    assert "apt-get" in serve_image.dockerfile("debian:bookworm-slim", install=True, python=(3, 11))


def test_the_serve_image_carries_the_requirements_closure_and_no_test_tools():
    names = {dist.metadata["Name"].lower() for dist in serve_image.distributions(("postgres",))}
    assert {"sqlalchemy", "greenlet", "asyncpg", "mcp", "kubernetes", "uvicorn", "starlette"} <= names
    assert not names & {"pytest", "ruff", "mypy", "e2b", "anthropic"}
    assert "asyncpg" not in {dist.metadata["Name"].lower() for dist in serve_image.distributions(())}


def test_guilds_serve_image_refuses_bad_input_in_one_line(tmp_path):
    for args, said in ((["--extra", "nope"], "--extra nope: guilds has no such extra"),
                       (["--rootfs", str(tmp_path / "none.tar")], "no such file")):
        done = subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "serve", "image", *args],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and said in done.stderr and done.stdout == ""


def test_readiness_says_why_the_record_does_not_answer():
    async def refused() -> bool:
        raise ConnectionRefusedError("connection refused")

    async def answers() -> bool:
        return True

    assert asyncio.run(readiness(answers)) == (200, "ready")
    assert asyncio.run(readiness(refused)) == (503, "not ready: ConnectionRefusedError: connection refused")
