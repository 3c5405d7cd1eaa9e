"""A mock OpenAI Chat Completions server for bench/python.sh: answers at once, STEPS calls of
`add` then "done", chosen by how many assistant messages the request carries (streamed or
not). Standard library only.

Usage: python mock_openai.py PORT STEPS
"""

import json
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, STEPS = int(sys.argv[1]), int(sys.argv[2])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's algorithm and
        # delayed ACKs stall every response ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        turn = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        message = {"role": "assistant", "content": "done" if turn >= STEPS else ""}
        finish = "stop"
        if turn < STEPS:
            finish = "tool_calls"
            message["tool_calls"] = [{"index": 0, "id": f"call_{turn}", "type": "function",
                                      "function": {"name": "add", "arguments": json.dumps({"a": turn, "b": 1})}}]
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if body.get("stream"):
            chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock",
                       "choices": [{"index": 0, "delta": message, "finish_reason": None}]},
                      {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock",
                       "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}]
            data = ("".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n").encode()
            kind = "text/event-stream"
        else:
            for call in message.get("tool_calls", []):
                call.pop("index")
            data = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "mock",
                               "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                               "usage": usage}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
