"""Custom LangChain middleware and chat models of classes the harness has no client for,
both run from the core through Python."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelRequest,
    after_agent,
    after_model,
    before_agent,
    before_model,
    dynamic_prompt,
    wrap_model_call,
    wrap_tool_call,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from typing_extensions import NotRequired

from deepagents_rs import ScriptedModel, create_deep_agent


def echo(text: str) -> str:
    """Echoes the text."""
    return text


def fake(*answers: AIMessage) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter(answers))


def call(name: str, args: dict[str, Any], id: str = "c1") -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id}])


# --- chat models called through Python ---------------------------------------------------


def test_a_langchain_fake_model_drives_the_agent_with_tool_calls() -> None:
    agent = create_deep_agent(model=fake(call("echo", {"text": "hi"}), AIMessage(content="said hi")), tools=[echo])
    result = agent.invoke({"messages": [("user", "say hi")]})
    kinds = [type(m).__name__ for m in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert result["messages"][2].content == "hi"
    assert result["messages"][-1].content == "said hi"


def test_a_python_model_sees_the_system_prompt_the_messages_and_the_bound_tools() -> None:
    seen: list[Any] = []

    class Recording(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            seen.append(("tools", sorted(t["function"]["name"] for t in tools)))
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            seen.append(("messages", [(type(m).__name__, m.content) for m in messages]))
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    agent = create_deep_agent(model=Recording(messages=iter([AIMessage(content="ok")])), tools=[echo], system_prompt="Be brief.")
    agent.invoke({"messages": [("user", "hello")]})
    tools = dict(seen)["tools"]
    assert "echo" in tools and "write_file" in tools
    messages = dict(seen)["messages"]
    assert messages[0][0] == "SystemMessage" and "Be brief." in messages[0][1]
    assert messages[1] == ("HumanMessage", "hello")


def test_a_python_model_that_raises_fails_the_run_with_its_message() -> None:
    class Broken(GenericFakeChatModel):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("quota exhausted")

    agent = create_deep_agent(model=Broken(messages=iter([])))
    with pytest.raises(Exception, match="quota exhausted"):
        agent.invoke({"messages": [("user", "hi")]})


def test_a_subagent_may_have_a_python_model_of_its_own() -> None:
    main = fake(call("task", {"description": "find it", "subagent_type": "finder"}), AIMessage(content="the finder said found"))
    sub = fake(AIMessage(content="found"))
    agent = create_deep_agent(model=main, subagents=[{"name": "finder", "description": "Finds things.", "system_prompt": "Find.", "model": sub}])
    result = agent.invoke({"messages": [("user", "find")]})
    tool_messages = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert tool_messages and "found" in tool_messages[0].content


# --- middleware ------------------------------------------------------------------------------


class CountState(AgentState):
    model_calls: NotRequired[int]


class Counter(AgentMiddleware):  # type: ignore[type-arg]
    state_schema = CountState

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return {"model_calls": state.get("model_calls", 0) + 1}


def test_hooks_update_declared_state_keys_that_are_kept_in_the_thread() -> None:
    agent = create_deep_agent(
        model=ScriptedModel([{"tool_calls": [{"name": "echo", "args": {"text": "a"}}]}, {"text": "done"}]),
        tools=[echo],
        middleware=[Counter()],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t1"}}
    result = agent.invoke({"messages": [("user", "go")]}, config)
    assert result["messages"][-1].content == "done"
    assert agent.get_state(config).values["model_calls"] == 2


def test_dynamic_prompt_shapes_the_system_prompt_and_sees_the_state(openai_mock: Any) -> None:
    @dynamic_prompt
    def prompt(request: ModelRequest) -> str:
        return f"Answer in French. Calls so far: {request.state.get('model_calls')}"

    openai_mock.turns = [{"text": "bonjour"}]
    agent = create_deep_agent(model="openai_chat:mock", middleware=[Counter(), prompt])
    result = agent.invoke({"messages": [("user", "hello")]})
    assert result["messages"][-1].content == "bonjour"
    system = json.dumps(openai_mock.requests[0]["messages"][0])
    assert "Answer in French. Calls so far: 1" in system


def test_before_model_trims_the_conversation_the_model_sees_and_the_thread_keeps(openai_mock: Any) -> None:
    @before_model
    def keep_last(state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = state["messages"]
        if len(messages) <= 1:
            return None
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), messages[-1]]}

    openai_mock.turns = [{"text": "one"}]
    agent = create_deep_agent(model="openai_chat:mock", middleware=[keep_last], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "trim"}}
    agent.invoke({"messages": [("user", "first")]}, config)
    agent.invoke({"messages": [("user", "second")]}, config)
    sent = [m for m in openai_mock.requests[-1]["messages"] if m["role"] not in ("system", "developer")]
    assert [m["content"] for m in sent] == ["second"]
    kept = agent.get_state(config).values["messages"]
    assert [m.content for m in kept] == ["second", "one"]


def test_after_model_replaces_the_answer_and_jump_to_end_stops_tool_calls() -> None:
    @after_model
    def redact(state: Any, runtime: Any) -> dict[str, Any] | None:
        last = state["messages"][-1]
        if last.tool_calls:
            return {"jump_to": "end", "messages": [AIMessage(id=last.id, content="blocked")]}
        return None

    ran: list[str] = []

    def danger(text: str) -> str:
        """Does something dangerous."""
        ran.append(text)
        return text

    agent = create_deep_agent(model=ScriptedModel([{"tool_calls": [{"name": "danger", "args": {"text": "x"}}]}]), tools=[danger], middleware=[redact])
    result = agent.invoke({"messages": [("user", "go")]})
    assert ran == []
    assert result["messages"][-1].content == "blocked"
    assert not result["messages"][-1].tool_calls


def test_before_model_jump_to_end_answers_without_calling_the_model(openai_mock: Any) -> None:
    @before_model
    def guard(state: Any, runtime: Any) -> dict[str, Any] | None:
        if "password" in state["messages"][-1].content:
            return {"jump_to": "end", "messages": [AIMessage(content="I can't help with that.")]}
        return None

    agent = create_deep_agent(model="openai_chat:mock", middleware=[guard])
    result = agent.invoke({"messages": [("user", "tell me the password")]})
    assert openai_mock.requests == []
    assert [m.content for m in result["messages"]] == ["tell me the password", "I can't help with that."]


def test_wrap_model_call_can_retry_and_swap_the_model() -> None:
    attempts: list[str] = []

    @wrap_model_call
    def fallback(request: ModelRequest, handler: Any) -> Any:
        try:
            return handler(request)
        except Exception as error:  # noqa: BLE001
            attempts.append(str(error))
            return handler(request.override(model=fake(AIMessage(content="from the fallback"))))

    class Broken(GenericFakeChatModel):
        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("primary down")

    agent = create_deep_agent(model=Broken(messages=iter([])), middleware=[fallback])
    result = agent.invoke({"messages": [("user", "hi")]})
    assert result["messages"][-1].content == "from the fallback"
    assert attempts and "primary down" in attempts[0]


def test_wrap_model_call_can_filter_the_tools_offered(openai_mock: Any) -> None:
    @wrap_model_call
    def only_echo(request: ModelRequest, handler: Any) -> Any:
        return handler(request.override(tools=[t for t in request.tools if t.name == "echo"]))

    openai_mock.turns = [{"text": "ok"}]
    agent = create_deep_agent(model="openai_chat:mock", tools=[echo], middleware=[only_echo])
    agent.invoke({"messages": [("user", "hi")]})
    assert [t["function"]["name"] for t in openai_mock.requests[0]["tools"]] == ["echo"]


def test_wrap_tool_call_rewrites_results_and_turns_errors_into_messages() -> None:
    @wrap_tool_call
    def guard(request: Any, handler: Any) -> Any:
        if request.tool_call["args"].get("text") == "forbidden":
            return ToolMessage(content="not allowed", tool_call_id=request.tool_call["id"], status="error")
        result = handler(request)
        return ToolMessage(content=f"<{result.content}>", tool_call_id=result.tool_call_id)

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "echo", "args": {"text": "fine"}}, {"name": "echo", "args": {"text": "forbidden"}}]},
            {"text": "done"},
        ]
    )
    agent = create_deep_agent(model=model, tools=[echo], middleware=[guard])
    result = agent.invoke({"messages": [("user", "go")]})
    tools = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [(t.content, t.status) for t in tools] == [("<fine>", "success"), ("not allowed", "error")]


def test_async_hooks_run_on_the_callers_loop() -> None:
    seen: list[str] = []

    class Async(AgentMiddleware):  # type: ignore[type-arg]
        async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            seen.append("before")
            return None

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            seen.append("wrap")
            return await handler(request)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            seen.append("tool")
            return await handler(request)

    model = ScriptedModel([{"tool_calls": [{"name": "echo", "args": {"text": "a"}}]}, {"text": "done"}])
    agent = create_deep_agent(model=model, tools=[echo], middleware=[Async()])
    result = asyncio.run(agent.ainvoke({"messages": [("user", "go")]}))
    assert result["messages"][-1].content == "done"
    assert seen == ["before", "wrap", "tool", "before", "wrap"]


def test_before_and_after_agent_run_once_per_run_and_middleware_tools_are_offered() -> None:
    seen: list[str] = []

    @tool
    def lookup(key: str) -> str:
        """Looks a key up."""
        return f"value of {key}"

    class WithTool(AgentMiddleware):  # type: ignore[type-arg]
        tools = [lookup]

        def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            seen.append(f"start {len(state['messages'])}")
            return {"messages": [HumanMessage(content="(context: be nice)")]}

        def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            seen.append(f"end {len(state['messages'])}")
            return None

    model = ScriptedModel([{"tool_calls": [{"name": "lookup", "args": {"key": "k"}}]}, {"text": "done"}])
    agent = create_deep_agent(model=model, middleware=[WithTool()])
    result = agent.invoke({"messages": [("user", "go")]})
    contents = [m.content for m in result["messages"]]
    assert contents[:2] == ["go", "(context: be nice)"]
    assert "value of k" in contents
    assert seen == ["start 1", "end 5"]


def test_what_is_not_supported_is_refused_with_a_message() -> None:
    @before_model
    def loop_back(state: Any, runtime: Any) -> dict[str, Any] | None:
        return {"jump_to": "model"}

    agent = create_deep_agent(model=ScriptedModel([{"text": "x"}]), middleware=[loop_back])
    with pytest.raises(Exception, match='jump_to "model" is not supported'):
        agent.invoke({"messages": [("user", "go")]})

    @before_model
    def undeclared(state: Any, runtime: Any) -> dict[str, Any] | None:
        return {"mystery": 1}

    agent = create_deep_agent(model=ScriptedModel([{"text": "x"}]), middleware=[undeclared])
    with pytest.raises(Exception, match="state_schema"):
        agent.invoke({"messages": [("user", "go")]})

    with pytest.raises(TypeError, match="AgentMiddleware"):
        create_deep_agent(model=ScriptedModel([]), middleware=[object()])
    with pytest.raises(TypeError, match="subagents is not supported"):
        create_deep_agent(model=ScriptedModel([]), subagents=[{"name": "s", "description": "d", "middleware": [Counter()]}])


def test_hooks_made_by_the_decorators_all_run() -> None:
    seen: list[str] = []

    @before_agent
    def a(state: Any, runtime: Any) -> None:
        seen.append("before_agent")

    @after_agent
    def b(state: Any, runtime: Any) -> None:
        seen.append("after_agent")

    @after_model
    def c(state: Any, runtime: Any) -> None:
        seen.append("after_model")

    agent = create_deep_agent(model=ScriptedModel([{"text": "x"}]), middleware=[a, b, c])
    agent.invoke({"messages": [("user", "go")]})
    assert seen == ["before_agent", "after_model", "after_agent"]
