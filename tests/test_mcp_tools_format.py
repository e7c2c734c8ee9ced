"""`guilds tools --format mcp` prints what the MCP front serves in tools/list, byte for byte."""

from __future__ import annotations

import json

from guilds.fronts.cli import main
from guilds.fronts.mcp_server import build_server
from toolbox_kit import local_toolbox


async def test_the_mcp_format_is_what_tools_list_serves(capsys, tmp_path):
    assert main(["tools", "--format", "mcp"], env={"GUILDS_DATA": str(tmp_path / "data")}) == 0
    printed = json.loads(capsys.readouterr().out)
    async with local_toolbox(tmp_path) as toolbox:
        served = await build_server(toolbox).list_tools()
    assert printed == [tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in served]
    for tool in printed:
        assert tool["inputSchema"]["properties"]["run"]["type"] == "string"
        assert "run" not in tool["inputSchema"]["required"]
