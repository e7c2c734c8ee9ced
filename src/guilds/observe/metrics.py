"""The Prometheus metrics of one server, on a registry of its own (two servers in one
process never share a series). docs/observability.md lists every metric and its labels.

    metrics = Metrics()
    toolbox = Toolbox(settings, sandbox, store, observer=metrics)
    route = metrics_route(metrics, store)        # GET /metrics, the text format

What the toolbox tells (``guilds.toolbox.observer``) is counted as it happens; the
agents and sandboxes by state are read when /metrics is asked for: the agents made on
demand from the run record, the sandboxes from the toolboxes this server made, the warm
pools (local, and kubernetes' SandboxWarmPools) from ``Pools``. A claim-mode sandbox of a
toolbox watched tells each claim's startup (``KubeClaimSandbox.hear_claims``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter as Tally
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..record.agent_rows import HELD
from ..toolbox.observer import STAGES, CallEnded, Observer
from ..toolbox.tools import TOOL_NAMES

if TYPE_CHECKING:
    from ..agents.pool import Pools
    from ..record.store import Store
    from ..toolbox import Toolbox
    from .traces import CallTraces

METRICS_PATH = "/metrics"
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 900.0)
"""Latency buckets: a millisecond (a pointer or a refusal) to 15 min (a long code_task)."""
OTHER_TOOL = "other"
"""The tool label of a call whose tool is none of the five (the label's values stay few)."""
SANDBOX_STATES = ("started", "not_started")
CLAIM_STARTUP_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""A claim's startup: a ready sandbox handed out (a fraction of a second) to a pod made cold and its
image pulled (minutes; ``KUBERNETES_START_SECONDS`` bounds it)."""


def tool_label(tool: str) -> str:
    return tool if tool in TOOL_NAMES else OTHER_TOOL


class _Sandboxes(Collector):
    """``guilds_sandboxes{state}``: the sandboxes of this server's toolboxes, started by it or not yet."""

    def __init__(self) -> None:
        self.toolboxes: weakref.WeakSet[Toolbox] = weakref.WeakSet()

    def collect(self) -> Any:
        counts = Tally("started" if toolbox.started else "not_started" for toolbox in list(self.toolboxes))
        family = GaugeMetricFamily("guilds_sandboxes", "Sandboxes of this server's agents, by state",
                                   labels=["state"])
        for state in SANDBOX_STATES:
            family.add_metric([state], counts[state])
        yield family


class _Pools(Collector):
    """``guilds_pool_agents{template,state}``, ``guilds_pool_hits_total{template}``,
    ``guilds_pool_misses_total{template}``: the warm pools of this server (``guilds.agents.pool``);
    ``guilds_claim_pool_replicas{template,warm_pool,state}`` and
    ``guilds_claim_pool_failures_total{template,warm_pool}``: the SandboxWarmPools it sizes
    (``guilds.agents.claim_pools``)."""

    def __init__(self) -> None:
        self.pools: Pools | None = None

    def collect(self) -> Any:
        agents = GaugeMetricFamily("guilds_pool_agents", "Agents of the warm pools, ready or being made, by "
                                   "template; target: the pool's size from demand", labels=["template", "state"])
        hits = CounterMetricFamily("guilds_pool_hits", "Agents made by taking a ready one of the template's "
                                   "warm pool", labels=["template"])
        misses = CounterMetricFamily("guilds_pool_misses", "Agents of a template with a warm pool made without "
                                     "it: none was ready", labels=["template"])
        for template, counts in (self.pools.counts() if self.pools is not None else {}).items():
            for state, value in (("ready", counts.ready), ("making", counts.making), ("target", counts.target)):
                agents.add_metric([template, state], value)
            hits.add_metric([template], counts.hits)
            misses.add_metric([template], counts.misses)
        yield from (agents, hits, misses)
        yield from self._claim_pools()

    def _claim_pools(self) -> Any:
        replicas = GaugeMetricFamily("guilds_claim_pool_replicas", "The SandboxWarmPools of the claim-mode "
                                     "templates: target, the replicas last set; ready and making, the pool's "
                                     "sandboxes as read then", labels=["template", "warm_pool", "state"])
        failures = CounterMetricFamily("guilds_claim_pool_failures", "Settings of a template's SandboxWarmPool "
                                       "the cluster refused", labels=["template", "warm_pool"])
        for template, counts in (self.pools.claims.counts() if self.pools is not None else {}).items():
            for state, value in (("target", counts.target), ("ready", counts.ready), ("making", counts.making)):
                replicas.add_metric([template, counts.warm_pool, state], value)
            failures.add_metric([template, counts.warm_pool], counts.failures)
        yield from (replicas, failures)


class Metrics(Observer):
    """The log lines of ``Observer``, and the counts, histograms and gauges of /metrics."""

    def __init__(self, traces: CallTraces | None = None) -> None:
        super().__init__(traces)
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("guilds_tool_calls", "Tool calls ended, by tool and outcome",
                             ["tool", "outcome"], registry=r)
        self.call_seconds = Histogram("guilds_tool_call_duration_seconds", "A tool call from its start to its "
                                      "recorded end, by tool", ["tool"], buckets=SECONDS_BUCKETS, registry=r)
        self.stage_seconds = Histogram("guilds_stage_duration_seconds", "One stage of a call: the sandbox's "
                                       "start, the helper, the record", ["stage"], buckets=SECONDS_BUCKETS,
                                       registry=r)
        self.egress_decisions = Counter("guilds_egress_decisions", "Egress proxy decisions, allowed or refused",
                                        ["decision"], registry=r)
        self.record_errors = Counter("guilds_record_errors", "Writes the run record could not take, by what "
                                     "was lost (a call's result, egress decisions)", ["what"], registry=r)
        self.agents = Gauge("guilds_agents", "Agents made on demand, by state (from the run record)",
                            ["state"], registry=r)
        self._stage_timers = {stage: self.stage_seconds.labels(stage) for stage in STAGES}
        self._sandboxes = _Sandboxes()
        r.register(self._sandboxes)
        self._pools = _Pools()
        r.register(self._pools)
        self.claim_seconds = Histogram("guilds_claim_startup_duration_seconds", "A SandboxClaim this server "
                                       "made, from its create to its pod's first answer, by warm pool",
                                       ["warm_pool"], buckets=CLAIM_STARTUP_BUCKETS, registry=r)

    def watch(self, toolbox: Toolbox) -> None:
        """Read the toolbox's sandbox's state at each scrape; time the claims a claim-mode sandbox makes."""
        self._sandboxes.toolboxes.add(toolbox)
        hear_claims = getattr(toolbox.sandbox, "hear_claims", None)
        if hear_claims is not None:
            hear_claims(self.claim_started)

    def claim_started(self, warm_pool: str, seconds: float) -> None:
        """A claim on warm_pool made, its pod answering seconds later (from a worker thread)."""
        self.claim_seconds.labels(warm_pool).observe(seconds)

    def watch_pools(self, pools: Pools) -> None:
        """Read the warm pools' counts at each scrape."""
        self._pools.pools = pools

    def stage_timer(self, stage: str) -> contextlib.AbstractContextManager[Any]:
        return self._stage_timers[stage].time()

    def call_ended(self, ended: CallEnded) -> None:
        super().call_ended(ended)
        tool = tool_label(ended.tool)
        self.calls.labels(tool, ended.outcome).inc()
        self.call_seconds.labels(tool).observe(ended.seconds)

    def egress(self, decisions: list[dict[str, Any]]) -> None:
        allowed = sum(1 for d in decisions if d.get("allowed") is True)
        if allowed:
            self.egress_decisions.labels("allowed").inc(allowed)
        if len(decisions) > allowed:
            self.egress_decisions.labels("refused").inc(len(decisions) - allowed)

    def record_error(self, what: str) -> None:
        self.record_errors.labels(what).inc()

    async def read_agents(self, store: Store) -> None:
        """The agents made on demand, by state, as the run record holds them now."""
        counts = Tally(agent.status for agent in await store.agents(statuses=HELD))
        for state in HELD:
            self.agents.labels(state).set(counts[state])

    def text(self) -> bytes:
        return generate_latest(self.registry)


def metrics_route(metrics: Metrics, store: Store) -> Route:
    """GET /metrics: the metrics in Prometheus' text format (behind the server's lock, as every route)."""
    async def scrape(request: Request) -> Response:
        await metrics.read_agents(store)
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return Route(METRICS_PATH, scrape, methods=["GET"], name="metrics")
