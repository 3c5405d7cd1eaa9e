"""One N-step tool loop through a Python API, against a mock OpenAI Chat Completions server
that answers at once: N calls of a Python tool, then an answer. Prints the median time per
step (ms), the time to import the package and build the agent (ms), and the peak RSS (MB).

Usage: python loop.py IMPL STEPS RUNS   (OPENAI_BASE_URL names the mock)

IMPL: ``rs`` (deepagents_rs, model as a spec string), ``rs-object`` (a ``ChatOpenAI`` object,
read into the native client), ``rs-python`` (a chat model class the harness has no client
for, called through Python on every step), ``rs-middleware`` (the spec string plus a Python
middleware with ``before_model`` and ``wrap_model_call`` hooks), ``reference`` (LangChain's
deepagents with ``ChatOpenAI``), ``reference-middleware`` (the same middleware on it).
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




def middleware() -> list:
    from langchain.agents.middleware import AgentMiddleware

    class Passthrough(AgentMiddleware):
        def before_model(self, state, runtime):
            return None

        def wrap_model_call(self, request, handler):
            return handler(request)

    return [Passthrough()]


def chat_openai(cls=None):
    from langchain_openai import ChatOpenAI

    return (cls or ChatOpenAI)(model="mock", base_url=os.environ["OPENAI_BASE_URL"], api_key="x")


if IMPL.startswith("rs"):
    from deepagents_rs import create_deep_agent

    if IMPL == "rs-object":
        model = chat_openai()
    elif IMPL == "rs-python":
        from langchain_openai import ChatOpenAI

        class OwnChat(ChatOpenAI):
            """A subclass: not a class whose settings the harness reads, so it is called."""

        model = chat_openai(OwnChat)
    else:
        model = "openai_chat:mock"
    extra = middleware() if IMPL == "rs-middleware" else []
    agent = create_deep_agent(model=model, tools=[add], max_turns=100_000, middleware=extra)
else:
    from deepagents import create_deep_agent

    extra = middleware() if IMPL == "reference-middleware" else []
    agent = create_deep_agent(model=chat_openai(), tools=[add], middleware=extra)

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
