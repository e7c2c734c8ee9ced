"""The way from this server to a port inside one E2B sandbox, on every backend.

One relay per request, started inside the sandbox as any of its processes is
(``Sandbox.open_process``: bwrap's namespaces through nsenter, a docker exec, a
pods/exec; on local, a process of the host), runs ``RELAY`` under the sandbox's
python (standard library only) and speaks on its stdin and stdout:

1. it writes its network namespace (``<device>:<inode>\\n`` of /proc/self/ns/net);
2. it waits for ``go\\n`` (anything else, or the end of its stdin: it ends);
3. it connects to 127.0.0.1:port, else [::1]:port, in that namespace, and writes
   ``+\\n`` (then splices the connection to its stdin and stdout, a half-close passed
   on) or ``-\\n`` (refused: it ends).

So a connection reaches only what listens in the sandbox's own network namespace.
Where that namespace is this server's own (local; bwrap or docker with the host's
network), a port there may be the host's: the relay is told to go on only when a
process of the sandbox listens on the port (``held_by_sandbox``), else the port counts
as closed. A sandbox's processes, as this machine sees them: its process service
(``EnvdChannel.host_pid``) and every process under it, and every process of a pid
namespace one of those made. Without a process service of this machine's (asleep, or a
container's on the host's network) none is, and every port counts as closed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ...errors import SandboxError
from ...limits import E2B_INGRESS_START_SECONDS
from ...sandbox.process_channel import ProcessChannel
from .sandboxes import E2BSandbox

T = TypeVar("T")

RELAY = """\
import os,socket,sys,threading
def put(b):
    while b:
        b=b[os.write(1,b):]
try:
    s=os.stat('/proc/self/ns/net')
    put(b'%d:%d\\n'%(s.st_dev,s.st_ino))
except OSError:
    put(b'0:0\\n')
go=b''
while len(go)<3:
    d=os.read(0,3-len(go))
    if not d:
        sys.exit(0)
    go+=d
if go!=b'go\\n':
    sys.exit(0)
c=None
for h in ('127.0.0.1','::1'):
    try:
        c=socket.create_connection((h,int(sys.argv[1])),timeout=float(sys.argv[2]))
        break
    except (OSError,ValueError):
        pass
if c is None:
    put(b'-\\n')
    sys.exit(0)
c.settimeout(None)
put(b'+\\n')
def up():
    try:
        while True:
            d=os.read(0,65536)
            if not d:
                break
            c.sendall(d)
    except OSError:
        pass
    try:
        c.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up,daemon=True).start()
try:
    while True:
        d=c.recv(65536)
        if not d:
            break
        put(d)
except OSError:
    pass
"""
_LINE_BYTES = 64
"""The relay's own lines are short: more without a newline is not the relay speaking."""


class PortClosed(Exception):
    """Nothing of the sandbox listens on the port (or the relay could not be started)."""


class PortLink:
    """A connection to a port inside a sandbox: bytes each way, through its relay. Its
    channel's blocking calls run on two threads of its own (one reads, one writes), never
    the loop's shared ones, which a long answer would hold."""

    def __init__(self, channel: ProcessChannel):
        self.channel = channel
        self.pending = b""
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="e2b-ingress")
        self._closed = False

    async def _blocking(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, call, *args)

    async def read(self) -> bytes:
        """The next bytes from the port; b"" once it closed."""
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await self._blocking(self.channel.receive)

    async def write(self, data: bytes) -> None:
        await self._blocking(self.channel.send, data)

    async def line(self) -> bytes:
        """The relay's next line (without its newline); PortClosed when it ends first."""
        while b"\n" not in self.pending:
            data = await self._blocking(self.channel.receive)
            if not data or len(self.pending) > _LINE_BYTES:
                raise PortClosed("the relay into the sandbox ended")
            self.pending += data
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    async def close(self) -> None:
        """The relay ended (a read or write under way returns); idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self.channel.close)
        self._threads.shutdown(wait=False)


async def open_port(box: E2BSandbox, port: int) -> PortLink:
    """A connection to port inside box (the module docstring); PortClosed when nothing of
    the sandbox listens there."""
    sandbox = box.sandbox
    try:
        channel = await sandbox.open_process([sandbox.python, "-I", "-S", "-c", RELAY, str(port),
                                              str(E2B_INGRESS_START_SECONDS)])
    except SandboxError as exc:
        raise PortClosed(f"the relay could not be started: {exc}") from None
    link = PortLink(channel)
    try:
        async with asyncio.timeout(E2B_INGRESS_START_SECONDS):
            await _start(link, box, port)
    except BaseException:
        await link.close()
        raise
    return link


async def _start(link: PortLink, box: E2BSandbox, port: int) -> None:
    namespace = await link.line()
    if namespace == _own_namespace():
        pid = box.envd.host_pid() if box.envd is not None else None
        if pid is None or not await asyncio.to_thread(held_by_sandbox, pid, port):
            raise PortClosed(f"no process of the sandbox listens on port {port}")
    await link.write(b"go\n")
    if await link.line() != b"+":
        raise PortClosed(f"port {port} refused the connection")


def _own_namespace() -> bytes:
    found = os.stat("/proc/self/ns/net")
    return b"%d:%d" % (found.st_dev, found.st_ino)


def held_by_sandbox(root: int, port: int) -> bool:
    """Whether a process of the sandbox whose process service is root (this machine's pid)
    holds a socket listening on port in this machine's network namespace."""
    listening = _listening_inodes(port)
    return bool(listening) and any(_holds(pid, listening) for pid in _sandbox_pids(root))


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the sockets listening on port (TCP, IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)
                for row in rows:
                    fields = row.split()
                    if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found.add(fields[9])
        except OSError:
            continue
    return found


def _sandbox_pids(root: int) -> set[int]:
    """root, every process under it, and every process of a pid namespace one of them made."""
    parents, namespaces = _processes()
    pids, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in pids]
        pids.update(children)
        frontier += children
    own = namespaces.get(os.getpid())
    theirs = {namespaces[pid] for pid in pids if pid in namespaces} - {own}
    return pids | {pid for pid, space in namespaces.items() if space in theirs}


def _processes() -> tuple[dict[int, int], dict[int, str]]:
    """Every process's parent, and its pid namespace, by pid (those that end meanwhile left out)."""
    parents, namespaces = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as stat:
                parents[int(name)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            namespaces[int(name)] = os.readlink(f"/proc/{name}/ns/pid")
        except (OSError, IndexError, ValueError):
            continue
    return parents, namespaces


def _holds(pid: int, inodes: set[str]) -> bool:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False
