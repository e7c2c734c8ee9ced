"""The E2B front's parts without a server: keys, routing, Connect framing at its limits,
the CLI's refusals, and the in-sandbox service (the built helper under `python3 -I`)
against an attacker's paths."""

from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from guilds.config.settings import load_settings
from guilds.errors import ConfigError
from guilds.fronts.cli import main as cli_main
from guilds.fronts.e2b import is_e2b_path
from guilds.fronts.e2b.connect import ConnectError, end_stream, envelope, json_object, stream_request, unary_request
from guilds.fronts.e2b.envd_channel import Lines
from guilds.fronts.e2b.keys import Keys, api_key
from guilds.limits import E2B_ENVD_LINE_BYTES, E2B_MAX_JSON_DEPTH, E2B_MAX_MESSAGE_BYTES
from guilds_code.limits import PATH_MAX_DEPTH


def test_a_key_is_made_from_the_token_and_its_name():
    key = api_key("token-a", "default")
    assert key.startswith("e2b_") and len(key) == 44
    assert key == api_key("token-a", "default")
    assert len({key, api_key("token-b", "default"), api_key("token-a", "ci")}) == 3
    keys = Keys("token-a", ("ci",))
    assert keys.name_of(key) == "default" and keys.name_of(api_key("token-a", "ci")) == "ci"
    assert keys.name_of(api_key("token-b", "default")) is None
    assert keys.name_of("") is None and keys.name_of(None) is None
    with pytest.raises(ConfigError, match="--e2b-key 'a b'"):
        Keys("token-a", ("a b",))


def test_only_the_e2b_paths_go_to_the_e2b_routes():
    for path in ("/sandboxes", "/v2/sandboxes", "/sandboxes/i1/pause", "/process.Process/Start",
                 "/filesystem.Filesystem/Stat", "/files", "/health"):
        assert is_e2b_path(path), path
    for path in ("/", "/mcp", "/runs/e2b-i1", "/static/app.css", "/filesx", "/sandboxesx", "/healthz"):
        assert not is_e2b_path(path), path


def _stream_body(message: bytes, flags: int = 0, size: int | None = None) -> bytes:
    return struct.pack(">BI", flags, len(message) if size is None else size) + message


def test_connect_stream_requests_are_checked_to_the_byte():
    kind = "application/connect+json"
    assert stream_request(kind, _stream_body(b'{"a": 1}')) == {"a": 1}
    at_limit = b'{"a": "' + b"x" * (E2B_MAX_MESSAGE_BYTES - 10) + b'"}'
    assert len(at_limit) == E2B_MAX_MESSAGE_BYTES - 1
    assert stream_request(kind, _stream_body(at_limit + b" "))["a"].startswith("x")
    refused = [
        (_stream_body(at_limit + b"  "), "invalid_argument"),  # one byte over the limit
        (b"\x00\x00", "invalid_argument"),
        (_stream_body(b"{}", size=3), "invalid_argument"),
        (_stream_body(b"{}", flags=1), "unimplemented"),
        (_stream_body(b"[1]"), "invalid_argument"),
        (_stream_body(b"\xff"), "invalid_argument"),
    ]
    for body, code in refused:
        with pytest.raises(ConnectError) as caught:
            stream_request(kind, body)
        assert caught.value.code == code, body[:20]
    with pytest.raises(ConnectError) as caught:
        stream_request("application/proto", _stream_body(b"\x0a\x00"))
    assert caught.value.code == "unimplemented"


def test_connect_unary_requests_and_stream_ends():
    assert unary_request("application/json; charset=utf-8", b"") == {}
    with pytest.raises(ConnectError) as caught:
        unary_request("application/json", b"x" * (E2B_MAX_MESSAGE_BYTES + 1))
    assert caught.value.code == "resource_exhausted"
    assert end_stream() == b"\x02\x00\x00\x00\x02{}"
    assert json.loads(end_stream(ConnectError("not_found", "gone"))[5:]) == {
        "error": {"code": "not_found", "message": "gone"}}
    assert envelope({"a": 1})[:5] == b"\x00\x00\x00\x00\x07"


@pytest.mark.parametrize("argv, error", [
    (["--e2b", "--no-token"], "--e2b: the E2B keys are made from the endpoint's token; drop --no-token"),
    (["--e2b-key", "ci"], "--e2b-key: only with --e2b"),
    (["--e2b", "--e2b-sandboxes", "3"], "unrecognized arguments: --e2b-sandboxes 3"),  # the caps: [agents]
    (["--e2b-sleep-idle", "5"], "--e2b-sleep-idle: only with --e2b"),
    (["--e2b", "--e2b-sleep-idle", "-1"], "--e2b-sleep-idle: must be whole seconds from 0 to 604800, got '-1'"),
    (["--e2b", "--e2b-sleep-idle", "604801"],
     "--e2b-sleep-idle: must be whole seconds from 0 to 604800, got '604801'"),
])
def test_the_cli_refuses_e2b_without_what_it_needs(tmp_path, capsys, argv, error):
    env = {"GUILDS_DATA": str(tmp_path / "data"), "HOME": str(tmp_path)}
    try:
        code = cli_main(["serve", "--sandbox", "local", *argv], env)
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(error)


