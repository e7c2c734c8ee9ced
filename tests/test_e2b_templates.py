"""E2B template builds (guilds.fronts.e2b.template_service), through the unmodified E2B Python
SDK's ``Template`` against a real `guilds serve --e2b`: a build's steps (COPY of uploaded
files, RUN, ENV, WORKDIR, USER) make a template whose sandboxes start with what they left;
its status and logs as the SDK polls them; a step that cannot be served or fails is the
build's error, naming it; the bounds refuse at their edge; one key never sees another's."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox, Template
from e2b.exceptions import BuildException, SandboxException

from e2b_kit import E2BServer, e2b_server
from guilds.limits import E2B_TEMPLATE_MAX_STEPS, E2B_TEMPLATE_UPLOAD_BYTES

pytestmark = [pytest.mark.slow, pytest.mark.backends("bwrap", "docker")]


@pytest.fixture(scope="module")
def server(backend, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"e2b-tpl-{backend}")
    (folder / "home").mkdir()
    (folder / "home" / "from-template.txt").write_text("template\n")
    with e2b_server(folder, backend, "[agents]\nmax_per_owner = 6\n") as served:
        yield served


@pytest.fixture
def env(server: E2BServer, monkeypatch):
    server.export(monkeypatch)


@pytest.fixture
def context(tmp_path: Path) -> Path:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "test.txt").write_text("This is a test file.")
    (folder / "symlink.txt").symlink_to("test.txt")
    (folder / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (folder / "run.sh").chmod(0o755)
    return tmp_path


def _name() -> str:
    return f"tpl-{secrets.token_hex(4)}"


def test_a_built_template_starts_its_sandboxes_with_what_its_steps_left(server, env, context):
    logs: list[str] = []
    template = (Template(file_context_path=str(context)).from_base_image()
                .copy("folder/*", "folder")
                .copy("folder/test.txt", "single/renamed.txt", mode=0o600)
                .set_envs({"GREETING": "hello there"})
                .run_cmd('cat folder/test.txt && echo "$GREETING" > made.txt')
                .set_workdir("/home/user/app")
                .run_cmd("pwd > where.txt")
                .make_symlink("../made.txt", "made-link"))
    name = _name()
    info = Template.build(template, name, skip_cache=True, on_build_logs=lambda entry: logs.append(entry.message))
    assert info.name == name and info.template_id
    assert any("This is a test file." in line for line in logs)  # a step's output, polled as it came
    assert any(line.startswith("Step 4/7: RUN") for line in logs)
    for ref in (name, info.template_id):
        box = Sandbox.create(ref, timeout=60)
        try:
            found = box.commands.run("cat made.txt app/where.txt folder/test.txt; readlink folder/symlink.txt; "
                                     "./folder/run.sh; stat -c %a single/renamed.txt; readlink app/made-link; "
                                     "cat from-template.txt; echo \"$GREETING\"").stdout
            assert found.split("\n") == ["hello there", "/home/user/app", "This is a test file.test.txt", "ran",
                                         "600", "../made.txt", "template", "hello there", ""]
        finally:
            box.kill()
    assert Template.exists(name) and Template.exists("base") and not Template.exists(_name())


def test_a_template_built_from_another_starts_with_its_home(server, env):
    first = _name()
    Template.build(Template().from_base_image().run_cmd("echo one > one.txt").set_envs({"FIRST": "1"}), first)
    second = _name()
    Template.build(Template().from_template(first).run_cmd("cat one.txt > two.txt"), second)
    box = Sandbox.create(second, timeout=60)
    try:
        assert box.commands.run('cat two.txt; echo "$FIRST"').stdout == "one\n1\n"
    finally:
        box.kill()


def test_a_new_build_of_a_name_replaces_the_former_one(server, env):
    name = _name()
    first = Template.build(Template().from_base_image().run_cmd("echo 1 > v.txt"), name)
    second = Template.build(Template().from_base_image().run_cmd("echo 2 > v.txt"), name)
    assert first.template_id == second.template_id and first.build_id != second.build_id
    box = Sandbox.create(name, timeout=60)
    try:
        assert box.files.read("v.txt") == "2\n"
    finally:
        box.kill()


def test_a_templates_start_command_runs_in_each_sandbox_made_of_it_until_it_is_ready(server, env):
    name = _name()
    template = (Template().from_base_image().run_cmd("echo built > built.txt")
                .set_start_cmd("sleep 1 && cat built.txt > started.txt && exec sleep 300", "test -s started.txt"))
    Template.build(template, name)
    box = Sandbox.create(name, timeout=60)
    try:
        assert box.files.read("started.txt") == "built\n"  # ready when the create answers
        assert [p.tag for p in box.commands.list()] == ["start_cmd"]
    finally:
        box.kill()


def test_a_failing_step_is_the_builds_error_naming_it(server, env):
    with pytest.raises(BuildException, match=r"failed to run command 'echo out && false': exit status 1"):
        Template.build(Template().from_base_image().run_cmd("true").run_cmd("echo out && false"), _name())
    with pytest.raises(BuildException, match="invalid username: 'root123'"):
        Template.build(Template().from_base_image().run_cmd("whoami", user="root123"), _name())


def test_a_build_in_the_background_is_followed_by_its_status(server, env):
    template = Template().from_base_image().run_cmd("sleep 2 && echo slept")
    info = Template.build_in_background(template, _name())
    first = Template.get_build_status(info)
    assert first.status.value == "building"
    deadline = time.monotonic() + 120
    status = first
    while status.status.value == "building" and time.monotonic() < deadline:
        time.sleep(0.3)
        status = Template.get_build_status(info)
    assert status.status.value == "ready"
    later = Template.get_build_status(info, logs_offset=len(status.log_entries) - 1)
    assert [e.message for e in later.log_entries] == [status.log_entries[-1].message]


def test_builds_are_bounded_at_their_edge(server, env):
    steps = Template().from_base_image()
    for _ in range(E2B_TEMPLATE_MAX_STEPS - 1):
        steps = steps.set_envs({"A": "1"})
    Template.build(steps.run_cmd('test "$A" = 1'), _name())  # exactly the most steps
    with pytest.raises(BuildException, match=f"at most {E2B_TEMPLATE_MAX_STEPS} steps"):
        Template.build(steps.set_envs({"A": "1"}).set_envs({"B": "2"}), _name())


def test_an_upload_is_bounded_at_its_edge(server, env):
    headers = {"X-API-KEY": server.key}
    made = httpx.post(f"{server.url}/v3/templates", json={"name": _name()}, headers=headers).json()
    link = httpx.get(f"{server.url}/templates/{made['templateID']}/files/{'a' * 64}", headers=headers)
    assert link.status_code == 201 and link.json()["present"] is False
    url = link.json()["url"]
    assert httpx.put(url, content=b"\0" * (E2B_TEMPLATE_UPLOAD_BYTES + 1), timeout=120).status_code == 413
    assert httpx.put(url, content=b"\0" * E2B_TEMPLATE_UPLOAD_BYTES, timeout=120).status_code == 200
    assert httpx.get(f"{server.url}/templates/{made['templateID']}/files/{'a' * 64}",
                     headers=headers).json()["present"] is True
    unsigned = url.split("?")[0] + "?signature=" + "0" * 64
    refused = httpx.put(unsigned, content=b"x")
    assert refused.status_code == 401 and "invalid signature" in refused.json()["message"]


def test_builds_of_one_key_at_once_are_bounded(server, env):
    headers = {"X-API-KEY": server.key}
    started, made = [], []
    for _ in range(3):
        made.append(httpx.post(f"{server.url}/v3/templates", json={"name": _name()}, headers=headers).json())
        build = f"{server.url}/v2/templates/{made[-1]['templateID']}/builds/{made[-1]['buildID']}"
        started.append(httpx.post(build, json={"fromImage": "e2bdev/base", "steps": [
            {"type": "RUN", "args": ["sleep 3"]}]}, headers=headers))
    assert [a.status_code for a in started[:2]] == [202, 202]
    assert started[2].status_code == 429 and "E2B_TEMPLATE_BUILDS_PER_KEY" in started[2].json()["message"]
    for one in made[:2]:  # both end; then a build of the key starts again
        status = f"{server.url}/templates/{one['templateID']}/builds/{one['buildID']}/status"
        deadline = time.monotonic() + 120
        while httpx.get(status, headers=headers).json()["status"] == "building" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert httpx.get(status, headers=headers).json()["status"] == "ready"
    again = f"{server.url}/v2/templates/{made[2]['templateID']}/builds/{made[2]['buildID']}"
    assert httpx.post(again, json={"fromImage": "e2bdev/base"}, headers=headers).status_code == 202


def test_a_key_never_sees_anothers_template_and_a_deleted_one_is_gone(server, env, monkeypatch):
    name = _name()
    info = Template.build(Template().from_base_image().run_cmd("echo mine > mine.txt"), name)
    monkeypatch.setenv("E2B_API_KEY", server.other_key)
    assert not Template.exists(name)
    with pytest.raises(SandboxException, match=f"template '{name}' not found"):
        Sandbox.create(name, timeout=30)
    monkeypatch.setenv("E2B_API_KEY", server.key)
    headers = {"X-API-KEY": server.key}
    assert httpx.delete(f"{server.url}/templates/{info.template_id}", headers=headers).status_code == 204
    assert not Template.exists(name)
    with pytest.raises(SandboxException, match=f"template '{name}' not found"):
        Sandbox.create(name, timeout=30)


def _read(ref: str) -> str:
    box = Sandbox.create(ref, timeout=60)
    try:
        return box.files.read("v.txt")
    finally:
        box.kill()


def test_a_tag_names_one_build_of_a_template_at_a_time(server, env):
    name = _name()
    one = Template.build(Template().from_base_image().run_cmd("echo 1 > v.txt"), f"{name}:v1")
    two = Template.build(Template().from_base_image().run_cmd("echo 2 > v.txt"), name, tags=["v2", "stable"])
    assert one.tags == ["v1"] and two.tags == ["v2", "stable"] and one.template_id == two.template_id
    assert (_read(f"{name}:v1"), _read(f"{name}:stable"), _read(f"{one.template_id}:v2")) == ("1\n", "2\n", "2\n")
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(name, timeout=30)  # no build has the tag default
    assert Template.exists(name)  # the name has builds
    assigned = Template.assign_tags(f"{name}:v1", ["stable", "default"])
    assert assigned.tags == ["stable", "default"]
    assert (_read(name), _read(f"{name}:stable"), _read(f"{name}:v2")) == ("1\n", "1\n", "2\n")
    listed = {(t.tag, t.build_id) for t in Template.get_tags(name)}
    assert {tag for tag, _ in listed} == {"v1", "stable", "default", "v2"}
    assert len({build for _, build in listed}) == 2
    Template.remove_tags(name, "v2")  # its build had no other tag: removed
    assert {t.tag for t in Template.get_tags(one.template_id)} == {"v1", "stable", "default"}
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(f"{name}:v2", timeout=30)
    for wrong in (":invalid", f"{name}:", "a:b"):
        with pytest.raises(Exception, match="400"):
            Template.assign_tags(f"{name}:v1", wrong)


def test_what_is_not_served_is_refused_naming_it(server, env):
    headers = {"X-API-KEY": server.key}
    listed = httpx.get(f"{server.url}/templates", headers=headers)
    assert listed.status_code == 501 and "not supported by this server" in listed.json()["message"]
    with pytest.raises(SandboxException, match="404"):
        Template.get_tags(_name())
    registry = {"fromImage": "private/x", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}}
    made = httpx.post(f"{server.url}/v3/templates", json={"name": _name()}, headers=headers).json()
    refused = httpx.post(f"{server.url}/v2/templates/{made['templateID']}/builds/{made['buildID']}", json=registry,
                         headers=headers)
    assert refused.status_code == 501 and "private registries" in refused.json()["message"]


@pytest.mark.backends("bwrap")
def test_on_bwrap_a_build_from_another_image_fails_at_its_base(server, env):
    with pytest.raises(BuildException, match=r"FROM ubuntu:22.04: a build on bwrap cannot start from an image"):
        Template.build(Template().from_image("ubuntu:22.04").run_cmd("true"), _name())
    with pytest.raises(BuildException, match=r"failed to run command 'touch /usr/x'"):
        Template.build(Template().from_base_image().run_cmd("touch /usr/x", user="root"), _name())
    assert os.path.exists("/usr") and not os.path.exists("/usr/x")
    with pytest.raises(BuildException, match=r"WORKDIR /app: /app cannot be made: a build here keeps only the home"):
        Template.build(Template().from_base_image().set_workdir("/app"), _name())


@pytest.mark.backends("docker")
def test_on_docker_a_build_is_an_image_its_root_steps_included(server, env):
    import docker

    client = docker.from_env()
    base = f"guilds-e2b-test-base:{secrets.token_hex(4)}"
    client.images.build(fileobj=__import__("io").BytesIO(
        b"FROM guilds-sandbox:latest\nUSER root\nRUN echo local > /etc/e2b-test-marker\n"), tag=base, pull=False)
    name = _name()
    try:
        with pytest.raises(BuildException, match=r"FROM ubuntu:22.04: the image is not on this machine's docker"):
            Template.build(Template().from_image("ubuntu:22.04").run_cmd("true"), _name())
        info = Template.build(Template().from_image(base)
                              .run_cmd('test "$(whoami)" = root && echo root-made > /usr/local/made', user="root")
                              .run_cmd("whoami > who.txt")
                              .run_cmd('test "$(ls /sys/class/net)" = lo')  # no network: the template has none
                              .set_workdir("/srv/app").run_cmd("touch here"), name)
        image = f"guilds-e2b-template:{info.template_id}-"
        assert [tag for found in client.images.list() for tag in found.tags if tag.startswith(image)] == [
            f"{image}{info.build_id.replace('-', '')[:12]}"]
        box = Sandbox.create(name, timeout=60)
        try:
            found = box.commands.run("cat /etc/e2b-test-marker /usr/local/made who.txt; ls /srv/app; whoami").stdout
            assert found == "local\nroot-made\nuser\nhere\nuser\n"
            with pytest.raises(CommandExitException, match="Permission denied"):  # the sandbox: no root
                box.commands.run("touch /usr/local/x", timeout=30)
        finally:
            box.kill()
        again = Template.build(Template().from_image(base).run_cmd("echo again > again.txt"), name)
        assert [tag for found in client.images.list() for tag in found.tags if tag.startswith(image)] == [
            f"{image}{again.build_id.replace('-', '')[:12]}"]  # the replaced build's image removed
    finally:
        client.images.remove(base, force=True)
        client.close()


@pytest.mark.backends("bwrap")
def test_a_built_template_outlives_the_servers_restart(backend, tmp_path, monkeypatch):
    (tmp_path / "home").mkdir()
    name = _name()
    with e2b_server(tmp_path, backend) as first:
        first.export(monkeypatch)
        Template.build(Template().from_base_image().run_cmd("echo kept > kept.txt"), f"{name}:v1")
    with e2b_server(tmp_path, backend) as second:  # the same data folder, a new server and key
        second.export(monkeypatch)
        assert Template.exists(name)
        box = Sandbox.create(f"{name}:v1", timeout=60)
        try:
            assert box.files.read("kept.txt") == "kept\n"
        finally:
            box.kill()


JS_SUITE = Path(__file__).parent / "e2b_js"


@pytest.mark.skipif(shutil.which("node") is None or not (JS_SUITE / "node_modules" / "e2b").is_dir(),
                    reason="node or the JS SDK is not installed: cd tests/e2b_js && npm ci")
def test_the_js_sdk_builds_a_template(server, context):
    env = {**server.env(), "E2B_TEST_CONTEXT": str(context), "E2B_TEST_NAME": _name(),
           "PATH": "/usr/local/bin:/usr/bin:/bin"}
    done = subprocess.run(["node", "templates.mjs"], cwd=JS_SUITE, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n") == ["ok build", "ok sandbox of the template", "ok exists", "ok a failing step", ""]
