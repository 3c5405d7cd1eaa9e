"""Conversation memory: an InMemorySaver keeps a thread, so the second turn sees the first."""

from deepagents import create_deep_agent
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

MOCK_SCRIPT = [
    # The second answer is given only when the request carries the first exchange.
    {"when": {"first_user_contains": "My name is Ada"}, "turns": [
        {"text": "Nice to meet you, Ada."},
        {"text": "Your name is Ada."},
    ]},
    {"when": {"first_user_contains": "What is my name"}, "turns": [
        {"text": "I do not know your name."},
    ]},
]

agent = create_deep_agent(model=ChatOpenAI(model="gpt-4o-mini"), checkpointer=InMemorySaver())
thread = {"configurable": {"thread_id": "ada"}}

first = agent.invoke({"messages": [{"role": "user", "content": "My name is Ada."}]}, thread)
assert first["messages"][-1].content == "Nice to meet you, Ada."

second = agent.invoke({"messages": [{"role": "user", "content": "What is my name?"}]}, thread)
assert second["messages"][-1].content == "Your name is Ada.", second["messages"][-1].content
humans = [m.content for m in second["messages"] if m.type == "human"]
assert humans == ["My name is Ada.", "What is my name?"], humans

# A different thread starts fresh.
other = agent.invoke({"messages": [{"role": "user", "content": "What is my name?"}]}, {"configurable": {"thread_id": "someone-else"}})
assert other["messages"][-1].content == "I do not know your name."
assert len([m for m in other["messages"] if m.type == "human"]) == 1
print("OK p07: the thread remembered the first turn")
