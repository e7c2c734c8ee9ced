"""What every command's environment gets behind the proxy."""

from __future__ import annotations

from typing import Mapping

from guilds_code.command import EGRESS_PROXY_ENV

from ...config.settings import AgentSettings
from .files import BUNDLE_NAME, EGRESS_INSIDE
from .placeholders import Bound
from .relay import RELAY_PORT

TRUST_VARS = ("SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
              "GIT_SSL_CAINFO", "PIP_CERT")
"""The variables common clients read a trust bundle from (python and openssl, curl,
requests and pip, Node, git, pip)."""
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY = "localhost,127.0.0.1,::1"
"""The sandbox's own loopback (the agent's servers on its ports) is reached directly."""

def sandbox_env(settings: AgentSettings, bound: Mapping[str, Bound],
                bundle: str = f"{EGRESS_INSIDE}/{BUNDLE_NAME}") -> dict[str, str]:
    """What every command's environment gets behind the proxy, over agent_env's: the
    proxy variables (the helper names the call in them), NO_PROXY, the trust bundle's
    variables (bundle: its path inside), and each host-bound secret's placeholder in
    place of its value."""
    where = f"127.0.0.1:{RELAY_PORT}"
    env = {EGRESS_PROXY_ENV: where, **dict.fromkeys(PROXY_VARS, f"http://{where}"),
           "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY, **dict.fromkeys(TRUST_VARS, bundle)}
    for name in settings.secret_hosts:
        env[name] = bound[f"secrets.{name}"].placeholder
    return env
