"""The unmodified E2B JS SDK (npm `e2b`, tests/e2b_js) against a real `guilds serve --e2b`.

tests/e2b_js/suite.mjs runs the steps (create, run, exit code, background and
reconnect, kill, stdin, timeout, files, path escapes, keys, network options, snapshots and
fork, kill) and prints
"ok <step>" for each; its packages come from `npm ci` in tests/e2b_js
(the versions tests/e2b_js/package-lock.json records).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from e2b_kit import BACKENDS, e2b_server, pids_alive

SUITE = Path(__file__).parent / "e2b_js"
STEPS = ["create", "run with streamed stdout and stderr", "exit code",
         "background, then reconnect by pid from a new client", "kill", "stdin", "timeout stops the command",
         "files", "paths outside the home", "keys", "network options", "snapshots and fork", "kill the sandbox"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
    pytest.mark.skipif(not (SUITE / "node_modules" / "e2b").is_dir(),
                       reason="the JS SDK is not installed: cd tests/e2b_js && npm ci"),
]


@pytest.mark.backends(*BACKENDS)
def test_the_js_sdk_runs_its_suite(tmp_path, backend):
    marker = f"e2bjs{secrets.token_hex(4)}"
    with e2b_server(tmp_path, backend) as server:
        env = {**server.env(), "E2B_OTHER_KEY": server.other_key, "E2B_TEST_MARKER": marker,
               "PATH": "/usr/local/bin:/usr/bin:/bin"}
        done = subprocess.run(["node", "suite.mjs"], cwd=SUITE, env=env, capture_output=True, text=True,
                              timeout=240, check=False)
        lines = done.stdout.splitlines()
        assert done.returncode == 0, done.stdout + done.stderr
        assert [line[3:] for line in lines if line.startswith("ok ")] == STEPS
        if backend != "docker":  # the docker backend's processes are not this machine's
            deadline = time.monotonic() + 8
            while pids_alive(marker) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert pids_alive(marker) == []
