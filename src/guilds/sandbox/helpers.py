"""Build the in-sandbox helpers into one file each: a plain Python script.

`python3 FILE` runs a script directly, where a zipapp goes through runpy (and
what it imports) first. The script is a small importer followed by the helper's
modules in comment lines, which it reads back from its own file: base64 of zlib
of a marshal'd {module name: (is_package, data)}, once with each module's code
object compiled by this interpreter, once with its source. A sandbox python with
this interpreter's bytecode magic number loads the code objects, with no compile
step; any other version (3.9-3.13) compiles the source instead. Comments cost
the parser least per byte; compressing keeps them few. Both compile with
optimize=2 (no docstrings: fewer bytes to parse), so the helpers' code holds no
assert and reads no __doc__ (tests/test_protocol.py checks).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import marshal
import os
import stat
import sys
import tempfile
import zlib
from pathlib import Path

CODE_HELPER = "guilds-code"
"""The helper of the four check tools (shell, shell_status, file_read, code_search)."""
HARNESS_HELPER = "guilds-harness"
"""code_task's helper: it drives the coding harness."""
HELPER_PACKAGES = {
    CODE_HELPER: ("guilds_code",),
    HARNESS_HELPER: ("guilds_harness", "guilds_code"),
}
"""Each helper's packages: the first holds its __main__; the rest are bundled
beside it because it imports them."""
_MAIN = """\
#!/usr/bin/env python3
# Built by guilds.sandbox.helpers from {packages}: do not edit.
import gc
import sys

gc.freeze()  # what python loaded to start lives as long as this one call: collections skip it
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import MAGIC_NUMBER
from binascii import a2b_base64
from marshal import loads
from zlib import decompress

MAGIC = {magic!r}


def _modules():
    \"\"\"(is code, {{module name: (is_package, marshal'd code or source)}}) from the end of this file.\"\"\"
    with open(__file__, "rb") as fh:
        data = fh.read()
    start = data.index(b"\\n#code\\n")
    end = data.index(b"\\n#source\\n", start)
    if MAGIC_NUMBER == MAGIC:
        return True, loads(decompress(a2b_base64(data[start + 7:end])))
    return False, loads(decompress(a2b_base64(data[end + 9:])))


IS_CODE, MODULES = _modules()


class Importer:
    \"\"\"The meta path finder and loader of the modules in MODULES.\"\"\"

    @staticmethod
    def find_spec(name, path=None, target=None):
        entry = MODULES.get(name)
        return None if entry is None else ModuleSpec(name, Importer, origin=name, is_package=entry[0])

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        name = module.__name__
        is_package, data = MODULES[name]
        if IS_CODE:
            code = loads(data)
        else:
            filename = name.replace(".", "/") + ("/__init__.py" if is_package else ".py")
            code = compile(data, filename, "exec", dont_inherit=True, optimize=2)
        exec(code, module.__dict__)


sys.meta_path.insert(0, Importer)
from {pkg}.__main__ import main

sys.exit(main())
"""
_LINE = 76
"""base64 characters per comment line."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package} not found")
    return Path(next(iter(spec.submodule_search_locations)))


def _sources(package: str):
    """(module name, is_package, path relative to the package's parent, source) by path."""
    root = _package_dir(package)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if "__pycache__" in rel:
            continue
        parts = rel[:-3].split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        yield ".".join(parts), is_package, rel, path.read_bytes()


def _comments(modules: dict) -> str:
    """modules as comment lines: base64 of zlib of marshal (version 2: no refs, any python reads it)."""
    text = base64.b64encode(zlib.compress(marshal.dumps(modules, 2), 9)).decode()
    return "".join(f"#{text[i:i + _LINE]}\n" for i in range(0, len(text), _LINE))


MARSHAL_VERSION = 2
"""Compiled code is marshalled without references: from version 3 on, marshal writes a
reference where an object's refcount is above one, which depends on what the building
process did before, so the same sources gave other bytes in another process."""


def build_bytes(packages: str | tuple[str, ...]) -> bytes:
    """The helper script's bytes: deterministic for the same sources and interpreter.

    packages: one package name, or a tuple whose first runs as __main__.
    """
    if isinstance(packages, str):
        packages = (packages,)
    code, source = {}, {}
    for package in packages:
        for name, is_package, rel, text in _sources(package):
            compiled = compile(text, rel, "exec", dont_inherit=True, optimize=2)
            code[name] = (is_package, marshal.dumps(compiled, MARSHAL_VERSION))
            source[name] = (is_package, text)
    script = _MAIN.format(packages=", ".join(packages), magic=importlib.util.MAGIC_NUMBER, pkg=packages[0])
    return (script + "#code\n" + _comments(code) + "#source\n" + _comments(source)).encode()


def build_helper(dest: Path, name: str = "guilds-code") -> Path:
    """Write the helper `name` to dest atomically, mode 0755; return dest."""
    data = build_bytes(HELPER_PACKAGES[name])
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".build-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)  # noqa: S103
    os.replace(tmp, dest)
    return dest


def source_digest(packages: tuple[str, ...]) -> str:
    """A short hash of what a helper is built from: its sources, this builder's template and
    the interpreter's bytecode magic. Reads the sources again only when one of them changed
    (its path, inode, size or mtime: ``_stamp``) since this process last read them; builds nothing."""
    stamp = _stamp(packages)
    kept = _digests.get(packages)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    digest = hashlib.sha256(_MAIN.encode() + importlib.util.MAGIC_NUMBER + str(_LINE).encode())
    for package in packages:
        for name, _, _, text in _sources(package):
            digest.update(b"\0%s\0%d\0" % (name.encode(), len(text)))
            digest.update(text)
    _digests[packages] = (stamp, digest.hexdigest()[:16])
    return _digests[packages][1]


_digests: dict[tuple[str, ...], tuple[tuple, str]] = {}
"""By packages: the sources' stamp when last read, and their digest."""


def _stamp(packages: tuple[str, ...]) -> tuple:
    """Each source file's path, inode, size and mtime, walked with scandir (nothing read)."""
    found = []
    pending = [str(_package_dir(package)) for package in packages]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append(entry.path)
                elif entry.name.endswith(".py"):
                    info = entry.stat()
                    found.append((entry.path, info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


def cached_helper(cache_dir: Path, name: str = "guilds-code") -> Path:
    """The helper built once into cache_dir, found again by the hash of its sources
    (``<name>-<source digest>.py``): a process that finds it builds nothing."""
    dest = Path(cache_dir) / f"{name}-{source_digest(HELPER_PACKAGES[name])}.py"
    if not dest.exists():
        build_helper(dest, name)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m guilds.sandbox.helpers", description=__doc__)
    parser.add_argument("dest", help="where to write the one-file helper")
    parser.add_argument("--name", default="guilds-code", choices=sorted(HELPER_PACKAGES))
    args = parser.parse_args(argv)
    print(build_helper(Path(args.dest), args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
