"""The docker sandbox's direct channel: a long-lived process's stdin and stdout as FIFOs
in a host folder bound read-only into its container, so a call's bytes never pass
through the engine.

    folder = ChannelFolder(data_dir, agent_id, owner)   <data>/docker-channels/<agent id>
    fifos = folder.make()                                two new FIFOs, this side's ends open
    argv = fifos.argv(argv)                              argv run with its stdin, stdout on them
    process = FifoProcess(fifos, attached)               the ProcessChannel over them and the exec
    folder.clear()                                       what FIFOs are left (the sandbox's stop)
    folder.remove()                                      the folder too (the agent removed)

An exec's attached stream goes from the process through the runtime's shim and the
engine, which frames it, to the orchestrator's connection, and a request the other way:
the engine's processes wake for every call. With the FIFOs, a request and its answer are
a pipe's write and read between the orchestrator and the helper, as on local. The exec
still starts the process, keeps its stderr and says when it ended (its stream carries
nothing else), and ends it (``kill_argv``, by its exec token).

Used where the engine runs on this machine (the container's process is one of this
machine's: ``DockerSandbox.cgroup_pid``) and the sandbox was given a data folder; else
the attached stream alone, as before.

What holds it shut:

- ``<data>/docker-channels`` is the orchestrator's, 0700; each agent's folder in it
  0711, bound read-only at CHANNEL_INSIDE into that agent's container alone: nothing
  inside can make, remove or replace a file there, nor list it;
- each FIFO is the agent's uid's, 0600, under a random name only the exec's argv
  carries, and is unlinked once the process has opened both (its first bytes on
  stdout); the orchestrator makes them and opens its ends before the exec starts, by
  no path the sandbox could have changed (and checks each is the FIFO it made);
- a process of the agent's uid may open the helper's descriptors through
  /proc/<pid>/fd, as it may its pipes on every backend (docs/helper.md says what
  that reaches); stdout's lines are bounded by ``Lines`` as every channel's are.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from ..process_channel import ChannelClosed, DockerProcess

CHANNEL_INSIDE = "/run/guilds-channel"
"""Where an agent's channel folder is bound inside its container (read-only)."""
FOLDER = "docker-channels"
"""Under the data folder: one folder per docker agent."""
ENDS = ("in", "out")
_READ = 64 * 1024
_WRAPPER = 'exec <"$1" >"$2"; shift 2; exec "$@"'
"""stdin and stdout on the FIFOs; stderr stays the exec's (a failure to open one is said there)."""


class ChannelFolder:
    """One agent's folder of FIFOs on the host."""

    def __init__(self, data_dir: str | os.PathLike, agent_id: str, owner: tuple[int, int]):
        self.path = Path(data_dir) / FOLDER / agent_id
        self.owner = owner

    def ensure(self) -> str:
        """The folder made (its parent 0700, itself 0711); its path, as the container binds it."""
        parent = self.path.parent
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path.mkdir(mode=0o711, exist_ok=True)
        os.chmod(self.path, 0o711)  # noqa: S103 - the agent's uid passes through; nothing is listed
        return str(self.path)

    def make(self) -> Fifos:
        """Two new FIFOs (the agent's, 0600), this side's ends open: stdin's for writing,
        stdout's for reading, neither waiting for the other side."""
        self.ensure()
        name = secrets.token_hex(12)
        made: list[str] = []
        try:
            for end in ENDS:
                path = str(self.path / f"{name}.{end}")
                os.mkfifo(path, 0o600)
                made.append(path)
                if os.geteuid() == 0:
                    os.chown(path, *self.owner, follow_symlinks=False)
            # O_RDWR: the write end opens with no reader yet (Linux), and its close is the stdin's end
            fds = [_open_fifo(made[0], os.O_RDWR), _open_fifo(made[1], os.O_RDONLY)]
        except BaseException:
            for path in made:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        return Fifos(name, made, fds)

    def remove(self) -> None:
        """The folder and what is left in it (the agent removed)."""
        self.clear()
        with contextlib.suppress(OSError):
            self.path.rmdir()

    def clear(self) -> None:
        """Every FIFO left in the folder (by an orchestrator that was killed); the folder
        stays, bound as it is into a container another process may be making."""
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _open_fifo(path: str, flags: int) -> int:
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not _is_fifo(fd):
        os.close(fd)
        raise ChannelClosed(f"{path} is not the FIFO made for the channel")
    return fd


