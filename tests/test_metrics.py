"""/metrics and the log lines of a real `guilds serve`: calls made over /mcp, then the
metrics scraped over HTTP and read with Prometheus' own text parser, and the server's
JSON log lines read from its stderr; refused egress on bwrap; a record error caused by a
full disk; two servers' metrics in one process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import sized_tmpfs
from guilds.observe.metrics import Metrics
from guilds.record.store import Store
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.toolbox import Toolbox
from guilds.toolbox.observer import CallEnded
from guilds.toolbox.toolbox import NOT_RECORDED
from mcp_raw import VERSION, envelope
from test_endpoint_lock import MCP_HEADERS
from toolbox_kit import local_toolbox
from web_kit import printed_lines, start_serve, stop_serve

SECRET = "sk-metrics-5f0e9d8c7b6a54321"
SECRETS = f'\n[secrets]\nAPI_KEY = "{SECRET}"\n'


def tool_call(tool: str, arguments: dict) -> tuple[dict, dict]:
    """A self-contained MCP tools/call and its headers."""
    headers = {**MCP_HEADERS, "mcp-protocol-version": VERSION, "mcp-method": "tools/call", "mcp-name": tool}
    return envelope("tools/call", {"name": tool, "arguments": arguments}), headers


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape: (name, sorted labels) -> value, as Prometheus' parser reads it."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def buckets(scraped: dict, name: str, **labels: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets, (upper bound, count), smallest bound first."""
    rows = [(float(dict(k)["le"]), v) for (n, k), v in scraped.items()
            if n == name + "_bucket" and all(dict(k).get(a) == b for a, b in labels.items())]
    return sorted(rows)


@pytest.fixture
def server(tmp_path):
    proc = start_serve(tmp_path / "data", "--log-json", more_settings=SECRETS)
    try:
        printed = "".join(printed_lines(proc))
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=(\S+)", printed)
        assert found, printed
        yield proc, found.group(1), found.group(2)
    finally:
        stop_serve_kept(proc)


def make_agent(config: Path) -> str:
    """`guilds agent new` on the server's data folder: an agent made on demand, in the record."""
    env = {**os.environ, "GUILDS_DATA": str(config.parent / "data")}
    env.pop("GUILDS_DATABASE_URL", None)
    made = subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "agent", "new", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0 and made.stdout.startswith("made "), made.stderr
    return made.stdout


def stop_serve_kept(proc: subprocess.Popen) -> None:
    if not proc.stderr.closed:
        stop_serve(proc)


