"""The endpoint's lock: /mcp and the app answer only the token's holder, from this origin.

In process over the real app (httpx's ASGI transport), then as an attacker would
meet it: a real `guilds serve` process on a loopback and on a non-loopback bind,
the official MCP SDK client over HTTP, and the modes of what the data folder holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from guilds.errors import RecordError
from guilds.fronts.serve import build_app
from guilds.limits import APP_SESSION_MAX_AGE_SECONDS, APP_SESSIONS_MAX
from guilds.record.session_terms import Terms
from guilds.record.store import Store
from guilds.web import sessions as sessions_module
from guilds.web.endpoint_lock import LOGGED_OUT, NO_LOGIN, TOKEN_FILE, Lock, cookie_values, host_names, server_token
from guilds.web.sessions import Sessions
from mcp_raw import VERSION, envelope
from test_mcp_http import serving
from toolbox_kit import local_toolbox
from web_kit import AUTH, LOCK, TOKEN, printed_lines, record_url, start_serve, stop_serve

pytestmark = pytest.mark.asyncio(loop_scope="module")
PAGES = ["/", "/runs/r1", "/runs/r1/calls/1", "/runs/r1/calls/1/log", "/runs/r1/events", "/static/app.css", "/mcp"]
WIDE = Lock(TOKEN, host_names("0.0.0.0"))
"""The lock of a server bound to every address."""
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
TOKEN_COOKIES = ({"cookie": f"guilds-token-8765={TOKEN}"}, {"cookie": f"guilds-session-8765={TOKEN}"})
"""The token itself in a cookie, under the name it once had and under the session's: taken nowhere."""
ID_U = envelope("tools/call", {"name": "shell", "arguments": {"command": "id -u"}})
"""What an attacker holding a credential sends: one self-contained call (no handshake) running `id -u`."""
ID_U_HEADERS = {**MCP_HEADERS, "mcp-protocol-version": VERSION, "mcp-method": "tools/call", "mcp-name": "shell"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def toolbox(tmp_path_factory):
    async with local_toolbox(tmp_path_factory.mktemp("lock")) as box:
        await box.call("r1", "shell", {"command": "echo secret-output-7"})
        yield box


@contextlib.asynccontextmanager
async def client_of(toolbox, lock: Lock, host: str = "127.0.0.1") -> AsyncIterator[httpx2.AsyncClient]:
    app = build_app(toolbox.settings, toolbox.store, toolbox, host=host, lock=lock)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8765") as c:
        yield c


async def test_every_route_refuses_a_request_without_the_token(toolbox):
    async with client_of(toolbox, LOCK) as c:
        for path in PAGES:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"cookie": "guilds-session-8765=wrong"},
                            {"authorization": f"Basic {TOKEN}"}, *TOKEN_COOKIES):
                r = await c.get(path, headers=headers)
                assert r.status_code == 401, (path, headers, r.status_code)
                assert r.headers["www-authenticate"] == challenge(path, headers) and "secret-output-7" not in r.text
        r = await c.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        assert r.status_code == 401 and "Authorization: Bearer" in r.text


def challenge(path: str, headers: dict) -> str:
    """The app's pages ask for the token; the MCP endpoint names its resource metadata (RFC 9728)."""
    if path != "/mcp":
        return "Bearer"
    named = 'Bearer resource_metadata="http://127.0.0.1:8765/.well-known/oauth-protected-resource/mcp"'
    return named + (', error="invalid_token"' if "authorization" in headers else "")


async def test_the_protected_resource_metadata_is_public_and_names_the_endpoint(toolbox):
    async with client_of(toolbox, LOCK) as c:
        refused = await c.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        url = re.fullmatch(r'Bearer resource_metadata="([^"]+)"', refused.headers["www-authenticate"]).group(1)
        for path in (url.removeprefix("http://127.0.0.1:8765"), "/.well-known/oauth-protected-resource"):
            document = await c.get(path, headers={"origin": "http://elsewhere.example"})
            assert document.status_code == 200 and document.headers["content-type"] == "application/json"
            assert document.headers["access-control-allow-origin"] == "*"
            assert document.json() == {"resource": "http://127.0.0.1:8765/mcp", "bearer_methods_supported": ["header"],
                                       "resource_name": "guilds"}
        assert (await c.get(url, headers={"host": "evil.example"})).status_code == 400
    async with client_of(toolbox, Lock(None, LOCK.hosts)) as c:  # --no-token: nothing to describe
        assert (await c.get("/.well-known/oauth-protected-resource/mcp")).status_code == 404


