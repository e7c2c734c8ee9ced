"""The kubernetes claim-mode pools in /metrics (guilds.observe.metrics, guilds.agents.claim_pools):
each served template's SandboxWarmPool, its replicas as set and read, and the startup of each
claim a sandbox makes, read from the scrape's text with Prometheus' own parser. On the test
cluster (marked ``kubernetes``): a real pool sized from demand and a real claim made through
``Agents``; without it, what a claim-mode sandbox tells of a claim it made before anyone heard."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

import kube_kit
from guilds.observe.metrics import CLAIM_STARTUP_BUCKETS, Metrics
from guilds.sandbox.kubernetes import kube_spec as spec
from guilds.sandbox.kubernetes.kube_claims import KubeClaimSandbox
from kube_kit import no_pool_left  # noqa: F401 - a fixture of this module
from test_agent_pool import opened
from test_kube_agents import custom, server, template, until
from test_metrics import buckets, samples, value


def families(text: str) -> dict[str, str]:
    """Each family of a scrape and its type, as Prometheus' parser reads them."""
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_a_server_without_claim_pools_says_so_with_empty_families(tmp_path):
    text = Metrics().text().decode()
    kinds = families(text)
    assert kinds["guilds_claim_pool_replicas"] == "gauge" and kinds["guilds_claim_pool_failures"] == "counter"
    assert kinds["guilds_claim_startup_duration_seconds"] == "histogram"
    assert not [key for key in samples(text) if key[0].startswith("guilds_claim_")]


def test_a_claim_made_before_anyone_heard_is_told_to_the_first_who_hears(tmp_path):
    """A made agent's sandbox claims before its toolbox (and so the metrics) is made: that claim
    is told to the first listener, once; a second listening the same way hears nothing twice."""
    kc = template(tmp_path, server(tmp_path))
    sandbox = KubeClaimSandbox(kc.for_agent("kc-0123456789ab", tmp_path / "h"), tmp_path / "data")
    sandbox._claimed_at = 0.0  # a claim created at the clock's start, its pod answering now
    sandbox._claim_answered("guilds-pool1")
    metrics = Metrics()
    sandbox.hear_claims(metrics.claim_started)
    sandbox.hear_claims(metrics.claim_started)
    sandbox._claim_answered("guilds-pool1")  # no claim made since: nothing told
    scraped = samples(metrics.text().decode())
    assert value(scraped, "guilds_claim_startup_duration_seconds_count", warm_pool="guilds-pool1") == 1
    assert value(scraped, "guilds_claim_startup_duration_seconds_sum", warm_pool="guilds-pool1") > 0


@kube_kit.needs_cluster[0]
@kube_kit.needs_cluster[1]
async def test_a_sized_warm_pool_and_a_claim_s_startup_are_in_the_scrape(tmp_path):
    settings = server(tmp_path, pool="spare = 0\nmax = 1")
    async with opened(tmp_path, settings) as agent:
        agents = await agent.agents()
        metrics = Metrics()
        metrics.watch_pools(agents.pools)
        agents.observer = metrics
        made = await agent.make_agent("kc", owner="alice")
        try:
            pool = custom("sandboxclaims", spec.object_name(made.id))["spec"]["warmPoolRef"]["name"]
            await until(lambda: agents.pools.claims.counts()["kc"].target == 1, "the pool set to 1 replica")
            scraped = samples(metrics.text().decode())
            assert value(scraped, "guilds_claim_pool_replicas", template="kc", warm_pool=pool, state="target") == 1
            ready = value(scraped, "guilds_claim_pool_replicas", template="kc", warm_pool=pool, state="ready")
            making = value(scraped, "guilds_claim_pool_replicas", template="kc", warm_pool=pool, state="making")
            assert 0 <= ready + making <= 1
            assert value(scraped, "guilds_claim_pool_failures_total", template="kc", warm_pool=pool) == 0
            assert value(scraped, "guilds_claim_startup_duration_seconds_count", warm_pool=pool) == 1
            rows = buckets(scraped, "guilds_claim_startup_duration_seconds", warm_pool=pool)
            assert [bound for bound, _ in rows][:-1] == list(CLAIM_STARTUP_BUCKETS) and rows[-1][1] == 1
            assert 0 < value(scraped, "guilds_claim_startup_duration_seconds_sum", warm_pool=pool) < 300
        finally:
            await agent.remove_agent(made.id)

