"""A file's metadata (``files.write(..., metadata=)``) through the unmodified E2B Python SDK against a
real `guilds serve --e2b`: kept as the file's ``user.e2b.`` extended attributes, shown by every entry,
replaced by each upload; the envd version reported is the one that has it (local backend: the
sandbox's service is the same on every backend)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.sandbox.filesystem.filesystem import WriteEntry
from packaging.version import Version

from e2b_kit import (
    E2BServer,
    e2b_server,
    home_of,
    made_sandbox,  # noqa: F401 - the sbx fixture of this module
)
from guilds.limits import E2B_ENVD_VERSION, E2B_FILE_METADATA_BYTES, E2B_FILE_METADATA_KEY_BYTES

pytestmark = pytest.mark.slow
PREFIX_BYTES = len("user.e2b.")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-metadata"), "local") as served:
        yield served


def _upload(server: E2BServer, sbx: Sandbox, path: str, headers: dict[str, str | bytes]) -> httpx.Response:
    """A raw upload (the SDK checks metadata before sending it: this is the server's own check)."""
    return httpx.post(f"{server.url}/files", params={"path": path}, content=b"body",
                      headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
                               "Content-Type": "application/octet-stream", **headers})


def test_the_envd_version_is_the_first_with_watch_entries_and_network_mounts(sbx):
    assert E2B_ENVD_VERSION == "0.6.4"
    assert sbx._envd_version == Version("0.6.4")
    assert Sandbox.connect(sbx.sandbox_id)._envd_version == Version("0.6.4")


def test_metadata_is_kept_and_shown_by_every_entry(sbx):
    info = sbx.files.write("notes/a.txt", "one", metadata={"Author": "mish", "purpose": "upload"})
    assert info.metadata == {"author": "mish", "purpose": "upload"}  # keys lower case, as E2B's
    assert sbx.files.get_info("notes/a.txt").metadata == {"author": "mish", "purpose": "upload"}
    [listed] = [e for e in sbx.files.list("notes") if e.name == "a.txt"]
    assert listed.metadata == {"author": "mish", "purpose": "upload"}
    assert sbx.files.rename("notes/a.txt", "notes/b.txt").metadata == {"author": "mish", "purpose": "upload"}
    streamed = sbx.files.write("c.txt", "two", metadata={"k": "v"}, use_octet_stream=True)
    assert streamed.metadata == {"k": "v"} and sbx.files.get_info("c.txt").metadata == {"k": "v"}
    infos = sbx.files.write_files([WriteEntry(path="m1.txt", data="1"), WriteEntry(path="m2.txt", data="2")],
                                  metadata={"source": "suite"})
    assert [i.metadata for i in infos] == [{"source": "suite"}] * 2
    assert sbx.files.get_info("m2.txt").metadata == {"source": "suite"}


def test_an_upload_replaces_the_metadata_and_none_clears_it(sbx):
    sbx.files.write("f.txt", "1", metadata={"a": "1", "b": "2"})
    assert sbx.files.write("f.txt", "2", metadata={"b": "3"}).metadata == {"b": "3"}
    assert sbx.files.get_info("f.txt").metadata == {"b": "3"}
    assert sbx.files.write("f.txt", "3").metadata is None
    assert sbx.files.get_info("f.txt").metadata is None
    assert sbx.files.read("f.txt") == "3"


def test_attributes_set_in_the_sandbox_show_and_others_do_not(server, sbx):
    sbx.files.write("x.txt", "content")
    path = home_of(sbx, server.data) / "x.txt"
    os.setxattr(path, "user.e2b.author", b"mish")
    os.setxattr(path, "user.other", b"not metadata")
    os.setxattr(path, "user.e2b.binary", b"\xff\xfe")  # not UTF-8: left out, as E2B's envd leaves it
    assert sbx.files.get_info("x.txt").metadata == {"author": "mish"}
    assert os.getxattr(path, "user.other") == b"not metadata"
    sbx.files.write("x.txt", "again")  # an upload replaces the e2b attributes only
    assert sbx.files.get_info("x.txt").metadata is None
    assert os.getxattr(path, "user.other") == b"not metadata"


def test_a_link_shows_its_target_metadata_only_through_stat(server, sbx):
    sbx.files.write("t.txt", "x", metadata={"k": "v"})
    os.symlink("t.txt", home_of(sbx, server.data) / "l.txt")
    assert sbx.files.get_info("l.txt").metadata == {"k": "v"}
    [link] = [e for e in sbx.files.list(".") if e.name == "l.txt"]
    assert link.metadata is None


def test_metadata_is_bounded_as_e2b_bounds_it(server, sbx):
    home = home_of(sbx, server.data)
    longest = "k" * E2B_FILE_METADATA_KEY_BYTES
    assert _upload(server, sbx, "k1", {f"X-Metadata-{longest}": "v"}).status_code == 200
    assert sbx.files.get_info("k1").metadata == {longest: "v"}
    refused = _upload(server, sbx, "k2", {f"X-Metadata-{longest}k": "v"})
    assert refused.status_code == 400 and "over 246 bytes" in refused.json()["message"]
    assert _upload(server, sbx, "t0", {"X-Metadata-a": "v" * 2000}).status_code == 200
    room = E2B_FILE_METADATA_BYTES - PREFIX_BYTES - 1  # one key "a", its value filling the rest
    edge = _upload(server, sbx, "t1", {"X-Metadata-a": "v" * room})  # within the bound: the file system decides
    assert edge.status_code == 200 or (edge.status_code == 507 and "no room" in edge.json()["message"]), edge.text
    refused = _upload(server, sbx, "t2", {"X-Metadata-a": "v" * (room + 1)})
    assert refused.status_code == 400 and refused.json() == {
        "code": 400, "message": "invalid metadata: 4097 bytes of keys and values, over 4096"}
    refused = _upload(server, sbx, "t3", {"X-Metadata-a": "caf\u00e9".encode()})
    assert refused.status_code == 400 and "only printable ASCII" in refused.json()["message"]
    assert not any((home / name).exists() for name in ("k2", "t2", "t3"))  # refused before anything is written


def test_the_sdk_refuses_bad_metadata_before_sending(sbx):
    from e2b.exceptions import InvalidArgumentException

    with pytest.raises(InvalidArgumentException):
        sbx.files.write("bad.txt", "x", metadata={"bad key": "v"})
    assert not sbx.files.exists("bad.txt")


def test_no_metadata_where_the_filesystem_keeps_no_user_attributes(sbx, tmp_path):
    """/proc keeps none: the write's entry and the stat say none (here: the helper's own check)."""
    from guilds_code.envd_files import metadata, replace_metadata

    fd = os.open("/proc/self/comm", os.O_RDONLY)
    try:
        replace_metadata(fd, {"k": "v"})  # ENOTSUP: nothing kept, no error
    finally:
        os.close(fd)
    assert metadata("/proc/self/comm") == {}
    plain = Path(tmp_path, "plain")
    plain.write_text("x")
    assert metadata(str(plain)) == {}
