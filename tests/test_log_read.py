"""The Full output log read back through the agent's sandbox (guilds-code's log_read,
the built helper under python3 -I in the local sandbox): bounded, redacted at every
cut, confined to the home's run logs. tests/test_docker_backend.py reads one in docker."""

from __future__ import annotations

import contextlib
import os

import pytest

from guilds.record.store import Store
from guilds.sandbox import get_sandbox
from guilds.sandbox.bwrap.bwrap_argv import unavailable
from guilds.toolbox import Toolbox
from guilds.toolbox.log_reading import log_reading
from guilds.web.logs import LOG_HEAD_BYTES, LOG_TAIL_BYTES, HelperLogReader, LogUnavailable
from guilds_code.ops.log_read import GONE, log_parts, secret_lines
from guilds_code.protocol import OpError
from guilds_code.redact import Redactor
from toolbox_kit import local_toolbox, make_settings

SECRET = "sk-live-0123456789abcdef"
PEM = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n-----END KEY-----"


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home/.runs/r1").mkdir(parents=True)
    return tmp_path / "home"


def write_log(home, data: bytes, name: str = "c1.log") -> str:
    path = home / ".runs/r1" / name
    path.write_bytes(data)
    return str(path)


@contextlib.asynccontextmanager
async def reader(home, secrets=(SECRET,)):
    """The app's reader, as serve hands it, over a toolbox of the local sandbox whose home is ``home``."""
    async with local_toolbox(home.parent, secrets={f"SECRET_{i}": s for i, s in enumerate(secrets)}) as box:
        yield box.settings.id, HelperLogReader(log_reading(box))


async def read(home, path: str, secrets=(SECRET,)):
    async with reader(home, secrets) as (agent_id, logs):
        return await logs.read(agent_id, path)


async def test_a_short_log_whole_and_redacted(home):
    path = write_log(home, f"start\n\x1b[31mred\x1b[0m {SECRET}\n50%\r100%\ndone\n".encode())
    log = await read(home, path)
    assert (log.head, log.tail, log.omitted) == ("start\nred [REDACTED]\n100%\ndone\n", "", 0)
    assert log.size == os.path.getsize(path)


async def test_a_long_log_shows_its_start_and_its_end(home):
    lines = b"".join(b"line %06d %s\n" % (i, SECRET.encode()) for i in range(40_000))
    log = await read(home, write_log(home, lines))
    assert log.head.startswith("line 000000 [REDACTED]\n") and log.tail.endswith("line 039999 [REDACTED]\n")
    assert log.tail.startswith("line ")
    assert SECRET not in log.head + log.tail and "sk-live" not in log.head + log.tail
    assert len(log.head.encode()) <= LOG_HEAD_BYTES and len(log.tail.encode()) <= LOG_TAIL_BYTES
    assert 0 < log.omitted < len(lines)


@pytest.mark.parametrize("shift", range(-len(SECRET) - 2, 3))
async def test_no_part_of_a_secret_passes_either_cut(home, shift):
    """The secret straddles the head's cut, and the tail's cut, at every offset."""
    size = LOG_HEAD_BYTES + LOG_TAIL_BYTES + 5000
    data = bytearray(b"x" * size)
    for at in (LOG_HEAD_BYTES + shift, size - LOG_TAIL_BYTES + shift):
        data[at:at + len(SECRET)] = SECRET.encode()
    data[size - LOG_TAIL_BYTES + 40] = ord("\n")  # the tail starts at a line
    log = await read(home, write_log(home, bytes(data)))
    shown = log.head + log.tail
    held_back = Redactor([SECRET]).longest  # a never-flushed stream's most: the secret, every byte escaped
    assert len(log.head) > LOG_HEAD_BYTES - len(SECRET) - held_back
    assert len(log.tail) > LOG_TAIL_BYTES - 100 - held_back  # the log's last line is unfinished
    for fragment_len in range(6, len(SECRET) + 1):
        for start in range(len(SECRET) - fragment_len + 1):
            assert SECRET[start:start + fragment_len] not in shown


async def test_a_log_being_written_holds_back_a_half_written_secret(home):
    log = await read(home, write_log(home, f"ok\n{'a' * 80}\nnow {SECRET[:12]}".encode()))
    assert log.head.startswith(f"ok\n{'a' * 40}") and SECRET[:6] not in log.head
    finished = await read(home, write_log(home, f"ok\nnow {SECRET}\n".encode(), "c5.log"))
    assert finished.head == "ok\nnow [REDACTED]\n"


