"""The agent's settings: a TOML file, frozen dataclasses, unknown keys refused.

```toml
[agent]
id = "agent1"
home = "/path/to/home"        # made if missing
sandbox = "auto"              # auto | local | bwrap | docker | kubernetes
coding = true                 # the live coding flag: tools offered only while true
max_tool_calls = 200          # per run; remaining_tool_calls counts down from it
ports = "20000-20099"         # the port block; PORT is its first port
network = false               # bwrap: may commands reach the network

[secrets]                     # put into every command's environment; redacted from every result
OPENAI_API_KEY = "..."

[repos.web]                   # a repository: its folder under the home, its token
path = "repos/web"
token = "..."
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

DEFAULT_AGENT_ID = "agent1"
DEFAULT_SANDBOX = "auto"
DEFAULT_MAX_TOOL_CALLS = 200
DEFAULT_PORTS = (20000, 20099)


@dataclass(frozen=True)
class Repo:
    name: str
    path: str
    """Folder relative to the home."""
    token: str = ""


@dataclass(frozen=True)
class AgentSettings:
    id: str
    home: Path
    sandbox: str = DEFAULT_SANDBOX
    coding: bool = True
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    ports: tuple[int, int] = DEFAULT_PORTS
    network: bool = False
    secrets: Mapping[str, str] = field(default_factory=dict)
    repos: tuple[Repo, ...] = ()

    def secret_values(self) -> list[str]:
        """Every value to redact: the secrets and the repository tokens."""
        return [*self.secrets.values(), *(r.token for r in self.repos if r.token)]
