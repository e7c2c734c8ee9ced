"""Test hosts for the egress tests: a network namespace of our own joined to the host
by a veth pair (addresses in 10.x only, nothing outside this machine), running the
test forge (fixtures/git_forge.py) over TLS with a certificate of a test authority."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FORGE = Path(__file__).parent / "fixtures" / "git_forge.py"
HOST_NAME = "forge.test"


def unavailable() -> str | None:
    """Why the namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making a network namespace needs root"
    missing = [t for t in ("ip", "openssl", "git", "gh") if not shutil.which(t)]
    return f"{', '.join(missing)} not found" if missing else None


@dataclass
class Forge:
    address: str
    subnet: str
    ca: str
    token: str
    log: Path
    root: Path

    def requests(self) -> list[dict]:
        import json

        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _certificates(folder: Path) -> None:
    def ssl(*args: str) -> None:
        _run("openssl", *args)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{folder}/ca.key", "-out",
        f"{folder}/ca.pem", "-days", "2", "-subj", "/CN=guilds test authority")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{folder}/leaf.key", "-out",
        f"{folder}/leaf.csr", "-subj", f"/CN={HOST_NAME}")
    (folder / "ext").write_text(f"subjectAltName=DNS:{HOST_NAME}\n")
    ssl("x509", "-req", "-in", f"{folder}/leaf.csr", "-CA", f"{folder}/ca.pem", "-CAkey", f"{folder}/ca.key",
        "-CAcreateserial", "-out", f"{folder}/leaf.pem", "-days", "2", "-extfile", f"{folder}/ext")


def _bare_repo(root: Path) -> None:
    bare = root / "owner" / "repo.git"
    _run("git", "init", "-q", "--bare", "-b", "main", str(bare))
    seed = root / "seed"
    _run("git", "init", "-q", "-b", "main", str(seed))
    (seed / "README").write_text("hello\n")
    _run("git", "-C", str(seed), "add", "README")
    _run("git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "init")
    _run("git", "-C", str(seed), "push", "-q", str(bare), "main")


class ForgeHost:
    """The namespace, the veth pair and the forge process; ``close`` removes them all."""

    def __init__(self, folder: Path):
        self.tag = secrets.token_hex(3)
        self.ns, self.veth = f"gf-{self.tag}", f"gf{self.tag}"
        octet = 100 + secrets.randbelow(100)
        self.subnet = f"10.{octet}.{secrets.randbelow(250)}"
        self.folder = folder
        self.proc: subprocess.Popen | None = None

    def open(self) -> Forge:
        _certificates(self.folder)
        _bare_repo(self.folder / "root")
        token = "ghs_" + secrets.token_hex(18)
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", f"{self.veth}h", "type", "veth", "peer", "name", f"{self.veth}n")
        _run("ip", "link", "set", f"{self.veth}n", "netns", self.ns)
        _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", f"{self.veth}h")
        _run("ip", "link", "set", f"{self.veth}h", "up")
        _run("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.subnet}.2/24", "dev", f"{self.veth}n")
        _run("ip", "netns", "exec", self.ns, "ip", "link", "set", f"{self.veth}n", "up")
        log = self.folder / "forge.log"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, str(FORGE), f"{self.subnet}.2", "443",
             f"{self.folder}/leaf.pem", f"{self.folder}/leaf.key", str(self.folder / "root"), token, str(log)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == b"ready"
        return Forge(f"{self.subnet}.2", f"{self.subnet}.0/24", f"{self.folder}/ca.pem", token, log,
                     self.folder / "root")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        subprocess.run(["ip", "link", "del", f"{self.veth}h"], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, check=False)


def image_with_gh(base: str, tag: str) -> str:
    """base with the host's gh in /usr/local/bin, built by the Docker engine as tag (gh
    needs only libc); returns tag."""
    import io
    import tarfile

    import docker

    client = docker.from_env()
    with open(shutil.which("gh") or "/usr/bin/gh", "rb") as fh:
        gh = fh.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in (("Dockerfile", f"FROM {base}\nCOPY gh /usr/local/bin/gh\n".encode(), 0o644),
                                 ("gh", gh, 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    client.images.build(fileobj=io.BytesIO(buf.getvalue()), custom_context=True, tag=tag, rm=True)
    client.close()
    return tag
