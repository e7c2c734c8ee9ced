"""Build the in-sandbox helpers into one file each (a zipapp).

The zipapp holds each module's source and an unchecked-hash .pyc compiled by
this interpreter (its own __main__ too): a sandbox python of the same version
imports the .pyc with no compile step and without reading the source; any other
version falls back to the source.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import marshal
import os
import stat
import sys
import tempfile
import zipfile
from pathlib import Path

HELPER_PACKAGES = {
    "guilds-code": ("guilds_code",),
    "guilds-harness": ("guilds_harness", "guilds_code"),
}
"""Each helper's packages: the first holds its __main__; the rest are bundled
beside it because it imports them."""
_MAIN = """\
# -*- coding: utf-8 -*-
import gc
import sys

gc.freeze()  # what python loaded to start lives as long as this one call: collections skip it
from {pkg}.__main__ import main

sys.exit(main())
"""
_SHEBANG = b"#!/usr/bin/env python3\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)
_UNCHECKED_HASH_PYC = 0b01
"""PEP 552 flags: bit 0 hash-based, bit 1 check_source (off: the source beside
it in the zip is never read, let alone hashed, on import)."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package} not found")
    return Path(next(iter(spec.submodule_search_locations)))


def _pyc(source: bytes, name: str) -> bytes:
    code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    digest = importlib.util.source_hash(source)
    flags = _UNCHECKED_HASH_PYC.to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + flags + digest + marshal.dumps(code)


def _sources(package: str):
    root = _package_dir(package)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if "__pycache__" not in rel:
            yield rel, path.read_bytes()


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_STORED
    zf.writestr(info, data)


def build_bytes(packages: str | tuple[str, ...]) -> bytes:
    """The zipapp's bytes: deterministic for the same sources and interpreter.

    packages: one package name, or a tuple whose first runs as __main__.
    """
    if isinstance(packages, str):
        packages = (packages,)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        main = _MAIN.format(pkg=packages[0]).encode()
        _add(zf, "__main__.py", main)
        _add(zf, "__main__.pyc", _pyc(main, "__main__.py"))
        for package in packages:
            for rel, source in _sources(package):
                _add(zf, rel, source)
                _add(zf, rel[:-3] + ".pyc", _pyc(source, rel))
    return _SHEBANG + buf.getvalue()


def build_helper(dest: Path, name: str = "guilds-code") -> Path:
    """Write the helper `name` to dest atomically, mode 0755; return dest."""
    data = build_bytes(HELPER_PACKAGES[name])
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".build-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    os.replace(tmp, dest)
    return dest


def cached_helper(cache_dir: Path, name: str = "guilds-code") -> Path:
    """The helper built once per content into cache_dir (rebuilt when sources change)."""
    data = build_bytes(HELPER_PACKAGES[name])
    digest = hashlib.sha256(data).hexdigest()[:16]
    dest = Path(cache_dir) / f"{name}-{digest}.pyz"
    if not dest.exists():
        build_helper(dest, name)
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m guilds.helpers", description=__doc__)
    parser.add_argument("dest", help="where to write the one-file helper")
    parser.add_argument("--name", default="guilds-code", choices=sorted(HELPER_PACKAGES))
    args = parser.parse_args(argv)
    print(build_helper(Path(args.dest), args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
