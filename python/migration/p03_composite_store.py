"""Long-term memory: /memories/ routed to a StoreBackend, the rest in the thread's state."""

from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend, StateBackend, StoreBackend
from langchain_openai import ChatOpenAI
from langgraph.store.memory import InMemoryStore

MOCK_SCRIPT = [
    {"when": {"first_user_contains": "Remember"}, "turns": [
        {"calls": [
            ["write_file", {"file_path": "/memories/preferences.md", "content": "The user prefers metric units.\n"}],
            ["write_file", {"file_path": "/scratch.md", "content": "temporary notes\n"}],
        ]},
        {"text": "Noted: metric units."},
    ]},
    {"when": {"first_user_contains": "What do you know"}, "turns": [
        {"calls": [["read_file", {"file_path": "/memories/preferences.md"}]]},
        {"text": "You prefer metric units."},
    ]},
]

store = InMemoryStore()
backend = CompositeBackend(
    default=StateBackend(),
    routes={"/memories/": StoreBackend(namespace=lambda runtime: ("memories",))},
)
agent = create_deep_agent(model=ChatOpenAI(model="gpt-4o-mini"), backend=backend, store=store)

first = agent.invoke(
    {"messages": [{"role": "user", "content": "Remember that I prefer metric units."}]},
    {"configurable": {"thread_id": "thread-1"}},
)
# The routed file went to the store (under the route-relative key), the other one to state.
item = store.get(("memories",), "/preferences.md")
assert item is not None, list(store.search(("memories",)))
assert "metric units" in str(item.value), item.value
assert "/scratch.md" in first["files"], first.get("files")
assert "/memories/preferences.md" not in first["files"]

# Another thread starts with empty state but reads the same long-term memory.
second = agent.invoke(
    {"messages": [{"role": "user", "content": "What do you know about my preferences?"}]},
    {"configurable": {"thread_id": "thread-2"}},
)
read = [m for m in second["messages"] if m.type == "tool" and m.name == "read_file"]
assert read and "metric units" in read[0].content, read
assert "/scratch.md" not in second.get("files", {})
print("OK p03: /memories/ persisted in the store across threads")
