"""OpenTelemetry traces of tool calls, sent over OTLP; off unless the environment asks.

    traces = traces_from_env(os.environ)      # None: off (nothing of the SDK imported)
    observer = Metrics(traces) or Observer(traces)

One span a call, as the GenAI conventions name a tool's execution: ``execute_tool
<tool>``, kind INTERNAL, with ``gen_ai.operation.name`` ``execute_tool``,
``gen_ai.tool.name`` (the name as recorded: redacted), ``gen_ai.tool.call.id``,
``gen_ai.tool.type`` ``function`` (guilds runs the tool the model asked for), and at
its end ``gen_ai.agent.id``, ``guilds.run.id`` (redacted), ``guilds.call.outcome``,
``guilds.call.recorded``; an outcome other than ``ok`` sets the status ERROR and
``error.type`` (``tool_error`` or ``cancelled``). Inside it, a span for each stage the
metrics time (``sandbox_start``, ``helper``, ``record``; a stage that raised has status
ERROR and ``error.type``, its exception's type). No span holds a call's arguments or
output, an exception's message, or anything the run record would redact.

Its parent: the W3C context the front carried (``guilds.observe.trace_context``: an MCP
``_meta``, HTTP headers), else the context current where the call is made (a program
calling ``guilds.open`` inside a span of its own). The spans go to a tracer provider of
guilds' own, never the process-wide one: a program's own tracing is left as it is.

The variables read (the OpenTelemetry SDK's, as the specification names them):
``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER`` (``otlp`` turns traces on; unset or
``none`` leaves them off), ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` (``http/protobuf``),
``_ENDPOINT``, ``_HEADERS``, ``_TIMEOUT`` (milliseconds), ``_COMPRESSION``,
``OTEL_SERVICE_NAME`` (default ``guilds``), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_BSP_SCHEDULE_DELAY``. A bad value is a ConfigError
naming the variable. One provider is made per distinct setting in a process, and its
spans are sent in batches by a thread of the SDK's, flushed at the process's exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..limits import TRACE_TOOL_NAME_CHARS
from . import trace_context

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..toolbox.observer import CallEnded

EXECUTE_TOOL = "execute_tool"
TOOL_TYPE = "function"
DEFAULT_SERVICE_NAME = "guilds"
DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
PROTOCOL = "http/protobuf"
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
DEFAULT_SAMPLER = "parentbased_always_on"
COMPRESSIONS = ("none", "gzip", "deflate")
ERROR_TYPES = {"error": "tool_error", "cancelled": "cancelled"}
"""``error.type`` of a call by its outcome (``guilds.toolbox.observer``)."""


@dataclass(frozen=True)
class TraceSettings:
    """Where and how the spans go, as the environment said (hashable: one provider each)."""

    endpoint: str
    headers: tuple[tuple[str, str], ...] = ()
    timeout_ms: int | None = None
    compression: str = "none"
    resource: tuple[tuple[str, str], ...] = (("service.name", DEFAULT_SERVICE_NAME),)
    sampler: str = DEFAULT_SAMPLER
    sampler_ratio: float = 1.0
    schedule_delay_ms: int | None = None


def _traces_var(env: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def _pairs(variable: str, text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` (values URL-encoded), as the OTLP headers and the resource attributes are written."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"{variable}: expected key=value pairs separated by commas, got {item!r}")
        pairs.append((key.strip(), urllib.parse.unquote(value.strip())))
    return tuple(pairs)


def _whole(variable: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ConfigError(f"{variable}: must be a whole number of milliseconds, got {value!r}")
    return int(value)


def _endpoint(env: Mapping[str, str]) -> str:
    own = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    url = own or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/") + TRACES_PATH
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        name = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if own else "OTEL_EXPORTER_OTLP_ENDPOINT"
        raise ConfigError(f"{name}: must be an http:// or https:// URL, got {url!r}")
    return url


def _resource(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    attributes = dict(_pairs("OTEL_RESOURCE_ATTRIBUTES", env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    attributes.setdefault("service.name", DEFAULT_SERVICE_NAME)
    if env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = env["OTEL_SERVICE_NAME"]
    return tuple(sorted(attributes.items()))


def _sampler(env: Mapping[str, str]) -> tuple[str, float]:
    name = env.get("OTEL_TRACES_SAMPLER") or DEFAULT_SAMPLER
    if name not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: must be one of {', '.join(SAMPLERS)}, got {name!r}")
    arg = env.get("OTEL_TRACES_SAMPLER_ARG")
    if not name.endswith("traceidratio") or not arg:
        return name, 1.0
    try:
        ratio = float(arg)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:  # NaN fails too
        raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: must be a ratio from 0 to 1, got {arg!r}")
    return name, ratio


def trace_settings(env: Mapping[str, str]) -> TraceSettings | None:
    """The settings of traces the environment asks for; None when it asks for none."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "none").split(",") if e.strip()]
    unknown = [e for e in exporters if e not in ("otlp", "none")]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: guilds sends traces over otlp (or none), got {unknown[0]!r}")
    if "otlp" not in exporters:
        return None
    protocol = _traces_var(env, "PROTOCOL") or PROTOCOL
    if protocol != PROTOCOL:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: guilds sends traces as {PROTOCOL}, got {protocol!r}")
    compression = (_traces_var(env, "COMPRESSION") or "none").lower()
    if compression not in COMPRESSIONS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_COMPRESSION: must be one of {', '.join(COMPRESSIONS)}, "
                          f"got {compression!r}")
    sampler, ratio = _sampler(env)
    return TraceSettings(
        endpoint=_endpoint(env), headers=_pairs("OTEL_EXPORTER_OTLP_HEADERS", _traces_var(env, "HEADERS") or ""),
        timeout_ms=_whole("OTEL_EXPORTER_OTLP_TIMEOUT", _traces_var(env, "TIMEOUT")), compression=compression,
        resource=_resource(env), sampler=sampler, sampler_ratio=ratio,
        schedule_delay_ms=_whole("OTEL_BSP_SCHEDULE_DELAY", env.get("OTEL_BSP_SCHEDULE_DELAY")))


