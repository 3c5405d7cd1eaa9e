"""Shared fixtures: a local OpenAI Chat Completions mock (standard library only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest


class _Mock(BaseHTTPRequestHandler):
    """Answers each request with the next scripted turn, chosen by how many assistant
    messages it carries; records every request."""

    turns: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        spec = self.turns[min(turn, len(self.turns) - 1)]
        message: dict[str, Any] = {"role": "assistant", "content": spec.get("text", "")}
        if "call" in spec:
            name, args = spec["call"]
            message["tool_calls"] = [{"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]
        if body.get("stream"):
            delta = dict(message)
            if "tool_calls" in delta:
                delta["tool_calls"] = [dict(delta["tool_calls"][0], index=0)]
            chunks = [
                {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if "call" in spec else "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}},
            ]
            payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            data = payload.encode()
            content_type = "text/event-stream"
        else:
            data = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "mock", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if "call" in spec else "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
            content_type = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def openai_mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Mock]]:
    handler = type("Handler", (_Mock,), {"turns": [], "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield handler
    finally:
        server.shutdown()
