"""The load of the server benchmark: RUNS concurrent runs, each on a new thread, spread
over the servers at URLS, through the official langgraph-sdk client; prints one JSON line
with each run's latency in seconds.

Usage: python load.py RUNS URL [URL...]
"""

import asyncio
import json
import sys
import time

from langgraph_sdk import get_client

RUNS, URLS = int(sys.argv[1]), sys.argv[2:]


async def one(client, i):
    thread = await client.threads.create()
    started = time.monotonic()
    values = await client.runs.wait(
        thread["thread_id"], "agent",
        input={"messages": [{"role": "user", "content": f"task {i}"}]},
    )
    latency = time.monotonic() - started
    ok = values.get("messages", [{}])[-1].get("content") == "Done."
    return latency, ok


async def main():
    clients = [get_client(url=url, timeout=600) for url in URLS]
    started = time.monotonic()
    results = await asyncio.gather(*(one(clients[i % len(clients)], i) for i in range(RUNS)))
    wall = time.monotonic() - started
    print(json.dumps({"wall": wall, "latencies": [r[0] for r in results],
                      "failed": sum(1 for r in results if not r[1])}))


asyncio.run(main())