async def test_the_token_lets_in(toolbox):
    async with client_of(toolbox, LOCK) as c:
        for path in ("/", "/runs/r1", "/runs/r1/calls/1", "/static/app.css"):
            assert (await c.get(path, headers=AUTH)).status_code == 200, path


async def test_the_one_time_url_sets_a_strict_session_cookie_and_leaves_a_clean_url(toolbox):
    async with client_of(toolbox, LOCK) as c:
        r = await c.get(f"/runs/r1/calls/1?view=metadata&token={TOKEN}")
        assert r.status_code == 303 and r.headers["location"] == "/runs/r1/calls/1?view=metadata"
        cookie = r.headers["set-cookie"]
        session = re.match(r"guilds-session-8765=([A-Za-z0-9_-]{43});", cookie).group(1)
        assert TOKEN not in cookie and session != TOKEN
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in cookie.split(";")}
        page = await c.get("/runs/r1/calls/1?view=metadata")  # the client keeps the cookie, as a browser does
        assert page.status_code == 200 and "Exit code" in page.text
        again = await c.get(f"/?token={TOKEN}")
        assert again.headers["set-cookie"] != cookie  # each login its own session
        c.cookies.clear()
        assert (await c.get("/")).status_code == 401
        assert (await c.get("/", headers={"authorization": f"Bearer {session}"})).status_code == 401
        away = await c.get(f"/%2Fevil.example/x?token={TOKEN}")  # the path is //evil.example/x
        assert away.status_code == 303 and away.headers["location"] == "/evil.example/x"
        c.cookies.clear()
        bad = await c.get("/?token=" + TOKEN[:-1] + "x")
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        posted = await c.post(f"/mcp?token={TOKEN}", json=INITIALIZE, headers=MCP_HEADERS)
        assert posted.status_code == 401 and "set-cookie" not in posted.headers
        got = await c.get(f"/mcp?token={TOKEN}", headers={"accept": "text/event-stream"})
        assert got.status_code == 401 and "set-cookie" not in got.headers


async def test_mcp_takes_the_bearer_header_only(toolbox):
    """A cookie reaches /mcp from any page of 127.0.0.1 the browser visits: neither the token in a
    cookie nor a live session runs a command there; the Bearer header does."""
    app = build_app(toolbox.settings, toolbox.store, toolbox, lock=LOCK)
    async with serving(app) as url, httpx2.AsyncClient(base_url=url.removesuffix("/mcp"), timeout=60) as c:
        port = url.rsplit(":", 1)[1].removesuffix("/mcp")

        async def refused(headers: dict[str, str]) -> None:
            r = await c.post("/mcp", json=ID_U, headers={**ID_U_HEADERS, **headers})
            assert r.status_code == 401, (headers, r.text)
            assert r.text == ("The MCP endpoint needs the header Authorization: Bearer <token> (the token is "
                              "in the data folder's serve.token); it takes no cookie.\n")
            assert (await c.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers})).status_code == 401

        await refused({"cookie": f"guilds-token-{port}={TOKEN}"})
        await refused({"cookie": f"guilds-session-{port}={TOKEN}"})
        login = await c.get(f"/?token={TOKEN}")
        session = re.match(rf"guilds-session-{port}=([^;]+);", login.headers["set-cookie"]).group(1)
        c.cookies.clear()
        live = {"cookie": f"guilds-session-{port}={session}"}
        assert (await c.get("/", headers=live)).status_code == 200
        await refused(live)
        await refused({"authorization": f"Bearer {session}"})
        ran = await c.post("/mcp", json=ID_U, headers={**ID_U_HEADERS, **AUTH, **live})
        run_line, output = ran.json()["result"]["content"][0]["text"].split("\n", 1)
        assert ran.status_code == 200 and run_line.startswith("run: mcp-") and output.startswith(f"{os.getuid()}\n")


async def test_logins_past_the_most_end_the_session_idle_longest(toolbox, monkeypatch):
    monkeypatch.setattr(sessions_module, "TERMS", dataclasses.replace(sessions_module.TERMS, touch=timedelta(0)))
    async with client_of(toolbox, LOCK) as c:
        async def login() -> dict[str, str]:
            r = await c.get(f"/?token={TOKEN}")
            c.cookies.clear()
            return {"cookie": r.headers["set-cookie"].split(";")[0]}

        first, second = await login(), await login()
        for _ in range(APP_SESSIONS_MAX - 2):
            await login()
        assert (await c.get("/", headers=first)).status_code == 200  # the most are live; first used now
        await login()  # one past the most: the session idle longest (the second) ends
        assert (await c.get("/", headers=second)).status_code == 401
        assert (await c.get("/", headers=first)).status_code == 200


