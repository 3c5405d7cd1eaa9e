"""Async subagents: ``"async": True`` subagents and the reference's ``AsyncSubAgent`` specs
(remote, ``graph_id`` + ``url``) start in the background with ``start_async_task``; ``invoke``
returns after the parent's answer, and the ending is delivered to the thread exactly once —
with the next ``invoke``, or as the turn ``invoke(None, config)`` runs after
``wait_for_background``."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from deepagents_rs import AsyncSubAgent, InMemorySaver, ScriptedModel, SubAgent, create_deep_agent


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def say(text: str) -> dict[str, Any]:
    return {"text": text}


def text(message: Any) -> str:
    content = message.content if hasattr(message, "content") else message["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))


def notices(messages: list[Any]) -> list[str]:
    """The messages that deliver an ending (their text names the task and its answer)."""
    return [text(m) for m in messages if "The answer is 42." in text(m) and "helper" in text(m)]


def helper_agent(go: threading.Event, parent_turns: list[dict[str, Any]]) -> Any:
    """A parent whose async subagent `helper` answers 42 once `go` is set."""

    def wait_for_go() -> str:
        """Waits until the test lets the helper finish."""
        go.wait(30)
        return "go"

    helper: SubAgent = {"name": "helper", "description": "Computes answers.", "system_prompt": "Compute.", "tools": [wait_for_go], "async": True}
    model = ScriptedModel(
        parent_turns,
        conversations=[{"when_task_contains": "Compute the answer", "turns": [call("wait_for_go"), say("The answer is 42.")]}],
    )
    return create_deep_agent(model=model, subagents=[helper], checkpointer=InMemorySaver(), general_purpose_subagent=False)


START = call("start_async_task", description="Compute the answer", subagent_type="helper")


def test_an_async_subagent_starts_in_the_background_and_its_ending_comes_with_the_next_invoke() -> None:
    go = threading.Event()
    agent = helper_agent(go, [START, say("Started; I will tell you."), say("The helper says 42.")])
    assert "start_async_task" in {t["name"] for t in agent.tools}
    assert "task" not in {t["name"] for t in agent.tools}
    config = {"configurable": {"thread_id": "t1"}}

    first = agent.invoke({"messages": [{"role": "user", "content": "find the answer"}]}, config)
    # invoke returns with the parent's answer while the subagent still works.
    assert text(first["messages"][-1]) == "Started; I will tell you."
    assert "Started background task" in text(first["messages"][-2])
    assert agent.background_running(config) == 1
    with pytest.raises(TimeoutError):
        agent.wait_for_background(config, timeout=0.2)

    go.set()
    endings = agent.wait_for_background(config, timeout=30)
    assert [(e["subagent"], e["status"], e["answer"]) for e in endings] == [("helper", "success", "The answer is 42.")]
    # Waiting delivers nothing: the state is as the first invoke left it.
    assert notices(agent.get_state(config).values["messages"]) == []

    second = agent.invoke({"messages": [{"role": "user", "content": "any news?"}]}, config)
    assert text(second["messages"][-1]) == "The helper says 42."
    assert len(notices(second["messages"])) == 1
    # Delivered once: nothing is left to wait for or to deliver again.
    assert agent.background_running(config) == 0
    assert agent.wait_for_background(config, timeout=5) == []
    assert len(notices(agent.get_state(config).values["messages"])) == 1


def test_invoke_none_runs_the_turn_the_endings_start_exactly_once() -> None:
    go = threading.Event()
    agent = helper_agent(go, [START, say("Started."), say("The helper says 42."), say("Nothing new.")])
    config = {"configurable": {"thread_id": "t2"}}
    agent.invoke("find the answer", config)
    go.set()
    assert len(agent.wait_for_background(config, timeout=30)) == 1

    parts = list(agent.stream(None, config, stream_mode=["deepagents", "values"]))
    events = [chunk for mode, chunk in parts if mode == "deepagents"]
    finished = [e for e in events if "background_task_finished" in json.dumps(e)]
    assert len(finished) == 1, events
    values = [chunk for mode, chunk in parts if mode == "values"][-1]
    assert text(values["messages"][-1]) == "The helper says 42."
    assert len(notices(values["messages"])) == 1

    # The ending is not delivered again: the next turn sees it once, in the history.
    third = agent.invoke("and now?", config)
    assert text(third["messages"][-1]) == "Nothing new."
    assert len(notices(third["messages"])) == 1
    assert agent.wait_for_background(config, timeout=5) == []


def test_ainvoke_and_await_background() -> None:
    go = threading.Event()
    agent = helper_agent(go, [START, say("Started."), say("The helper says 42.")])
    config = {"configurable": {"thread_id": "t3"}}

    async def scenario() -> None:
        first = await agent.ainvoke("find the answer", config)
        assert text(first["messages"][-1]) == "Started."
        with pytest.raises(TimeoutError):
            await agent.await_background(config, timeout=0.2)
        go.set()
        endings = await agent.await_background(config, timeout=30)
        assert [e["answer"] for e in endings] == ["The answer is 42."]
        woken = await agent.ainvoke(None, config)
        assert text(woken["messages"][-1]) == "The helper says 42."
        assert len(notices(woken["messages"])) == 1
        assert await agent.await_background(config, timeout=5) == []

    asyncio.run(scenario())


def test_async_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="'async' must be True or False"):
        create_deep_agent(model=ScriptedModel([say("x")]), subagents=[{"name": "h", "description": "d", "async": "yes"}])


# --- the reference's AsyncSubAgent: a graph on an Agent Protocol server -------------------


class _AgentProtocol(BaseHTTPRequestHandler):
    """The few Agent Protocol calls a remote task makes: a thread, a run that is running
    until ``done`` is set and then has succeeded, its join, and the thread's state with the
    remote agent's answer."""

    requests: list[tuple[str, str, dict[str, str]]] = []
    done: threading.Event = threading.Event()

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).requests.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.path == "/threads":
            self._answer({"thread_id": "remote-thread"})
        else:
            self._answer({"run_id": "remote-run", "status": "pending"})

    def do_GET(self) -> None:
        type(self).requests.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.path.endswith("/state"):
            self._answer({"values": {"messages": [{"type": "human", "content": "q"}, {"type": "ai", "content": "Remote says 7."}]}})
        elif self.path.endswith("/join"):
            self._answer({})
        else:
            self._answer({"run_id": "remote-run", "status": "success" if self.done.is_set() else "running"})


