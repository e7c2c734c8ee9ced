"""Terminals (``sandbox.pty``) and folder watches (``files.watch_dir``) through the unmodified E2B
Python SDK against a real `guilds serve --e2b`: an interactive bash in a terminal (input, output,
resize seen by ``stty size``, Ctrl-C, kill (answered once the process is gone), reconnect),
and every kind of watch event, recursive too, a stopped watcher's descriptor freed, a burst of events bounded."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, FilesystemEventType, Sandbox, SandboxException
from e2b.sandbox.commands.command_handle import PtySize

from e2b_kit import (
    BACKENDS,
    E2BServer,
    e2b_server,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
)
from guilds_code.limits import (
    ENVD_TERMINAL_SIZE_MAX,
    ENVD_WATCH_EVENTS_MAX,
    ENVD_WATCH_FOLDERS_MAX,
    ENVD_WATCHERS_MAX,
)

pytestmark = [pytest.mark.slow, pytest.mark.backends(*BACKENDS)]
CREATE, WRITE, REMOVE = FilesystemEventType.CREATE, FilesystemEventType.WRITE, FilesystemEventType.REMOVE
RENAME, CHMOD = FilesystemEventType.RENAME, FilesystemEventType.CHMOD


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp(f"e2b-pty-{backend}"), backend) as served:
        yield served


def _service_fds(sbx: Sandbox) -> int:
    """The inotify descriptors the sandbox's process service holds (a command's parent is the service)."""
    # A descriptor the service closes while ls reads the folder is said on stderr: not one counted.
    listing = sbx.commands.run("ls -l /proc/$PPID/fd 2>/dev/null || true").stdout
    return listing.count("anon_inode:inotify")


def _service_fds_become(sbx: Sandbox, count: int) -> int:
    """The service's inotify descriptors once they are count (a stopped watcher lets go of its
    descriptor a moment after its answer), or as they are after a few seconds."""
    deadline = time.monotonic() + 10
    while (now := _service_fds(sbx)) != count and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def _read_until(terminal, output: list[bytes], text: str) -> str:
    """The terminal's output read (``output`` grows) until text is in it."""
    for _, _, pty in terminal:
        if pty:
            output.append(pty)
        if text in b"".join(output).decode(errors="replace"):
            break
    return b"".join(output).decode(errors="replace")


def test_a_terminal_runs_an_interactive_bash_its_input_output_and_size(sbx):
    output: list[bytes] = []
    terminal = sbx.pty.create(PtySize(cols=80, rows=24), envs={"GREETING": "hello-pty"})
    sbx.pty.send_stdin(terminal.pid, b"echo $GREETING; stty size; tty\n")
    text = _read_until(terminal, output, "/dev/pts/")
    assert "hello-pty" in text and "24 80" in text
    sbx.pty.resize(terminal.pid, PtySize(cols=132, rows=40))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    result = terminal.wait(on_pty=output.append)
    assert result.exit_code == 0
    assert "40 132" in b"".join(output).decode(errors="replace")


def test_ctrl_c_interrupts_the_foreground_job_and_a_terminal_is_reconnected_to(sbx):
    output: list[bytes] = []
    terminal = sbx.pty.create(PtySize(cols=80, rows=24))
    terminal.disconnect()
    reconnected = sbx.pty.connect(terminal.pid)
    sbx.pty.send_stdin(terminal.pid, b"sleep 60; echo sl''ept\n")
    started = time.monotonic()
    _read_until(reconnected, output, "sleep 60")
    time.sleep(0.3)
    sbx.pty.send_stdin(terminal.pid, b"\x03")  # the terminal's interrupt: SIGINT to its foreground job
    time.sleep(0.3)
    sbx.pty.send_stdin(terminal.pid, b"echo interrupted; exit\n")
    result = reconnected.wait(on_pty=output.append)
    text = b"".join(output).decode(errors="replace")
    assert result.exit_code == 0 and "interrupted" in text and "slept" not in text
    assert time.monotonic() - started < 10


