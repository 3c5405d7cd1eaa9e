"""One N-step tool loop through a Python API, against a mock OpenAI Chat Completions server
that answers at once: N calls of a Python tool, then an answer. Prints the median time per
step (ms), the time to import the package and build the agent (ms), and the peak RSS (MB).

Usage: python loop.py rs|reference STEPS RUNS   (OPENAI_BASE_URL names the mock)
"""

import os
import resource
import statistics
import sys
import time

STARTED = time.perf_counter()

IMPL, STEPS, RUNS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


if IMPL == "rs":
    from deepagents_rs import create_deep_agent

    agent = create_deep_agent(model="openai_chat:mock", tools=[add], max_turns=100_000)
else:
    from deepagents import create_deep_agent
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="mock", base_url=os.environ["OPENAI_BASE_URL"], api_key="x")
    agent = create_deep_agent(model=model, tools=[add])

startup_ms = (time.perf_counter() - STARTED) * 1000
times = []
for _ in range(RUNS):
    start = time.perf_counter()
    result = agent.invoke({"messages": [{"role": "user", "content": "add things"}]}, {"recursion_limit": 10_000})
    times.append(time.perf_counter() - start)
    assert result["messages"][-1].content == "done", result["messages"][-1]
    tools = [m for m in result["messages"] if getattr(m, "type", None) == "tool"]
    assert len(tools) == STEPS, len(tools)
per_step_ms = statistics.median(times) / (STEPS + 1) * 1000
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{IMPL} {per_step_ms:.3f} {startup_ms:.0f} {peak_mb:.1f}")
