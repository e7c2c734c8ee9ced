"""`guilds call` and `guilds tools`, in process and once as the installed console script."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guilds.fronts.cli import main


def config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[agent]\nhome = "home"\nsandbox = "local"\n{extra}')
    path.chmod(0o600)  # a settings file with secrets others may read is refused
    return path


def run(capsys, tmp_path, *argv, env=None):
    code = main(list(argv), env={"GUILDS_DATA": str(tmp_path / "data"), **(env or {})})
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "mcp"])
def test_tools_prints_the_definitions(capsys, tmp_path, fmt):
    code, out, _ = run(capsys, tmp_path, "tools", "--format", fmt)
    tools = json.loads(out)
    assert code == 0 and len(tools) == 5
    names = [t["function"]["name"] if fmt == "openai" else t["name"] for t in tools]
    assert names == ["code_task", "shell", "shell_status", "file_read", "code_search"]


def test_version_is_the_installed_packages_and_an_unknown_format_is_named(capsys, tmp_path):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        run(capsys, tmp_path, "--version")
    out, _ = capsys.readouterr()
    assert exited.value.code == 0 and out == f"guilds {version('guilds')}\n"
    with pytest.raises(SystemExit) as exited:
        run(capsys, tmp_path, "tools", "--format", "yaml")
    _, err = capsys.readouterr()
    assert exited.value.code == 2 and "'anthropic', 'mcp', 'openai', 'openai-responses'" in err


def test_call_prints_the_result_and_a_run_carries_its_directory(capsys, tmp_path):
    cfg = str(config(tmp_path))
    (tmp_path / "home/sub").mkdir(parents=True)
    code, out, _ = run(
        capsys, tmp_path, "call", "shell", '{"command": "cd sub && echo in"}', "--config", cfg, "--run", "r1"
    )
    assert (code, out) == (0, "in\n[working directory now: ~/sub]\nremaining_tool_calls: 199\n")
    code, out, _ = run(capsys, tmp_path, "call", "shell", '{"command": "pwd; exit 4"}', "--config", cfg,
                       "--run", "r1", "--json")
    result = json.loads(out)
    assert code == 0 and set(result) == {"text", "is_error", "meta"}
    assert result["text"] == f"{tmp_path}/home/sub\nexit_code: 4\nremaining_tool_calls: 198"
    assert result["is_error"] is False
    meta = result["meta"]
    assert (meta["seq"], meta["exit_code"], meta["row"]) == (2, 4, "Run pwd; exit 4 · exit 4")


def test_call_prints_every_escaped_form_of_a_secret_redacted(capsys, tmp_path):
    from fixtures import secret_forms

    cfg = config(tmp_path, f'[secrets]\nDEPLOY_KEY = "{secret_forms.SECRET}"\n')
    command = f"python3 {shlex.quote(secret_forms.__file__)} DEPLOY_KEY"
    code, out, _ = run(capsys, tmp_path, "call", "shell", json.dumps({"command": command}), "--config", str(cfg))
    assert code == 0
    assert out.splitlines() == [*secret_forms.redacted_lines(), "remaining_tool_calls: 199"]


def test_an_error_result_is_still_a_call_made(capsys, tmp_path):
    code, out, _ = run(capsys, tmp_path, "call", "file_read", '{"path": "nope"}', "--config", str(config(tmp_path)))
    assert code == 0 and out.endswith("remaining_tool_calls: 199\n")


def test_home_overrides_the_settings(capsys, tmp_path):
    other = tmp_path / "elsewhere"
    code, out, _ = run(capsys, tmp_path, "call", "shell", '{"command": "pwd"}', "--config", str(config(tmp_path)),
                       "--home", str(other))
    assert code == 0 and out.startswith(f"{other}\n")


def test_the_embedded_default_writes_its_settings_on_first_run(capsys, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "settings.toml").write_text('[agent]\nsandbox = "local"\n')  # as a user would edit it
    code, out, _ = run(capsys, tmp_path, "call", "shell", '{"command": "pwd"}')
    assert code == 0 and out.startswith(f"{data}/home\n")
    assert (data / "guilds.db").exists()
    fresh = tmp_path / "fresh"
    main(["tools"], env={"GUILDS_DATA": str(fresh)})
    assert not fresh.exists()  # `tools` touches nothing


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["call", "shell", '{"command": "ls"'], "arguments: not valid JSON"),
        (["call", "shell", "[1]"], "arguments: must be a JSON object"),
        (["call", "shell", '{"x": NaN}'], "arguments: not valid JSON"),
        (["call", "shell", "{}", "--run", "../up"], "run id: must be letters"),
        (["call", "shell", "{}", "--sandbox", "vm"], "agent.sandbox: must be one of auto, local"),
        (["serve", "--sandbox", "vm"], "agent.sandbox"),
        (["mcp", "--sandbox", "vm"], "agent.sandbox"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, tmp_path, *argv, "--config", str(config(tmp_path))) if argv[0] == "call" \
        else run(capsys, tmp_path, *argv)
    assert (code, out) == (2, "") and message in err


def test_bad_settings_name_the_key(capsys, tmp_path):
    cfg = config(tmp_path, "ports = 'many'\n")
    code, _, err = run(capsys, tmp_path, "call", "shell", '{"command": "ls"}', "--config", str(cfg))
    assert code == 2 and "agent.ports: must be 'first-last'" in err
    cfg.write_text('[agent]\nsandbx = "local"\n')
    code, _, err = run(capsys, tmp_path, "call", "shell", '{"command": "ls"}', "--config", str(cfg))
    assert code == 2 and "agent.sandbx: unknown key" in err
    code, _, err = run(capsys, tmp_path, "call", "shell", "{}", "--config", str(tmp_path / "missing.toml"))
    assert code == 2 and "no such settings file" in err


def test_the_console_script(tmp_path):
    exe = shutil.which("guilds", path=os.path.dirname(sys.executable))
    assert exe, "the guilds console script is installed beside python"
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    proc = subprocess.run([exe, "call", "shell", '{"command": "echo $PORT"}', "--config", str(config(tmp_path))],
                          check=False, capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "20000\nremaining_tool_calls: 199\n"), proc.stderr


def test_a_call_imports_only_what_it_needs(tmp_path):
    """Not the MCP SDK, the app's web stack, another sandbox backend, nor PostgreSQL's dialect."""
    code = (
        "import sys; from guilds.fronts.cli import main; "
        f"main(['call', 'shell', '{{}}', '--config', {str(config(tmp_path))!r}]); "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr); "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('guilds.', 'sqlalchemy.dialects.')))), "
        "file=sys.stderr)"
    )
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=60)
    tops, ours = (set(line.split()) for line in proc.stderr.splitlines()[-2:])
    assert not tops & {"mcp", "starlette", "uvicorn", "jinja2", "docker", "kubernetes", "anthropic", "openai"}
    assert "guilds.sandbox.local" in ours and "sqlalchemy.dialects.sqlite" in ours
    assert not {m for m in ours if m.startswith(("guilds.web", "guilds.sandbox.docker", "guilds.sandbox.kubernetes",
                                                   "guilds.sandbox.bwrap", "sqlalchemy.dialects.postgresql"))}



def _serve_lines(data: Path, *python_flags: str) -> list[str]:
    """The stderr lines of a real `guilds serve` up to its MCP line; then it is stopped."""
    env = {k: v for k, v in os.environ.items() if k != "GUILDS_DATABASE_URL"}
    env["GUILDS_DATA"] = str(data)
    proc = subprocess.Popen([sys.executable, *python_flags, "-m", "guilds.fronts.cli", "serve", "--port", "0"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "MCP at" in line:
                break
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()
    return lines


def test_serve_says_what_it_does_at_once_then_its_url(tmp_path):
    data = tmp_path / "data"
    lines = _serve_lines(data, "-X", "importtime")
    ours = [i for i, line in enumerate(lines) if line.startswith("guilds serve:")]
    assert lines[ours[0]] == (f"guilds serve: first run: the settings written to {data}/settings.toml; now the "
                              'token, the run record, the sandbox check (sandbox = "auto") and the app')
    heavy = [i for i, line in enumerate(lines) if line.startswith("import time:")
             and line.split("|")[-1].strip() in ("sqlalchemy", "starlette", "uvicorn", "mcp")]
    assert heavy and ours[0] < min(heavy), "the line comes before the web stack and the record's library load"
    assert lines[ours[1]].startswith("guilds serve: the app at http://127.0.0.1:") and "MCP at" in lines[ours[2]]
    again = [line for line in _serve_lines(data) if line.startswith("guilds serve:")]
    assert again[0] == 'guilds serve: starting: the run record, the sandbox check (sandbox = "auto") and the app'
    assert again[1].startswith("guilds serve: the app at") and again[2].startswith("guilds serve: MCP at")
