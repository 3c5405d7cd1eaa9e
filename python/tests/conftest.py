"""Shared fixtures: a local OpenAI Chat Completions mock (standard library only) and aimock,
an independent mock of the real provider APIs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


class _Mock(BaseHTTPRequestHandler):
    """Answers each request with the next scripted turn, chosen by how many assistant
    messages it carries (from ``by_model[model]`` when the request's model has turns of its
    own, else from ``turns``); records every request and its headers."""

    turns: list[dict[str, Any]] = []
    by_model: dict[str, list[dict[str, Any]]] = {}
    requests: list[dict[str, Any]] = []
    headers_seen: list[dict[str, str]] = []
    url = ""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        type(self).headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        turns = self.by_model.get(body.get("model"), self.turns)
        spec = turns[min(turn, len(turns) - 1)]
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
    handler = type("Handler", (_Mock,), {"turns": [], "by_model": {}, "requests": [], "headers_seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", handler.url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    try:
        yield handler
    finally:
        server.shutdown()


class Aimock:
    """A running aimock (npm @copilotkit/aimock, the version scripts/test pins) and its journal."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"

    def journal(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/__aimock/journal", timeout=10) as answer:
            return list(json.load(answer))


@pytest.fixture
def aimock(tmp_path: Path) -> Iterator[Callable[[list[dict[str, Any]]], Aimock]]:
    """Starts aimock on the fixtures given; skips when it is not installed (fails under CI,
    where scripts/test installs it and exports AIMOCK_CLI)."""
    cli = os.environ.get("AIMOCK_CLI")
    node = shutil.which("node")
    if not cli or not Path(cli).is_file() or node is None:
        if os.environ.get("CI") == "true":
            pytest.fail("aimock is missing: scripts/test installs it and exports AIMOCK_CLI")
        pytest.skip("aimock is not installed (set AIMOCK_CLI to its dist/cli.js)")
    started: list[subprocess.Popen[bytes]] = []

    def start(fixtures: list[dict[str, Any]]) -> Aimock:
        (tmp_path / "fixtures.json").write_text(json.dumps({"fixtures": fixtures}))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        process = subprocess.Popen(
            [node, cli, "-p", str(port), "-h", "127.0.0.1", "-f", str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(process)
        server = Aimock(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                server.journal()
                return server
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"aimock did not start on port {port}") from None
                time.sleep(0.1)

    try:
        yield start
    finally:
        for process in started:
            process.kill()
            process.wait()