async def test_a_multi_line_secret_cut_by_the_tail(home):
    size = LOG_HEAD_BYTES + LOG_TAIL_BYTES + 5000
    pem_at = size - LOG_TAIL_BYTES - 25  # the tail's first line starts inside the key
    data = bytearray(b"y" * size)
    data[pem_at:pem_at + len(PEM)] = PEM.encode()
    log = await read(home, write_log(home, bytes(data)), secrets=(PEM,))
    assert "MIIEvQ" not in log.tail and "BKcwgg" not in log.tail and "[REDACTED]" in log.tail
    assert secret_lines([PEM, SECRET]) == list(PEM.split("\n"))


async def test_an_end_without_a_line_start_is_not_shown(home):
    data = b"z" * (LOG_HEAD_BYTES + 2 * LOG_TAIL_BYTES)
    log = await read(home, write_log(home, data))
    assert log.tail == "" and log.omitted == len(data) - LOG_HEAD_BYTES


async def test_a_log_no_longer_kept(home):
    with pytest.raises(LogUnavailable, match="no longer kept"):
        await read(home, str(home / ".runs/r1/c9.log"))
    assert "20 most recent runs" in GONE


@pytest.mark.parametrize("link", ["file", "folder"])
async def test_links_are_refused(home, tmp_path, link):
    outside = tmp_path / "outside.log"
    outside.write_text(f"not yours {SECRET}\n")
    if link == "file":
        os.symlink(outside, home / ".runs/r1/c2.log")
        path = str(home / ".runs/r1/c2.log")
    else:
        (tmp_path / "elsewhere").mkdir()
        os.symlink(outside, tmp_path / "elsewhere/c3.log")
        os.symlink(tmp_path / "elsewhere", home / ".runs/r2")
        path = str(home / ".runs/r2/c3.log")
    with pytest.raises(LogUnavailable, match="link"):
        await read(home, path)


async def test_a_fifo_is_refused_without_blocking(home):
    os.mkfifo(home / ".runs/r1/c4.log")
    with pytest.raises(LogUnavailable, match="not a regular file"):
        await read(home, str(home / ".runs/r1/c4.log"))


@pytest.mark.parametrize("path", [
    "/etc/passwd", "/h/.runs/r1/c1.log/../../../../etc/x.log", "/h/.runs/r1/c1.txt", "/h/.runs/c1.log",
    "/h/other/r1/c1.log", "/h/.runs/r1/sub/c1.log", "relative/.runs/r1/c1.log", "/h/.runs/../.runs/r1/c1.log",
])
def test_only_run_logs_under_the_home(path):
    if path == "/h/.runs/../.runs/r1/c1.log":
        assert log_parts("/h", path) == (".runs", "r1", "c1.log")  # normalised, still inside
        return
    with pytest.raises(OpError, match="not a log of this agent"):
        log_parts("/h", path)


async def test_a_path_outside_the_run_logs_is_refused_by_the_helper(home):
    with pytest.raises(LogUnavailable, match="not a log of this agent"):
        await read(home, "/etc/passwd")


async def test_an_agent_not_served_here(home):
    async with reader(home, ()) as (_, logs):
        with pytest.raises(LogUnavailable, match="agent other"):
            await logs.read("other", str(home / ".runs/r1/c1.log"))


@pytest.mark.bwrap
@pytest.mark.skipif(bool(unavailable()), reason=f"bwrap: {unavailable()}")
async def test_a_log_is_read_inside_the_bwrap_sandbox(tmp_path):
    """The same reader through bwrap: the helper opens the log in the sandbox, redacted there."""
    settings = make_settings(tmp_path, agent={"sandbox": "bwrap"}, secrets={"API_KEY": SECRET})
    async with Store(f"sqlite:///{tmp_path}/guilds.db") as store:
        box = Toolbox(settings, get_sandbox(settings, tmp_path / "data"), store)
        try:
            result = await box.call("r1", "shell", {"command": 'seq 1 30000; echo "$API_KEY"'})
            logs = HelperLogReader(log_reading(box))
            log = await logs.read(settings.id, result.meta["log_path"])
            assert log.head.startswith("1\n2\n") and log.tail.endswith("30000\n[REDACTED]\n")
            with pytest.raises(LogUnavailable, match="no longer kept"):
                await logs.read(settings.id, result.meta["log_path"].replace(".log", "x.log"))
        finally:
            await box.close()
            await box.sandbox.stop()
