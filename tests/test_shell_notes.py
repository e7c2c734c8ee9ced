"""shell: the no-prompt environment, the prompt line at a timeout, the working-directory line.

Through the built helper and real bash.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conftest import ok_text
from guilds_code import limits
from guilds_code.command import COMMAND_ENV

NO_PROMPT_ENV = {
    "GIT_EDITOR": "true", "GIT_SEQUENCE_EDITOR": "true", "EDITOR": "true", "VISUAL": "true",
    "GIT_ASKPASS": "echo", "SSH_ASKPASS": "echo", "SSH_ASKPASS_REQUIRE": "never",
    "PIP_NO_INPUT": "1", "npm_config_yes": "true",
}


def sh(sandbox, command, **args):
    return sandbox.call("shell", dict(command=command, **args))


def test_every_command_gets_the_no_prompt_environment(sandbox):
    assert {k: COMMAND_ENV[k] for k in NO_PROMPT_ENV} == NO_PROMPT_ENV
    names = " ".join(f"{k}=${k}" for k in NO_PROMPT_ENV)
    out = ok_text(sh(sandbox, f"echo {names}"))
    assert out == " ".join(f"{k}={v}" for k, v in NO_PROMPT_ENV.items())


def test_background_commands_get_it_too(sandbox):
    start = sh(sandbox, "echo $GIT_EDITOR $PIP_NO_INPUT $npm_config_yes", background=True)
    log = Path(start["meta"]["log_path"])
    for _ in range(100):
        if log.read_text():
            break
        time.sleep(0.05)
    assert log.read_text() == "true 1 true\n"


def test_dev_tty_fails_at_once(sandbox):
    env = sh(sandbox, "echo hi > /dev/tty; echo rc=$?; read -r x < /dev/tty; echo rc=$?", timeout_seconds=5)
    no_tty = "bash: line 1: /dev/tty: No such device or address"
    assert ok_text(env) == f"{no_tty}\nrc=1\n{no_tty}\nrc=1"
    assert env["meta"]["timed_out"] is False


def test_git_commit_without_message_uses_the_default_editor_answer(sandbox):
    script = (
        "git init -q r && cd r && git config user.email a@b && git config user.name a && "
        "echo x > f && git add f && git commit -qm one && git checkout -qb side && echo y > g && "
        "git add g && git commit -qm two && git checkout -q - && git merge --no-ff side >/dev/null && "
        "git log -1 --format=%s"
    )
    env = sh(sandbox, script, timeout_seconds=30)
    assert ok_text(env).startswith("Merge branch 'side'") and env["meta"]["timed_out"] is False


@pytest.mark.parametrize("prompt", ["Password:", "Continue? [y/N]", "Are you sure (yes/no)?", "Continue?",
                                    "Overwrite file.txt? (y/n) "])
def test_a_prompt_left_at_the_timeout_is_named(sandbox, prompt):
    env = sh(sandbox, f"echo working; printf '%s' '{prompt}'; sleep 30", timeout_seconds=1)
    lines = ok_text(env).splitlines()
    assert lines[-3:] == [
        "[timed out after 1s; the command was stopped]",
        f'[it seemed to wait for input: "{prompt.strip()}"; stdin is closed]',
        "exit_code: 124",
    ]


@pytest.mark.parametrize("command", [
    "printf 'Password:\\n'; sleep 30",  # ended by a newline: not left waiting
    "printf 'progress 40%%'; sleep 30",  # no question
    "sleep 30",  # no output
])
def test_no_prompt_line_otherwise(sandbox, command):
    text = ok_text(sh(sandbox, command, timeout_seconds=1))
    assert "seemed to wait" not in text and text.endswith("exit_code: 124")


def test_no_prompt_line_without_a_timeout(sandbox):
    assert ok_text(sh(sandbox, "printf 'Password:'")) == "Password:"


def test_a_long_prompt_is_clipped(sandbox):
    n = limits.PROMPT_MAX_CHARS
    text = ok_text(sh(sandbox, f"printf '%s?' $(printf 'a%.0s' $(seq {n})); sleep 30", timeout_seconds=1))
    assert f'"{"a" * n}… [+1 chars]"' in text
    text = ok_text(sh(sandbox, f"printf '%s?' $(printf 'a%.0s' $(seq {n - 1})); sleep 30", timeout_seconds=1))
    assert f'"{"a" * (n - 1)}?"' in text


# --- the working directory line ------------------------------------------------------
def test_a_cd_is_said_in_one_line(sandbox):
    (sandbox.home / "app" / "src").mkdir(parents=True)
    env = sh(sandbox, "cd app/src && echo here")
    assert ok_text(env) == "here\n[working directory now: ~/app/src]"
    assert ok_text(sh(sandbox, "echo again")) == "again"  # it stays: nothing moved
    assert ok_text(sh(sandbox, "cd ~")) == "(no output)\n[working directory now: ~]"
    assert ok_text(sh(sandbox, "cd /tmp; false")) == "(no output)\n[working directory now: /tmp]\nexit_code: 1"
    assert ok_text(sh(sandbox, "cd /tmp")) == "(no output)"


def test_the_same_folder_by_a_link_is_no_move(sandbox):
    (sandbox.home / "real").mkdir()
    os.symlink(sandbox.home / "real", sandbox.home / "link")
    assert ok_text(sh(sandbox, "cd real")) == "(no output)\n[working directory now: ~/real]"
    assert ok_text(sh(sandbox, "cd ../link")) == "(no output)"


def test_the_line_is_kept_when_output_is_elided(sandbox):
    (sandbox.home / "d").mkdir()
    text = ok_text(sh(sandbox, "cd d; seq 1 20000; exit 2"))
    assert text.endswith("20000\n[working directory now: ~/d]\nexit_code: 2")
    assert len(text.encode()) <= 8192
