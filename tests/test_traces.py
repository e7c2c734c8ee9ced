"""OpenTelemetry traces of tool calls, received by a real OpenTelemetry Collector
(scripts/otel-collector-test-env.sh: the OTLP receiver on loopback, the file exporter
writing what it receives as OTLP JSON lines): a shell call through ``guilds.open``; an
MCP call with ``_meta.traceparent`` from the official SDK's client against ``guilds
serve``; an HTTP ``traceparent`` header; tracing off; the agent's secret in no span.
The environment's settings are read by ``trace_settings``, checked here without a collector."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import guilds
from e2b_kit import e2b_server
from guilds.errors import ConfigError
from guilds.observe.log_lines import CALLS_LOGGER
from guilds.observe.traces import TraceSettings, trace_settings
from guilds.web.endpoint_lock import TOKEN_FILE
from test_metrics import tool_call
from web_kit import start_serve, stop_serve

ENDPOINT = os.environ.get("GUILDS_TEST_OTLP_ENDPOINT")
SPANS = os.environ.get("GUILDS_TEST_OTLP_SPANS")
needs_collector = pytest.mark.skipif(not (ENDPOINT and SPANS), reason="GUILDS_TEST_OTLP_ENDPOINT is not set "
                                     "(eval \"$(bash scripts/otel-collector-test-env.sh)\")")
SECRET = "sk-traces-9d8c7b6a5f4e3d2c1b"
SECRETS = f'\n[secrets]\nAPI_KEY = "{SECRET}"\n'
STAGES = {"sandbox_start", "helper", "record"}
ERROR = 2
"""OTLP's STATUS_CODE_ERROR."""


def otel_env() -> dict[str, str]:
    """Traces on, to the test collector, sent 50 ms after a span ends."""
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT or "",
            "OTEL_SERVICE_NAME": "guilds-traces-test", "OTEL_BSP_SCHEDULE_DELAY": "50"}


def _value(value: dict) -> Any:
    kind, held = next(iter(value.items()))
    return int(held) if kind == "intValue" else held


def received(trace_id: str | None = None) -> list[dict]:
    """Every span the collector wrote (of trace_id), each with its ``attrs`` and its ``service``."""
    spans = []
    for line in Path(SPANS or "").read_text().splitlines():
        for resource in json.loads(line).get("resourceSpans", []):
            service = {a["key"]: _value(a["value"]) for a in resource["resource"].get("attributes", [])}
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    if trace_id is None or span["traceId"] == trace_id:
                        attrs = {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}
                        spans.append({**span, "attrs": attrs, "service": service.get("service.name")})
    return spans


def wait_for_spans(trace_id: str, count: int, timeout: float = 30) -> list[dict]:
    """The spans of trace_id once there are count of them (or what came in timeout seconds)."""
    deadline = time.monotonic() + timeout
    spans = received(trace_id)
    while len(spans) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        spans = received(trace_id)
    return spans


def call_span(spans: list[dict], call_id: str) -> dict:
    found = [s for s in spans if s["attrs"].get("gen_ai.tool.call.id") == call_id]
    assert len(found) == 1, spans
    return found[0]


