"""E2B programs that reach `guilds serve --e2b` by E2B's host names alone (``E2B_DOMAIN``), over
the server's own HTTPS (``--tls-cert``, ``--tls-key``, ``--e2b-domain``): the real Python SDK in a
process of its own, as a program run with the printed variables and its certificate authority
trusted; real curl for a sandbox's port; names outside the domain, a client that does not trust
the certificate and plain HTTP refused; bad options refused in one line before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2b_kit import E2BServer, e2b_server
from guilds.errors import ConfigError
from guilds.fronts.serve_options import E2BServing, Tls, checked_domain

DOMAIN = "guilds.localhost"
"""A name under localhost: curl and the SDK's client resolve it, and every name under it, to this machine."""
ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r"""
import json, subprocess, sys, time
from e2b import Sandbox
box = Sandbox.create(timeout=120)
seen = {"id": box.sandbox_id, "domain": box.sandbox_domain}
seen["run"] = box.commands.run("echo hi; whoami").stdout
box.files.write("/home/user/a.txt", "over https")
seen["read"] = box.files.read("/home/user/a.txt")
seen["listed"] = [info.sandbox_id for info in Sandbox.list().next_items()]
box.files.write("/home/user/srv.py", "import http.server as h; h.HTTPServer(('127.0.0.1', 8001), "
                "type('H', (h.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200), "
                "s.end_headers(), s.wfile.write(s.headers['host'].encode()))})).serve_forever()")
box.commands.run("python3 /home/user/srv.py", background=True)
seen["host"] = box.get_host(8001)
for _ in range(240):  # the server's start, on a loaded machine; an answer of the front (not open yet) is no answer
    got = subprocess.run(["curl", "-sSf", "--cacert", sys.argv[1], f"https://{seen['host']}/"],
                         capture_output=True, text=True)
    if got.returncode == 0 and got.stdout:
        break
    time.sleep(0.25)
seen["port"] = [got.returncode, got.stdout, got.stderr]
box.kill()
print(json.dumps(seen))
"""
"""An E2B program: a sandbox made, a command run, a file written and read, the list, a server
started in the sandbox and reached by curl at get_host over HTTPS; what it saw, as JSON."""


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Path:
    """A test authority's certificate (ca.pem) and the server's for DOMAIN and *.DOMAIN."""
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(ROOT / "scripts/test-tls-cert.sh"), str(folder), DOMAIN], check=True, timeout=60)
    return folder


@pytest.fixture(scope="module")
def server(tls, tmp_path_factory) -> Iterator[E2BServer]:
    options = ("--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key"), "--e2b-domain", DOMAIN)
    with e2b_server(tmp_path_factory.mktemp("domain"), "bwrap", options=options) as served:
        yield served


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "20", *args], check=False, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_an_e2b_program_with_e2b_domain_alone_runs_over_https(server, tls):
    port = int(server.domain.rsplit(":", 1)[1])
    assert server.domain == f"{DOMAIN}:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(server.env(), SSL_CERT_FILE=str(tls / "ca.pem"))
    ran = subprocess.run([sys.executable, "-c", PROGRAM, str(tls / "ca.pem")], env=env, check=False,
                         capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    seen = json.loads(ran.stdout.splitlines()[-1])
    assert seen["domain"] == server.domain
    assert seen["run"] == "hi\nuser\n" and seen["read"] == "over https"
    assert seen["id"] in seen["listed"]
    assert seen["host"] == f"8001-{seen['id']}.{server.domain}"
    assert seen["port"][:2] == [0, seen["host"]], seen["port"]


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_the_printed_lines_are_e2b_domain_and_the_keys(server):
    e2b_lines = [line for line in server.printed.splitlines() if "E2B_" in line or "get_host" in line]
    assert e2b_lines == [f"export E2B_DOMAIN={server.domain}", f"export E2B_API_KEY={server.key}",
                         f"# key other: export E2B_API_KEY={server.other_key}",
                         f"# a sandbox's port (get_host): https://<port>-<sandbox id>.{server.domain}/"]


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_what_is_not_the_servers_over_its_certificate_is_refused(server, tls):
    api = f"https://api.{server.domain}/sandboxes"
    key = ("-H", f"X-API-KEY: {server.key}")
    assert curl("--cacert", str(tls / "ca.pem"), *key, "-o", "/dev/null", "-w", "%{http_code}", api).stdout == "200"
    untrusted = curl(*key, api)
    assert untrusted.returncode == 60, untrusted  # the certificate is not trusted: nothing sent
    plain = curl(*key, api.replace("https://", "http://"))
    assert plain.returncode != 0 or "400" in plain.stdout, plain
    for name in (f"api.other.{server.domain}", "api.localhost", f"api.{DOMAIN}.example"):
        rebound = curl("--cacert", str(tls / "ca.pem"), *key, "-H", f"Host: {name}", "-w", " %{http_code}", api)
        assert rebound.stdout.endswith(" 400"), (name, rebound)


@pytest.mark.slow
@pytest.mark.backends("bwrap")
def test_the_app_is_served_over_https_at_an_allowed_name(tls, tmp_path):
    """Without a domain: the app's URLs are https, and /healthz answers over HTTPS at a name the
    certificate holds (--allow-host)."""
    options = ("--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key"), "--allow-host", DOMAIN)
    with e2b_server(tmp_path, "bwrap", options=options) as served:
        port = served.url.rsplit(":", 1)[1]
        assert served.url.startswith("https://")
        health = curl("--cacert", str(tls / "ca.pem"), f"https://{DOMAIN}:{port}/healthz")
        assert health.returncode == 0 and health.stdout.strip() == "ok", health


