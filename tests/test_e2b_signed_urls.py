"""Signed file URLs (``download_url``, ``upload_url``) through the unmodified E2B Python SDK against a
real `guilds serve --e2b`: opened with no header at all, checked as E2B's envd checks them (local
backend: these are the front's answers, the same on every backend)."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from e2b import Sandbox
from e2b.sandbox.signature import get_signature

from e2b_kit import E2BServer, e2b_server
from guilds.fronts.e2b.signed_urls import signature

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with e2b_server(tmp_path_factory.mktemp("e2b-signed"), "local") as served:
        yield served


@pytest.fixture
def sbx(server: E2BServer, monkeypatch):
    server.export(monkeypatch)
    box = Sandbox.create(timeout=120, secure=True)
    yield box
    box.kill()


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def _with(url: str, **changed: str) -> str:
    parts = urlsplit(url)
    return parts._replace(query=urlencode({**_query(url), **changed})).geturl()


def test_the_signature_is_e2bs():
    assert signature("a/b.txt", "read", "user", "token", None) == get_signature("a/b.txt", "read", "user",
                                                                                "token")["signature"]
    signed = get_signature("f.txt", "write", None, "tok", 60)
    assert signature("f.txt", "write", "", "tok", signed["expiration"]) == signed["signature"]


def test_a_signed_url_reads_and_writes_with_no_header(sbx):
    sbx.files.write("shared.txt", "hello")
    answer = httpx.get(sbx.download_url("shared.txt"))
    assert answer.status_code == 200 and answer.text == "hello"
    answer = httpx.get(sbx.download_url("shared.txt", "user", use_signature_expiration=120))
    assert answer.status_code == 200 and answer.text == "hello"
    upload = sbx.upload_url("up/new.txt", use_signature_expiration=60)
    written = httpx.post(upload, files={"file": ("new.txt", b"uploaded")})
    assert written.status_code == 200 and written.json()[0]["name"] == "new.txt"
    assert sbx.files.read("up/new.txt") == "uploaded"


def test_an_expired_or_altered_signature_is_refused(sbx, server):
    sbx.files.write("shared.txt", "hello")
    expired = httpx.get(sbx.download_url("shared.txt", use_signature_expiration=-120))
    assert expired.status_code == 401 and expired.json() == {"code": 401, "message": "signature is already expired"}
    url = sbx.download_url("shared.txt", use_signature_expiration=120)
    later = str(int(_query(url)["signature_expiration"]) + 1000)  # a longer life is not in the signature
    given = _query(url)["signature"]
    retouched = given[:-1] + ("B" if given.endswith("A") else "A")
    for altered in (_with(url, signature_expiration=later), _with(url, path="other.txt"),
                    _with(url, username="root"), _with(url, signature=retouched)):
        answer = httpx.get(altered)
        assert answer.status_code == 401 and answer.json() == {"code": 401, "message": "invalid signature"}
    assert httpx.post(url, content=b"x", headers={"Content-Type": "application/octet-stream"}).status_code == 401
    forged = signature("shared.txt", "read", "", "not the token", int(time.time()) + 60)
    assert httpx.get(_with(url, signature=forged)).status_code == 401
    assert httpx.get(_with(url, signature_expiration="soon")).status_code == 400


def test_the_url_is_the_sandbox_it_was_signed_by(sbx, server):
    other = Sandbox.create(timeout=120)
    try:
        other.files.write("shared.txt", "the other's")
        sbx.files.write("shared.txt", "mine")
        assert httpx.get(sbx.download_url("shared.txt")).text == "mine"
        assert httpx.get(other.download_url("shared.txt")).text == "the other's"
        named = httpx.get(sbx.download_url("shared.txt"), headers={"E2b-Sandbox-Id": other.sandbox_id})
        assert named.status_code == 401  # the header names another sandbox than the signature's
        other.kill()
        assert httpx.get(other.download_url("shared.txt")).status_code == 401  # gone with its sandbox
    finally:
        other.kill()