# --- the in-sandbox service, as an attacker drives it -------------------------------

class Envd:
    """The built helper's envd on a home, one request at a time."""

    def __init__(self, helper: Path, home: Path, *options: str):
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(helper), "envd", str(home), *options],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=home)
        self.ids = 0

    def __call__(self, op: str, **fields) -> dict:
        self.ids += 1
        self.proc.stdin.write((json.dumps({"id": self.ids, "op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.ids:
                return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture
def envd(helper_path, tmp_path):
    home, outside = tmp_path / "home", tmp_path / "outside"
    home.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (home / "out").symlink_to(outside)
    (home / "out-file").symlink_to(outside / "secret.txt")
    (home / "mine.txt").write_text("mine")
    service = Envd(helper_path, home)
    yield service, home, outside
    service.close()


def _code(reply: dict) -> str | None:
    return reply.get("error", {}).get("code")


def test_the_service_refuses_every_way_out_of_the_home(envd):
    service, home, outside = envd
    b64 = base64.b64encode(b"planted").decode()
    attempts = [
        ("write", {"path": "out/planted.txt", "b64": b64}),
        ("write", {"path": "out-file", "b64": b64}),
        ("write", {"path": str(outside / "planted.txt"), "b64": b64}),
        ("write", {"path": "../outside/planted.txt", "b64": b64}),
        ("make_dir", {"path": "out/newdir"}),
        ("move", {"source": "mine.txt", "destination": "out/moved.txt"}),
        ("move", {"source": "out/secret.txt", "destination": "stolen.txt"}),
        ("read", {"path": "out-file"}),
        ("read", {"path": "/proc/self/root" + str(outside / "secret.txt")}),
        ("list_dir", {"path": "out"}),
        ("stat", {"path": "/etc/passwd"}),
    ]
    for op, fields in attempts:
        reply = service(op, **fields)
        assert _code(reply) == "permission_denied", (op, fields, reply)
        assert "outside the home" in reply["error"]["message"]
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret"
    assert (home / "mine.txt").read_text() == "mine"


def test_removing_a_link_removes_the_link_only(envd):
    service, home, outside = envd
    assert service("remove", path="out") == {"id": service.ids, "ok": {}}
    assert service("remove", path="out-file") == {"id": service.ids, "ok": {}}
    assert not os.path.lexists(home / "out") and (outside / "secret.txt").read_text() == "secret"


def test_a_sigkill_is_answered_once_the_command_is_reaped(envd):
    service = envd[0]
    for _ in range(20):  # a zombie left at the answer would still take signal 0
        pid = service("start", cmd="/bin/sleep", args=["60"])["ok"]["pid"]
        assert service("signal", pid=pid, signal="SIGNAL_SIGKILL") == {"id": service.ids, "ok": {}}
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_bad_requests_are_one_line_errors(envd):
    service, _, _ = envd
    assert _code(service("start", cmd=["not", "a", "string"])) == "invalid_argument"
    assert _code(service("start", cmd="/no/such/program")) == "invalid_argument"
    assert _code(service("signal", pid=1, signal="SIGNAL_SIGKILL")) == "not_found"
    assert _code(service("input", pid=1, b64="")) == "not_found"
    assert _code(service("read", path="mine.txt\0x")) == "invalid_argument"
    assert _code(service("nope")) == "unimplemented"
    started = service("start", cmd="/bin/sleep", args=["30"], stdin=True)["ok"]
    assert _code(service("input", pid=started["pid"], b64="!!not base64!!")) == "invalid_argument"
    assert _code(service("signal", pid=started["pid"], signal="SIGNAL_SIGSTOP")) == "invalid_argument"
    assert service("stop_all")["ok"] == {}


def test_a_path_too_deep_to_make_is_refused_and_the_service_serves_on(envd):
    service, home, _ = envd
    deepest = "/".join(["d"] * 1500)
    reply = service("make_dir", path=deepest)
    assert _code(reply) == "invalid_argument" and "folders to make" in reply["error"]["message"]
    assert not (home / "d").exists()  # refused before any folder was made
    at_limit = "/".join(["e"] * PATH_MAX_DEPTH)
    assert service("make_dir", path=at_limit)["ok"]["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    assert service("make_dir", path=at_limit + "/f")["ok"]["entry"]["name"] == "f"
    assert _code(service("make_dir", path=at_limit + "/f/g")) == "invalid_argument"  # deeper than a path may go
    assert _code(service("list_dir", path=".", depth=10**6)) is None
    assert service("stat", path="mine.txt")["ok"]["entry"]["name"] == "mine.txt"


def test_json_nesting_is_bounded_at_its_edge():
    def nested(levels: int) -> bytes:  # the object itself is the first level
        return b'{"a": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"

    assert "a" in json_object(nested(E2B_MAX_JSON_DEPTH))
    for body in (nested(E2B_MAX_JSON_DEPTH + 1), nested(100_000)):
        with pytest.raises(ConnectError) as caught:
            json_object(body)
        assert caught.value.code == "invalid_argument" and caught.value.status == 400
        assert str(caught.value) == f"the request nests deeper than {E2B_MAX_JSON_DEPTH} levels"
    with pytest.raises(ConnectError) as proto:
        unary_request("application/proto", b"\x0a\x00")
    assert (proto.value.code, proto.value.status) == ("unimplemented", 415)


def test_the_service_channel_holds_no_line_past_its_bound():
    lines = Lines()
    assert lines.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert lines.feed(b':2}\n') == [b'{"b":2}']
    assert lines.feed(b"x" * E2B_ENVD_LINE_BYTES) == [] and len(lines.pending) == E2B_ENVD_LINE_BYTES  # at it: kept
    assert lines.feed(b"x") == [] and len(lines.pending) == 0  # past it: dropped, and what follows until a newline
    assert lines.feed(b"y" * 100_000) == [] and len(lines.pending) == 0
    assert lines.feed(b'yy\n{"c":3}\n') == [b'{"c":3}']


def _sandboxes(tmp_path, templates: str):
    from guilds.agents.registry import Agents
    from guilds.config.settings import read_toml
    from guilds.config.templates import parse_served
    from guilds.fronts.e2b.sandboxes import Sandboxes

    path = tmp_path / "server.toml"
    path.write_text(f"[agent]\nid = 'own'\nhome = 'home'\nsandbox = 'local'\n{templates}")
    own = load_settings(path, env={})
    served = parse_served(read_toml(path), tmp_path, {}, own)
    return Sandboxes(Agents(served, tmp_path / "data", store=None), "guilds")  # type: ignore[arg-type]


def test_template_ids_name_the_default_template_or_a_template_served(tmp_path):
    boxes = _sandboxes(tmp_path, "[templates.py.agent]\nhome = 'py'\n")
    assert boxes.templates() == ("base", "own", "py")
    assert [boxes.template_of(t) for t in ("base", "own", "py")] == ["default", "default", "py"]
    for unknown in ("default", "nope", ""):
        with pytest.raises(ConnectError, match=rf"^template '{unknown}' not found: this server serves 'base' and "
                                               r"'own' and 'py'$"):
            boxes.template_of(unknown)
    named = _sandboxes(tmp_path, "[templates.base.agent]\nhome = 'b'\n")  # the settings' own base
    assert named.templates() == ("own", "base") and named.template_of("base") == "base"


async def test_a_create_whose_process_service_fails_leaves_nothing_of_its_agent(tmp_path):
    from guilds.agents.registry import Agents
    from guilds.config.templates import served_by
    from guilds.fronts.e2b.sandboxes import Sandboxes
    from guilds.record import Store, database_url

    path = tmp_path / "server.toml"
    path.write_text("[agent]\nid = 'own'\nhome = 'home'\nsandbox = 'local'\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "kept.txt").write_text("the template's")
    data = tmp_path / "data"
    data.mkdir()
    async with Store(database_url(data, {})) as store:
        agents = await Agents.open(served_by(load_settings(path, env={}), path, {}), data, store)
        boxes = Sandboxes(agents, "guilds")

        async def failing(agent_id, sandbox):
            raise ConnectError("unavailable", "the process service did not start")

        boxes.open_envd = failing  # the create's one seam after the make
        with pytest.raises(ConnectError, match=r"^the process service did not start$"):
            await boxes.create("ci", "base", 60, {}, {})
        rows = await store.agents(statuses=("making", "live", "removed"))
        assert [(r.template, r.owner, r.status) for r in rows] == [("default", "e2b:ci", "removed")]
        assert list((data / "agent-homes").iterdir()) == [] and boxes.of_key("ci") == []
        assert (tmp_path / "home" / "kept.txt").read_text() == "the template's"
        await agents.close()


def test_agents_of_the_default_template_get_a_uid_of_their_own(tmp_path):
    boxes = _sandboxes(tmp_path, "[bwrap]\nuid = 4242\n")
    own = boxes.agents.served.template("default")
    assert own.settings.bwrap.uid == 4242  # the file's own agent keeps it
    made = own.for_agent("default-0123456789ab", tmp_path / "a")
    assert (made.id, made.bwrap.uid, made.bwrap.memory) == ("default-0123456789ab", 0, own.settings.bwrap.memory)
