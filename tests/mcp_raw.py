"""Raw 2026-07-28 requests to `/mcp`: what a client of the current revision puts on the wire
(no handshake, no session; the envelope in each request's ``_meta``), without any SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx2

TASKS = "io.modelcontextprotocol/tasks"
VERSION = "2026-07-28"


def envelope(method: str, params: dict[str, Any], *, tasks: bool = False, request_id: int = 1) -> dict:
    capabilities = {"extensions": {TASKS: {}}} if tasks else {}
    meta = {"io.modelcontextprotocol/protocolVersion": VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": capabilities,
            **params.pop("_meta", {})}
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": meta}}


def _last_message(stream: str) -> dict:
    """The last `message` event's JSON of a response the server sent as a stream (it does so
    when the answer takes long enough for a keep-alive comment to go first)."""
    data = [line[len("data:"):].strip() for line in stream.splitlines() if line.startswith("data:")]
    assert data, stream
    return json.loads(data[-1])


class RawClient:
    """POSTs one self-contained request at a time; ``token``: the bearer header."""

    def __init__(self, url: str, token: str | None = None, *, tasks: bool = True):
        self.url, self.tasks = url, tasks
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    async def post(self, method: str, params: dict[str, Any], *, name: str | None = None,
                   tasks: bool | None = None) -> dict:
        """The JSON-RPC response (``result`` or ``error``) of one request."""
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
                   "mcp-protocol-version": VERSION, "mcp-method": method, **self.headers}
        if name is not None:
            headers["mcp-name"] = name
        message = envelope(method, dict(params), tasks=self.tasks if tasks is None else tasks)
        async with httpx2.AsyncClient(timeout=60) as http:
            response = await http.post(self.url, json=message, headers=headers)
        assert response.status_code in (200, 400, 404), (response.status_code, response.text)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return _last_message(response.text)
        return response.json()

    async def call(self, tool: str, arguments: dict[str, Any], **kw: Any) -> dict:
        """A tools/call's result (asserting it is not a protocol error)."""
        answer = await self.post("tools/call", {"name": tool, "arguments": arguments}, name=tool, **kw)
        assert "result" in answer, answer
        return answer["result"]

    async def task(self, method: str, task_id: str, **kw: Any) -> dict:
        """tasks/get, tasks/update or tasks/cancel of task_id: the whole response."""
        params: dict[str, Any] = {"taskId": task_id}
        if method == "tasks/update":
            params["inputResponses"] = {}
        return await self.post(method, params, name=task_id, **kw)