def test_kill_ends_a_terminal_before_it_answers(sbx):
    for _ in range(5):  # its process is gone by the answer: no zombie left for kill -0 to find
        terminal = sbx.pty.create(PtySize(cols=80, rows=24))
        assert sbx.pty.kill(terminal.pid)
        assert sbx.commands.run(f"kill -0 {terminal.pid} 2>/dev/null || echo gone").stdout == "gone\n"
    sleeper = sbx.commands.run("sleep 60", background=True)
    assert sleeper.kill()
    assert sbx.commands.run(f"kill -0 {sleeper.pid} 2>/dev/null || echo gone").stdout == "gone\n"
    assert not sbx.pty.kill(terminal.pid)
    assert not sbx.pty.kill(999_999)


def test_a_terminals_size_is_bounded_at_its_edges(sbx):
    terminal = sbx.pty.create(PtySize(cols=ENVD_TERMINAL_SIZE_MAX, rows=1))
    sbx.pty.resize(terminal.pid, PtySize(cols=1, rows=ENVD_TERMINAL_SIZE_MAX))
    for cols, rows in ((ENVD_TERMINAL_SIZE_MAX + 1, 24), (80, 0)):
        with pytest.raises(SandboxException, match=r"pty\.size\.(cols|rows): a whole number from 1 to 65535"):
            sbx.pty.resize(terminal.pid, PtySize(cols=cols, rows=rows))
    with pytest.raises(SandboxException, match=r"pty\.size\.cols"):
        sbx.pty.create(PtySize(cols=0, rows=24))
    with pytest.raises(SandboxException, match=r"runs in a terminal: send Ctrl-D \(0x04\)"):
        sbx.commands.close_stdin(terminal.pid)
    sbx.pty.kill(terminal.pid)
    piped = sbx.commands.run("sleep 30", background=True)
    with pytest.raises(SandboxException, match=f"process {piped.pid} runs in no terminal"):
        sbx.pty.resize(piped.pid, PtySize(cols=80, rows=24))
    sbx.commands.kill(piped.pid)


def _kinds(events) -> list[tuple[str, FilesystemEventType]]:
    return [(e.name, e.type) for e in events]


def test_a_watch_sees_create_write_chmod_rename_and_remove_as_e2b_reports_them(sbx):
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched", include_entry=True)
    sbx.files.write("watched/a.txt", "one")  # as E2B's envd writes: created, owned, written
    events = handle.get_new_events()
    assert _kinds(events) == [("a.txt", CREATE), ("a.txt", CHMOD), ("a.txt", WRITE)]
    assert events[2].entry is not None and events[2].entry.path.endswith("/watched/a.txt")
    sbx.files.rename("watched/a.txt", "watched/b.txt")
    sbx.commands.run("chmod 600 watched/b.txt && echo more >> watched/b.txt")
    sbx.files.remove("watched/b.txt")
    events = handle.get_new_events()
    assert _kinds(events) == [("a.txt", RENAME), ("b.txt", CREATE), ("b.txt", CHMOD), ("b.txt", WRITE),
                              ("b.txt", REMOVE)]
    assert events[0].entry is None and events[1].entry is not None and events[4].entry is None
    assert handle.get_new_events() == []
    handle.stop()


def test_a_recursive_watch_follows_folders_made_after_it_began(sbx):
    handle = sbx.files.watch_dir("tree", recursive=True) if sbx.files.make_dir("tree") else None
    assert handle is not None
    sbx.files.make_dir("tree/inner")
    sbx.files.write("tree/inner/f.txt", "x")
    sbx.commands.run("mkdir -p tree/inner/deep/er && touch tree/inner/deep/er/g")
    time.sleep(0.3)
    seen = _kinds(handle.get_new_events())
    assert seen[:4] == [("inner", CREATE), ("inner/f.txt", CREATE), ("inner/f.txt", CHMOD), ("inner/f.txt", WRITE)]
    assert ("inner/deep", CREATE) in seen and ("inner/deep/er/g", CREATE) in seen
    handle.stop()