def children(spans: list[dict], parent: dict) -> dict[str, dict]:
    return {s["name"]: s for s in spans if s.get("parentSpanId") == parent["spanId"]}


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def settings_file(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nhome = "home"\nsandbox = "local"\n' + SECRETS)
    path.chmod(0o600)
    return path


# --- guilds.open ---------------------------------------------------------------------------

@needs_collector
async def test_a_shell_call_through_guilds_open_is_a_span_with_its_stages(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=CALLS_LOGGER)
    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env=otel_env()) as agent:
        ok = await agent.call("traces-open", "shell", {"command": "echo $API_KEY"})
        failed = await agent.call("traces-open", "file_read", {"path": "no-such-file.txt"})
    lines = {r.event["call_id"]: r.event for r in caplog.records if getattr(r, "event", {}).get("event") == "call"}
    line = lines[ok.meta["call"]]
    assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"]), line
    spans = wait_for_spans(line["trace_id"], 4)
    span = call_span(spans, ok.meta["call"])
    assert span["name"] == "execute_tool shell" and span["kind"] == 1 and span["service"] == "guilds-traces-test"
    assert span["attrs"] == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "shell",
                             "gen_ai.tool.call.id": ok.meta["call"], "gen_ai.tool.type": "function",
                             "gen_ai.agent.id": "agent1", "guilds.run.id": "traces-open",
                             "guilds.call.outcome": "ok", "guilds.call.recorded": True}
    assert span.get("status", {}).get("code", 0) != ERROR
    stages = children(spans, span)
    assert set(stages) == STAGES, spans
    assert all(s["attrs"] == {"guilds.stage": name} for name, s in stages.items())
    assert all(int(span["startTimeUnixNano"]) <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"])
               <= int(span["endTimeUnixNano"]) for s in stages.values())
    failed_line = lines[failed.meta["call"]]
    failed_span = call_span(wait_for_spans(failed_line["trace_id"], 3), failed.meta["call"])
    assert failed.is_error and failed_span["status"]["code"] == ERROR
    assert failed_span["attrs"]["error.type"] == "tool_error" and failed_span["attrs"]["guilds.call.outcome"] == "error"
    assert failed_span["name"] == "execute_tool file_read"
    assert set(children(received(failed_line["trace_id"]), failed_span)) == {"helper", "record"}  # started already


@needs_collector
async def test_a_call_inside_a_programs_own_span_is_its_child(tmp_path):
    """guilds.open's call continues the OpenTelemetry context current where it is awaited."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("the-program")
    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env=otel_env()) as agent:
        with tracer.start_as_current_span("agent-step") as outer:
            result = await agent.call("traces-inner", "shell", {"command": "true"})
    context = outer.get_span_context()
    span = call_span(wait_for_spans(format(context.trace_id, "032x"), 4), result.meta["call"])
    assert span["parentSpanId"] == format(context.span_id, "016x")


@needs_collector
async def test_the_agents_secret_is_in_no_span(tmp_path, caplog):
    """The secret as the run id, in the tool's name and in the output: each span says [REDACTED]."""
    caplog.set_level(logging.INFO, logger=CALLS_LOGGER)
    async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data", env=otel_env()) as agent:
        echoed = await agent.call(SECRET, "shell", {"command": "echo $API_KEY; echo sk-traces-9d8c7b6a5f4e3d2c1b"})
        named = await agent.call("traces-secret", f"tool-{SECRET}", {"key": SECRET})
    ids = [r.event["trace_id"] for r in caplog.records if getattr(r, "event", {}).get("event") == "call"]
    spans = wait_for_spans(ids[0], 4) + wait_for_spans(ids[1], 2)  # no helper for an unknown tool
    assert "[REDACTED]" in echoed.text and named.is_error
    assert {s["attrs"].get("guilds.run.id") for s in spans} >= {"[REDACTED]", "traces-secret"}
    assert "execute_tool tool-[REDACTED]" in {s["name"] for s in spans}
    written = Path(SPANS or "").read_text()
    assert all(trace_id in written for trace_id in ids) and SECRET not in written


# --- guilds serve: MCP and HTTP ------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """`guilds serve` with traces on: its /mcp URL and token."""
    if not (ENDPOINT and SPANS):
        pytest.skip("GUILDS_TEST_OTLP_ENDPOINT is not set")
    folder = tmp_path_factory.mktemp("served")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in otel_env().items():
            patch.setenv(name, value)
        proc = start_serve(folder / "data", more_settings=SECRETS)
    try:
        for line in proc.stderr:
            if found := re.search(r"(http://127\.0\.0\.1:\d+)/\?token=", line):
                yield found.group(1) + "/mcp", (folder / "data" / TOKEN_FILE).read_text().strip()
                break
        else:
            raise AssertionError(f"guilds serve ended: {proc.wait()}")
    finally:
        stop_serve(proc)


