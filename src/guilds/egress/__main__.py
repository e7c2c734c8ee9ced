"""``python -m guilds.egress CONFIG.json``: one sandbox's egress proxy (guilds.egress.daemon)."""

from .daemon import main

raise SystemExit(main())