SHORT = Terms(idle=timedelta(seconds=2), max_age=timedelta(seconds=5), most=APP_SESSIONS_MAX, touch=timedelta(0))
"""Lifetimes a test can wait out."""


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_a_session_ends_after_its_idle_time_at_its_max_age_and_with_its_token(tmp_path, db):
    me, other = f"token:{os.urandom(8).hex()}", f"token:{os.urandom(8).hex()}"
    async with Store(record_url(db, tmp_path)) as store:
        sessions = Sessions(store, SHORT)
        value = await sessions.start(me)
        begun = time.monotonic()
        await asyncio.sleep(1.2)
        assert await sessions.holds(value, me)  # used: its idle time starts again
        await asyncio.sleep(1.2)
        assert await sessions.holds(value, me)  # 2.4 s after its login, 1.2 s after its last use
        await asyncio.sleep(2.1)
        assert not await sessions.holds(value, me)  # idle its time out
        kept = await sessions.start(me)
        begun = time.monotonic()
        while time.monotonic() - begun < SHORT.max_age.total_seconds() - 1:
            assert await sessions.holds(kept, me)  # used well within its idle time
            await asyncio.sleep(0.5)
        await asyncio.sleep(max(0.0, begun + SHORT.max_age.total_seconds() + 0.1 - time.monotonic()))
        assert not await sessions.holds(kept, me)  # its max age, however much it was used
        mine = await sessions.start(me)
        assert not await sessions.holds(mine, other) and await sessions.holds(mine, me)  # another token's: no
        assert not await sessions.holds("", me) and not await sessions.holds(None, me)
        assert await sessions.end(mine) and not await sessions.holds(mine, me) and not await sessions.end(mine)


async def test_a_session_is_every_servers_on_the_record_and_a_logout_on_one_ends_it_on_all(toolbox):
    async with Store(toolbox.store.engine.url.render_as_string(hide_password=False)) as elsewhere:  # another server
        other_app = build_app(toolbox.settings, elsewhere, toolbox, host="127.0.0.1", lock=LOCK)
        async with client_of(toolbox, LOCK) as here, httpx2.AsyncClient(
                transport=httpx2.ASGITransport(app=other_app), base_url="http://127.0.0.1:8765") as there:
            session = {"cookie": (await here.get(f"/?token={TOKEN}")).headers["set-cookie"].split(";")[0]}
            here.cookies.clear()
            assert (await there.get("/", headers=session)).status_code == 200
            assert (await there.post("/logout", headers={**session, "origin": "null"})).status_code == 200
            assert (await here.get("/", headers=session)).status_code == 401


FOREIGN_COOKIES = ['prefs={"theme": "dark", "size": 2}', "q=\"a b\"", 'x=a"b', "flag", "a=b c", "=v", 'j={"k":"v;w"}']
"""Cookies other local apps set (JSON, spaced, quoted, bare): never in the way of the session's."""


@pytest.mark.parametrize("foreign", FOREIGN_COOKIES)
async def test_another_apps_cookie_before_or_after_the_session_does_not_lock_out(toolbox, foreign):
    async with client_of(toolbox, LOCK) as c:
        session = (await c.get(f"/?token={TOKEN}")).headers["set-cookie"].split(";")[0]
        c.cookies.clear()
        for header in (f"{foreign}; {session}", f"{session}; {foreign}", f"{foreign};{session};{foreign}"):
            assert (await c.get("/", headers={"cookie": header})).status_code == 200, header
        assert (await c.get("/", headers={"cookie": foreign})).status_code == 401


@pytest.mark.parametrize("header,values", [
    ("guilds-session-1=abc", ["abc"]),
    ("  guilds-session-1 = abc ; other=1", ["abc"]),
    ('a={"x": 1, "y": "z"}; guilds-session-1=abc; b', ["abc"]),
    ("guilds-session-1=one; guilds-session-1=two", ["one", "two"]),
    ("guilds-session-10=abc; xguilds-session-1=abc", []),
    ("", []),
])
async def test_the_cookie_header_is_read_pair_by_pair(header, values):
    assert cookie_values(header, "guilds-session-1") == values


