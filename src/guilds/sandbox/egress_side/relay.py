"""The relay the sandbox's init runs first (standard library only: it runs inside, in
pid 1): it listens on 127.0.0.1:RELAY_PORT in the sandbox's own network namespace and
splices each connection to the egress proxy (its socket, bound in at EGRESS_INSIDE;
on kubernetes a TCP address, ``kube_egress.RELAY_TCP``)."""

from __future__ import annotations

from .files import EGRESS_INSIDE, SOCKET_NAME

RELAY_PORT = 3128
"""The relay's port on the sandbox's own loopback (the proxy variables name it)."""
_RELAY_PIPE = (
    "import _socket,_thread,sys,time\n"
    "def _pipe(a,b):\n"
    " try:\n"
    "  while True:\n"
    "   d=a.recv(65536)\n"
    "   if not d:break\n"
    "   b.sendall(d)\n"
    " except OSError:pass\n"
    " try:b.shutdown(1)\n"
    " except OSError:pass\n"
)
_RELAY_UNIX = (
    "def _connect(path):\n"
    " u=_socket.socket(_socket.AF_UNIX,_socket.SOCK_STREAM)\n"
    " try:u.connect(path)\n"
    " except OSError:\n"
    "  u.close()\n"
    "  raise\n"
    " return u\n"
)
_RELAY_SERVE = (
    "def _back(u,c,done):\n"
    " try:_pipe(u,c)\n"
    " finally:done.release()\n"
    "def _serve(c,path):\n"
    " u=None\n"
    " try:\n"
    "  u=_connect(path)\n"
    "  done=_thread.allocate_lock()\n"
    "  done.acquire()\n"
    "  _thread.start_new_thread(_back,(u,c,done))\n"
    "  _pipe(c,u)\n"
    "  done.acquire()\n"
    " except Exception:pass\n"
    " finally:\n"
    "  c.close()\n"
    "  if u is not None:u.close()\n"
    "def _relay(lst,path):\n"
    " while True:\n"
    "  try:\n"
    "   c=_socket.socket(fileno=lst._accept()[0])\n"
    "   try:_thread.start_new_thread(_serve,(c,path))\n"
    "   except BaseException:\n"
    "    c.close()\n"
    "    raise\n"
    "  except Exception:\n"
    "   time.sleep(0.1)\n"
    "_lst=_socket.socket()\n"
    "_lst.bind(('127.0.0.1',int(sys.argv[5])))\n"
    "_lst.listen(128)\n"
    "_thread.start_new_thread(_relay,(_lst,sys.argv[4]))\n"
)


def relay_code(connect: str) -> str:
    """The relay with connect's ``_connect(path)`` (a connected socket to the proxy, or
    OSError/ValueError: the connection is closed and nothing else is tried)."""
    return _RELAY_PIPE + connect + _RELAY_SERVE


RELAY = relay_code(_RELAY_UNIX)
"""The relay, run first by the sandbox's init (its argv[4]: the proxy's socket inside,
argv[5]: the port): each connection to 127.0.0.1:port is spliced to the socket,
each way in its own thread, a half-close passed on. It imports only modules built
into the interpreter (``_socket``, ``_thread``, ``time``): ``socket`` and
``threading`` would cost the init about a megabyte more (``enum``, ``functools``). A socket that refuses (the
proxy is down) closes the connection: nothing else is tried. A thread that cannot be
started (the sandbox at its process limit) closes that connection only: the relay
goes on accepting, and serves again once processes are free."""


def init_args() -> list[str]:
    """What the init takes after its own arguments when it runs RELAY."""
    return [f"{EGRESS_INSIDE}/{SOCKET_NAME}", str(RELAY_PORT)]
