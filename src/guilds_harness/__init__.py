"""guilds-harness: the in-sandbox helper for code_task.

It hands a change to a headless coding harness (Claude Code, Codex CLI, ...,
chosen in the agent's config), or resumes one of its sessions, and reports the
harness's status, a diffstat of what it changed, its final message and the log
of its event stream. Standard library only (Python >= 3.9) plus ``git`` and the
harness's CLI; shipped as one script file (with guilds_code, whose transport,
run state and shaping it reuses) that ``python3 -I -S FILE ARG`` runs.

Transport: as guilds-code (see guilds_code.protocol): ARG is base64 JSON, or
the path of a request file under ``<state root>/requests/`` that is read and
deleted; exactly one envelope line on stdout, exit 0.

Request fields:

    op          "code_task"
    args        the tool's arguments as the model gave them:
                  brief (required), repo, session_id, notes,
                  timeout_minutes (default 30, 1 to 120)
    run_id, agent_id, call_id, home, cwd, max_bytes, seq, redact_env
                as guilds-code (cwd: the run's default working directory)
    harness     "claude-code" (default) | "codex": the agent's configured harness
    repos       {name: absolute folder} of the agent's repositories; the
                harness works in args.repo, else the one holding the run's
                working directory, else the only one

Result: see report.py (text and metadata) and run.py (statuses). The
harness's whole event stream goes to ``<home>/.runs/<run id>/<call id>.log``
(see stream.py). The orchestrator waits ``timeout_minutes * 60 +
limits.WAIT_EXTRA_SECONDS`` for the envelope.
"""
