"""A scripted stand-in for OpenAI's Chat Completions and Responses APIs (standard library only).

Each migration program carries its script in a module-level literal ``MOCK_SCRIPT``: a list of
rules, each ``{"when": {...}, "turns": [...]}``. A request is answered by the first rule whose
``when`` matches it, with the turn numbered by how many assistant turns the request's
conversation already holds (so a thread resumed from a checkpoint, or a subagent's own
conversation, gets the right answer whatever called the model before).

``when`` keys (all optional, all must hold):
  model                 the request's ``model`` equals this
  first_user_contains   the conversation's first user message contains this text
  last_user_contains    the conversation's last user message contains this text
  system_contains       a system/developer message (or ``instructions``) contains this text
  tool_offered          a tool of this name is offered
  tool_not_offered      no tool of this name is offered

A turn is ``{"text": "..."}``, ``{"calls": [[name, args], ...]}`` (with optional ``text``), or
``{"structured": {...}}``: a structured answer, given the way the request asks for it, as a
model would: the message text when a ``response_format`` JSON schema is asked for, else a call
of the one offered tool whose parameters are exactly the answer's fields (LangChain's
ToolStrategy, or another harness, offering the schema as a tool), else the JSON as text.

A request no rule matches, or whose turn is past the end of its rule's turns, gets HTTP 400
naming why, so a program fails loudly instead of looping.

    python mock_openai.py PROGRAM.py    serves PROGRAM's script and prints its base URL
"""

from __future__ import annotations