def serve_refusal(tmp_path: Path, *options: str) -> str:
    """`guilds serve` with options that must be refused: its one stderr line (exit 2, nothing served)."""
    (tmp_path / "home").mkdir(exist_ok=True)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "refused"\nhome = "{tmp_path / "home"}"\nsandbox = "local"\n')
    ran = subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "serve", "--port", "0", "--config", str(config),
                          *options], env={**os.environ, "GUILDS_DATA": str(tmp_path / "data")},
                         check=False, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert ran.returncode == 2 and ran.stdout == "", ran
    lines = ran.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("guilds: "), ran.stderr
    return lines[0]


def test_bad_https_and_domain_options_are_refused_in_one_line(tmp_path, tls):
    other = tmp_path / "other"
    subprocess.run(["bash", str(ROOT / "scripts/test-tls-cert.sh"), str(other), "other.localhost"], check=True,
                   timeout=60)
    cert, key = str(tls / "server.pem"), str(tls / "server.key")
    assert "give both" in serve_refusal(tmp_path, "--tls-cert", cert)
    assert "--tls-key: no such file: /nowhere.key" in serve_refusal(tmp_path, "--tls-cert", cert, "--tls-key",
                                                                   "/nowhere.key")
    assert "are not a certificate and its key" in serve_refusal(tmp_path, "--tls-cert", cert, "--tls-key",
                                                                str(other / "server.key"))
    assert "are not a certificate and its key" in serve_refusal(tmp_path, "--tls-cert", key, "--tls-key", key)
    assert serve_refusal(tmp_path, "--e2b-domain", DOMAIN) == "guilds: --e2b-domain: only with --e2b"
    assert "is not a host name" in serve_refusal(tmp_path, "--e2b", "--e2b-domain", "127.0.0.1")


@pytest.mark.parametrize("text", ["a b", "", "-a.com", "a-.com", "a..b", "x.com:0", "x.com:65536", "10.0.0.1",
                                  "x.com:8:8", "*.x.com", "a" * 64 + ".com", ".".join(["a" * 63] * 4) + ".com"])
def test_a_domain_that_is_no_host_name_is_refused(text):
    with pytest.raises(ConfigError, match=r"--e2b-domain: .* is not a host name"):
        checked_domain(text)


@pytest.mark.parametrize("text, domain", [("Guilds.Localhost", "guilds.localhost"), ("x.com:65535", "x.com:65535"),
                                          ("x.com:1", "x.com:1"), ("localhost", "localhost"),
                                          (".".join(["a" * 63] * 3) + ".abcdefghi", None)])
def test_a_host_name_is_taken(text, domain):
    assert checked_domain(text) == (domain or text)


def test_the_domain_gets_the_servers_port_only_when_the_server_serves_https_itself():
    assert E2BServing(domain="x.com").domain_at(8443, tls=True) == "x.com:8443"
    assert E2BServing(domain="x.com").domain_at(8765, tls=False) == "x.com"  # a TLS front on 443 before it
    assert E2BServing(domain="x.com:9000").domain_at(8443, tls=True) == "x.com:9000"
    assert E2BServing().domain_at(8443, tls=True) is None
    assert E2BServing(domain="x.com:9000").host_names() == ("x.com", "api.x.com")
    assert E2BServing().host_names() == ()


def test_a_certificate_file_that_cannot_be_read_is_named(tmp_path, tls):
    unreadable = tmp_path / "cert.pem"
    unreadable.mkdir()
    with pytest.raises(ConfigError, match="--tls-cert: no such file"):
        Tls.checked(str(unreadable), str(tls / "server.key"))
    assert Tls.checked(str(tls / "server.pem"), str(tls / "server.key")).uvicorn_options() == {
        "ssl_certfile": str(tls / "server.pem"), "ssl_keyfile": str(tls / "server.key")}
