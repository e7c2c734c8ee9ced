"""The data folder's private places: the folder 0700, the record and the token file 0600.

    private_dir(path)            make the folder 0700 (narrow one of ours that is wider)
    private_file(path)           make or open the file 0600, never through a link
    read_private(path) -> str    a private file's text, refusing a link or a non-file

The data folder holds the run record (every call's arguments and results) and
the server's token: no other user of the machine may read them. An OSError
becomes a RecordError naming the path and what went wrong (a full disk, a
folder not ours), never a traceback.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import RecordError

DIR_MODE = 0o700
FILE_MODE = 0o600
_OTHERS = 0o077
"""Mode bits for the group and others: none are kept on a private place."""


def _narrow(st: os.stat_result, mode: int, chmod) -> None:
    if st.st_mode & _OTHERS and st.st_uid == os.geteuid():
        chmod(mode)


def private_dir(path: Path) -> Path:
    """The folder, made 0700 (its parents as the umask says); an existing one of ours
    that others may enter is narrowed to 0700."""
    path = Path(path)
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise RecordError(f"the data folder {path} is not a folder")
        _narrow(st, DIR_MODE, lambda mode: os.chmod(path, mode))
    except OSError as exc:
        raise RecordError(f"cannot make the data folder {path}: {exc.strerror or exc}") from None
    return path


def private_file(path: Path, *, create: bool = True) -> int:
    """Open (or make, with create) the file 0600 for reading and writing; its descriptor.

    A link at the path is refused (O_NOFOLLOW), as is anything but a regular file.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        raise RecordError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"{path} is not a regular file")
        _narrow(st, FILE_MODE, lambda mode: os.fchmod(fd, mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, limit: int = 4096) -> str:
    """The text of a private file (at most limit bytes), narrowed to 0600 if it was wider."""
    fd = private_file(path, create=False)
    try:
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)