import ast
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def load_script(program: str | Path) -> list[dict[str, Any]]:
    """The ``MOCK_SCRIPT`` literal of a program file, read without running the program."""
    tree = ast.parse(Path(program).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MOCK_SCRIPT" for t in node.targets):
            script = ast.literal_eval(node.value)
            if not isinstance(script, list):
                raise ValueError(f"{program}: MOCK_SCRIPT must be a list of rules")
            return script
    raise ValueError(f"{program}: no MOCK_SCRIPT")


def _text(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


class Conversation:
    """What the rules look at, the same for both APIs."""

    def __init__(self, body: dict[str, Any], api: str) -> None:
        self.model = str(body.get("model", ""))
        self.users: list[str] = []
        self.systems: list[str] = []
        self.assistant_turns = 0
        self.tools: list[str] = []
        self.tool_parameters: dict[str, Any] = {}
        self.json_schema = False
        if api == "chat":
            for m in body.get("messages", []):
                role = m.get("role")
                if role == "user":
                    self.users.append(_text(m.get("content")))
                elif role in ("system", "developer"):
                    self.systems.append(_text(m.get("content")))
                elif role == "assistant":
                    self.assistant_turns += 1
            for t in body.get("tools") or []:
                function = t.get("function") or t
                self.tools.append(str(function.get("name", "")))
                self.tool_parameters[self.tools[-1]] = function.get("parameters") or {}
            self.json_schema = (body.get("response_format") or {}).get("type") == "json_schema"
        else:
            if body.get("instructions"):
                self.systems.append(_text(body["instructions"]))
            items = body.get("input")
            if isinstance(items, str):
                items = [{"role": "user", "content": items}]
            in_assistant = False
            for item in items or []:
                kind = item.get("type", "message")
                role = item.get("role")
                assistant = (kind == "message" and role == "assistant") or kind in ("function_call", "reasoning")
                if assistant and not in_assistant:
                    self.assistant_turns += 1
                in_assistant = assistant
                if kind == "message" and role == "user":
                    self.users.append(_text(item.get("content")))
                elif kind == "message" and role in ("system", "developer"):
                    self.systems.append(_text(item.get("content")))
            for t in body.get("tools") or []:
                function = t if t.get("name") else t.get("function") or {}
                self.tools.append(str(function.get("name", "")))
                self.tool_parameters[self.tools[-1]] = function.get("parameters") or {}
            self.json_schema = ((body.get("text") or {}).get("format") or {}).get("type") == "json_schema"

    def matches(self, when: dict[str, Any]) -> bool:
        for key, want in when.items():
            if key == "model":
                ok = self.model == want
            elif key == "first_user_contains":
                ok = bool(self.users) and want in self.users[0]
            elif key == "last_user_contains":
                ok = bool(self.users) and want in self.users[-1]
            elif key == "system_contains":
                ok = any(want in s for s in self.systems)
            elif key == "tool_offered":
                ok = want in self.tools
            elif key == "tool_not_offered":
                ok = want not in self.tools
            else:
                raise ValueError(f"unknown MOCK_SCRIPT condition {key!r}")
            if not ok:
                return False
        return True


class MockOpenAI:
    """The server: ``url`` is the base URL (ending in ``/v1``); ``requests`` records each
    request body with the API it came to; ``close()`` stops it."""

    def __init__(self, script: list[dict[str, Any]], host: str = "127.0.0.1", port: int = 0) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                path = self.path.split("?")[0].rstrip("/")
                api = "chat" if path.endswith("/chat/completions") else "responses" if path.endswith("/responses") else None
                with mock.lock:
                    mock.requests.append({"api": api, "path": self.path, "body": body})
                if api is None:
                    self._send(404, {"error": {"message": f"the mock serves /chat/completions and /responses, not {self.path}", "type": "invalid_request_error"}})
                    return
                try:
                    conversation = Conversation(body, api)
                    turn, number = mock.turn_for(conversation)
                except LookupError as error:
                    self._send(400, {"error": {"message": f"mock_openai: {error}", "type": "invalid_request_error", "code": "mock_script"}})
                    return
                if api == "chat":
                    self._chat(body, conversation, turn, number)
                else:
                    self._responses(body, conversation, turn, number)

            def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _chat(self, body: dict[str, Any], conversation: Conversation, turn: dict[str, Any], number: str) -> None:
                text, calls = _resolve(turn, conversation)
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if calls:
                    message["tool_calls"] = [
                        {"id": f"call_{number}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                        for i, (name, args) in enumerate(calls)
                    ]
                finish = "tool_calls" if calls else "stop"
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if not body.get("stream"):
                    self._send(200, {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": 0, "model": conversation.model, "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}], "usage": usage})
                    return
                base = {"id": f"chatcmpl-{number}", "object": "chat.completion.chunk", "created": 0, "model": conversation.model}
                deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
                deltas += [{"content": piece} for piece in _pieces(text)]
                for i, call in enumerate(message.get("tool_calls", [])):
                    deltas.append({"tool_calls": [dict(call, index=i)]})
                chunks = [dict(base, choices=[{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
                chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    chunks.append(dict(base, choices=[], usage=usage))
                payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(200, payload.encode(), "text/event-stream")

            def _responses(self, body: dict[str, Any], conversation: Conversation, turn: dict[str, Any], number: str) -> None:
                text, calls = _resolve(turn, conversation)
                output: list[dict[str, Any]] = []
                if text:
                    output.append({"type": "message", "id": f"msg_{number}", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]})
                for i, (name, args) in enumerate(calls):
                    output.append({"type": "function_call", "id": f"fc_{number}_{i}", "call_id": f"call_{number}_{i}", "name": name, "arguments": json.dumps(args), "status": "completed"})
                usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
                response = {
                    "id": f"resp_{number}", "object": "response", "created_at": 0, "status": "completed", "model": conversation.model,
                    "output": output, "usage": usage, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
                }
                if not body.get("stream"):
                    self._send(200, response)
                    return
                events: list[dict[str, Any]] = [{"type": "response.created", "response": dict(response, status="in_progress", output=[])}]
                for index, item in enumerate(output):
                    if item["type"] == "message":
                        events.append({"type": "response.output_item.added", "output_index": index, "item": dict(item, status="in_progress", content=[])})
                        events.append({"type": "response.content_part.added", "output_index": index, "item_id": item["id"], "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
                        for piece in _pieces(text):
                            events.append({"type": "response.output_text.delta", "output_index": index, "item_id": item["id"], "content_index": 0, "delta": piece})
                        events.append({"type": "response.output_text.done", "output_index": index, "item_id": item["id"], "content_index": 0, "text": text})
                        events.append({"type": "response.content_part.done", "output_index": index, "item_id": item["id"], "content_index": 0, "part": item["content"][0]})
                    else:
                        events.append({"type": "response.output_item.added", "output_index": index, "item": dict(item, status="in_progress", arguments="")})
                        events.append({"type": "response.function_call_arguments.delta", "output_index": index, "item_id": item["id"], "delta": item["arguments"]})
                        events.append({"type": "response.function_call_arguments.done", "output_index": index, "item_id": item["id"], "arguments": item["arguments"]})
                    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
                events.append({"type": "response.completed", "response": response})
                payload = "".join(f"event: {e['type']}\ndata: {json.dumps(dict(e, sequence_number=n))}\n\n" for n, e in enumerate(events))
                self._send(200, payload.encode(), "text/event-stream")

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://{host}:{self.server.server_address[1]}/v1"

    def turn_for(self, conversation: Conversation) -> tuple[dict[str, Any], str]:
        for number, rule in enumerate(self.script):
            if conversation.matches(rule.get("when") or {}):
                turns = rule["turns"]
                if conversation.assistant_turns >= len(turns):
                    raise LookupError(
                        f"rule {number} has {len(turns)} turns but the conversation already holds {conversation.assistant_turns} assistant turns"
                    )
                return turns[conversation.assistant_turns], f"{number}_{conversation.assistant_turns}"
        first = conversation.users[0][:80] if conversation.users else ""
        raise LookupError(f"no rule matches the request (model {conversation.model!r}, first user message {first!r}, tools {conversation.tools})")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pieces(text: str) -> list[str]:
    """The text in a few stream chunks (word by word)."""
    if not text:
        return []
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def _resolve(turn: dict[str, Any], conversation: Conversation) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """The text and tool calls a turn answers with."""
    if "structured" in turn:
        answer = dict(turn["structured"])
        if not conversation.json_schema:
            # As a model would: call the offered tool whose parameters are the answer's fields.
            fitting = [name for name, schema in conversation.tool_parameters.items() if set((schema or {}).get("properties") or {}) == set(answer)]
            if len(fitting) == 1:
                return "", [(fitting[0], answer)]
        return json.dumps(answer), []
    calls = [(str(name), dict(args)) for name, args in turn.get("calls", [])]
    return str(turn.get("text", "")), calls


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python mock_openai.py PROGRAM.py")
    server = MockOpenAI(load_script(sys.argv[1]))
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.close()


if __name__ == "__main__":
    main()
