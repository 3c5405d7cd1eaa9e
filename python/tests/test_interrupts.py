"""Tools that ask mid-call: ``interrupt(value)`` (LangGraph's or this package's) pauses the run
on the question; ``Command(resume=answer)`` runs the same call again with the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.types import Command as LangGraphCommand
from langgraph.types import interrupt as langgraph_interrupt

from deepagents_rs import Command, InMemorySaver, ScriptedModel, SqliteSaver, create_deep_agent, interrupt


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "args": args}]}


def test_langgraph_interrupt_in_a_tool_pauses_and_the_resume_value_is_returned() -> None:
    ran: list[str] = []

    def book(city: str) -> str:
        """Books a trip."""
        ran.append(city)
        day = langgraph_interrupt({"question": f"Which day for {city}?"})
        return f"booked {city} on {day}"

    agent = create_deep_agent(model=ScriptedModel([call("book", city="Paris"), {"text": "Booked."}]), tools=[book], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "trip"}}
    paused = agent.invoke({"messages": [("user", "book")]}, config)
    [question] = paused["__interrupt__"]
    assert question.value == {"question": "Which day for Paris?"}
    assert agent.get_state(config).next
    # LangGraph's own Command works as well as this package's.
    done = agent.invoke(LangGraphCommand(resume="Friday"), config)
    assert "__interrupt__" not in done
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["booked Paris on Friday"]
    assert done["messages"][-1].content == "Booked."
    assert ran == ["Paris", "Paris"]


def test_several_questions_in_one_call_are_asked_in_turn_and_answers_keep_their_json() -> None:
    @tool
    def order(item: str) -> str:
        """Orders an item."""
        size = interrupt(f"Size of {item}?")
        extras = interrupt({"question": "Extras?", "choices": ["milk", "sugar"]})
        return f"{item} {size} {extras}"

    agent = create_deep_agent(model=ScriptedModel([call("order", item="coffee"), {"text": "Ordered."}]), tools=[order], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "order"}}
    first = agent.invoke({"messages": "order"}, config)
    assert first["__interrupt__"][0].value == "Size of coffee?"
    second = agent.invoke(Command(resume="large"), config)
    assert second["__interrupt__"][0].value["choices"] == ["milk", "sugar"]
    # Keyed by the interrupt's id, with a JSON value.
    interrupt_id = second["__interrupt__"][0].id
    done = agent.invoke(Command(resume={interrupt_id: ["milk"]}), config)
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["coffee large ['milk']"]


def test_parallel_questions_are_answered_with_a_list_and_a_single_value_is_refused() -> None:
    def ask(topic: str) -> str:
        """Asks about a topic."""
        return f"{topic}: {langgraph_interrupt(f'About {topic}?')}"

    model = ScriptedModel([{"tool_calls": [{"name": "ask", "args": {"topic": "a"}}, {"name": "ask", "args": {"topic": "b"}}]}, {"text": "ok"}])
    agent = create_deep_agent(model=model, tools=[ask], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "both"}}
    paused = agent.invoke({"messages": "go"}, config)
    requests = paused["__interrupt__"][0].value["action_requests"]
    assert [r["args"] for r in requests] == ["About a?", "About b?"]
    with pytest.raises(ValueError, match="2 questions wait"):
        agent.invoke(Command(resume="x"), config)
    done = agent.invoke(Command(resume=["one", "two"]), config)
    assert sorted(m.content for m in done["messages"] if m.type == "tool") == ["a: one", "b: two"]


def test_a_question_survives_a_restart(tmp_path: Path) -> None:
    def confirm(action: str) -> str:
        """Confirms an action."""
        return f"{action}: {langgraph_interrupt('Sure?')}"

    def agent() -> Any:
        return create_deep_agent(model=ScriptedModel([call("confirm", action="deploy"), {"text": "Deployed."}]), tools=[confirm], checkpointer=SqliteSaver(tmp_path / "threads.db"))

    config = {"configurable": {"thread_id": "deploy"}}
    assert agent().invoke({"messages": "deploy"}, config)["__interrupt__"][0].value == "Sure?"
    done = agent().invoke(Command(resume="yes"), config)
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["deploy: yes"]


def test_interrupt_outside_an_agent_says_so() -> None:
    with pytest.raises(RuntimeError, match="tools of a deepagents_rs agent"):
        interrupt("hello?")


def test_ask_user_is_an_interrupt_answered_with_command_resume(openai_mock: Any) -> None:
    # The question is the model's: the built-in tool (Rust, a suspension), not a Python one.
    openai_mock.turns = [
        {"call": ("ask_user", {"question": "Which colour?", "options": ["red", "blue"]})},
        {"text": "Painted blue."},
    ]
    agent = create_deep_agent(model="openai_chat:mock", ask_user=True, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "paint"}}
    paused = agent.invoke({"messages": "paint the door"}, config)
    [question] = paused["__interrupt__"]
    assert question.value == {"question": "Which colour?", "options": ["red", "blue"]}
    assert agent.get_state(config).next == ("tools",)
    assert len(openai_mock.requests) == 1
    done = agent.invoke(Command(resume="blue"), config)
    assert "__interrupt__" not in done
    # The answer is the call's result as typed (not JSON-quoted), and the model gets it.
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["blue"]
    assert done["messages"][-1].content == "Painted blue."
    [answered] = [m for m in openai_mock.requests[-1]["messages"] if m["role"] == "tool"]
    assert answered["content"] in ("blue", [{"type": "text", "text": "blue"}]), answered


def test_ask_user_survives_a_restart_and_is_answered_by_id(tmp_path: Path, openai_mock: Any) -> None:
    openai_mock.turns = [{"call": ("ask_user", {"question": "Deploy to which region?"})}, {"text": "Deployed to eu."}]

    def agent() -> Any:
        # A new agent on the same database: what a restarted process builds.
        return create_deep_agent(model="openai_chat:mock", ask_user=True, checkpointer=SqliteSaver(tmp_path / "threads.db"))

    config = {"configurable": {"thread_id": "deploy"}}
    [question] = agent().invoke({"messages": "deploy"}, config)["__interrupt__"]
    assert question.value == {"question": "Deploy to which region?"}
    restarted = agent()
    [waiting] = restarted.get_state(config).interrupts
    assert waiting.id == question.id and waiting.value == question.value
    done = restarted.invoke(Command(resume={question.id: "eu"}), config)
    assert [m.content for m in done["messages"] if m.type == "tool"] == ["eu"]
    assert done["messages"][-1].content == "Deployed to eu."
    assert "eu" in json.dumps([m for m in openai_mock.requests[-1]["messages"] if m["role"] == "tool"])
    # Answered, the question is gone: a second answer is refused.
    with pytest.raises(ValueError):
        agent().invoke(Command(resume="us"), config)
