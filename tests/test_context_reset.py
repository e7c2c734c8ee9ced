"""Reads that stay honest after the model's context was compacted or rewound.

Toolbox.context_reset and call(context_reset=True) over the real local sandbox
and real SQLite (and PostgreSQL where $GUILDS_TEST_POSTGRES_URL names one); the
MCP `_meta` key through the official SDK client over HTTP; the CLI flag in process.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
from mcp import Client

from guilds.errors import BadInput
from guilds.fronts.mcp_server import CONTEXT_RESET_KEY, RUN_KEY, streamable_http_app
from guilds.record.schema import metadata
from guilds.record.store import Store
from test_cli import config, run
from test_mcp_http import serving
from toolbox_kit import local_toolbox

PG_URL = os.environ.get("GUILDS_TEST_POSTGRES_URL")
POINTER = "unchanged since step"


def lines(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "home"
    path.mkdir()
    (path / "big.txt").write_text(lines(300))
    return path


async def test_a_read_inside_an_earlier_range_points_to_it(tmp_path, home):
    async with local_toolbox(tmp_path) as tb:
        first = await tb.call("r", "file_read", {"path": "big.txt"})
        assert first.meta["range"] == [1, 200]
        inside = await tb.call("r", "file_read", {"path": "big.txt", "offset": 10, "limit": 41})
        assert inside.text.startswith("big.txt lines 10–50: unchanged since step 1; read that result.")
        assert inside.meta["repeat_of"] == 1
        past = await tb.call("r", "file_read", {"path": "big.txt", "offset": 190, "limit": 20})
        assert past.text.startswith("big.txt lines 190–209 of 300\n") and "repeat_of" not in past.meta


async def test_after_a_reset_the_first_read_returns_content_then_points_again(tmp_path, home):
    async with local_toolbox(tmp_path) as tb:
        await tb.call("r", "file_read", {"path": "big.txt"})
        assert POINTER in (await tb.call("r", "file_read", {"path": "big.txt"})).text
        assert await tb.context_reset("r") == 2
        again = await tb.call("r", "file_read", {"path": "big.txt"})
        assert again.text.startswith("big.txt lines 1–200 of 300\n") and "repeat_of" not in again.meta
        after = await tb.call("r", "file_read", {"path": "big.txt", "offset": 5, "limit": 5})
        assert after.meta["repeat_of"] == 3  # the read after the reset, never step 1
        # another run is not touched
        await tb.call("other", "file_read", {"path": "big.txt"})
        assert (await tb.call("other", "file_read", {"path": "big.txt"})).meta["repeat_of"] == 1


async def test_the_call_flag_resets_before_the_call(tmp_path, home):
    async with local_toolbox(tmp_path) as tb:
        await tb.call("r", "file_read", {"path": "big.txt"})
        fresh = await tb.call("r", "file_read", {"path": "big.txt"}, context_reset=True)
        assert "repeat_of" not in fresh.meta and fresh.text.startswith("big.txt lines 1–200 of 300\n")
        assert (await tb.call("r", "file_read", {"path": "big.txt"})).meta["repeat_of"] == 2


async def test_a_reset_is_in_the_run_record_for_every_process(tmp_path, home):
    async with Store(f"sqlite:///{tmp_path}/shared.db") as store:
        async with local_toolbox(tmp_path, store=store) as one:
            await one.call("r", "file_read", {"path": "big.txt"})
            await one.context_reset("r")
        async with local_toolbox(tmp_path, store=store) as two:
            assert "repeat_of" not in (await two.call("r", "file_read", {"path": "big.txt"})).meta


async def test_a_reset_of_a_new_run_and_a_bad_run_id(tmp_path, home):
    async with local_toolbox(tmp_path) as tb:
        assert await tb.context_reset("fresh") == 0
        await tb.call("fresh", "file_read", {"path": "big.txt"})
        assert (await tb.call("fresh", "file_read", {"path": "big.txt"})).meta["repeat_of"] == 1
        with pytest.raises(BadInput, match="run id"):
            await tb.context_reset("../x")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_the_store_keeps_the_latest_mark(tmp_path, backend):
    if backend == "postgresql" and not PG_URL:
        pytest.skip("GUILDS_TEST_POSTGRES_URL is not set")
    store = Store(f"sqlite:///{tmp_path}/m.db" if backend == "sqlite" else PG_URL)
    if backend == "postgresql":
        async with store.engine.begin() as conn:
            await conn.run_sync(metadata.drop_all)
    async with store:
        now = datetime.now(UTC)
        assert await store.context_reset_seq("r") == 0
        for seq in (1, 2, 3):
            slot = await store.begin_call(run_id="r", agent_id="a", tool="shell", args={}, call_id=f"c{seq}",
                                          started_at=now, budget=10)
            assert slot.seq == seq
            if seq == 2:
                assert await store.mark_context_reset("r", now) == 2
        assert await store.context_reset_seq("r") == 2
        assert await store.mark_context_reset("r", now) == 3
        assert await store.context_reset_seq("r") == 3 and await store.context_reset_seq("s") == 0


async def test_the_mcp_meta_key(tmp_path, home):
    async with local_toolbox(tmp_path) as tb, serving(streamable_http_app(tb)) as url:
        run_meta = {RUN_KEY: "mcp-reset"}
        async with Client(url, read_timeout_seconds=60) as client:
            await client.call_tool("file_read", {"path": "big.txt"}, meta=run_meta)
            repeat = await client.call_tool("file_read", {"path": "big.txt"}, meta=run_meta)
            assert POINTER in repeat.content[0].text
            fresh = await client.call_tool("file_read", {"path": "big.txt"},
                                           meta={**run_meta, CONTEXT_RESET_KEY: True})
            assert fresh.content[0].text.startswith("big.txt lines 1–200 of 300\n")
            not_true = await client.call_tool("file_read", {"path": "big.txt"},
                                              meta={**run_meta, CONTEXT_RESET_KEY: "yes"})
            assert POINTER in not_true.content[0].text  # only true resets


def test_the_cli_flag(capsys, tmp_path):
    cfg = str(config(tmp_path))
    (tmp_path / "home").mkdir()
    (tmp_path / "home/a.txt").write_text(lines(3))
    args = ["call", "file_read", '{"path": "a.txt"}', "--config", cfg, "--run", "r1", "--json"]
    for expected in (False, True):
        code, out, _ = run(capsys, tmp_path, *args)
        assert code == 0 and ("repeat_of" in json.loads(out)["meta"]) is expected
    code, out, _ = run(capsys, tmp_path, *args, "--context-reset")
    assert code == 0 and "repeat_of" not in json.loads(out)["meta"]
    code, out, _ = run(capsys, tmp_path, *args)
    assert json.loads(out)["meta"]["repeat_of"] == 3
