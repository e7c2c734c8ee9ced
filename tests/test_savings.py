"""What shaping saved: the metadata of real calls (Toolbox.call, local sandbox, SQLite),
the app's row notes, Metadata rows and the run's totals and bar, and the pure texts by table."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import httpx2
import pytest

from guilds.record.values import CallRecord
from guilds.web.savings_view import BAR_WIDTH, metadata_rows, row_savings, run_savings, size, tokens
from toolbox_kit import local_toolbox
from web_kit import AUTH, SECRET, served


def record(seq: int, text: str | None, meta: dict | None) -> CallRecord:
    now = datetime.now(UTC)
    return CallRecord(run_id="r", seq=seq, call_id=f"c{seq}", tool="shell", args={}, text=text, is_error=False,
                      meta=meta, cut=False, counted=True, status="done" if text is not None else "running",
                      started_at=now, finished_at=now, duration_ms=1, row="Run x")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KB"), (8294, "8.1 KB"),
                                     (10 * 1024, "10 KB"), (1024 * 1024, "1.0 MB"), (50 * 1024 * 1024, "50 MB")])
def test_size(n, text):
    assert size(n) == text


@pytest.mark.parametrize("meta, text", [
    ({}, ""), (None, ""), ({"bytes_elided": 0}, ""), ({"bytes_elided": True}, ""),
    ({"bytes_elided": 8294}, "8.1 KB elided"),
    ({"pointer_bytes_saved": 2048}, "2.0 KB saved by a pointer"),
    ({"secrets_redacted": 1}, "1 secret redacted"),
    ({"bytes_elided": 100, "secrets_redacted": 3}, "100 B elided · 3 secrets redacted"),
])
def test_row_savings(meta, text):
    assert row_savings(meta) == text


def test_metadata_rows():
    meta = {"bytes_elided": 30027, "error_lines": [1201, 1502], "pointer_bytes_saved": 5, "secrets_redacted": 2}
    assert metadata_rows(meta) == [("Bytes elided", "30,027"), ("Error lines in the log", "1201, 1502"),
                                   ("Bytes saved by the pointer", "5"), ("Secrets redacted", "2")]
    assert metadata_rows({"exit_code": 0}) == []


def test_run_totals_and_the_bar():
    calls = [record(1, "a" * 1000, {"bytes_elided": 3000, "secrets_redacted": 2}),
             record(2, "b" * 100, {"pointer_bytes_saved": 900}),
             record(3, "é" * 50, {}),  # 100 bytes
             record(4, None, {"bytes_elided": 10**6})]  # running: not counted
    totals = run_savings(calls)
    assert (totals.produced, totals.returned, totals.elided, totals.pointer_saved, totals.secrets) == (
        5100, 1200, 3000, 900, 2)
    assert totals.saved == 3900 and totals.tokens == "≈ 975 tokens (estimate: bytes ÷ 4)"
    assert totals.returned_width == round(BAR_WIDTH * 1200 / 5100)
    assert totals.parts == "2.9 KB elided · 900 B saved by pointers · 2 secrets redacted"
    empty = run_savings([])
    assert (empty.produced, empty.returned_width, empty.parts) == (0, BAR_WIDTH, "")
    assert tokens(6) == "≈ 2 tokens (estimate: bytes ÷ 4)"


# --- real calls ---------------------------------------------------------------------------
async def test_call_metadata_says_what_shaping_did(tmp_path):
    async with local_toolbox(tmp_path, secrets={"API_KEY": SECRET}) as tb:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        (home / "f.txt").write_text("".join(f"row {i}\n" for i in range(1, 101)))
        long = await tb.call("r", "shell", {"command": "seq 1 20000; echo $API_KEY; echo $API_KEY"})
        assert long.meta["bytes_elided"] > 100_000 and long.meta["secrets_redacted"] == 2
        plain = await tb.call("r", "shell", {"command": "echo hi"})
        assert not {"bytes_elided", "secrets_redacted", "pointer_bytes_saved"} & set(plain.meta)
        first = await tb.call("r", "file_read", {"path": "f.txt"})
        again = await tb.call("r", "file_read", {"path": "f.txt", "offset": 10, "limit": 5})
        assert again.meta["repeat_of"] == 3
        assert again.meta["pointer_bytes_saved"] == len(first.text.encode()) - len(again.text.encode())
        assert "pointer_bytes_saved" not in first.meta


async def test_the_app_shows_savings_on_rows_and_the_run(tmp_path):
    async with (
        served(tmp_path) as s,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=s.app), base_url="http://127.0.0.1", headers=AUTH) as c,
    ):
        page = (await c.get("/runs/run1")).text
        notes = re.findall(r'<span class="saved">(.*?)</span>', page)
        elided = re.fullmatch(r"\d+ KB elided · (\d+) secrets redacted", notes[0])
        assert elided and int(elided.group(1)) > 100, notes  # one per line of the head and the tail
        assert re.fullmatch(r"\d+ B saved by a pointer", notes[1]), notes
        assert notes[2] == "1 secret redacted"
        section = re.search(r'<section class="savings".*?</section>', page, re.S).group(0)
        assert '<svg class="bar" width="200"' in section and '<rect class="returned"' in section
        figures = re.search(r'<span class="figures">(.*?)</span>', section).group(1)
        assert re.fullmatch(r"[\d.]+ KB returned of [\d.]+ KB produced: [\d.]+ KB saved, "
                            r"≈ [\d,]+ tokens \(estimate: bytes ÷ 4\)", figures), figures
        assert "elided · " in section and "saved by pointers" in section
        assert f"{int(elided.group(1)) + 1} secrets redacted" in section
        meta = (await c.get("/runs/run1/calls/1?view=metadata")).text
        assert "<dt>Bytes elided</dt>" in meta and "<dt>Secrets redacted</dt>" in meta