_MADE: dict[TraceSettings, CallTraces] = {}
_MAKING = threading.Lock()


def traces_from_env(env: Mapping[str, str]) -> CallTraces | None:
    """The process's traces for what ``env`` asks (one per distinct setting), or None when off.
    Off, nothing of OpenTelemetry is imported."""
    settings = trace_settings(env)
    if settings is None:
        return None
    with _MAKING:
        if settings not in _MADE:
            try:
                _MADE[settings] = CallTraces(settings)
            except ImportError as exc:
                raise ConfigError(f"OTEL_TRACES_EXPORTER=otlp: traces need the otel extra "
                                  f"(pip install 'guilds[otel]'); missing: {exc.name}") from exc
        return _MADE[settings]


@dataclass(frozen=True)
class _InCall:
    call_id: str
    span: Span


_CALL: ContextVar[_InCall | None] = ContextVar("guilds_trace_call", default=None)


class CallTraces:
    """A tracer provider of guilds' own, sending to one OTLP endpoint, and the spans of calls."""

    def __init__(self, settings: TraceSettings):
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.settings = settings
        timeout = None if settings.timeout_ms is None else settings.timeout_ms / 1000
        self.exporter = OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers),
                                         timeout=timeout, compression=Compression(settings.compression))
        self.provider = TracerProvider(sampler=_make_sampler(settings), resource=Resource(dict(settings.resource)))
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter,
                                                            schedule_delay_millis=settings.schedule_delay_ms))
        self._tracer = self.provider.get_tracer("guilds")
        self._propagator = TraceContextTextMapPropagator()

    def call(self, call_id: str, tool: str) -> AbstractContextManager[Any]:
        """The span of one call, current inside (its stages are its children)."""
        return self._call_span(call_id, tool[:TRACE_TOOL_NAME_CHARS])

    @contextlib.contextmanager
    def _call_span(self, call_id: str, tool: str) -> Iterator[None]:
        from opentelemetry.trace import SpanKind, use_span

        span = self._tracer.start_span(f"{EXECUTE_TOOL} {tool}", context=self._parent(), kind=SpanKind.INTERNAL,
                                       attributes={"gen_ai.operation.name": EXECUTE_TOOL, "gen_ai.tool.name": tool,
                                                   "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": TOOL_TYPE})
        token = _CALL.set(_InCall(call_id, span))
        try:
            with use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                yield
        finally:
            _CALL.reset(token)

    def _parent(self) -> Any:
        """The carried context when it holds a valid parent; else None (the current context)."""
        from opentelemetry.trace import get_current_span

        carrier = trace_context.incoming()
        if carrier is None:
            return None
        context = self._propagator.extract(carrier)
        return context if get_current_span(context).get_span_context().is_valid else None

    def stage(self, stage: str, timer: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """``timer`` inside a span of the stage, when a call's span is current; else ``timer`` alone."""
        return timer if _CALL.get() is None else self._stage_span(stage, timer)

    @contextlib.contextmanager
    def _stage_span(self, stage: str, timer: AbstractContextManager[Any]) -> Iterator[None]:
        from opentelemetry.trace import StatusCode

        with self._tracer.start_as_current_span(stage, attributes={"guilds.stage": stage}, record_exception=False,
                                                set_status_on_exception=False) as span:
            try:
                with timer:
                    yield
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(StatusCode.ERROR)
                raise

    def call_ended(self, ended: CallEnded) -> CallEnded:
        """The call's span told how the call ended; ``ended`` with its trace id."""
        from opentelemetry.trace import StatusCode

        current = _CALL.get()
        if current is None or current.call_id != ended.call_id:
            return ended
        span = current.span
        span.set_attributes({"gen_ai.agent.id": ended.agent_id, "guilds.run.id": ended.run_id,
                             "guilds.call.outcome": ended.outcome, "guilds.call.recorded": ended.recorded})
        if ended.outcome in ERROR_TYPES:
            span.set_attribute("error.type", ERROR_TYPES[ended.outcome])
            span.set_status(StatusCode.ERROR)
        return dataclasses.replace(ended, trace_id=format(span.get_span_context().trace_id, "032x"))

    def flush(self) -> bool:
        """Send the spans ended so far now; False when they could not all go in time."""
        return self.provider.force_flush()


def _make_sampler(settings: TraceSettings) -> Any:
    from opentelemetry.sdk.trace import sampling

    roots = {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF,
             "traceidratio": sampling.TraceIdRatioBased(settings.sampler_ratio)}
    name = settings.sampler.removeprefix("parentbased_")
    return sampling.ParentBased(roots[name]) if settings.sampler.startswith("parentbased_") else roots[name]