async def test_logout_ends_the_session_on_the_server(toolbox):
    async with client_of(toolbox, LOCK) as c:
        login = await c.get(f"/?token={TOKEN}")
        assert f"Max-Age={round(APP_SESSION_MAX_AGE_SECONDS)}" in login.headers["set-cookie"].split("; ")
        session = {"cookie": login.headers["set-cookie"].split(";")[0]}
        c.cookies.clear()
        other = {"cookie": (await c.get(f"/?token={TOKEN}")).headers["set-cookie"].split(";")[0]}
        c.cookies.clear()
        assert (await c.get("/logout", headers=session)).status_code == 405  # a link or a prefetch: no
        cross = await c.post("/logout", headers={**session, "origin": "http://evil.example"})
        assert cross.status_code == 403 and (await c.get("/", headers=session)).status_code == 200
        nulled = await c.get("/", headers={**session, "origin": "null"})  # the app's own form's, at the logout only
        assert nulled.status_code == 403
        out = await c.post("/logout", headers={**session, "origin": "null"})
        assert out.status_code == 200 and out.text == LOGGED_OUT + "\n"
        assert out.headers["set-cookie"] == "guilds-session-8765=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"
        assert (await c.get("/", headers=session)).status_code == 401  # replayed: ended on the server
        assert (await c.post("/logout", headers=session)).status_code == 401
        assert (await c.get("/", headers=other)).status_code == 200  # another browser's session stays
        assert (await c.post("/logout", headers=AUTH)).status_code == 200  # the token: nothing to end
    async with client_of(toolbox, Lock(None, LOCK.hosts)) as c:
        assert (await c.post("/logout")).text == NO_LOGIN + "\n"


@pytest.mark.parametrize("lock,host", [(LOCK, "127.0.0.1"), (WIDE, "0.0.0.0")], ids=["loopback", "any-address"])
async def test_a_rebinding_host_is_refused_even_with_the_token(toolbox, lock, host):
    async with client_of(toolbox, lock, host) as c:
        for path in ("/", "/mcp"):
            r = await c.get(path, headers={**AUTH, "host": "evil.example"})
            assert r.status_code == 400, path
        assert (await c.get("/", headers={**AUTH, "host": "localhost:8765"})).status_code == 200


@pytest.mark.parametrize("lock,host", [(LOCK, "127.0.0.1"), (WIDE, "0.0.0.0")], ids=["loopback", "any-address"])
async def test_another_origin_is_refused_on_every_bind(toolbox, lock, host):
    async with client_of(toolbox, lock, host) as c:
        for origin in ("http://evil.example", "null", "http://127.0.0.1:9999", "https://127.0.0.1.evil.example"):
            r = await c.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **AUTH, "origin": origin})
            assert r.status_code == 403, origin
            assert (await c.get("/", headers={**AUTH, "origin": origin})).status_code == 403, origin
        same = await c.get("/", headers={**AUTH, "origin": "http://127.0.0.1:8765"})
        assert same.status_code == 200


async def test_an_mcp_client_with_the_bearer_header_calls_a_tool(toolbox):
    """The official client over HTTP: refused without the header, served with it."""
    lock = Lock(TOKEN, host_names("0.0.0.0"))  # the non-loopback lock: the SDK's own checks are off
    app = build_app(toolbox.settings, toolbox.store, toolbox, host="0.0.0.0", lock=lock)
    async with serving(app) as url:
        async with create_mcp_http_client() as http:
            assert (await http.post(url, json=INITIALIZE, headers=MCP_HEADERS)).status_code == 401
            evil = await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **AUTH, "origin": "http://evil.example"})
            assert evil.status_code == 403
        async with (
            create_mcp_http_client(headers=AUTH) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as c,
        ):
            result = await c.call_tool("shell", {"command": "echo through the lock"})
        assert result.content[0].text.startswith("through the lock")


async def test_the_token_file_is_made_once_and_private(tmp_path):
    token = server_token(tmp_path)
    path = tmp_path / TOKEN_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) >= 40
    assert server_token(tmp_path) == token
    path.chmod(0o644)
    assert server_token(tmp_path) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("short\n")
    with pytest.raises(RecordError, match="does not hold a token"):
        server_token(tmp_path)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RecordError, match=TOKEN_FILE):
        server_token(tmp_path)
    assert not (tmp_path / "elsewhere").exists()