def test_watching_what_is_no_folder_is_refused(sbx):
    sbx.files.write("plain.txt", "x")
    with pytest.raises(SandboxException, match="not a directory"):
        sbx.files.watch_dir("plain.txt")
    with pytest.raises(SandboxException, match="not found"):
        sbx.files.watch_dir("nowhere")


def test_a_stopped_watcher_frees_its_descriptor_and_the_watcher_count_is_bounded(sbx):
    before = _service_fds(sbx)
    handles = [sbx.files.watch_dir(".") for _ in range(ENVD_WATCHERS_MAX)]
    assert _service_fds(sbx) == before + ENVD_WATCHERS_MAX
    with pytest.raises(SandboxException, match=f"{ENVD_WATCHERS_MAX} watchers are open"):
        sbx.files.watch_dir(".")
    for handle in handles:
        handle.stop()
    assert _service_fds_become(sbx, before) == before
    sbx.files.watch_dir(".").stop()


def test_a_burst_of_events_is_bounded_the_watcher_failing_past_its_limit(sbx):
    sbx.files.make_dir("burst")
    names = " ".join(f"d{i}" for i in range(ENVD_WATCH_EVENTS_MAX))
    handle = sbx.files.watch_dir("burst")
    sbx.commands.run(f"cd burst && mkdir {names}")
    assert len(handle.get_new_events()) == ENVD_WATCH_EVENTS_MAX  # exactly the limit: all kept
    before = _service_fds(sbx)
    sbx.commands.run(f"cd burst && rmdir {names} && mkdir {names} x")  # twice the limit, and one
    with pytest.raises(SandboxException, match=f"more than {ENVD_WATCH_EVENTS_MAX} events were not taken"):
        handle.get_new_events()
    assert _service_fds_become(sbx, before - 1) == before - 1  # the failed watcher let go of its descriptor
    handle.stop()


def test_a_recursive_watch_takes_at_most_its_limit_of_folders(sbx):
    sbx.commands.run(f"mkdir -p many && cd many && mkdir $(seq -f d%g {ENVD_WATCH_FOLDERS_MAX - 1})")
    handle = sbx.files.watch_dir("many", recursive=True)  # the folder and those beneath: exactly the limit
    sbx.files.write("many/d1/f", "x")
    assert ("d1/f", CREATE) in _kinds(handle.get_new_events())
    sbx.files.make_dir("many/one-more")
    with pytest.raises(SandboxException, match=f"more than {ENVD_WATCH_FOLDERS_MAX} folders"):
        handle.get_new_events()
    handle.stop()
    with pytest.raises(SandboxException, match=f"more than {ENVD_WATCH_FOLDERS_MAX} folders"):
        sbx.files.watch_dir("many", recursive=True)


def test_a_watch_stream_delivers_events_as_they_come_and_ends_its_watcher(server: E2BServer, sbx):
    async def watch() -> list[tuple[str, FilesystemEventType]]:
        box = await AsyncSandbox.connect(sbx.sandbox_id)
        seen: list[tuple[str, FilesystemEventType]] = []
        removed = asyncio.Event()

        def on_event(event):
            seen.append((event.name, event.type))
            if event.type == REMOVE:
                removed.set()

        await box.files.make_dir("streamed/sub")
        handle = await box.files.watch_dir("streamed", on_event=on_event, recursive=True)
        await box.files.write("streamed/sub/s.txt", "x")
        await box.commands.run("rm streamed/sub/s.txt")
        await asyncio.wait_for(removed.wait(), 10)
        await handle.stop()
        return seen

    before = _service_fds(sbx)
    seen = asyncio.run(watch())
    assert seen == [("sub/s.txt", CREATE), ("sub/s.txt", CHMOD), ("sub/s.txt", WRITE), ("sub/s.txt", REMOVE)]
    deadline = time.monotonic() + 5
    while _service_fds(sbx) != before:  # the stream's end removes its watcher
        assert time.monotonic() < deadline
        time.sleep(0.1)
