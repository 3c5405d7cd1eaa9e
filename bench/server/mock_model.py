"""A mock OpenAI Chat Completions server for the server load benchmark: every answer takes
DELAY seconds, then streams a five-step tool loop and a final answer, chosen by how many
assistant messages the request carries. Standard library only.

Usage: python mock_model.py PORT DELAY_SECONDS
"""

import asyncio
import json
import sys

PORT, DELAY = int(sys.argv[1]), float(sys.argv[2])
CALLS = [
    ("write_file", {"file_path": "/notes.txt", "content": "one\ntwo\n"}),
    ("read_file", {"file_path": "/notes.txt"}),
    ("edit_file", {"file_path": "/notes.txt", "old_string": "two", "new_string": "three"}),
    ("ls", {"path": "/"}),
    ("read_file", {"file_path": "/notes.txt"}),
]
served = 0


def chunk(delta, finish=None):
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def answer(request):
    turn = sum(1 for m in request.get("messages", []) if m.get("role") == "assistant")
    if turn < len(CALLS):
        name, args = CALLS[turn]
        call = {"index": 0, "id": f"call_{turn}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}
        events = [chunk({"role": "assistant", "tool_calls": [call]}), chunk({}, "tool_calls")]
    else:
        events = [chunk({"role": "assistant", "content": "Done."}), chunk({}, "stop")]
    events.append({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "mock",
                   "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10,
                                            "total_tokens": 110}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return body.encode()


async def handle(reader, writer):
    global served
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            request = json.loads(await reader.readexactly(length)) if length else {}
            await asyncio.sleep(DELAY)
            body = answer(request)
            served += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT, backlog=4096)
    print(f"mock model on {PORT}", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
