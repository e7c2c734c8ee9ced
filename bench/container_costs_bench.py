"""What a docker sandbox's container adds to a shell call, below guilds: bash's spawn
inside the container, and a line through the engine's exec stream.

Run: DOCKER_HOST=... .venv/bin/python bench/container_costs_bench.py [--image guilds-sandbox:latest] [--rounds 3]

1. `bash -c true` spawned 300 times by Python (``posix_spawn``, ``waitpid``):
   on the host, in a container of the image with the docker sandbox's options
   (its uid, no capabilities, no new privileges, no network), and in one with
   ``seccomp=unconfined`` beside them; medians, the three in turns, R rounds.
2. A 100-byte line echoed by a process in the container: through an exec with
   stdin attached (the engine's stream, as the docker sandbox's resident helper
   is reached), and through a pair of FIFOs bound into the same container;
   600 round trips each, taking turns; medians.

Needs a Docker engine and the image (`guilds sandbox image` builds it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

SPAWNS = """
import os, time, statistics
def one():
    os.waitpid(os.posix_spawn("/bin/bash", ["bash", "-c", "true"], {"PATH": "/usr/bin:/bin"}), 0)
for _ in range(20): one()
times = []
for _ in range(300):
    began = time.perf_counter(); one(); times.append(time.perf_counter() - began)
print(f"{statistics.median(times) * 1e6:.0f}")
"""
ECHO = "import os\nwhile True:\n d = os.read(0, 65536)\n if not d: break\n os.write(1, d)\n"
USER = "1000:1000"


def container(client: Any, image: str, name: str, security: list[str], volumes: dict | None = None) -> Any:
    return client.containers.run(image, ["sleep", "900"], name=name, detach=True, network_mode="none",
                                 user=USER, cap_drop=["ALL"], security_opt=security, volumes=volumes or {})


def spawn_rounds(client: Any, image: str, rounds: int) -> None:
    tag = os.getpid()
    boxes = {"container (the sandbox's options)": container(client, image, f"bench-spawn-{tag}", ["no-new-privileges"]),
             "container, seccomp=unconfined": container(client, image, f"bench-spawn-u-{tag}",
                                                        ["no-new-privileges", "seccomp=unconfined"])}
    times: dict[str, list[int]] = {name: [] for name in [*boxes, "host"]}
    try:
        for _ in range(rounds):
            for name, box in boxes.items():
                out = client.api.exec_start(client.api.exec_create(box.id, ["python3", "-c", SPAWNS])["Id"])
                times[name].append(int(out.decode().strip()))
            host = subprocess.run([sys.executable, "-c", SPAWNS], capture_output=True, text=True, check=True)
            times["host"].append(int(host.stdout.strip()))
    finally:
        for box in boxes.values():
            box.remove(force=True)
    print("| bash -c true spawned from Python | median µs, each round |")
    print("| --- | --- |")
    for name, values in times.items():
        print(f"| {name} | {' / '.join(map(str, values))} |")
    print()


def echo_rounds(client: Any, image: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="guilds-bench-fifo-"))
    folder.chmod(0o711)
    box = container(client, image, f"bench-echo-{os.getpid()}", ["no-new-privileges"],
                    {str(folder): {"bind": "/chan", "mode": "ro"}})
    try:
        stream = client.api.exec_start(client.api.exec_create(box.id, ["python3", "-c", ECHO], stdin=True)["Id"],
                                       socket=True)._sock
        for end in ("in", "out"):
            os.mkfifo(folder / end, 0o600)
            os.chown(folder / end, *map(int, USER.split(":")))
        out_fd = os.open(folder / "out", os.O_RDONLY | os.O_NONBLOCK)
        in_fd = os.open(folder / "in", os.O_RDWR)
        piped = client.api.exec_create(box.id, ["sh", "-c", 'exec python3 -c "$0" </chan/in >/chan/out', ECHO])
        client.api.exec_start(piped["Id"], detach=True)
        os.set_blocking(out_fd, True)
        line = b"x" * 99 + b"\n"

        def through_stream() -> None:
            stream.sendall(line)
            got = 0
            while got < len(line) + 8:  # the stream's frame header
                got += len(stream.recv(65536))

        def through_fifos() -> None:
            os.write(in_fd, line)
            got = 0
            while got < len(line):
                got += len(os.read(out_fd, 65536))

        through_fifos()
        times: dict[str, list[float]] = {"the engine's exec stream": [], "FIFOs bound into the container": []}
        for _ in range(600):
            for name, trip in zip(times, (through_stream, through_fifos)):
                began = time.perf_counter()
                trip()
                times[name].append(time.perf_counter() - began)
        print("| a 100-byte line echoed by a process in the container | median µs |")
        print("| --- | ---: |")
        for name, values in times.items():
            print(f"| {name} | {statistics.median(values) * 1e6:.0f} |")
    finally:
        box.remove(force=True)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="guilds-sandbox:latest")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    client = docker.from_env()
    print(f"load average {os.getloadavg()[0]:.1f}\n")
    spawn_rounds(client, opts.image, opts.rounds)
    echo_rounds(client, opts.image)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