# --- a real `guilds serve` -----------------------------------------------------------
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_guilds_serve_prints_its_url_and_keeps_the_data_folder_private(tmp_path):
    data = tmp_path / "data"
    proc = start_serve(data)
    try:
        lines = printed_lines(proc)
        app_line = next(line for line in lines if "?token=" in line)
        url = re.search(r"http://127\.0\.0\.1:\d+/\?token=(\S+)", app_line)
        assert url and url.group(1) == (data / TOKEN_FILE).read_text().strip()
        token, base = url.group(1), url.group(0).split("/?")[0]
        assert f'{base}/mcp with the header "Authorization: Bearer {token}"' in lines[-1]
        async with httpx2.AsyncClient(base_url=base) as c:
            assert (await c.get("/")).status_code == 401
            assert (await c.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)).status_code == 401
            login = await c.get(f"/?token={token}")
            assert login.status_code == 303 and login.headers["location"] == "/"
            assert (await c.get("/")).status_code == 200  # the cookie
            c.cookies.clear()
            assert (await c.get("/", headers={"authorization": f"Bearer {token}"})).status_code == 200
            assert (
                await c.get("/", headers={"authorization": f"Bearer {token}", "host": "evil.example"})
            ).status_code == 400
    finally:
        stop_serve(proc)
    assert _mode(data) == 0o700 and _mode(data / TOKEN_FILE) == 0o600 and _mode(data / "guilds.db") == 0o600
    assert all(_mode(p) & 0o077 == 0 for p in data.glob("guilds.db*"))


def _app_url(lines: list[str]) -> tuple[str, str]:
    """(base, token) of the app's URL `guilds serve` printed."""
    url = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=(\S+)", "".join(lines))
    assert url, lines
    return url.group(1), url.group(3)


async def test_a_session_outlives_a_restart_and_ends_with_its_token(tmp_path):
    """Sessions live in the run record: after a restart the cookie still lets in; once the
    token is another (its file removed, a new one made at the start) it is refused."""
    data = tmp_path / "data"

    async def page(cookie: str) -> httpx2.Response:
        async with httpx2.AsyncClient(base_url=base) as c:
            return await c.get("/", headers={"cookie": f"guilds-session-{base.rsplit(':', 1)[1]}={cookie}"})

    proc = start_serve(data)
    try:
        base, token = _app_url(printed_lines(proc))
        async with httpx2.AsyncClient(base_url=base) as c:
            session = (await c.get(f"/?token={token}")).cookies[f"guilds-session-{base.rsplit(':', 1)[1]}"]
            assert (await c.get("/")).status_code == 200
    finally:
        stop_serve(proc)
    proc = start_serve(data)
    try:
        base, same = _app_url(printed_lines(proc))
        assert same == token and (await page(session)).status_code == 200  # under the new port's name too
    finally:
        stop_serve(proc)
    (data / TOKEN_FILE).unlink()
    proc = start_serve(data)
    try:
        base, new_token = _app_url(printed_lines(proc))
        old = await page(session)
        assert new_token != token and old.status_code == 401 and "the token changed" in old.text
        async with httpx2.AsyncClient(base_url=base) as c:
            assert (await c.get(f"/?token={new_token}")).status_code == 303
            assert (await c.get("/")).status_code == 200
    finally:
        stop_serve(proc)


async def test_a_non_loopback_bind_without_the_token_is_refused(tmp_path):
    proc = start_serve(tmp_path / "data", "--host", "0.0.0.0", "--no-token")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err == "guilds: --no-token: serving on 0.0.0.0 (not a loopback address) needs the token\n"


async def test_a_non_loopback_bind_keeps_the_host_and_origin_checks(tmp_path):
    proc = start_serve(tmp_path / "data", "--host", "0.0.0.0")
    try:
        lines = printed_lines(proc)
        assert any("whoever has the token runs commands as the agent" in line for line in lines)
        port = re.search(r":(\d+)/\?token=", "".join(lines)).group(1)
        token = (tmp_path / "data" / TOKEN_FILE).read_text().strip()
        auth = {"authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            assert (await c.get("/")).status_code == 401
            assert (await c.get("/", headers=auth)).status_code == 200
            assert (await c.get("/", headers={**auth, "host": f"evil.example:{port}"})).status_code == 400
            evil = await c.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth, "origin": "http://evil.example"})
            assert evil.status_code == 403
            ok = await c.post("/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth})
            assert ok.status_code == 200
    finally:
        stop_serve(proc)


async def test_guilds_call_makes_the_data_folder_and_the_record_private(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nhome = "{tmp_path / "home"}"\nsandbox = "local"\n')
    env = {**os.environ, "GUILDS_DATA": str(tmp_path / "data")}
    env.pop("GUILDS_DATABASE_URL", None)
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    (old / "guilds.db").touch(mode=0o644)
    for data in (tmp_path / "data", old):
        done = subprocess.run([sys.executable, "-m", "guilds.fronts.cli", "call", "shell", '{"command": "true"}',
                               "--config", str(config)], check=False, env={**env, "GUILDS_DATA": str(data)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert _mode(data) == 0o700 and _mode(data / "guilds.db") == 0o600, data
        assert all(_mode(p) & 0o077 == 0 for p in data.glob("guilds.db*"))
