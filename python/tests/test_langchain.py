"""Reference deepagents code on this package: LangChain chat model objects as models, and
LangChain message objects back (dicts when ``langchain_core`` is absent).

scripts/test installs the pinned LangChain packages into the test virtualenv; the package
itself does not need them."""

from __future__ import annotations

import sys
import types
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_openai")

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_openai import ChatOpenAI  # noqa: E402

from deepagents_rs import InMemorySaver, Message, create_deep_agent  # noqa: E402
from deepagents_rs import _messages  # noqa: E402
from deepagents_rs._models import chat_model_spec  # noqa: E402


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the environment: what reaches the mock came from the model object."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


# --- model objects -------------------------------------------------------------------------


def test_chat_openai_objects_drive_the_agent_and_its_subagent(openai_mock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = openai_mock.url
    _no_environment(monkeypatch)
    openai_mock.by_model = {
        "gpt-4o-mini": [
            {"call": ("task", {"description": "Find the numbers", "subagent_type": "researcher"})},
            {"call": ("add", {"a": 2, "b": 3})},
            {"text": "2 + 3 = 5"},
        ],
        "gpt-4o": [{"text": "The numbers are 2 and 3."}],
    }
    agent = create_deep_agent(
        model=ChatOpenAI(model="gpt-4o-mini", base_url=url, api_key="test", temperature=0.2, max_tokens=321, max_retries=0, timeout=30),
        tools=[add],
        system_prompt="Use tools.",
        subagents=[
            {
                "name": "researcher",
                "description": "Finds numbers.",
                "system_prompt": "Find numbers.",
                "model": ChatOpenAI(model="gpt-4o", base_url=url, api_key="sub-key", temperature=0.7, max_completion_tokens=99),
            }
        ],
    )
    result = agent.invoke({"messages": [{"role": "user", "content": "Add the numbers."}]})

    main = [(r, h) for r, h in zip(openai_mock.requests, openai_mock.headers_seen) if r["model"] == "gpt-4o-mini"]
    sub = [(r, h) for r, h in zip(openai_mock.requests, openai_mock.headers_seen) if r["model"] == "gpt-4o"]
    assert len(main) == 3 and len(sub) == 1
    for request, headers in main:
        assert request["temperature"] == 0.2
        assert request["max_completion_tokens"] == 321
        assert headers["authorization"] == "Bearer test"
    request, headers = sub[0]
    assert request["temperature"] == 0.7
    assert request["max_completion_tokens"] == 99
    assert headers["authorization"] == "Bearer sub-key"
    assert request["messages"][-1] == {"role": "user", "content": "Find the numbers"}

    messages = result["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage, ToolMessage, AIMessage]
    assert messages[-1].content == "2 + 3 = 5"
    task_call, add_call = messages[1].tool_calls[0], messages[3].tool_calls[0]
    assert task_call["name"] == "task" and task_call["args"]["subagent_type"] == "researcher"
    assert add_call["name"] == "add" and add_call["args"] == {"a": 2, "b": 3} and add_call["id"]
    assert messages[2].content == "The numbers are 2 and 3." and messages[2].tool_call_id == task_call["id"]
    tool = messages[4]
    assert (tool.content, tool.tool_call_id, tool.name, tool.status) == ("5", add_call["id"], "add", "success")
    assert {"type": "tool_call", "id": add_call["id"], "name": "add", "args": {"a": 2, "b": 3}} in messages[3].content_blocks
    assert messages[-1].content_blocks == [{"type": "text", "text": "2 + 3 = 5"}]
    assert all(m.id for m in messages)


def test_the_model_object_sends_what_langchain_itself_sends(openai_mock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    openai_mock.turns = [{"text": "hi"}]
    settings: dict[str, Any] = {"model": "gpt-4o-mini", "base_url": openai_mock.url, "api_key": "test", "temperature": 0, "max_tokens": 50, "stop": ["END"], "top_p": 0.5}
    ChatOpenAI(**settings).invoke("hello")
    _no_environment(monkeypatch)
    create_deep_agent(model=ChatOpenAI(**settings)).invoke("hello")
    reference, ours = openai_mock.requests
    for key in ("model", "temperature", "max_completion_tokens", "stop", "top_p"):
        assert ours[key] == reference[key], key
    assert "max_tokens" not in ours


def test_init_chat_model_returns_objects_that_work(openai_mock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    init_chat_model = pytest.importorskip("langchain.chat_models").init_chat_model
    openai_mock.turns = [{"text": "ok"}]
    url = openai_mock.url
    _no_environment(monkeypatch)
    model = init_chat_model("openai:gpt-4.1-nano", base_url=url, api_key="k", temperature=0)
    assert create_deep_agent(model=model).invoke("hi")["messages"][-1].content == "ok"
    assert openai_mock.requests[0]["model"] == "gpt-4.1-nano" and openai_mock.requests[0]["temperature"] == 0

    with pytest.raises(TypeError, match="configurable_fields"):
        create_deep_agent(model=init_chat_model("openai:gpt-4o", api_key="k", configurable_fields=("temperature",)))
    with pytest.raises(TypeError, match="configurable_fields"):
        create_deep_agent(model=init_chat_model())


def test_chat_anthropic_settings_are_read() -> None:
    anthropic = pytest.importorskip("langchain_anthropic")
    model = anthropic.ChatAnthropic(
        model="claude-sonnet-4-5", api_key="sk-ant", base_url="http://127.0.0.1:1", temperature=0.1, max_tokens=1000, stop=["X"], max_retries=1, timeout=5
    )
    assert chat_model_spec(model) == {
        "spec": "anthropic:claude-sonnet-4-5",
        "base_url": "http://127.0.0.1:1",
        "api_key": "sk-ant",
        "max_retries": 1,
        "timeout": 5.0,
        "max_tokens": 1000,
        "temperature": 0.1,
        "stop": ["X"],
    }
    create_deep_agent(model=model)  # builds the native client


def _fake(package: str, name: str, **fields: Any) -> Any:
    cls = type(name, (), {"__module__": f"{package}.chat_models"})
    obj = cls()
    for key, value in fields.items():
        setattr(obj, key, value)
    return obj


def test_google_and_ollama_settings_are_read_without_their_packages() -> None:
    gemini = _fake("langchain_google_genai", "ChatGoogleGenerativeAI", model="models/gemini-2.5-flash", google_api_key="g", temperature=0.0, max_output_tokens=64, client_options={"api_endpoint": "127.0.0.1:5"})
    assert chat_model_spec(gemini) == {"spec": "google_genai:gemini-2.5-flash", "base_url": "https://127.0.0.1:5", "api_key": "g", "max_tokens": 64, "temperature": 0.0}
    ollama = _fake("langchain_ollama", "ChatOllama", model="qwen3:8b", base_url="http://127.0.0.1:11434/", num_predict=200, temperature=0.4)
    assert chat_model_spec(ollama) == {"spec": "ollama:qwen3:8b", "base_url": "http://127.0.0.1:11434/v1", "max_tokens": 200, "temperature": 0.4}


def test_models_that_cannot_be_read_are_refused_naming_what_works() -> None:
    with pytest.raises(TypeError, match="bound model"):
        create_deep_agent(model=ChatOpenAI(model="gpt-4o", api_key="k").bind_tools([add]))
    with pytest.raises(TypeError, match="ChatOpenAI"):
        create_deep_agent(model=_fake("langchain_mistralai", "ChatMistralAI", model="m"))
    with pytest.raises(TypeError, match="ChatOpenAI"):
        create_deep_agent(model=object())
    with pytest.raises(TypeError, match="ChatOpenAI"):
        create_deep_agent(model="openai:gpt-4o", subagents=[{"name": "s", "description": "d", "model": object()}])
    with pytest.warns(UserWarning, match="model_kwargs"):
        create_deep_agent(model=ChatOpenAI(model="gpt-4o", api_key="k", model_kwargs={"user": "u"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_deep_agent(model=ChatOpenAI(model="gpt-4o", api_key="k"))


# --- messages ------------------------------------------------------------------------------


def _agent(openai_mock: Any, **kwargs: Any) -> Any:
    openai_mock.turns = [{"call": ("add", {"a": 2, "b": 3})}, {"text": "5"}]
    return create_deep_agent(model=ChatOpenAI(model="m", base_url=openai_mock.url, api_key="k"), tools=[add], **kwargs)


def test_stream_modes_yield_langchain_messages(openai_mock: Any) -> None:
    agent = _agent(openai_mock)
    chunks = list(agent.stream({"messages": [HumanMessage("add")]}, stream_mode="messages"))
    ai = [c for c, _ in chunks if c.type != "tool"]
    assert ai and all(type(c) is AIMessageChunk for c in ai)
    assert [type(c) for c, _ in chunks if c.type == "tool"] == [ToolMessage]
    first_turn = [c for c in ai if c.id == ai[0].id]
    merged = first_turn[0]
    for chunk in first_turn[1:]:
        merged = merged + chunk
    assert merged.tool_calls == [{"name": "add", "args": {"a": 2, "b": 3}, "id": "call_0", "type": "tool_call"}]
    assert "".join(str(c.content) for c in ai if c.id == ai[-1].id) == "5"

    values = list(agent.stream({"messages": [HumanMessage("add")]}, stream_mode="values"))
    assert [type(m) for m in values[-1]["messages"]] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    updates = list(agent.stream({"messages": [HumanMessage("add")]}, stream_mode="updates"))
    produced = [m for update in updates for node in update.values() if isinstance(node, dict) for m in node.get("messages", [])]
    assert produced and all(isinstance(m, BaseMessage) for m in produced)
    both = list(agent.stream("add", stream_mode=["messages", "values"]))
    assert {mode for mode, _ in both} == {"messages", "values"}
    assert all(isinstance(m, BaseMessage) for mode, data in both if mode == "values" for m in data["messages"])


def test_pretty_print_works_on_returned_messages(openai_mock: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = _agent(openai_mock).invoke("add 2 and 3")
    for message in result["messages"]:
        message.pretty_print()
    printed = capsys.readouterr().out
    assert "Human Message" in printed and "Tool Calls:" in printed and "add (call_0)" in printed
    assert "Tool Message" in printed and "Name: add" in printed


def test_thread_state_holds_langchain_messages_and_takes_them(openai_mock: Any) -> None:
    agent = _agent(openai_mock, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": [SystemMessage("be brief"), HumanMessage("add")]}, config)
    state = agent.get_state(config)
    assert [type(m) for m in state.values["messages"]][-3:] == [AIMessage, ToolMessage, AIMessage]
    history = list(agent.get_state_history(config))
    assert all(isinstance(m, BaseMessage) for snapshot in history for m in snapshot.values.get("messages", []))
    last = state.values["messages"][-1]
    agent.update_state(config, {"messages": [AIMessage(content="five", id=last.id)]})
    replaced = agent.get_state(config).values["messages"][-1]
    assert type(replaced) is AIMessage and replaced.content == "five" and replaced.id == last.id


def test_without_langchain_core_messages_are_dicts(openai_mock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_core.messages", None)
    monkeypatch.setattr(_messages, "_LANGCHAIN_ABSENT", False)
    agent = _agent(openai_mock)
    messages = agent.invoke("add")["messages"]
    assert all(type(m) is Message for m in messages)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1].tool_calls[0]["args"] == {"a": 2, "b": 3} and messages[2].tool_call_id == "call_0"
    chunks = [c for c, _ in agent.stream("add", stream_mode="messages")]
    assert all(type(c) is Message for c in chunks)


def test_without_langchain_core_installed_the_lookup_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = __import__
    attempts = []

    def refuse(name: str, *args: Any, **kwargs: Any) -> types.ModuleType:
        if name.startswith("langchain_core"):
            attempts.append(name)
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "langchain_core.messages")
    monkeypatch.setattr(_messages, "_LANGCHAIN_ABSENT", False)
    monkeypatch.setattr("builtins.__import__", refuse)
    wire = {"type": "ai", "content": "x", "tool_calls": []}
    assert type(_messages.message_from_wire(wire)) is Message
    assert type(_messages.message_from_wire(wire)) is Message
    assert len(attempts) == 1


# --- version="v2" and event streams ---------------------------------------------------------


def _scripted(**kwargs: Any) -> Any:
    from deepagents_rs import ScriptedModel

    model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, {"text": "5"}])
    return create_deep_agent(model=model, tools=[add], **kwargs)


def test_version_v2_returns_graph_output_and_stream_parts() -> None:
    from deepagents_rs import GraphOutput

    result = _scripted().invoke("add", version="v2")
    assert isinstance(result, GraphOutput) and result.interrupts == ()
    assert [type(m) for m in result.value["messages"]] == [HumanMessage, AIMessage, ToolMessage, AIMessage]

    paused = _scripted(interrupt_on={"add": True}, checkpointer=InMemorySaver()).invoke("add", {"configurable": {"thread_id": "t"}}, version="v2")
    assert "__interrupt__" not in paused.value and len(paused.interrupts) == 1
    assert paused.interrupts[0].value["action_requests"][0]["name"] == "add"
    assert paused["__interrupt__"] == paused.interrupts

    parts = list(_scripted().stream("add", stream_mode=["values", "updates", "messages"], version="v2"))
    assert {p["type"] for p in parts} == {"values", "updates", "messages"}
    assert all(p["ns"] == () for p in parts)
    values = [p for p in parts if p["type"] == "values"]
    assert all(set(p) == {"type", "ns", "data", "interrupts"} and p["interrupts"] == () for p in values)
    assert values[-1]["data"]["messages"][-1].content == "5"
    chunk, metadata = next(p["data"] for p in parts if p["type"] == "messages")
    assert type(chunk) is AIMessageChunk and metadata["langgraph_node"] == "model"
    single = list(_scripted().stream("add", version="v2"))
    assert all(p["type"] == "values" for p in single)
    with pytest.raises(ValueError, match="version"):
        _scripted().invoke("add", version="v3")


def test_stream_events_and_astream_events_yield_langchain_events() -> None:
    import asyncio

    events = list(_scripted().stream_events("add", version="v2"))
    names = [e["event"] for e in events]
    assert names[0] == "on_chain_start" and names[-1] == "on_chain_end"
    assert "on_tool_start" in names and names.index("on_tool_start") < names.index("on_tool_end")
    streamed = [e["data"]["chunk"] for e in events if e["event"] == "on_chat_model_stream"]
    assert streamed and all(type(c) is AIMessageChunk for c in streamed)
    tool_end = next(e for e in events if e["event"] == "on_tool_end")
    assert tool_end["name"] == "add" and tool_end["data"]["output"] == "5"
    root = events[0]["run_id"]
    assert all(e["parent_ids"] == [root] for e in events[1:-1])
    assert events[-1]["data"]["output"]["messages"][-1].content == "5"

    async def collect() -> list[str]:
        return [e["event"] async for e in _scripted().astream_events("add", version="v2")]

    assert asyncio.run(collect()) == names
