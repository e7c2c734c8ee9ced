"""The run's state inside the sandbox: folders, the working directory, tokens.

Layout (see docs/helper.md, "State"):

    <home>/.runs/<run id>/cwd          the run's working directory (atomic writes)
    <home>/.runs/<run id>/<call>.log   a shell call's full output
    <state root>/<agent id>/repos.json absolute repository folder -> token (0600)
    <state root>/<agent id>/background/ background records (ops/background.py)

Everything under the home can be rewritten by the agent's own commands, so it
is read defensively: one component at a time without following links, regular
files only, at most limits.STATE_FILE_MAX_BYTES. A bad state file counts as
absent.

State that cannot be kept never costs a shell call its command or its output:
the functions taking ``notes`` add one line there saying what was not kept, and
the op returns it with the output. Something of the wrong kind where a state
folder or file belongs (a link, a file where a folder goes, a folder where a
file goes) is never followed and never deleted: it is renamed beside itself to
``<name>.aside-<hex>`` (said in a note) and the state is made anew.
"""

from __future__ import annotations

import fcntl
import os
import stat

from . import codec, limits, protocol, redact

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Set

    KeepAlso = Optional[Callable[[protocol.Request], Set[str]]]

RUNS_DIR = ".runs"
CWD_FILE = "cwd"
REPOS_FILE = "repos.json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_regular(path: str) -> Optional[int]:
    """A regular file opened read-only, never through a link nor blocking on a FIFO; else None."""
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write data to path through a temp file in the same folder and a rename.

    A reader sees the old content or the new, never a part. A link at path is
    replaced, not followed. Raises OSError.
    """
    folder, name = os.path.split(path)
    dir_fd = os.open(folder or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        atomic_write_at(dir_fd, name, data, mode)
    finally:
        os.close(dir_fd)


def ensure_dir(path: str) -> bool:
    """Make path a folder (0700) if missing; True when it was made now.

    OpError when path is a link or not a folder, or cannot be made.
    """
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    except OSError as exc:
        raise protocol.OpError(f"cannot make {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise protocol.OpError(f"{path} is a link or not a folder; remove it")
    return created


def move_aside(path: str, what: str) -> str:
    """Rename what is at path (a `what`: 'a link', 'a file'...) beside it, unfollowed;
    the note saying so. OpError when it cannot be moved."""
    aside = f"{path}.aside-{os.urandom(4).hex()}"
    try:
        os.rename(path, aside)
    except OSError as exc:
        raise protocol.OpError(f"{path} is {what} and could not be moved aside: {exc.strerror}") from None
    return f"note: {path} was {what}; moved it to {aside} and made the state anew"


def rebuild_dir(path: str, notes: List[str]) -> bool:
    """ensure_dir, but something else at path is moved aside first (a note says so)."""
    try:
        return ensure_dir(path)
    except protocol.OpError:
        pass
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None:
        notes.append(move_aside(path, _kind(st)))
    return ensure_dir(path)


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    return "a file" if stat.S_ISREG(st.st_mode) else "a special file"


def run_dir(request: protocol.Request, notes: Optional[List[str]] = None, keep_also: KeepAlso = None) -> Optional[str]:
    """<home>/.runs/<run id>, made if missing; making one prunes old runs, but for
    the folders keep_also(request) names (the ops pass
    ``ops.background.running_run_dirs``: a running command's log is there).

    Without notes, OpError when it cannot be had. With notes, whatever is in the
    way is moved aside (noted), and None, with a note, when it still cannot be had.
    """
    if notes is None:
        return _run_dir(request, [], keep_also)
    try:
        return _run_dir(request, notes, keep_also)
    except protocol.OpError as exc:
        notes.append(f"note: this call's working directory and log could not be kept: {exc}")
        return None


def _run_dir(request: protocol.Request, notes: List[str], keep_also: KeepAlso = None) -> str:
    runs = os.path.join(request.home, RUNS_DIR)
    rebuild_dir(runs, notes)
    path = os.path.join(runs, request.run_id)
    if rebuild_dir(path, notes):
        kept = None if keep_also is None else (lambda: keep_also(request))
        prune_runs(runs, keep=limits.RUNS_KEPT, keep_also=kept)
    else:
        _touch(path)
    return path


def log_path(request: protocol.Request, notes: Optional[List[str]] = None, keep_also: KeepAlso = None) -> str:
    """<run dir>/<call id>.log (absolute): where a shell call's output goes (keep_also: see run_dir).
    OpError when the run folder cannot be had (things in its way moved aside first)."""
    return os.path.join(_run_dir(request, [] if notes is None else notes, keep_also), f"{request.call_id}.log")


def held_run_dir(request: protocol.Request, notes: List[str], keep_also: KeepAlso = None):
    """``run_dir`` and ``hold`` of it: (the folder or None, the fd to close or None). A folder
    pruned between the two (a prune of another run had it already) is made again."""
    for _ in range(2):
        folder = run_dir(request, notes, keep_also)
        fd = hold(folder)
        if fd is None or os.fstat(fd).st_nlink > 0:
            return folder, fd
        os.close(fd)
    return folder, None


def hold(folder: Optional[str]) -> Optional[int]:
    """A shared lock on a run folder for as long as a call uses it (close the fd it gives to
    let go; None when there is no folder to hold): ``prune_runs`` removes no folder a call
    holds, however many newer runs there are."""
    if folder is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_unheld(path: str) -> None:
    """path removed, unless a call holds it (``hold``): its exclusive lock kept while it goes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    try:
        import shutil  # only when there is something to prune

        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def prune_runs(runs: str, keep: int, keep_also=None) -> None:
    """Delete all but the `keep` most recent run folders (by mtime) in runs; a folder a
    call holds (``hold``) stays.

    keep_also() gives the paths of other folders to keep; it is asked only when
    there is something to prune. Links and other non-folders are left alone;
    nothing is followed.
    """
    entries = []
    with os.scandir(runs) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                entries.append((st.st_mtime, entry.path))
    entries.sort(reverse=True)
    if len(entries) > keep:
        kept = keep_also() if keep_also is not None else set()
        for _, path in entries[keep:]:
            if path not in kept:
                _remove_unheld(path)


def current_cwd(request: protocol.Request) -> str:
    """The run's working directory.

    <run dir>/cwd when it holds an absolute path of an existing folder, else the
    request's default cwd, else (when that is gone too) the home.
    """
    raw = read_small(request.home, [RUNS_DIR, request.run_id, CWD_FILE])
    if raw is not None:
        path = os.fsdecode(raw)
        if _is_dir_path(path):
            return path
    if os.path.isdir(request.cwd):
        return request.cwd
    return request.home


def save_cwd(request: protocol.Request, path: str, notes: List[str], keep_also: KeepAlso = None) -> bool:
    """Record path (absolute) as the run's working directory, atomically (not
    rewritten when it holds path already); True when the run's state holds it now.

    The run folder is had again (what the command put in its way is moved aside)
    and written beneath descriptors opened without following links; what is not
    a regular file at cwd is moved aside. A failure is a note (and False).
    """
    if read_small(request.home, [RUNS_DIR, request.run_id, CWD_FILE]) == os.fsencode(path):
        return True
    if run_dir(request, notes, keep_also) is None:
        return False
    fds: List[int] = []
    try:
        fds.append(os.open(request.home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in (RUNS_DIR, request.run_id):
            fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
        _clear_for_file(fds[-1], CWD_FILE, os.path.join(request.home, RUNS_DIR, request.run_id), notes)
        atomic_write_at(fds[-1], CWD_FILE, os.fsencode(path))
    except (OSError, protocol.OpError) as exc:
        notes.append(f"note: the working directory {path} could not be kept: {_reason(exc)}")
        return False
    finally:
        for fd in fds:
            os.close(fd)
    return True


def _clear_for_file(dir_fd: int, name: str, folder: str, notes: List[str]) -> None:
    """Move aside (noted) what is at folder/name (open as dir_fd) when it is not a regular file."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        return
    aside = f"{name}.aside-{os.urandom(4).hex()}"
    os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    notes.append(f"note: {os.path.join(folder, name)} was {_kind(st)}; moved it to "
                 f"{os.path.join(folder, aside)} and made the state anew")


def atomic_write_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """atomic_write of name in the folder open as dir_fd. Raises OSError."""
    tmp = f".{name}.{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def state_dir() -> str:
    """The state root: $GUILDS_STATE_DIR, else /run/guilds."""
    return protocol.state_root()


def agent_dir(request: protocol.Request) -> str:
    """<state root>/<agent id> (not made here)."""
    return os.path.join(state_dir(), request.agent_id)


def load_repo_tokens(request: protocol.Request) -> Dict[str, str]:
    """<state root>/<agent id>/repos.json: absolute folder -> token.

    A folder maps to its token, or to ``{"token": ..., "gh_host": ...}`` (a
    repository whose GitHub host is not github.com, behind the egress proxy).
    Missing, unreadable or malformed counts as {}; entries that are not an
    absolute path mapped to a non-empty token are skipped.
    """
    return _repo_field(request, "token")


def load_repo_gh_hosts(request: protocol.Request) -> Dict[str, str]:
    """repos.json: absolute folder -> the GitHub host of the repositories that name one."""
    return _repo_field(request, "gh_host")


def _repo_field(request: protocol.Request, field: str) -> Dict[str, str]:
    raw = read_small(state_dir(), [request.agent_id, REPOS_FILE])
    if raw is None:
        return {}
    try:
        data = codec.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    for folder, entry in data.items():
        value = entry.get(field) if isinstance(entry, dict) else entry if field == "token" else None
        if folder.startswith("/") and isinstance(value, str) and value:
            out[os.path.normpath(folder)] = value
    return out


def redactor_for(request: protocol.Request, tokens: Optional[Dict[str, str]] = None) -> redact.Redactor:
    """The run's secrets: the values of request.redact_env and every repository
    token (tokens: load_repo_tokens(request), loaded here when not given)."""
    if tokens is None:
        tokens = load_repo_tokens(request)
    return redact.from_environment(request.redact_env, extra=tokens.values())


def read_small(base: str, names: List[str]) -> Optional[bytes]:
    """The bytes of base/names[0]/.../names[-1], or None.

    base is followed; every name after it is opened without following links.
    None when any part is missing, a link, of the wrong kind, or the file is
    larger than limits.STATE_FILE_MAX_BYTES.
    """
    fds = []
    try:
        fds.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in names[:-1]:
            fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
        fds.append(os.open(names[-1], _FILE_FLAGS, dir_fd=fds[-1]))
        return _read_regular(fds[-1], limits.STATE_FILE_MAX_BYTES)
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _read_regular(fd: int, cap: int) -> Optional[bytes]:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
        return None
    data = os.read(fd, cap + 1)
    return data if len(data) <= cap else None


def _is_dir_path(path: str) -> bool:
    return path.startswith("/") and "\x00" not in path and os.path.isdir(path)


def _touch(path: str) -> None:
    try:
        os.utime(path, follow_symlinks=False)
    except OSError:
        pass


def unlink_quietly(path: str) -> None:
    """Remove path if it is there; never fails."""
    try:
        os.unlink(path)
    except OSError:
        pass
