"""The load of the server benchmark: RUNS concurrent runs, each on a new thread, spread
over the servers at URLS, through the official langgraph-sdk client; prints one JSON line
with the wall time, each run's latency in seconds, how many runs failed (a wrong answer,
an error, or no answer within RUN_TIMEOUT seconds, default 300), and the CPU seconds this
client spent (on a small machine the client competes with the servers for the cores).

Usage: python load.py RUNS URL [URL...]
"""

import asyncio
import json
import os
import resource
import sys
import time

import httpx
from langgraph_sdk.client import LangGraphClient

RUNS, URLS = int(sys.argv[1]), sys.argv[2:]
RUN_TIMEOUT = float(os.environ.get("RUN_TIMEOUT", "300"))


async def one(client, i):
    started = time.monotonic()
    try:
        thread = await client.threads.create()
        values = await asyncio.wait_for(client.runs.wait(
            thread["thread_id"], "agent",
            input={"messages": [{"role": "user", "content": f"task {i}"}]},
        ), RUN_TIMEOUT)
        messages = values.get("messages", []) if isinstance(values, dict) else []
        ok = bool(messages) and messages[-1].get("content") == "Done."
    except Exception:  # a failed run counts, whatever failed
        ok = False
    return time.monotonic() - started, ok


PER_CLIENT = 25


def client(url):
    """The SDK's client as `get_client` makes it, for PER_CLIENT runs. One client for the whole
    load would measure the client: its default pool (100 connections) holds a load above 100
    runs to 100 requests in flight, and one pool of a thousand connections costs the client's
    process a core (httpcore's pool does work in proportion to its connections per request)."""
    limits = httpx.Limits(max_connections=PER_CLIENT, max_keepalive_connections=PER_CLIENT)
    return LangGraphClient(httpx.AsyncClient(
        base_url=url, transport=httpx.AsyncHTTPTransport(retries=5, limits=limits),
        timeout=httpx.Timeout(RUN_TIMEOUT + 60)))


async def main():
    count = len(URLS) * -(-RUNS // (PER_CLIENT * len(URLS)))
    clients = [client(URLS[i % len(URLS)]) for i in range(count)]
    started = time.monotonic()
    results = await asyncio.gather(*(one(clients[i % len(clients)], i) for i in range(RUNS)))
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": wall, "latencies": [r[0] for r in results if r[1]],
                      "failed": sum(1 for r in results if not r[1]),
                      "client_cpu_s": usage.ru_utime + usage.ru_stime}))


asyncio.run(main())
