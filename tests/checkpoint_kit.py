"""What the checkpoint tests share: a tree of every kind of path, and a byte-for-byte picture of one."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def picture(root: Path) -> dict[str, tuple]:
    """Every path under root: kind, mode, owner, mtime, and a file's bytes or a link's target."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("l", os.readlink(path), st.st_uid, st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                seen[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            else:
                seen[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns, path.read_bytes())
    return seen


def make_tree(home: Path) -> None:
    """Files of several modes, links (relative, absolute, dangling, to a folder), an
    empty folder, a nested one, a file to be deleted later, an empty file."""
    (home / "src" / "pkg").mkdir(parents=True)
    (home / "empty").mkdir()
    (home / "src" / "pkg" / "mod.py").write_text("print('hi')\n" * 100)
    (home / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(home / "run.sh", 0o755)
    (home / "secret.key").write_bytes(os.urandom(4096))
    os.chmod(home / "secret.key", 0o600)
    (home / "readonly.txt").write_text("fixed\n")
    os.chmod(home / "readonly.txt", 0o444)
    (home / "blank").write_bytes(b"")
    (home / "doomed.txt").write_text("deleted after the checkpoint\n")
    os.symlink("src/pkg/mod.py", home / "link-rel")
    os.symlink("/etc/hostname", home / "link-abs")
    os.symlink("nowhere", home / "link-dangling")
    os.symlink("src", home / "link-dir")
    os.chmod(home / "src" / "pkg", 0o750)


def mess_up(home: Path) -> None:
    """Every kind of change a call can make to the tree of make_tree."""
    (home / "src" / "pkg" / "mod.py").write_text("changed\n")
    os.chmod(home / "run.sh", 0o644)
    (home / "doomed.txt").unlink()
    (home / "empty").rmdir()
    (home / "link-rel").unlink()
    os.symlink("run.sh", home / "link-rel")
    (home / "link-dangling").unlink()
    (home / "link-dangling").mkdir()
    (home / "new.txt").write_text("made after\n")
    (home / "src" / "extra").mkdir()
    (home / "src" / "extra" / "f").write_text("x")
    os.chmod(home / "readonly.txt", 0o644)
    (home / "readonly.txt").write_text("edited\n")
    os.chmod(home / "src" / "pkg", 0o700)