async def test_an_mcp_calls_span_is_a_child_of_its_meta_traceparent(served):
    url, token = served
    traceparent, trace_id, parent_id = new_traceparent()
    meta = {"traceparent": traceparent, "tracestate": "guilds=test", "guilds/run": "traces-mcp"}
    async with (create_mcp_http_client(headers={"authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as c):
        result = await c.call_tool("shell", {"command": "echo $API_KEY"}, meta=meta)
    call_id = result.meta["guilds/meta"]["call"]
    spans = await asyncio.to_thread(wait_for_spans, trace_id, 3)
    span = call_span(spans, call_id)
    assert span["parentSpanId"] == parent_id and span["traceState"] == "guilds=test"
    assert span["name"] == "execute_tool shell" and span["attrs"]["guilds.run.id"] == "traces-mcp"
    assert {"helper", "record"} <= set(children(spans, span))
    assert SECRET not in json.dumps(spans) and "[REDACTED]" in result.content[0].text


async def test_a_traceparent_that_is_not_w3cs_starts_a_trace_of_its_own(served):
    url, token = served
    bad = f"00-{'0' * 32}-{secrets.token_hex(8)}-01"  # an all-zero trace id is invalid
    async with (create_mcp_http_client(headers={"authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as c):
        result = await c.call_tool("shell", {"command": "true"}, meta={"traceparent": bad, "guilds/run": "traces-bad"})
    call_id = result.meta["guilds/meta"]["call"]
    deadline = time.monotonic() + 30
    while not (found := [s for s in received() if s["attrs"].get("gen_ai.tool.call.id") == call_id]):
        assert time.monotonic() < deadline, "no span of the call"
        await asyncio.sleep(0.1)
    assert found[0]["traceId"] != "0" * 32 and not found[0].get("parentSpanId")


async def test_an_http_traceparent_header_is_honoured(served):
    """A self-contained tools/call with no _meta: the request's traceparent header is the parent."""
    url, token = served
    traceparent, trace_id, parent_id = new_traceparent()
    body, headers = tool_call("shell", {"command": 4})  # refused by the toolbox: an error result
    async with httpx2.AsyncClient(timeout=60) as c:
        answer = await c.post(url, json=body, headers={**headers, "authorization": f"Bearer {token}",
                                                       "traceparent": traceparent})
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["isError"] is True, answer.text
    spans = await asyncio.to_thread(wait_for_spans, trace_id, 2)  # the call's and its record's
    span = next(s for s in spans if s["name"] == "execute_tool shell")
    assert span["parentSpanId"] == parent_id and span["attrs"]["error.type"] == "tool_error", span
    assert span["status"]["code"] == ERROR


# --- tracing off ---------------------------------------------------------------------------

PROGRAM = """
import asyncio, json, logging, sys
import guilds

class Lines(logging.Handler):
    def emit(self, record):
        if getattr(record, "event", {}).get("event") == "call":
            print(json.dumps({"trace_id": record.event["trace_id"]}))

logging.getLogger("guilds.calls").addHandler(Lines())
logging.getLogger("guilds.calls").setLevel(logging.INFO)

async def main():
    async with guilds.open(sys.argv[1], data_dir=sys.argv[2], env=json.loads(sys.argv[3])) as agent:
        await agent.call("traces-off", "shell", {"command": "true"})
    print(json.dumps({"sdk": "opentelemetry.sdk.trace" in sys.modules,
                      "exporter": any(m.startswith("opentelemetry.exporter") for m in sys.modules)}))

asyncio.run(main())
"""


def run_program(tmp_path: Path, env: dict[str, str]) -> list[dict]:
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(settings_file(tmp_path)), str(tmp_path / "data"),
                           json.dumps(env)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@needs_collector
@pytest.mark.parametrize("tracing", ["off", "none", "on"])
def test_tracing_off_makes_no_exporter_and_no_trace_id(tmp_path, tracing):
    env = {"off": {}, "none": {"OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "x"}, "on": otel_env()}[tracing]
    line, loaded = run_program(tmp_path, env)
    if tracing == "on":
        assert loaded == {"sdk": True, "exporter": True} and re.fullmatch(r"[0-9a-f]{32}", line["trace_id"])
        assert wait_for_spans(line["trace_id"], 1)  # sent at the program's exit
    else:
        assert loaded == {"sdk": False, "exporter": False} and line["trace_id"] == ""


# --- the environment's settings ------------------------------------------------------------

def test_the_settings_read_from_the_standard_variables():
    assert trace_settings({}) is None and trace_settings({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert trace_settings({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) is None
    assert trace_settings({"OTEL_TRACES_EXPORTER": "otlp"}) == TraceSettings(endpoint="http://localhost:4318/v1/traces")
    read = trace_settings({
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t,x-tenant=a", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip", "OTEL_RESOURCE_ATTRIBUTES": "service.name=r,team=core",
        "OTEL_SERVICE_NAME": "guilds-eu", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_BSP_SCHEDULE_DELAY": "200"})
    assert read == TraceSettings(endpoint="http://collector:4318/v1/traces",
                                 headers=(("authorization", "Bearer t"), ("x-tenant", "a")), timeout_ms=2500,
                                 compression="gzip", resource=(("service.name", "guilds-eu"), ("team", "core")),
                                 sampler="parentbased_traceidratio", sampler_ratio=0.25, schedule_delay_ms=200)
    own = trace_settings({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
                          "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b/traces"})
    assert own is not None and own.endpoint == "https://b/traces"


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: guilds sends traces over otlp (or none), got 'zipkin'"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL: guilds sends traces as http/protobuf"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: must be an http:// or"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "OTEL_EXPORTER_OTLP_HEADERS: expected key=value pairs"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT: must be a whole number of milliseconds"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION: must be one of none, gzip"),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER: must be one of always_on"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"}, "OTEL_TRACES_SAMPLER_ARG: must be"),
])
def test_a_bad_variable_is_named(env, named):
    with pytest.raises(ConfigError) as raised:
        trace_settings({"OTEL_TRACES_EXPORTER": "otlp", **env})
    assert str(raised.value).startswith(named) and "\n" not in str(raised.value)


async def test_a_bad_variable_stops_guilds_open_with_its_name(tmp_path):
    with pytest.raises(ConfigError, match=r"^OTEL_TRACES_SAMPLER: must be one of"):
        async with guilds.open(settings_file(tmp_path), data_dir=tmp_path / "data",
                               env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "x"}):
            pass


@needs_collector
@pytest.mark.slow
def test_an_e2b_request_continues_its_traceparent_header(tmp_path, monkeypatch):
    """A file written through the E2B front's files API (envd's, as the SDK sends it) with a
    traceparent header: its call's span is the header's span's child."""
    from e2b import Sandbox

    traceparent, trace_id, parent_id = new_traceparent()
    for name, value in otel_env().items():
        monkeypatch.setenv(name, value)
    with e2b_server(tmp_path, "local", SECRETS) as served:
        for name, value in served.env().items():
            monkeypatch.setenv(name, value)
        box = Sandbox.create()
        try:
            written = httpx2.post(f"{served.url}/files", params={"path": "traced.txt"},
                                  headers={**box.connection_config.sandbox_headers, "traceparent": traceparent},
                                  files={"file": ("traced.txt", SECRET.encode())}, timeout=60)
            assert written.status_code == 200, written.text
            assert box.files.read("traced.txt") == SECRET
        finally:
            box.kill()
        spans = wait_for_spans(trace_id, 2)
    calls = [s for s in spans if s["attrs"].get("gen_ai.operation.name") == "execute_tool"]
    assert len(calls) == 1 and calls[0]["parentSpanId"] == parent_id, spans
    assert calls[0]["name"].startswith("execute_tool e2b ") and calls[0]["attrs"]["guilds.run.id"].startswith("e2b-")
    assert SECRET not in json.dumps(spans)