def _is_fifo(fd: int) -> bool:
    return stat.S_ISFIFO(os.fstat(fd).st_mode)


class Fifos:
    """One process's two FIFOs: their host paths (until unlinked) and this side's ends."""

    def __init__(self, name: str, paths: list[str], fds: list[int]):
        self.name, self.paths = name, paths
        self.stdin, self.stdout = fds

    def argv(self, argv: Sequence[str]) -> list[str]:
        """argv run inside with its stdin and stdout on the FIFOs (by their paths inside)."""
        inside = [f"{CHANNEL_INSIDE}/{self.name}.{end}" for end in ENDS]
        return ["/bin/sh", "-c", _WRAPPER, "sh", *inside, *argv]

    def close(self) -> None:
        """This side's ends closed and the paths gone (an exec that never started)."""
        self.unlink()
        for fd in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                os.close(fd)

    def unlink(self) -> None:
        """The paths gone (the ends open stay open)."""
        paths, self.paths = self.paths, []
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


class FifoProcess:
    """A process inside a container whose stdin and stdout are this channel's FIFOs (see
    the module docstring): a ``LoopReadable`` ``ProcessChannel``. Its exec stays attached
    for its stderr and its end (``DockerProcess``, read by a thread of its own): when the
    exec ends, a writer opened and closed on stdout's FIFO ends a reader that had no
    writer yet (the process died before opening it). ``close`` ends its stdin, then the
    exec's close ends what it started (by its exec token)."""

    loop_readable = True

    def __init__(self, fifos: Fifos, attached: DockerProcess):
        self._fifos, self._attached = fifos, attached
        self._closed = False
        self._ending = threading.Lock()
        self._readable = select.poll()
        self._readable.register(fifos.stdout, select.POLLIN)
        threading.Thread(target=self._follow_exec, daemon=True, name="guilds-docker-exec").start()

    def _follow_exec(self) -> None:
        while self._attached.receive():
            pass  # the wrapper's own stdout: nothing, once its stdout is the FIFO
        with self._ending, contextlib.suppress(OSError):
            if not self._closed:  # its end still open: a writer come and gone, and its readers see the end
                os.close(os.open(f"/proc/self/fd/{self._fifos.stdout}", os.O_WRONLY | os.O_NONBLOCK))

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self.send_nowait(bytes(view[:select.PIPE_BUF]))
            if not sent:
                select.select([], [self._fifos.stdin], [], 1.0)
            view = view[sent:]

    def send_nowait(self, data: bytes) -> int:
        if self._closed:
            raise ChannelClosed("the channel was closed")
        try:
            return os.write(self._fifos.stdin, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise ChannelClosed(f"the process is gone ({exc})") from exc

    def receive(self) -> bytes:
        while (chunk := self._read(None)) is None:
            pass
        return chunk

    def receive_nowait(self) -> bytes | None:
        return self._read(0)

    def _read(self, wait_ms: int | None) -> bytes | None:
        """What stdout holds, once poll says it is readable (within wait_ms; None: no limit):
        a FIFO no writer has opened yet reads as ended, and polls as not readable."""
        if not self._readable.poll(wait_ms):
            return None
        try:
            chunk = os.read(self._fifos.stdout, _READ)
        except BlockingIOError:
            return None
        except (OSError, ValueError):
            return b""
        if chunk:
            self._fifos.unlink()  # both are open: the process opens stdout last
        return chunk

    def reader_fd(self) -> int:
        """A duplicate of stdout's end (non-blocking, as the ends are), the caller's to close."""
        return os.dup(self._fifos.stdout)

    def stdout_ended(self) -> None:
        """Nothing to note: stderr is the exec's."""

    def stderr_tail(self) -> str:
        return self._attached.stderr_tail()

    def close(self) -> None:
        with self._ending:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):
            os.close(self._fifos.stdin)  # the process's stdin ends
        self._fifos.unlink()
        try:
            self._attached.close()
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fifos.stdout)