def stopped_output(proc: subprocess.Popen) -> str:
    """What the server wrote on stderr after its URLs, up to its end on SIGTERM."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.stderr.read()
    finally:
        proc.wait(20)
        proc.stderr.close()


async def test_metrics_count_the_calls_made_and_their_latency(server):
    proc, base, token = server
    auth = {"authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
        refused = await c.get("/metrics")
        assert refused.status_code == 401 and "needs its token" in refused.text
        assert (await c.get("/metrics", headers={"authorization": "Bearer wrong"})).status_code == 401
        before = samples((await c.get("/metrics", headers=auth)).text)
        assert value(before, "guilds_tool_calls_total", tool="shell", outcome="ok") == 0
        assert value(before, "guilds_sandboxes", state="not_started") == 1
        made = [("shell", {"command": "echo $API_KEY"}), ("shell", {"command": "true"}),
                ("file_read", {"path": "no-such-file.txt"})]
        for tool, arguments in made:
            body, headers = tool_call(tool, arguments)
            answer = await c.post("/mcp", json=body, headers={**headers, **auth})
            assert answer.status_code == 200, answer.text
        scrape = await c.get("/metrics", headers=auth)
        made_agent = make_agent(Path(proc.args[proc.args.index("--config") + 1]))
        agents = samples((await c.get("/metrics", headers=auth)).text)
    assert value(agents, "guilds_agents", state="live") == 1, made_agent
    assert scrape.headers["content-type"].startswith("text/plain; version=")
    after = samples(scrape.text)
    assert value(after, "guilds_tool_calls_total", tool="shell", outcome="ok") == 2
    assert value(after, "guilds_tool_calls_total", tool="file_read", outcome="error") == 1
    assert value(after, "guilds_tool_call_duration_seconds_count", tool="shell") == 2
    shell_buckets = buckets(after, "guilds_tool_call_duration_seconds", tool="shell")
    assert shell_buckets[-1] == (float("inf"), 2)
    assert [count for _, count in shell_buckets] == sorted(count for _, count in shell_buckets)
    assert value(after, "guilds_tool_call_duration_seconds_sum", tool="shell") > 0
    for stage, count in (("sandbox_start", 1), ("helper", 3), ("record", 3)):
        assert value(after, "guilds_stage_duration_seconds_count", stage=stage) == count, stage
        assert buckets(after, "guilds_stage_duration_seconds", stage=stage)[-1] == (float("inf"), count)
    assert value(after, "guilds_sandboxes", state="started") == 1
    assert value(after, "guilds_sandboxes", state="not_started") == 0
    assert value(after, "guilds_record_errors_total", what="call") == 0
    assert ("guilds_agents", (("state", "live"),)) in after and value(after, "guilds_agents", state="live") == 0

    assert_log_lines(stopped_output(proc))


def assert_log_lines(logged: str) -> None:
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    calls = [line for line in lines if line.get("event") == "call"]
    assert [(line["tool"], line["outcome"]) for line in calls] == [
        ("shell", "ok"), ("shell", "ok"), ("file_read", "error")]
    for line in calls:
        assert re.fullmatch(r"c[0-9a-f]{12}", line["call_id"]) and line["run"].startswith("mcp-")
        assert line["agent"] and line["trace_id"] == "" and line["recorded"] is True
    assert len({line["call_id"] for line in calls}) == 3
    assert [line["event"] for line in lines if line.get("event", "").startswith("sandbox")] == ["sandbox started"]
    assert SECRET not in logged



FETCH = ("python3 -c 'import sys, urllib.request as u\n"
         "try: print(u.urlopen(sys.argv[1], timeout=10).status)\n"
         "except Exception as e: print(type(e).__name__, e)' ")


@pytest.mark.bwrap
@pytest.mark.skipif(unavailable() is not None, reason=f"bwrap: {unavailable()}")
async def test_refused_egress_is_counted(tmp_path):
    proc = start_serve(tmp_path / "data", sandbox="bwrap", more_settings='network = ["listed.test"]\n')
    try:
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=(\S+)", "".join(printed_lines(proc)))
        assert found
        base, token = found.groups()
        auth = {"authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(base_url=base, timeout=60) as c:
            body, headers = tool_call("shell", {"command": f"{FETCH} http://elsewhere.test/; "
                                                           f"{FETCH} https://elsewhere.test/"})
            answer = await c.post("/mcp", json=body, headers={**headers, **auth})
            assert "is not in agent.network" in answer.text, answer.text
            scraped = samples((await c.get("/metrics", headers=auth)).text)
        assert value(scraped, "guilds_egress_decisions_total", decision="refused") == 2
        assert value(scraped, "guilds_egress_decisions_total", decision="allowed") == 0
    finally:
        stop_serve_kept(proc)


async def test_a_result_the_full_record_cannot_take_is_a_record_error(tmp_path):
    """The call's own command fills the record's disk: the call ends, its result not recorded, counted."""
    disk = tmp_path / "record"
    disk.mkdir()
    with sized_tmpfs(disk, "4m"):
        metrics = Metrics()
        async with Store(f"sqlite:///{disk}/guilds.db") as store, local_toolbox(tmp_path, store) as plain:
            toolbox = Toolbox(plain.settings, plain.sandbox, store, observer=metrics)
            result = await toolbox.call("filling", "shell", {
                "command": f"head -c 8M /dev/zero > {disk}/filler 2>/dev/null; echo produced"})
            assert result.text.startswith("produced") and NOT_RECORDED in result.meta
            scraped = samples(metrics.text().decode())
    assert value(scraped, "guilds_record_errors_total", what="call") == 1
    assert value(scraped, "guilds_tool_calls_total", tool="shell", outcome="ok") == 1


def test_two_servers_in_one_process_count_apart():
    first, second = Metrics(), Metrics()
    first.call_ended(CallEnded("c1", "r", "a", "shell", "ok", 0.002, True))
    first.call_ended(CallEnded("c2", "r", "a", "not-a-tool", "error", 0.002, True))
    one, other = samples(first.text().decode()), samples(second.text().decode())
    assert value(one, "guilds_tool_calls_total", tool="shell", outcome="ok") == 1
    assert value(one, "guilds_tool_calls_total", tool="other", outcome="error") == 1
    assert value(other, "guilds_tool_calls_total", tool="shell", outcome="ok") == 0
    assert buckets(one, "guilds_tool_call_duration_seconds", tool="shell")[:3] == [
        (0.001, 0.0), (0.0025, 1.0), (0.005, 1.0)]
