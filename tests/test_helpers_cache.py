"""The helpers built once per installed version, found again by a hash of their sources."""

from __future__ import annotations

import subprocess
import time

from conftest import PYTHON
from guilds.sandbox import helpers
from guilds_code.protocol import decode_envelope


def test_a_built_helper_is_found_by_its_sources_without_building(tmp_path):
    first = helpers.cached_helper(tmp_path, "guilds-code")
    assert first.name == f"guilds-code-{helpers.source_digest(helpers.HELPER_PACKAGES['guilds-code'])}.py"
    stamp = first.stat()
    first.write_bytes(first.read_bytes() + b"# marked\n")  # a rebuild would drop the mark
    t0 = time.perf_counter()
    again = helpers.cached_helper(tmp_path, "guilds-code")
    found_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    helpers.build_bytes(helpers.HELPER_PACKAGES["guilds-code"])
    build_ms = (time.perf_counter() - t0) * 1000
    assert again == first and again.read_bytes().endswith(b"# marked\n") and again.stat().st_ino == stamp.st_ino
    assert found_ms < build_ms / 3, (found_ms, build_ms)
    out = subprocess.run([PYTHON, "-I", "-S", str(again)], check=False, capture_output=True, text=True)
    assert decode_envelope(out.stdout.strip())["error"] == "request: expected one argument, got 0"


def test_each_helper_has_its_own_digest_and_it_follows_the_sources():
    code, harness = (helpers.source_digest(helpers.HELPER_PACKAGES[n]) for n in ("guilds-code", "guilds-harness"))
    assert code != harness and len(code) == 16
    assert helpers.source_digest(("guilds_code",)) == code