@pytest.fixture
def agent_protocol() -> Iterator[tuple[str, type[_AgentProtocol]]]:
    handler = type("Handler", (_AgentProtocol,), {"requests": [], "done": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()


def test_a_remote_async_subagent_runs_on_its_server_and_its_ending_is_delivered(agent_protocol: tuple[str, type[_AgentProtocol]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, server = agent_protocol
    monkeypatch.setenv("LANGSMITH_API_KEY", '"secret"')
    monkeypatch.delenv("LANGGRAPH_API_KEY", raising=False)
    remote: AsyncSubAgent = {"name": "researcher", "description": "Researches remotely.", "graph_id": "research", "url": url}
    model = ScriptedModel(
        [
            call("start_async_task", description="Find seven", subagent_type="researcher"),
            say("Asked the researcher."),
            say("The researcher says 7."),
        ]
    )
    agent = create_deep_agent(model=model, subagents=[remote], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "r1"}}
    first = agent.invoke("find seven", config)
    assert text(first["messages"][-1]) == "Asked the researcher."
    assert agent.background_running(config) == 1

    server.done.set()
    endings = agent.wait_for_background(config, timeout=30)
    assert [(e["subagent"], e["status"], e["answer"]) for e in endings] == [("researcher", "success", "Remote says 7.")]
    woken = agent.invoke(None, config)
    assert text(woken["messages"][-1]) == "The researcher says 7."
    assert sum("Remote says 7." in text(m) for m in woken["messages"]) == 1
    assert agent.wait_for_background(config, timeout=5) == []

    started = [r for r in server.requests if r[0] == "POST"]
    assert [path for _, path, _ in started] == ["/threads", "/threads/remote-thread/runs"]
    # The headers the reference and its SDK send.
    headers = started[0][2]
    assert headers["x-auth-scheme"] == "langsmith"
    assert headers["x-api-key"] == "secret"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"url": None}, "needs a url"),
        ({"mode": "fork"}, "mode='fork' is not supported"),
        ({"update_strategy": "enqueue"}, "update_strategy='enqueue' is not supported"),
        ({"webhook": "http://example.invalid/hook"}, "webhook= is not supported"),
        ({"notify_parent": False}, "notify_parent=False is not supported"),
    ],
)
def test_remote_async_subagent_settings_this_package_cannot_honour_are_refused(extra: dict[str, Any], message: str) -> None:
    spec = {"name": "r", "description": "Remote.", "graph_id": "g", "url": "http://127.0.0.1:9", **extra}
    with pytest.raises(ValueError, match=message):
        create_deep_agent(model=ScriptedModel([say("x")]), subagents=[spec])
