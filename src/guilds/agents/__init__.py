"""Agents made on demand from a server's templates (``guilds.config.templates``).

    registry     Agents: make, find, list, remove, reap (the record's ``agents`` table)
    homes        an agent's home: its template's starting home, an overlay or a copy
    home_layers  a template's starting home frozen as a layer, once per content version
    mounts       the mount calls of an overlay home (root only)
    pool         warm pools: agents of a template made ahead, adopted by a make, refilled
    pooled       one template's pool and its agents; whether a pooled agent answers
    demand       a warm pool's target from the template's makes (pure)
"""
